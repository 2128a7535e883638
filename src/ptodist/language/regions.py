"""Inline regions: ``with pl.at(...) [as tid]:`` and ``with pl.spmd(n) [as tid]:`` become tasks.

Upstream outlines each such block into a kernel of its own.  ptodist does the
same, on the function's source: :func:`outlined` rewrites every region of a
program function into a nested function whose parameters are the enclosing
locals the block reads (bound by value when the region is submitted, as a
task's arguments are), and the ``with`` statement into a call of
:meth:`Region.run`.  The running context decides what a region is: in a rank a
task of its dependency graph (it may run later, once its ``deps=`` are
complete); in the host orchestrator a chip dispatch; in plain Python the block
itself.

Names a region assigns flow back to the enclosing function when the region ran
at once (the usual case).  A region that had to wait leaves them as they were;
its results are the tensors it wrote, which is all upstream lets a region
produce.  A function whose source cannot be read (built with ``exec``), or a
region that returns, yields or breaks out of an enclosing loop, runs inline.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import marshal
import sys
import textwrap
import types

from .. import context
from ..context import RegionResult
from ..errors import ProgramError

_REGION_CALLS = {"at", "spmd"}


class Region:
    """What ``pl.at(...)`` / ``pl.spmd(n)`` returns: a region's placement and its dependencies."""

    def __init__(self, kind: str, level=None, role=None, deps=(), name_hint: str | None = None, blocks: int = 0,
                 options: dict | None = None):
        self.kind = kind  # "at" or "spmd"
        self.level = level
        self.role = role
        self.deps = list(deps or ())
        self.name_hint = name_hint
        self.blocks = blocks
        self.options = dict(options or {})
        self._inline = None

    def run(self, body, *args) -> RegionResult:
        """Run (or submit) the outlined ``body(*args)``; generated code calls this."""
        from .mixed import scoped

        return context.current().region(self, scoped(self, body), args)

    # A region that was not outlined runs inline: still one task of the running rank.
    def __enter__(self):
        from .mixed import enter_region

        self._inline = context.current().region_begin(self)
        enter_region(self)
        return self._inline

    def __exit__(self, *exc):
        from .mixed import exit_region

        exit_region()
        context.current().region_end(self, self._inline, exc[0] is not None)
        return False

    def __repr__(self) -> str:
        return f"<pl.{self.kind} region level={getattr(self.level, 'name', self.level)} deps={self.deps}>"


# -- outlining -------------------------------------------------------------------------------------
@functools.cache
def _outline_code(fn_code, source: str, filename: str, first_line: int, regions: bool = True):
    tree = ast.parse(textwrap.dedent(source))
    ast.increment_lineno(tree, first_line - 1)
    fdef = tree.body[0]
    # The source found must be this function's own definition (inspect searches back to the nearest `def`).
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)) or fdef.name != fn_code.co_name:
        return None
    fdef.decorator_list = []
    _check_func_attrs(fdef, filename)
    outer = _bound_names(fdef)
    rewriter = _Outliner(outer, filename, regions)
    fdef.body = rewriter.block(fdef.body)
    if not rewriter.count and not rewriter.loops:
        return None
    # Compile inside a factory whose parameters are the original's free variables, so that the new code has
    # the same free variables and can take the original closure.
    free = list(fn_code.co_freevars)
    factory = ast.FunctionDef(name="__pl_factory", args=_args(free), body=[fdef, ast.Return(ast.Name(fdef.name,
                              ast.Load()))], decorator_list=[], returns=None)
    module = ast.Module(body=[ast.copy_location(factory, fdef)], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec")
    factory_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    return next(c for c in factory_code.co_consts if isinstance(c, types.CodeType) and c.co_name == fdef.name)


def outlined(fn, regions: bool = True):
    """``fn`` with its regions outlined (``regions``) and its ``pl.while_`` loops made to stop at their
    ``pl.cond``, or ``fn`` itself when it has neither (or its source is unavailable)."""
    code = getattr(fn, "__code__", None)
    names = code.co_names if code is not None else ()
    if code is None or not (regions and ("at" in names or "spmd" in names)) and "while_" not in names \
            and "func_attr" not in names \
            or code.co_name.startswith("__pl_region_"):  # already outlined: a region's own body
        return fn
    try:
        lines, first = inspect.getsourcelines(fn)
        filename = inspect.getsourcefile(fn) or code.co_filename
    except (OSError, TypeError):
        return fn
    new = _outline_code(code, "".join(lines), filename, first, regions)
    if new is None:
        return fn
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    closure = tuple(cells[name] for name in new.co_freevars)
    out = types.FunctionType(new, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    out.__kwdefaults__ = fn.__kwdefaults__
    out.__qualname__ = fn.__qualname__
    return out


def reduce_region(fn):
    """How to pickle ``fn`` when it is an outlined region's body (else None): by value, as its code, module and
    closure values, so that ranks forked before the region was outlined (a worker's) rebuild and run it."""
    code = getattr(fn, "__code__", None)
    if not isinstance(fn, types.FunctionType) or not code.co_name.startswith("__pl_region_"):
        return None
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append((True, cell.cell_contents))
        except ValueError:  # a name of the enclosing function not bound yet
            cells.append((False, None))
    return _region_from, (marshal.dumps(code), fn.__module__, fn.__name__, fn.__qualname__, fn.__defaults__,
                          tuple(cells))


def _region_from(code: bytes, module: str, name: str, qualname: str, defaults, cells):
    """Rebuild a region's body that :func:`reduce_region` pickled."""
    mod = sys.modules.get(module) or importlib.import_module(module)
    closure = tuple(types.CellType(value) if bound else types.CellType() for bound, value in cells)
    fn = types.FunctionType(marshal.loads(code), mod.__dict__, name, defaults, closure or None)
    fn.__qualname__ = qualname
    return fn


def _args(names) -> ast.arguments:
    return ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in names], vararg=None, kwonlyargs=[],
                         kw_defaults=[], kwarg=None, defaults=[])


def _walk_scope(node):
    """The nodes of ``node``'s own scope (not those of nested functions, lambdas or classes)."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(n))


def _bound_names(fdef) -> set:
    a = fdef.args
    names = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    names.update(x.arg for x in (a.vararg, a.kwarg) if x is not None)
    for n in _walk_scope(fdef):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
    return names


def _is_region(item: ast.withitem) -> bool:
    call = item.context_expr
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in _REGION_CALLS
            and isinstance(call.func.value, ast.Name))


class _Outliner:
    def __init__(self, outer: set, filename: str = "?", regions: bool = True):
        self.outer = outer
        self.filename = filename
        self.regions = regions
        self.count = 0
        self.lines: set[int] = set()  # the lines of the regions outlined so far (each names its region)
        self.loops = 0  # pl.while_ loops rewritten

    def block(self, stmts: list, loop: bool = False) -> list:
        out = []
        for s in stmts:
            out.extend(self.stmt(s, loop))
        return out

    def stmt(self, s, loop: bool) -> list:
        if self.regions and isinstance(s, ast.With) and len(s.items) == 1 and _is_region(s.items[0]) \
                and self._outlinable(s, loop):
            return self.outline(s)
        if isinstance(s, ast.For) and _is_call(s.iter, "while_"):
            self.while_loop(s)
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [s]
        for field in ("body", "orelse", "finalbody"):
            if isinstance(getattr(s, field, None), list) and getattr(s, field) and isinstance(getattr(s, field)[0],
                                                                                                ast.stmt):
                setattr(s, field, self.block(getattr(s, field), loop or isinstance(s, (ast.For, ast.While))))
        if isinstance(s, ast.Try):
            for h in s.handlers:
                h.body = self.block(h.body, loop)
        return [s]

    @staticmethod
    def _outlinable(s: ast.With, loop: bool) -> bool:
        for n in _walk_scope(s):
            if isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal)):
                return False
        if loop:  # a break/continue in the region that belongs to an enclosing loop
            inner_loops = [n for n in _walk_scope(s) if isinstance(n, (ast.For, ast.While))]
            inside = {id(x) for lp in inner_loops for x in ast.walk(lp)}
            if any(isinstance(n, (ast.Break, ast.Continue)) and id(n) not in inside for n in _walk_scope(s)):
                return False
        return True

    def while_loop(self, s: ast.For) -> None:
        """Make ``for T in pl.while_(...): pl.cond(c); ...`` stop when ``c`` is false, before the rest of the body:
        ``for T in pl.while_(...)._guarded(): if not pl.cond(c): out = pl.yield_(*T); break`` (``out``: the
        name the body's ``pl.yield_`` binds, which then holds the values the loop ends with)."""
        first = s.body[0]
        if not (isinstance(first, ast.Expr) and _is_call(first.value, "cond") and len(first.value.args) == 1):
            raise ProgramError(
                f"the pl.while_ loop at {self.filename}:{s.lineno}: the first statement of its body must be "
                f"pl.cond(<condition>), which decides whether the loop goes on; found `{ast.unparse(first)}` at line "
                f"{first.lineno}. Write `for (x,) in pl.while_(init_values=(x0,)):` then `pl.cond(x < n)` first")
        self.loops += 1
        s.iter = ast.Call(ast.Attribute(s.iter, "_guarded", ast.Load()), [], [])
        stop: list = []
        out = _yield_target(s.body[1:])
        if out is not None:
            target, func = out
            values = _as_load(s.target)
            stop.append(ast.Assign([target], ast.Call(func, [ast.Starred(values, ast.Load())], [])))
        stop.append(ast.Break())
        check = ast.If(ast.UnaryOp(ast.Not(), first.value), stop, [])
        for n in ast.walk(check):  # the new nodes take the place of the pl.cond(...) line
            if "lineno" in n._attributes and getattr(n, "lineno", None) is None:
                ast.copy_location(n, first)
        s.body[0] = check

    def outline(self, s: ast.With) -> list:
        self.count += 1
        n = self.count
        item = s.items[0]
        # What the block reads and writes is read off its source as written (before inner regions are outlined).
        region = ast.Module(body=s.body, type_ignores=[])
        loads, stores, first_store = [], set(), {}
        # An assignment binds its targets after its value is read (`out = f(out)` reads the outer `out`).
        bound_at, augmented = {}, set()
        for st in ast.walk(region):
            if isinstance(st, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and st.value is not None:
                for t in st.targets if isinstance(st, ast.Assign) else [st.target]:
                    for name in ast.walk(t):
                        bound_at[id(name)] = (st.value.end_lineno, st.value.end_col_offset)
                if isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name):
                    augmented.add(id(st.target))  # `x += 1` reads x first
        for node in ast.walk(region):
            if isinstance(node, ast.Name):
                pos = bound_at.get(id(node), (node.lineno, node.col_offset))
                if id(node) in augmented and node.id in self.outer:
                    loads.append(((node.lineno, node.col_offset), node.id))
                if isinstance(node.ctx, ast.Store):
                    stores.add(node.id)
                    first_store[node.id] = min(first_store.get(node.id, pos), pos)
                elif node.id in self.outer:
                    loads.append((pos, node.id))
        # Parameters: enclosing locals the region reads before (or without) assigning them.
        params = list(dict.fromkeys(name for pos, name in sorted(loads)
                                    if name not in first_store or pos <= first_store[name]))
        assigned = sorted(stores)
        body = self.block(s.body)
        # Named by the line of its `with` (unique in a function: a compound statement starts its own line), so
        # tracebacks, traces and reports say which region ran; the count keeps them apart should lines not.
        line = item.context_expr.lineno
        tag = f"L{line}" if line not in self.lines else f"L{line}_{n}"
        self.lines.add(line)
        fname, rname = f"__pl_region_{tag}", f"__pl_result_{tag}"
        result = _locals_subset(assigned) if assigned else ast.Constant(None)
        inner = [*body, ast.Return(result)]
        fdef = ast.FunctionDef(name=fname, args=_args(params), body=inner, decorator_list=[], returns=None)
        call = ast.Call(ast.Attribute(item.context_expr, "run", ast.Load()),
                        [ast.Name(fname, ast.Load()), *[ast.Name(p, ast.Load()) for p in params]], [])
        out = [fdef, ast.Assign([ast.Name(rname, ast.Store())], call)]
        if item.optional_vars is not None:
            out.append(ast.Assign([item.optional_vars],
                                  ast.Attribute(ast.Name(rname, ast.Load()), "tid", ast.Load())))
        for k in assigned:  # names the region assigned: rebound when it ran at once, else left as they were
            got = ast.Compare(ast.Constant(k), [ast.In()], [ast.Attribute(ast.Name(rname, ast.Load()), "values",
                                                                          ast.Load())])
            take = ast.Assign([ast.Name(k, ast.Store())],
                              ast.Subscript(ast.Attribute(ast.Name(rname, ast.Load()), "values", ast.Load()),
                                            ast.Constant(k), ast.Load()))
            # ... and a name the region was to bind for the first time stands for "runs later": reading it says so.
            later = ast.Assign([ast.Name(k, ast.Store())],
                               ast.Call(ast.Attribute(ast.Name(rname, ast.Load()), "later", ast.Load()),
                                        [ast.Constant(k)], []))
            probe = ast.Try(body=[ast.Expr(ast.Name(k, ast.Load()))],
                            handlers=[ast.ExceptHandler(ast.Name("NameError", ast.Load()), None, [later])],
                            orelse=[], finalbody=[])
            out.append(ast.If(got, [take], [probe]))
        for node in out:  # every new node takes the place of the pl.at(...) call (errors point at its line)
            for n in ast.walk(node):
                if "lineno" in n._attributes and getattr(n, "lineno", None) is None:
                    ast.copy_location(n, item.context_expr)
        return out


def _locals_subset(names: list) -> ast.expr:
    """``{k: v for k, v in locals().items() if k in (names)}``: the assigned names that are bound."""
    return ast.DictComp(
        key=ast.Name("__pl_k", ast.Load()), value=ast.Name("__pl_v", ast.Load()),
        generators=[ast.comprehension(
            target=ast.Tuple([ast.Name("__pl_k", ast.Store()), ast.Name("__pl_v", ast.Store())], ast.Store()),
            iter=ast.Call(ast.Attribute(ast.Call(ast.Name("locals", ast.Load()), [], []), "items", ast.Load()),
                          [], []),
            ifs=[ast.Compare(ast.Name("__pl_k", ast.Load()), [ast.In()],
                             [ast.Tuple([ast.Constant(k) for k in names], ast.Load())])],
            is_async=0)])


def _is_call(node, name: str) -> bool:
    """Whether ``node`` is a call of ``<anything>.name(...)`` or ``name(...)``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return isinstance(f, ast.Attribute) and f.attr == name or isinstance(f, ast.Name) and f.id == name


def _yield_target(stmts: list):
    """``(target, yield_ function)`` of the first ``target = pl.yield_(...)`` among ``stmts`` and their branches
    (not inside nested loops or functions), or None."""
    for st in stmts:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and _is_call(st.value, "yield_"):
            return copy.deepcopy(st.targets[0]), copy.deepcopy(st.value.func)
        if isinstance(st, (ast.If, ast.With, ast.Try)):
            for branch in (st.body, getattr(st, "orelse", []), getattr(st, "finalbody", [])):
                found = _yield_target(branch)
                if found is not None:
                    return found
    return None


def _as_load(target):
    """The loop target ``target`` read back as an expression."""
    node = copy.deepcopy(target)
    for n in ast.walk(node):
        if hasattr(n, "ctx"):
            n.ctx = ast.Load()
    return node


def _check_func_attrs(fdef, filename: str) -> None:
    """``pl.func_attr({...})`` describes the whole function: only before every other statement (after the
    docstring), each key once."""
    body = fdef.body
    k = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str) else 0
    leading, seen = set(), {}
    while k < len(body) and isinstance(body[k], ast.Expr) and _is_call(body[k].value, "func_attr"):
        leading.add(id(body[k].value))
        arg = body[k].value.args[0] if body[k].value.args else None
        for key in arg.keys if isinstance(arg, ast.Dict) else ():
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                if key.value in seen:
                    raise ProgramError(
                        f"pl.func_attr at {filename}:{key.lineno}: the attribute {key.value!r} of {fdef.name}() is "
                        f"declared twice (first at line {seen[key.value]}); declare each attribute once")
                seen[key.value] = key.lineno
        k += 1
    for n in _walk_scope(fdef):
        if _is_call(n, "func_attr") and id(n) not in leading:
            raise ProgramError(
                f"pl.func_attr at {filename}:{n.lineno}: it must precede every other statement of {fdef.name}() "
                "(it describes the whole function); move it to the top of the body")

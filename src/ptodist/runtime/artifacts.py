"""The build output tree: what compiling a program writes into its ``output_dir``, and reading a build back.

Laid out as upstream PyPTO lays out a build, holding what ptodist knows of the program:

- an L2 program (one chip, no host orchestrator): ``kernel_config.py`` (``RUNTIME_CONFIG``, ``ORCHESTRATION``,
  ``KERNELS``: each function's name, source file and line, core type and argument directions) and
  ``compiled_meta.json`` (the entry's parameters, platform, backend type); with several orchestrations each has
  its own pair under ``next_levels/<name>/``;
- an L3 program (a host orchestrator): ``orchestration/host_orch.py`` (the host orchestrator's source and the
  next-level callables it dispatches; importing it and calling ``entry(...)`` runs the build),
  ``distributed_meta.json`` (the host's parameters and the distributed config), and ``next_levels/<callee>/
  kernel_config.py`` for each chip-level function it dispatches and each builtin collective variant it calls
  (``builtin.tensor.allreduce__sum__fp32``, ...).

ptodist runs the program's Python functions, so a build records where they live (module, file, qualified name)
and a hash of each function's source: loading a build (``from_dir``) imports them again and refuses a build whose
source changed since.  Everything here runs at compile (and once per new dispatch plan for the collective
variants), never per dispatch.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ..collectives.registry import REGISTRY as COLLECTIVES
from ..compiler.ir_view import ParamDirection, entry_target, function_source, return_types, user_functions
from ..compiler.plan import BuiltinCall, DispatchPlan, WindowView
from ..errors import BuildError, BuildNotFoundError
from ..language import dtypes as dt
from ..language.functions import EntryFunction, Function, FunctionType, Kind, Program
from ..language.types import Direction, DynDim, DynExpr

SCHEMA = 1  # the version of compiled_meta.json / distributed_meta.json (upstream's, for both files)
COMPILED_META = "compiled_meta.json"
DISTRIBUTED_META = "distributed_meta.json"
HOST_ORCH = Path("orchestration") / "host_orch.py"
DEFAULT_RUNTIME = "tensormap_and_ringbuffer"


class ArgDirection(enum.IntEnum):
    """An argument's direction in a ``kernel_config.py`` signature (the names simpler's task interface uses)."""

    SCALAR = 0
    IN = 1
    OUT = 2
    INOUT = 3


_ARG = {Direction.IN: ArgDirection.IN, Direction.OUT: ArgDirection.OUT, Direction.INOUT: ArgDirection.INOUT}
_PARAM_DIRECTION = {Direction.IN: ParamDirection.In, Direction.OUT: ParamDirection.Out,
                    Direction.INOUT: ParamDirection.InOut}
# Upstream's text for a dtype (str(DataType)) where it is not the lower-case name.
_DTYPE_TEXT = {"BF16": "bfloat16", "FP8E4M3FN": "fp8e4m3fn", "FP8E8M0": "fp8e8m0"}
# Ops a kernel runs on the cube core (a kernel calling one is an AIC kernel).
_CUBE_OPS = frozenset({"matmul", "matmul_acc", "matmul_bias", "batch_matmul", "batch_matmul_acc", "gemv", "gemv_acc",
                       "gemv_bias", "matmul_mx", "matmul_mx_acc", "matmul_mx_bias"})


def dtype_text(dtype: dt.DataType | None) -> str | None:
    """``dtype`` as upstream writes it (``fp32``, ``bfloat16``, ``int32``, ...)."""
    if dtype is None:
        return None
    return _DTYPE_TEXT.get(dtype.name, dtype.name.lower())


def dtype_from_text(text: str) -> dt.DataType | None:
    for d in dt.ALL:
        if dtype_text(d) == text:
            return d
    return None


# -- what a build records ------------------------------------------------------------------------

def param_info(p) -> dict:
    """One parameter as upstream's meta records it: name, direction, shape (-1 for a dynamic dim; null for a
    scalar) and dtype."""
    tt = p.ttype
    shape = None
    if p.kind != "scalar" and tt is not None and getattr(tt, "shape", None) is not None:
        shape = [-1 if isinstance(d, (DynDim, DynExpr)) else int(d) for d in tt.shape]
    return {"name": p.name, "direction": _PARAM_DIRECTION[p.direction].name, "shape": shape,
            "dtype": dtype_text(getattr(tt, "dtype", None))}


def _disk_source(f: Function) -> str:
    """``f``'s text as its file holds it now, read afresh: the lines a module's loader cached are never checked
    again, and leaving that cache alone keeps every message's source lines as they were."""
    code = f.fn.__code__
    try:
        with open(code.co_filename, encoding="utf-8") as fh:
            lines = fh.read().splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):  # no file (a pl.parse text): the lines Python keeps are all there is
        return function_source(f)
    try:
        return textwrap.dedent("".join(inspect.getblock(lines[code.co_firstlineno - 1:])))
    except Exception:  # noqa: BLE001 - a file cut short since: its text is what it is
        return "".join(lines[code.co_firstlineno - 1:])


def _source_hash(f: Function) -> str:
    return hashlib.sha256(_disk_source(f).encode()).hexdigest()


def _function_record(f: Function) -> dict:
    return {"name": f.name, "kind": f.kind.value, "file": os.path.abspath(f.file), "line": f.line,
            "qualname": f.fn.__qualname__, "source_sha256": _source_hash(f)}


def _origin(compiled) -> dict:
    """Where a build's program comes from: the object to import again (module, file, qualified name)."""
    program = getattr(compiled, "source_program", None)
    # An L2 entry wraps the user's orchestration (or kernel) function itself: host.fn is the one to import.
    obj, kind = (program.cls, "program") if program is not None else (compiled.host.fn, "function")
    module = sys.modules.get(obj.__module__)
    # A module made by hand (exec) may be in no sys.modules entry: its functions still know their file.
    file = getattr(module, "__file__", None) or compiled.host.file
    return {"form": kind, "module": obj.__module__, "qualname": obj.__qualname__, "file": os.path.abspath(file),
            "orchestration": compiled.name if compiled._parent is not None else None}


def _meta(compiled, host: Function) -> dict:
    cfg = compiled.config
    return {"schema": SCHEMA, "params": [param_info(p) for p in host.params],
            "num_return_types": len(return_types(host)), "platform": cfg.platform,
            "backend_type": getattr(cfg.backend_type, "name", None) or "Ascend910B",
            "ptodist": {"program": compiled.name, "origin": _origin(compiled), "backend": cfg.backend,
                        "functions": [_function_record(f) for f in user_functions(host, compiled.extra_functions)]}}


def _write_json(path: Path, data: dict) -> None:
    # Replaced whole, so a reader never sees half a file.
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- kernel_config.py ------------------------------------------------------------------------------

def _core_type(f: Function) -> str:
    declared = f.options.get("type")
    if declared is FunctionType.AIC:
        return "aic"
    if declared is FunctionType.AIV:
        return "aiv"
    names = set()
    codes = [f.fn.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if inspect.iscode(c))
    return "aic" if names & _CUBE_OPS else "aiv"


def _signature(f: Function) -> list[ArgDirection]:
    """The directions of ``f``'s tensor arguments (scalars travel apart from them, as in upstream)."""
    return [_ARG[p.direction] for p in f.params if p.kind != "scalar"]


def _literal(value) -> str:
    if isinstance(value, ArgDirection):
        return f"_D.{value.name}"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool) or value is None:
        return repr(value)
    return json.dumps(value)


def _entry(f: Function, **first) -> dict:
    return {**first, "name": f.name, "source": os.path.abspath(f.file), "line": f.line,
            "qualname": f.fn.__qualname__, "core_type": _core_type(f), "signature": _signature(f)}


def runtime_config(cfg) -> dict:
    """The ``RUNTIME_CONFIG`` of a build for ``cfg``: the runtime, AICPU threads and block dim it records."""
    dc = cfg.devices
    return {"runtime": dc.runtime or DEFAULT_RUNTIME,
            "aicpu_thread_num": cfg.aicpu_thread_num if cfg.aicpu_thread_num is not None else dc.aicpu_thread_num,
            "block_dim": cfg.block_dim if cfg.block_dim is not None else dc.block_dim}


@dataclass
class CallConfig:
    """The settings of one call, as upstream's ``CallConfig`` carries them to the runtime."""

    block_dim: int | None = None
    aicpu_thread_num: int | None = None
    enable_chip_swimlane: bool = False
    enable_scope_stats: bool = False
    enable_dep_gen: bool = False
    enable_dump_args: int = 0
    enable_profiling: bool = False
    output_prefix: str | None = None


def call_config(cfg, runtime: dict, *, aicpu_thread_num: int | None = None, block_dim: int | None = None,
                dfx_dir=None) -> CallConfig:
    """``cfg``'s per-call settings: a given ``aicpu_thread_num``/``block_dim`` first, then ``cfg``'s, then the
    build's ``RUNTIME_CONFIG``."""
    def pick(given, field):
        for value in (given, getattr(cfg, field, None), runtime.get(field)):
            if value is not None:
                return value
        return None

    return CallConfig(block_dim=pick(block_dim, "block_dim"),
                      aicpu_thread_num=pick(aicpu_thread_num, "aicpu_thread_num"),
                      enable_chip_swimlane=cfg.enable_chip_swimlane, enable_scope_stats=cfg.enable_scope_stats,
                      enable_dep_gen=cfg.enable_dep_gen, enable_dump_args=cfg.enable_dump_args,
                      enable_profiling=cfg.enable_profiling,
                      output_prefix=str(dfx_dir) if dfx_dir is not None else None)


def kernel_config_text(what: str, runtime: dict, orchestration: dict, kernels: list[dict]) -> str:
    lines = ["# Kernel and Orchestration Configuration",
             f"# Written by ptodist at compile, for {what}.",
             "# ptodist runs the Python functions named here: each entry gives its source file, line and qualified",
             "# name, its core type and its tensor arguments' directions.",
             "", "from pathlib import Path", "", "from ptodist.runtime.artifacts import ArgDirection as _D", "",
             "_ROOT_DIR = Path(__file__).parent", "",
             f"# Runtime configuration for {runtime['runtime']}.",
             "RUNTIME_CONFIG = {", *(f"    {json.dumps(k)}: {_literal(v)}," for k, v in runtime.items()), "}", "",
             "ORCHESTRATION = {", *(f"    {json.dumps(k)}: {_literal(v)}," for k, v in orchestration.items()), "}",
             "", "KERNELS = ["]
    lines += [f"    {_literal(k)}," for k in kernels]
    lines += ["]", ""]
    return "\n".join(lines)


def _chip_config(compiled, orch: Function, what: str) -> str:
    kernels = sorted((f for f in user_functions(orch) if f.kind is Kind.KERNEL), key=lambda f: (f.file, f.line))
    if orch.kind is Kind.KERNEL:  # a kernel compiled on its own: it is the chip's one task
        kernels = [orch]
    entries = [_entry(k, func_id=i) for i, k in enumerate(kernels)]
    orchestration = {"source": os.path.abspath(orch.file), "function_name": orch.name, "line": orch.line,
                     "qualname": orch.fn.__qualname__, "signature": _signature(orch)}
    return kernel_config_text(what, runtime_config(compiled.config), orchestration, entries)


# -- writing a build ---------------------------------------------------------------------------------

def write_build(compiled) -> None:
    """Write the build tree of a freshly compiled program into its output directory."""
    if compiled._orchestrations:  # several L2 orchestrations: each is a build of its own under next_levels/
        (compiled.output_dir / COMPILED_META).unlink(missing_ok=True)
        for sub in compiled._orchestrations.values():
            write_build(sub)
        return
    out = compiled.output_dir
    host = compiled.host
    if isinstance(host, EntryFunction):
        _write_text(out / "kernel_config.py", _chip_config(compiled, entry_target(host),
                                                           f"the L2 program '{compiled.name}'"))
        _write_json(out / COMPILED_META, _meta(compiled, host))
        return
    meta = _meta(compiled, host)
    dc = compiled.config.devices
    meta["distributed_config"] = {"device_ids": list(dc.device_ids), "num_sub_workers": dc.num_sub_workers,
                                  "runtime": dc.runtime, "block_dim": dc.block_dim,
                                  "aicpu_thread_num": dc.aicpu_thread_num}
    callees = [f for f in user_functions(host, compiled.extra_functions) if f.kind is Kind.ORCHESTRATION]
    for f in callees:
        _write_text(out / "next_levels" / f.name / "kernel_config.py",
                    _chip_config(compiled, f, f"'{f.name}', a chip-level function of program '{compiled.name}'"))
    variants = static_variants(host)
    for name, call in variants.items():
        _write_variant(compiled, name, call)
    compiled._callees = [f.name for f in callees]
    compiled._variants_written = set(variants)
    _write_text(out / HOST_ORCH, _host_orch_text(compiled, host))
    _write_json(out / DISTRIBUTED_META, meta)


def _host_orch_text(compiled, host: Function) -> str:
    callables = list(getattr(compiled, "_callees", ())) + sorted(compiled._variants_written or ())
    source = textwrap.indent(function_source(host), "#   ")
    names = "".join(f"#   next_levels/{n}/\n" for n in callables) or "#   (none)\n"
    return (f'"""Host orchestration of program {compiled.name!r}, written by ptodist at compile.\n\n'
            "ptodist runs the host orchestrator's own Python code: `entry(*args)` loads this build\n"
            "(DistributedCompiledProgram.from_dir) and calls it.\n\"\"\"\n\n"
            "from pathlib import Path\n\n"
            f"# The host orchestrator: {host.name} at {os.path.abspath(host.file)}:{host.line} "
            f"({host.fn.__module__}.{host.fn.__qualname__})\n"
            f"# The next-level callables it dispatches:\n{names}"
            f"CALLABLES = {json.dumps({n: f'next_levels/{n}' for n in callables}, indent=4)}\n\n"
            "_BUILD = Path(__file__).resolve().parent.parent\n\n\n"
            "def entry(*args, config=None):\n"
            "    \"\"\"Load this build and run it once with ``args`` (as ``compiled(*args)``).\"\"\"\n"
            "    from ptodist.runtime.program import CompiledProgram\n\n"
            "    return CompiledProgram.from_dir(_BUILD)(*args, config=config)\n\n\n"
            "entry._pypto_distributed_entry = True\n\n"
            f"# The host orchestrator's source when this build was made:\n{source}")


# -- builtin collective variants -----------------------------------------------------------------

def _data_arg(name: str) -> int:
    """The argument whose dtype names the variant: the one that defines the comm domain (the data window)."""
    return COLLECTIVES[name].domain[0]


def variant_name(name: str, op: str | None, mode: str | None, dtype: dt.DataType | None) -> str:
    """The ``next_levels`` name of a builtin collective, as upstream names its variants."""
    base = "allreduce_ring" if name == "allreduce" and mode == "ring" else name
    # A barrier moves no data: upstream builds its one barrier kernel under the FP32 name, whatever the signal.
    text = "fp32" if name == "barrier" else dtype_text(dtype)
    parts = [f"builtin.tensor.{base}"]
    if COLLECTIVES[name].reducing:
        parts.append((op or "Sum").lower())
    parts.append(text or "fp32")
    return "__".join(parts)


def _variant_of(call: BuiltinCall) -> tuple[str, dict]:
    view = call.args[_data_arg(call.name)] if len(call.args) > _data_arg(call.name) else None
    views = [a for a in call.args if isinstance(a, WindowView)]
    dtype = view.dtype if isinstance(view, WindowView) else views[0].dtype if views else None
    op = call.kwargs.get("op")
    op = op.name if isinstance(op, enum.Enum) else None
    info = {"name": call.name, "op": op, "mode": call.kwargs.get("mode"), "dtype": dtype,
            "nargs": len(call.args), "loc": str(call.loc)}
    return variant_name(call.name, op, info["mode"], dtype), info


def _write_variant(compiled, name: str, info: dict) -> None:
    path = compiled.output_dir / "next_levels" / name / "kernel_config.py"
    declared = COLLECTIVES[info["name"]]
    source = os.path.abspath(inspect.getsourcefile(declared.run))
    algorithm = declared.algorithm(info.get("mode"))
    nargs = info.get("nargs") or 2
    signature = [ArgDirection.IN] * max(nargs - 2, 0) + [ArgDirection.INOUT, ArgDirection.INOUT]
    if info["name"] == "barrier":
        signature = [ArgDirection.INOUT]
    orchestration = {"source": source, "function_name": f"pld.tensor.{info['name']}", "signature": signature}
    kernel = {"func_id": 0, "name": name.split(".", 2)[2], "source": source, "function": algorithm,
              "core_type": "aiv", "signature": signature}
    if info.get("loc"):
        kernel["called_at"] = info["loc"]
    _write_text(path, kernel_config_text(f"the builtin collective {name} of program '{compiled.name}'",
                                         runtime_config(compiled.config), orchestration, [kernel]))


def write_variants(compiled, plan: DispatchPlan) -> None:
    """Write the ``next_levels`` folder of each builtin collective ``plan`` calls that the build lacks."""
    written = getattr(compiled, "_variants_written", None)
    if written is None or compiled._parent is not None or isinstance(compiled.host, EntryFunction):
        return
    seen, new = set(), False
    for task in (t for tasks in plan.tasks for t in tasks):  # every rank's: a comm domain may leave rank 0 out
        if isinstance(task.function, BuiltinCall) and task.function.key not in seen:
            seen.add(task.function.key)
            name, info = _variant_of(task.function)
            if name not in written:
                _write_variant(compiled, name, info)
                written.add(name)
                new = True
    if new:  # host_orch.py lists the callables: it gains the new ones
        _write_text(compiled.output_dir / HOST_ORCH, _host_orch_text(compiled, compiled.host))


def static_variants(host: Function) -> dict[str, dict]:
    """The builtin collectives the host orchestrator's source calls, where its text tells the variant (the data
    window made by ``pld.window(..., dtype=...)``); the rest are written when a plan shows them."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(host.fn)))
    except (OSError, TypeError, SyntaxError):
        return {}
    namespace = {**host.fn.__globals__, **host.scope}
    if host.fn.__closure__:
        for n, cell in zip(host.fn.__code__.co_freevars, host.fn.__closure__):
            try:
                namespace[n] = cell.cell_contents
            except ValueError:
                pass
    windows: dict[str, list] = {}  # name -> the dtypes of the windows assigned to it
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and _attr_tail(node.value.func) == "window":
            windows.setdefault(node.targets[0].id, []).append(_window_dtype(node.value, namespace))
        if isinstance(node, ast.Call) and _is_collective(node.func):
            calls.append(node)
    out = {}
    for node in calls:
        name = _attr_tail(node.func)
        index = _data_arg(name)
        arg = node.args[index] if len(node.args) > index else None
        dtypes = windows.get(arg.id, []) if isinstance(arg, ast.Name) else []
        if name != "barrier" and (len(set(dtypes)) != 1 or dtypes[0] is None):
            continue  # not told by the text: the plan tells it
        op = _keyword(node, "op")
        op_name = op.attr if isinstance(op, ast.Attribute) else None if op is None else "?"
        mode = _keyword(node, "mode")
        mode = mode.value if isinstance(mode, ast.Constant) else None if mode is None else "?"
        if "?" in (op_name, mode):
            continue
        dtype = dtypes[0] if dtypes else None
        out[variant_name(name, op_name, mode, dtype)] = {"name": name, "op": op_name, "mode": mode, "dtype": dtype,
                                                          "nargs": len(node.args),
                                                          "loc": f"{host.file}:{host.fn.__code__.co_firstlineno + node.lineno - 1}"}
    return out


def _attr_tail(node) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def _is_collective(func) -> bool:
    return isinstance(func, ast.Attribute) and func.attr in COLLECTIVES and \
        isinstance(func.value, ast.Attribute) and func.value.attr == "tensor" and \
        _attr_tail(func.value.value) not in (None, "pl")


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _window_dtype(call: ast.Call, namespace: dict) -> dt.DataType | None:
    node = _keyword(call, "dtype") or (call.args[2] if len(call.args) > 2 else None)
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in namespace:
        return None
    value = namespace[node.id]
    for part in reversed(parts):  # names and attributes only: reading them runs no user code
        value = getattr(value, part, None)
    return value if isinstance(value, dt.DataType) else None


# -- reading a build back ----------------------------------------------------------------------------

def read_meta(output_dir, filename: str, loader: str) -> dict:
    """The meta file of build ``output_dir``, checked; a clear error when it is missing or not one."""
    path = Path(output_dir).resolve() / filename
    other = DISTRIBUTED_META if filename == COMPILED_META else COMPILED_META
    if not path.is_file():
        hint = ""
        if (path.parent / other).is_file():
            hint = (f" The folder holds {other}: it is a{' distributed (L3)' if other == DISTRIBUTED_META else 'n L2'}"
                    f" build; load it with {'DistributedCompiledProgram' if other == DISTRIBUTED_META else 'CompiledProgram'}"
                    ".from_dir.")
        elif (path.parent / "next_levels").is_dir() and filename == COMPILED_META:
            hint = (" It holds next_levels/: a program with several orchestrations keeps one build per "
                    "orchestration there; load next_levels/<name>.")
        raise BuildNotFoundError(f"{loader}.from_dir({str(output_dir)!r}): {path} not found, so the folder is not "
                                 f"a build ptodist can load.{hint} Compile the program (ir.compile(...)) to make one.")
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BuildError(f"{loader}.from_dir: {path} cannot be read as JSON ({e}). Compile the program again "
                         "(ir.compile(...)) to write a fresh build.") from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA or not isinstance(meta.get("ptodist"), dict):
        raise BuildError(f"{loader}.from_dir: {path} is not a build this ptodist wrote (schema "
                         f"{meta.get('schema') if isinstance(meta, dict) else None!r}, expected {SCHEMA}, and a "
                         "'ptodist' section naming the program's Python functions). Compile the program again "
                         "(ir.compile(...)) to write a fresh build.")
    return meta


def load_origin(meta: dict, path: Path, loader: str):
    """Import the program a build was made from: a ``@pl.program`` (Program) or a program function."""
    origin = meta["ptodist"]["origin"]
    qualname = origin["qualname"]
    where = f"{loader}.from_dir({str(path)!r})"
    if "<locals>" in qualname:
        raise BuildError(f"{where}: the build's program {qualname!r} was defined inside a function (in "
                         f"{origin['file']}), so it cannot be imported again. Define the program at module level "
                         "to load its builds, or compile it again where it is defined.")
    module = _import(origin, where)
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise BuildError(f"{where}: {origin['file']} no longer defines {qualname!r}, the build's program. "
                             "Restore it, or compile the program again (ir.compile(...)).")
    if origin["form"] == "program" and not isinstance(obj, Program):
        raise BuildError(f"{where}: {qualname!r} in {origin['file']} is no longer a @pl.program. Compile the "
                         "program again (ir.compile(...)).")
    if origin["form"] == "function" and not isinstance(obj, Function):
        raise BuildError(f"{where}: {qualname!r} in {origin['file']} is no longer a program function (@pl.jit...). "
                         "Compile the program again (ir.compile(...)).")
    return obj


def _import(origin: dict, where: str):
    name, file = origin["module"], origin["file"]
    loaded = sys.modules.get(name)
    if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") == file:
        return loaded
    if name != "__main__":
        try:
            module = importlib.import_module(name)
            if os.path.abspath(getattr(module, "__file__", "") or "") == file:
                return module
        except Exception:  # noqa: BLE001 - not importable by name here: load the recorded file instead
            pass
    if not os.path.isfile(file):
        raise BuildError(f"{where}: the program's source file {file} no longer exists. Restore it, or compile the "
                         "program again (ir.compile(...)).")
    private = "ptodist_build_" + hashlib.sha256(file.encode()).hexdigest()[:12]
    if private in sys.modules:
        return sys.modules[private]
    spec = importlib.util.spec_from_file_location(private, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[private] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(private, None)
        raise
    return module


def check_sources(meta: dict, functions: list[Function], path: Path, loader: str) -> None:
    """Refuse a build whose functions' source changed since it was made, naming each changed function."""
    now = {f.name: f for f in functions}
    changed = []
    for rec in meta["ptodist"]["functions"]:
        f = now.get(rec["name"])
        if f is None:
            changed.append(f"'{rec['name']}' ({rec['file']}:{rec['line']}) is gone")
        elif _source_hash(f) != rec["source_sha256"]:
            changed.append(f"'{rec['name']}' ({os.path.abspath(f.file)}:{f.line}, built from line {rec['line']}) "
                           "changed")
    if changed:
        raise BuildError(f"{loader}.from_dir({str(path)!r}): the program's source changed since this build was "
                         f"made: {'; '.join(changed)}. The build describes the old code; compile the program again "
                         "(ir.compile(...)) to refresh it, or restore the source.")


__all__ = ["ArgDirection", "CallConfig", "COMPILED_META", "DISTRIBUTED_META", "SCHEMA", "read_meta", "write_build",
           "write_variants"]

"""DistributedWorker features that follow PyPTO's own worker, on the shm and sim backends.

Sub-worker callbacks in PyPTO's calling form (``fn(args)`` with ``args.tensor(i)`` /
``args.scalar(i)``) next to ptodist's positional one; ``sub_worker_overrides`` (the deprecated
alias of ``callbacks``); ``rt.register(compiled)`` handles; stacked tensors placed with
``worker_ids``; ``inherited_host_tensors`` and ``release_inherited_host_tensor_refs()``; and
``deps.json`` written with the swimlane alone.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, DistributedWorker, RunConfig, ir
from ptodist.errors import ConfigError, DispatchIndexError, DispatchTypeError, DispatchValueError, UsageError
from ptodist.runtime.worker import MappedArgs, RegistrationHandle

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[torch]')")

NR = pl.dynamic("NR")
BACKENDS = ["shm", "sim"]


def cfg(nr: int, backend: str, **kw) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=backend, **kw)


def shared(t):
    return t.share_memory_()


# -- programs --------------------------------------------------------------------------------------------

@pl.jit.incore
def scale(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], r: pl.Scalar[pl.INT32]):
    tile = pl.load(x, [0, 0], [1, 4])
    return pl.store(pl.add(pl.mul(tile, 2.0), pl.cast(r, target_type=pl.FP32)), [0, 0], y)


@pl.jit
def scale_rank(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], r: pl.Scalar[pl.INT32]):
    return scale(x, y, r)


@pl.jit.host
def double(x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        scale_rank(x[r], y[r], r, device=r)


@pl.jit.host
def rotated(x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    # shard i is used on rank (i + 1) % world, which writes y[i] = 2 * x[i] + that rank
    n = pld.world_size()
    for i in pl.range(n):
        scale_rank(x[i], y[i], (i + 1) % n, device=(i + 1) % n)


def expected(x):
    nr = x.shape[0]
    return np.asarray(x) * 2 + np.arange(nr, dtype=np.float32).reshape(nr, 1, 1)


@pl.jit.incore
def double_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    return pl.store(pl.mul(pl.load(x, [0, 0], [1, 4]), 2.0), [0, 0], y)


@pl.jit
def double_chip(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    """The chip function of the programs with sub-worker functions below: y = 2 * x."""
    return double_kernel(x, y)


def make_inspecting():
    @pl.program
    class Inspecting:
        @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
        def inspect(self, y: pl.Tensor[[NR, 1, 4], pl.FP32], step: pl.Scalar[pl.INT32]):
            ...

        @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
        def verify(self, f: pl.Tensor[[NR, 1, 4], pl.FP32]):
            ...

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.InOut[pl.Tensor[[NR, 1, 4], pl.FP32]], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
            for r in pl.range(pld.world_size()):
                double_chip(x[r], y[r], device=r)
            self.inspect(y, 1)
            for r in pl.range(pld.world_size()):
                double_chip(y[r], x[r], device=r)
            self.verify(x)

    return Inspecting


# -- 1. callbacks in PyPTO's calling form --------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_one_parameter_callback_gets_mapped_args(backend):
    prog = make_inspecting()
    compiled = ir.compile(prog, distributed_config=DistributedConfig(device_ids=[0, 1]))
    seen = {}

    def inspect(args):  # PyPTO's form: one positional argument
        seen["inspect"] = (args.tensor_count(), args.scalar_count(), args.tensor(0).clone(), args.scalar(0),
                           args["step"], args.names, args.function, len(args))

    def verify(y):  # one parameter: PyPTO's form too, whatever the name
        seen["verify"] = (isinstance(y, MappedArgs), y.tensor(0).clone(), y.tensor(0) is x)

    x = shared(torch.ones(2, 1, 4))
    y = shared(torch.zeros(2, 1, 4))
    with compiled.prepare(RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend=backend),
                          callbacks={"inspect": inspect, "verify": verify}) as rt:
        rt(x, y)
    count_t, count_s, t0, s0, by_name, names, function, n = seen["inspect"]
    assert (count_t, count_s, s0, by_name, names, function, n) == (1, 1, 1, 1, ("y", "step"), "inspect", 2)
    assert torch.equal(t0, torch.full((2, 1, 4), 2.0))           # y after the first segment
    assert seen["verify"][0] and torch.equal(seen["verify"][1], torch.full((2, 1, 4), 4.0))
    assert seen["verify"][2]  # a whole host tensor is the caller's own object
    assert torch.equal(x, torch.full((2, 1, 4), 4.0))


def test_mapped_args_errors():
    args = MappedArgs("inspect", ["y", "step"], [np.zeros(2), 3], [True, False])
    assert args.tensor(0) is args[0] and args.scalar(0) == 3 and list(args) == [args[0], 3]
    with pytest.raises(DispatchIndexError) as info:
        args.tensor(1)
    assert str(info.value) == (
        "MappedArgs.tensor(1): sub-worker 'inspect' was called with 1 tensor argument(s) (y), so tensor(i) takes "
        "0 <= i < 1. Tensors and scalars are counted separately: read the others with args.scalar(i), or all in "
        "parameter order with args[i].")
    assert isinstance(info.value, IndexError)
    with pytest.raises(DispatchTypeError, match=r"MappedArgs.scalar\('a'\): the index must be an int"):
        args.scalar("a")
    with pytest.raises(KeyError, match="sub-worker 'inspect' has no parameter 'z'; its parameters are y, step"):
        args["z"]


def test_positional_callbacks_still_work_and_bad_arities_are_refused():
    prog = make_inspecting()
    compiled = ir.compile(prog, distributed_config=DistributedConfig(device_ids=[0, 1]))
    steps = []
    with compiled.prepare(cfg(2, "sim"), callbacks={"inspect": lambda y, step: steps.append((step, float(y.sum()))),
                                                    "verify": lambda a: steps.append(float(a.tensor(0).sum()))}) as rt:
        rt(torch.ones(2, 1, 4), torch.zeros(2, 1, 4))
    assert steps == [(1, 16.0), 32.0]

    def three(a, b, c):
        pass

    with pytest.raises(DispatchTypeError) as info:
        compiled.prepare(cfg(2, "sim"), callbacks={"inspect": three, "verify": print})
    assert str(info.value) == (
        f"prepare(callbacks=...): callback for SubWorker 'inspect' ({prog.inspect.location}) must accept a single "
        "positional argument fn(args: MappedArgs); got signature (a, b, c). PyPTO calls it with one object "
        "(args.tensor(i), args.scalar(i)); ptodist also calls fn(y, step) with the sub-worker's 2 argument(s) when "
        "fn cannot take one. Change the callback's parameters to one of these forms.")
    assert isinstance(info.value, TypeError)


# -- 2. sub_worker_overrides --------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_sub_worker_overrides_is_a_deprecated_alias_of_callbacks(backend):
    prog = make_inspecting()
    compiled = ir.compile(prog, distributed_config=DistributedConfig(device_ids=[0, 1]))
    calls = []
    with pytest.warns(DeprecationWarning, match=r"^sub_worker_overrides is deprecated; use callbacks= instead\.$") \
            as record:
        rt = DistributedWorker(compiled, cfg(2, backend),
                               sub_worker_overrides={"inspect": lambda a: calls.append(("override", a.scalar(0))),
                                                     "verify": lambda a: calls.append("override verify")},
                               callbacks={"verify": lambda a: calls.append(("callback", float(a.tensor(0).sum())))})
    assert record[0].filename == __file__  # the warning points at the caller
    with pytest.warns(DeprecationWarning) as through_prepare:  # compiled.prepare() takes it too
        compiled.prepare(cfg(2, backend), sub_worker_overrides={"inspect": print, "verify": print}).close()
    assert through_prepare[0].filename == __file__
    with rt:
        x = shared(torch.ones(2, 1, 4))
        rt(x, shared(torch.zeros(2, 1, 4)))
    assert calls == [("override", 1), ("callback", 32.0)]  # callbacks wins a name both give
    assert torch.equal(x, torch.full((2, 1, 4), 4.0))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(DispatchTypeError) as info:
            DistributedWorker(compiled, cfg(2, backend), sub_worker_overrides=[print])
        assert str(info.value) == ("prepare(sub_worker_overrides=...): expects a dict {name: function}, got list. "
                                   "It is the deprecated name of callbacks=: pass callbacks={name: function} "
                                   "instead.")
        with pytest.raises(ConfigError) as info:
            DistributedWorker(compiled, cfg(2, backend), sub_worker_overrides={"inspect": print})
        assert str(info.value) == (
            f"prepare(): sub-worker function 'verify' ({prog.verify.location}) has no body ('...'): it is one of the "
            "program's runtime-bound callbacks, which prepare() must be given. Bind it with "
            "prepare(callbacks={'verify': fn}).")


# -- 3. register -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_register_returns_a_callable_handle(backend):
    compiled = double.compile(config=cfg(2, backend))
    other = rotated.compile(config=cfg(2, backend))
    x = shared(torch.arange(8, dtype=torch.float32).reshape(2, 1, 4))
    with compiled.prepare() as rt:
        handle = rt.register(compiled)
        assert isinstance(handle, RegistrationHandle) and handle.compiled is compiled and not handle.closed
        assert handle.cid == 0
        y = handle(x)
        np.testing.assert_array_equal(y.numpy(), expected(x.numpy()))
        out = shared(torch.zeros(2, 1, 4))
        assert handle(x, out) is out and torch.equal(out, y)
        with rt.register(compiled) as scoped:
            scoped(x, out)
        assert scoped.closed and not handle.closed
        with pytest.raises(UsageError) as info:
            scoped(x, out)
        assert str(info.value) == ("RegistrationHandle of 'double' was unregistered (unregister(), or leaving its "
                                   "with block), so it can dispatch nothing more. Get a fresh handle with "
                                   "rt.register(compiled), or dispatch with rt.run(compiled, *args).")
        with pytest.raises(DispatchValueError) as info:
            rt.register(other)
        assert str(info.value) == ("DistributedWorker.register(): program 'rotated' was not registered when this "
                                   "worker was prepared (prepare() was not given it); this worker runs 'double'. "
                                   "Prepare the worker with extra_compiled=[...] to run it.")
        with pytest.raises(DispatchTypeError, match=r"register\(\): expects one of the worker's compiled programs, "
                                                    "got int"):
            rt.register(3)
    assert handle.closed
    with pytest.raises(UsageError) as info:
        handle(x, out)
    assert isinstance(info.value, RuntimeError)
    assert str(info.value) == ("RegistrationHandle of 'double': its DistributedWorker was closed (close(), or "
                               "leaving its with block), so it can dispatch nothing more. Prepare a new worker with "
                               "compiled.prepare() and register the program on it: rt.register(compiled).")
    with pytest.raises(UsageError, match=r"DistributedWorker.register\(\): called after close\(\): the worker is closed"):
        rt.register(compiled)


# -- 4. worker_ids and inherited host tensors ----------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 3])
def test_stacked_tensor_placed_with_worker_ids(backend, world):
    compiled = rotated.compile(config=cfg(world, backend))
    host_x = torch.arange(world * 4, dtype=torch.float32).reshape(world, 1, 4)
    ids = [(i + 1) % world for i in range(world)]
    with compiled.prepare() as rt:
        x = rt.alloc_stacked_tensor(host_x, worker_ids=ids)
        assert x.worker_ids == tuple(ids) and x.full_shape == (world, 1, 4) and len(x.shards) == world
        y = shared(torch.zeros(world, 1, 4))
        rt(x, y)
        want = host_x.numpy() * 2 + np.array(ids, dtype=np.float32).reshape(world, 1, 1)
        np.testing.assert_array_equal(y.numpy(), want)
        out = rt.alloc_stacked_tensor(torch.zeros(world, 1, 4), worker_ids=ids)  # a placed output
        rt(x, out)
        back = torch.zeros(world, 1, 4)
        rt.copy_stacked_from(out, back)
        np.testing.assert_array_equal(back.numpy(), want)

        wrong = rt.alloc_stacked_tensor(host_x)  # default placement: shard i on rank i
        with pytest.raises(DispatchValueError) as info:
            rt(wrong, y)
        assert str(info.value).startswith("rotated() parameter 'x' is a StackedDeviceTensor: shard i lives on rank "
                                          "i, but the dispatch to rank 0 at ")
        assert str(info.value).endswith(f"is given x[{world - 1}]. Give each rank its own shard: x[r] in the "
                                        "dispatch loop.")


def test_worker_ids_must_match_the_program_placement_and_be_valid():
    compiled = double.compile(config=cfg(2, "sim"))
    with compiled.prepare() as rt:
        x = rt.alloc_stacked_tensor(torch.ones(2, 1, 4), worker_ids=[1, 0])
        with pytest.raises(DispatchValueError) as info:
            rt(x, torch.zeros(2, 1, 4))
        text = str(info.value)
        assert text.startswith("double() parameter 'x' is a StackedDeviceTensor placed with worker_ids=[1, 0] "
                               "(shard i lives on rank worker_ids[i]), but the dispatch to rank 0 at ")
        assert text.endswith("is given x[0], which lives on rank 1. Rank 0 holds x[1]: give each rank the shard "
                             "placed on it, or allocate the stacked tensor with worker_ids matching the program's "
                             "device= placement (alloc_stacked_tensor(host, worker_ids=[...])).")
        host = torch.ones(2, 1, 4)
        with pytest.raises(DispatchValueError) as info:
            rt.alloc_stacked_tensor(host, worker_ids=[0])
        assert str(info.value) == ("alloc_stacked_tensor(host, worker_ids=[0]): worker_ids has 1 entries but "
                                   "host's first dimension is 2 (shape [2, 1, 4]); give one rank per shard: shard i "
                                   "(host[i]) goes to rank worker_ids[i]")
        with pytest.raises(DispatchValueError) as info:
            rt.alloc_stacked_tensor(host, worker_ids=[1, 1])
        assert str(info.value) == ("alloc_stacked_tensor(host, worker_ids=[1, 1]): worker_ids must be distinct "
                                   "(one shard per rank); rank 1 appears more than once")
        with pytest.raises(DispatchValueError) as info:
            rt.alloc_stacked_tensor(host, worker_ids=[0, 2])
        assert str(info.value) == ("alloc_stacked_tensor(host, worker_ids=[0, 2]): worker id 2 is out of range "
                                   "[0, 2): the worker has 2 ranks, one per device in device_ids [0, 1]")
        with pytest.raises(DispatchTypeError, match=r"worker_ids must be a sequence of ints"):
            rt.alloc_stacked_tensor(host, worker_ids=["a", "b"])
        one = rt.alloc_stacked_tensor(torch.full((1, 1, 4), 7.0), worker_ids=[1])  # fewer shards than ranks
        assert one.worker_ids == (1,) and len(one) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_inherited_host_tensors_and_their_release(backend):
    compiled = double.compile(config=cfg(2, backend))
    weights = shared(torch.arange(8, dtype=torch.float32).reshape(2, 1, 4))
    plain = np.ones((2, 1, 4), np.float32)  # not shared: listing it is the caller's promise, never checked
    rt = DistributedWorker(compiled, inherited_host_tensors=[weights, plain])
    with rt:
        assert rt.inherited_host_tensors == (weights, plain)
        w = rt.alloc_stacked_tensor(weights)
        p = rt.alloc_tensor((2, 1, 4), np.float32, init=plain)
        rt.release_inherited_host_tensor_refs()
        assert rt.inherited_host_tensors == ()
        y = shared(torch.zeros(2, 1, 4))
        rt(w, y)  # resident tensors made from them stay valid
        np.testing.assert_array_equal(y.numpy(), expected(weights.numpy()))
        rt(p, y)
        np.testing.assert_array_equal(y.numpy(), expected(plain))
    with pytest.raises(UsageError, match=r"release_inherited_host_tensor_refs\(\): called after close\(\): the worker "
                                         r"is closed"):
        rt.release_inherited_host_tensor_refs()

    with pytest.raises(DispatchTypeError) as info:
        DistributedWorker(compiled, inherited_host_tensors=[weights, "w"])
    assert str(info.value) == ("prepare(inherited_host_tensors=...): entry 1 is a str; entries must be host tensors "
                               "(torch tensors or numpy arrays)")
    with pytest.raises(DispatchValueError) as info:
        DistributedWorker(compiled, inherited_host_tensors=[weights.transpose(0, 2)])
    assert str(info.value) == ("prepare(inherited_host_tensors=...): entry 0 must be a contiguous CPU tensor; got "
                               "device=cpu shape=[4, 1, 2] contiguous=False. List a contiguous CPU tensor "
                               "(.contiguous().cpu() makes one that you then keep and use)")


# -- 5. the swimlane writes deps.json too ---------------------------------------------------------------------

def _deps(out, rank: int, k: int) -> dict:
    return json.loads((ptodist.dfx.latest_run(out) / f"rank{rank}" / f"d{k}" / "deps.json").read_text())


@pytest.mark.parametrize("backend", BACKENDS)
def test_swimlane_alone_writes_deps_json_on_a_worker_and_one_shot(backend, tmp_path):
    compiled = double.compile(config=cfg(2, backend, enable_chip_swimlane=True, output_dir=str(tmp_path / "w")))
    x = shared(torch.arange(8, dtype=torch.float32).reshape(2, 1, 4))
    with compiled.prepare() as rt:
        y = rt(x)
        rt(x)
    np.testing.assert_array_equal(y.numpy(), expected(x.numpy()))
    for r in range(2):
        for k in range(2):
            deps = _deps(tmp_path / "w", r, k)
            assert (deps["rank"], deps["dispatch"]) == (r, k)
            assert [t["kernel"] for t in deps["tasks"]] == ["scale"]
            assert (ptodist.dfx.latest_run(tmp_path / "w") / f"rank{r}" / f"d{k}" /
                    "chip_swimlane_records.json").is_file()

    one_shot = double.compile(config=cfg(2, backend, enable_chip_swimlane=True, output_dir=str(tmp_path / "o")))
    y = one_shot(torch.ones(2, 1, 4))
    np.testing.assert_array_equal(y.numpy(), expected(np.ones((2, 1, 4), np.float32)))
    for r in range(2):
        assert _deps(tmp_path / "o", r, 0)["rank"] == r

    off = double.compile(config=cfg(2, backend, output_dir=str(tmp_path / "n")))
    off(torch.ones(2, 1, 4))
    assert ptodist.dfx.latest_run(tmp_path / "n") is None


# -- a one-shot call of a program with sub-worker functions ---------------------------------------------------

TALLIES: list = []


def make_tallying():
    @pl.program
    class Tallying:
        @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
        def tally(self, y: pl.Tensor[[NR, 1, 4], pl.FP32]):
            TALLIES.append(float(np.asarray(y).sum()))

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.InOut[pl.Tensor[[NR, 1, 4], pl.FP32]], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
            for r in pl.range(pld.world_size()):
                double_chip(x[r], y[r], device=r)
            self.tally(y)
            for r in pl.range(pld.world_size()):
                double_chip(y[r], x[r], device=r)

    return Tallying


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nr", [2, 4])
def test_a_one_shot_call_runs_the_sub_worker_bodies_between_its_segments(backend, nr):
    TALLIES.clear()
    compiled = ir.compile(make_tallying(), distributed_config=DistributedConfig(device_ids=list(range(nr))))
    x = np.arange(nr * 4, dtype=np.float32).reshape(nr, 1, 4)  # plain numpy: the call makes shared copies on shm
    x0 = x.copy()
    y = np.zeros_like(x)
    got = compiled(x, y, config=cfg(nr, backend))
    assert TALLIES == [float((2 * x0).sum())]  # the body ran once, after the first segment
    np.testing.assert_array_equal(y, 2 * x0)
    np.testing.assert_array_equal(x, 4 * x0)  # the second segment wrote the caller's own tensor
    assert got[0] is x and got[1] is y


def test_a_one_shot_call_with_sub_workers_writes_back_into_plain_torch_tensors():
    TALLIES.clear()
    compiled = ir.compile(make_tallying(), distributed_config=DistributedConfig(device_ids=[0, 1]))
    x, y = torch.arange(8, dtype=torch.float32).reshape(2, 1, 4), torch.zeros(2, 1, 4)  # not shared memory
    x0 = x.clone()
    compiled(x, y, config=cfg(2, "shm"))
    assert not x.is_shared() and torch.equal(y, 2 * x0) and torch.equal(x, 4 * x0)
    assert TALLIES == [float((2 * x0).sum())]


def test_a_one_shot_call_refuses_a_callback_point_it_cannot_run():
    compiled = ir.compile(make_inspecting(), distributed_config=DistributedConfig(device_ids=[0, 1]))
    x = np.ones((2, 1, 4), np.float32)
    with pytest.raises(ConfigError) as info:
        compiled(x, np.zeros_like(x), config=cfg(2, "sim"))
    # The first callback point the host reaches is named, with its definition's line.
    line = next(i for i, text in enumerate(open(__file__), 1) if "def verify(self, f: pl.Tensor[[NR, 1, 4]" in text)
    assert str(info.value) == (
        f"{compiled.name}(...): sub-worker function 'verify' ({__file__}:{line}) has no body ('...'): it is a "
        "callback point, and a one-shot call has no callback to run there. Give it a body, or run the program on a "
        "worker with its callback: compiled.prepare(callbacks={'verify': fn}).")

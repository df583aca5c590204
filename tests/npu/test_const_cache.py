"""Results computed once per constant (numerics/memo.py): a constant's inserted cast and its cube filter
layout are reused across replays only while the constant cannot have changed, and only under the same
dtype, overflow mode, subnormal mode and cube model. Every replay here is compared bit for bit with the
same replay computed without the memo."""
import numpy as np
import pytest

from ascend_emu import Device
from ascend_emu.graph import Graph, InputSpec, Node
from ascend_emu.numerics import cube, memo
from fp32mode import fp32  # the tests' fp32 mode

RNG = np.random.default_rng(17)
X = {"x": RNG.standard_normal((2, 7, 7, 4)).astype(np.float32)}


def _conv_graph(w, bn=False):
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [2, 7, 7, 4]}),
             Node("w", "Const", [], {"dtype": "float32", "value": w}),
             Node("conv", "Conv2D", ["x", "w"], {"T": "float32", "strides": [1, 1, 1, 1], "padding": "SAME"})]
    out = "conv:0"
    if bn:
        c = w.shape[3]
        params = {"s": RNG.uniform(0.5, 1.5, c), "o": RNG.normal(0, 0.1, c), "m": RNG.normal(0, 0.1, c),
                  "v": RNG.uniform(0.5, 2.0, c)}
        nodes += [Node(k, "Const", [], {"dtype": "float32", "value": v.astype(np.float32)}) for k, v in params.items()]
        nodes.append(Node("bn", "FusedBatchNormV3", ["conv", "s", "o", "m", "v"],
                          {"T": "float32", "U": "float32", "epsilon": 1e-3, "is_training": False,
                           "data_format": "NHWC"}, num_outputs=6))
        out = "bn:0"
    nodes.append(Node("y", "Relu", [out], {"T": "float32"}))
    return Graph(nodes=nodes, inputs=[InputSpec("x", "float32", [2, 7, 7, 4])], outputs=["y:0"])


def _bits(res):
    return {k: (v.dtype.str, v.view(np.uint8).tobytes()) for k, v in res.tensors.items()}, res.summary["float_status"]


def _uncached(monkeypatch, device, graph):
    """The replay with every memo lookup computed afresh (and the device's fused graph rebuilt)."""
    with monkeypatch.context() as m:
        m.setattr(memo, "memo", lambda a, key, build: build())
        fresh = Device.__new__(Device)
        fresh.__dict__.update(device.__dict__, _fusion_cache={})
        return _bits(fresh.replay(graph, X, progress=False))


def _cached_keys():
    return {k[0][0] for _, entry in memo._ENTRIES.values() for k in entry}


@pytest.mark.parametrize("mode", ["force_fp16", "allow_mix_precision", "must_keep_origin_dtype"])
def test_folded_filter_is_cached_and_gives_the_same_bits(monkeypatch, mode):
    g = _conv_graph(RNG.standard_normal((3, 3, 4, 8)).astype(np.float32), bn=True)
    # float32 on a cube that has it (the default Ascend910 would place the float32 convolution on the AI CPU)
    dev = Device(**fp32(precision_mode=mode)) if mode == "must_keep_origin_dtype" else Device(mode)
    first = _bits(dev.replay(g, X, progress=False))
    folded = [n for n in dev._fused(g).nodes if n.name.endswith("ConvBnFilterHost")]
    assert folded and memo.frozen(folded[0].attrs["value"])      # the fusion's own constant is read-only
    assert "conv2d filter" in _cached_keys()
    assert _bits(dev.replay(g, X, progress=False)) == first       # served from the memo
    assert _uncached(monkeypatch, dev, g) == first


def test_a_changed_constant_is_never_served_stale(monkeypatch):
    w = RNG.standard_normal((3, 3, 4, 8)).astype(np.float32)
    g = _conv_graph(memo.freeze(w.copy()))
    dev = Device("force_fp16")
    before = _bits(dev.replay(g, X, progress=False))
    assert "cast" in _cached_keys() and "conv2d filter" in _cached_keys()
    # a new array in place of the constant
    g.nodes[1].attrs["value"] = memo.freeze(w * 3)
    replaced = _bits(dev.replay(g, X, progress=False))
    assert replaced != before and replaced == _uncached(monkeypatch, dev, g)
    # a writeable constant changed in place between replays: never memoized
    g.nodes[1].attrs["value"] = v = w.copy()
    assert _bits(dev.replay(g, X, progress=False)) == _uncached(monkeypatch, dev, g)
    v *= -0.5
    changed = _bits(dev.replay(g, X, progress=False))
    assert changed not in (before, replaced) and changed == _uncached(monkeypatch, dev, g)
    # a frozen constant made writeable again and changed: no longer frozen, so computed afresh
    g.nodes[1].attrs["value"] = v = memo.freeze(w.copy())
    assert _bits(dev.replay(g, X, progress=False)) == before
    v.flags.writeable = True
    v += 1
    assert _bits(dev.replay(g, X, progress=False)) == _uncached(monkeypatch, dev, g) != before
    # a read-only view of a writeable array is not frozen either
    base = w.copy()
    view = base[...]
    view.flags.writeable = False
    g.nodes[1].attrs["value"] = view
    assert not memo.frozen(view)
    a = _bits(dev.replay(g, X, progress=False))
    base *= 2
    assert _bits(dev.replay(g, X, progress=False)) == _uncached(monkeypatch, dev, g) != a


@pytest.mark.parametrize("options", [
    [{"precision_mode": "force_fp16", "overflow_mode": "saturation"},
     {"precision_mode": "force_fp16", "overflow_mode": "inf_nan"}],
    [{"precision_mode": "force_fp16"}, {"precision_mode": "force_fp32"}, {"precision_mode": "allow_fp32_to_bf16",
                                                                               "soc": "Ascend910B"}],
    [{"precision_mode": "force_fp16", "subnormals": "flush"}, {"precision_mode": "force_fp16"}],
    [{"precision_mode": "force_fp16", "soc": "Ascend910"}, {"precision_mode": "force_fp16", "soc": "Ascend910B"}],
])
def test_devices_sharing_a_frozen_constant_get_their_own_results(monkeypatch, options):
    # weights beyond fp16's range (the cast overflows: saturation vs Inf) and fp16 subnormals (flushed or kept)
    w = RNG.standard_normal((3, 3, 4, 8)).astype(np.float32)
    w[0, 0, 0, :4] = [7e4, -1e5, 3e-6, -2e-7]
    g = _conv_graph(memo.freeze(w))
    devices = [Device(**o) for o in options]
    want = [_uncached(monkeypatch, d, g) for d in devices]
    assert len({str(b) for b in want}) == len(want)      # the configurations really differ
    for _ in range(2):                                    # alternate: each device hits its own entries
        for d, b in zip(devices, want):
            assert _bits(d.replay(g, X, progress=False)) == b


def test_memo_keys_arrays_by_identity_and_only_frozen_ones():
    calls = []

    def build():
        calls.append(1)
        return np.arange(3.0)

    a = np.ones(4)
    memo.memo(a, "k", build)
    memo.memo(a, "k", build)
    assert len(calls) == 2                               # writeable: computed every time
    memo.freeze(a)
    r1 = memo.memo(a, "k", build)
    r2 = memo.memo(a, "k", build)
    assert len(calls) == 3 and r1 is r2 and not r1.flags.writeable
    memo.memo(a, "other key", build)
    assert len(calls) == 4
    a.shape = (2, 2)                                      # a changed shape is part of the key
    memo.memo(a, "k", build)
    assert len(calls) == 5
    a.flags.writeable = True                              # seen writeable: its entries are dropped,
    memo.memo(a, "k", build)                              # so a change now and a second freeze
    a[0, 0] = 5.0                                         # cannot bring an old result back
    memo.freeze(a)
    memo.memo(a, "k", build)
    assert len(calls) == 7
    ident = id(a)
    del a                                                 # the entry dies with its array
    assert ident not in memo._ENTRIES
    assert not memo.frozen(np.frombuffer(bytearray(8)))   # memory another object can write
    assert memo.frozen(np.frombuffer(b"12345678"))


def test_memo_keys_a_view_by_its_owner_and_place():
    """A frozen view is keyed by the array owning its memory and its place in it: a new view made the same way
    (a replay's Reshape of a weight, made afresh each replay) meets the old entry; another place or layout, or
    an owner seen writeable, does not."""
    calls = []

    def build():
        calls.append(1)
        return np.zeros(1)

    w = memo.freeze(np.arange(24.0))
    r1 = memo.memo(w.reshape(4, 6), "k", build)
    r2 = memo.memo(w.reshape(4, 6), "k", build)             # a new view object, the same bits
    assert len(calls) == 1 and r1 is r2 and id(w) in memo._ENTRIES
    memo.memo(w[6:].reshape(3, 6), "k", build)              # another offset
    memo.memo(w.reshape(6, 4), "k", build)                  # another shape
    memo.memo(w.reshape(4, 6).T, "k", build)                # other strides
    assert len(calls) == 4
    w.flags.writeable = True                                # the owner writeable: a view of it is not frozen,
    memo.memo(w.reshape(4, 6), "k", build)                  # its entries are dropped
    assert id(w) not in memo._ENTRIES
    memo.freeze(w)
    memo.memo(w.reshape(4, 6), "k", build)
    assert len(calls) == 6


def _matmul_graph(w):
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [64, 48]}),
             Node("w", "Const", [], {"dtype": "float32", "value": w}),
             Node("mm", "MatMul", ["x", "w"], {"T": "float32", "transpose_a": False, "transpose_b": False}),
             Node("y", "Relu", ["mm"], {"T": "float32"})]
    return Graph(nodes=nodes, inputs=[InputSpec("x", "float32", [64, 48])], outputs=["y:0"])


@pytest.mark.parametrize("overflow_mode", ["inf_nan", "saturation"])
def test_a_matmul_weight_is_rounded_and_packed_once(monkeypatch, overflow_mode):
    """A frozen MatMul weight's cube operand values (its fp16 rounding and that rounding's status) and the
    fast kernel's packed slabs are kept with it (numerics/cube_core._batched); a new weight is computed afresh."""
    w = RNG.standard_normal((48, 40)).astype(np.float32)
    w[0, :4] = [7e4, -1e5, 3e-6, -2e-7]                  # the rounding overflows (status) and makes subnormals
    g = _matmul_graph(memo.freeze(w.copy()))
    x = {"x": RNG.standard_normal((64, 48)).astype(np.float32)}
    dev = Device("force_fp16", overflow_mode=overflow_mode)

    def run(d):
        r = d.replay(g, x, progress=False)
        return {k: v.view(np.uint8).tobytes() for k, v in r.tensors.items()}, r.summary["float_status"]

    first = run(dev)
    assert {"cube operand values", "packed slabs"} <= _cached_keys()
    assert first[1] != 0 and run(dev) == first
    with monkeypatch.context() as m:
        m.setattr(memo, "memo", lambda a, key, build: build())
        assert run(dev) == first
    g.nodes[1].attrs["value"] = memo.freeze(w * -2)
    changed = run(dev)
    with monkeypatch.context() as m:
        m.setattr(memo, "memo", lambda a, key, build: build())
        assert changed != first and run(dev) == changed


def test_an_array_dying_at_interpreter_exit_prints_nothing():
    """At exit Python clears a module's globals (to None) before the last arrays die; memo's weak-reference
    callback read the global `_forget` and `_ENTRIES` then and printed "Exception ignored ... 'NoneType'" after
    a test run. The run below does to the module what shutdown does, then drops the array."""
    import subprocess
    import sys

    code = ("import numpy as np\n"
            "from ascend_emu.numerics import memo\n"
            "a = memo.freeze(np.arange(4.0))\n"
            "memo.memo(a, 'k', lambda: a * 2)\n"
            "keep = memo._ENTRIES\n"
            "memo._ENTRIES = memo._forget = None\n"
            "del a\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr


def test_a_pooled_buffer_handed_out_again_meets_no_old_entry():
    """Large arrays live in kernels.alloc's pool, whose buffers are handed out again once their arrays die: a frozen
    weight in a reused buffer must not meet the memo entries (rounded, packed operands) of the dead weight that was
    there before, though it has the same owner buffer, offset, dtype, shape and strides (review of session 16)."""
    import gc

    from ascend_emu.kernels import alloc

    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 512)).astype(np.float16)
    for _ in range(4):
        w = alloc.empty((512, 1024), np.float16)     # 1 MiB: from the pool
        assert alloc.pooled(_owner_of(w))
        w[...] = rng.standard_normal((512, 1024)).astype(np.float16)
        memo.freeze(w)
        got = cube.matmul(a, w)[0]
        want = cube.matmul(a, w.copy())[0]      # writeable: never memoized
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
        del w, got, want
        gc.collect()


def _owner_of(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a

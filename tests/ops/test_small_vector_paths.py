"""The small-node paths of issue 46 (session 20, small4), each against the path it stands for on hostile data (Inf,
NaN, -0, float32 subnormals, zeros, fp16 overflow, results that overflow), bits, dtype, shape and status, in every
context that must decline it (saturation, flushed subnormals, cce_ftz, the op models):

- ``_util.f32_ring_steps`` (RsqrtGrad, SigmoidGrad, ReciprocalGrad / InvGrad): their float32 steps without step32
  where the result is finite, against ``f32_steps`` (the path switched off), and an oracle: each step the float64
  product / sum of float32 values rounded once to float32 (exact in float64: the IEEE float32 operation);
- ``math_ops._f32_unary`` (neg, abs, square, sqrt, reciprocal of float32), against ``vector`` (switched off), and the
  float64 result rounded once;
- ``grad_ops._sce_unstepped`` ((Sparse)SoftmaxCrossEntropyWithLogits), against the op-by-op steps with
  step32 after every one (the code it replaced, written out here)."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.numerics.vector import vector
from ascend_emu.ops import activation_grad_ops as agr
from ascend_emu.ops import grad_ops, math_ops
from ascend_emu.ops._util import f32_steps, finish, step32, sum_f32, widen
from ascend_emu.ops.registry import OpContext

F = np.float32


def _hostile(rng, shape, positive=False):
    x = np.asarray(rng.standard_normal(shape).astype(F) * F(2.0) ** rng.integers(-140, 100, shape).astype(F), F)
    if positive:
        x = np.asarray(np.abs(x), F)
    flat = x.reshape(-1)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 3.4028235e38, -1.0,
                        1.8446744e19, 65504.0, 65520.0], F)
    if flat.size > 1:
        idx = rng.integers(0, flat.size, max(1, flat.size // 6))
        flat[idx] = special[rng.integers(0, special.size, idx.size)]
    return x


def _finite(rng, shape, positive=False, lo=-20, hi=20):
    x = np.asarray(rng.standard_normal(shape).astype(F) * F(2.0) ** rng.integers(lo, hi, shape).astype(F), F)
    x = np.asarray(np.abs(x), F) if positive else x
    flat = x.reshape(-1)
    if flat.size > 2:
        flat[:2] = (F(0.0), F(-0.0))
    return x


def _same(a, b, view=True):
    """Same type, dtype, shape and bits; with ``view`` also the same view-ness (strides: a broadcast view's zeros,
    C or F order; writeable: a read-only broadcast view or a fresh array), as the path switched off gives it. (Not
    against an oracle, a fresh array.)"""
    if view:
        assert type(a) is type(b), (type(a), type(b))
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    if view:
        assert a.strides == b.strides and a.flags.writeable == b.flags.writeable, (
            a.strides, b.strides, a.flags.writeable, b.flags.writeable)
    w = a.dtype.itemsize
    u = {4: np.uint32, 2: np.uint16, 8: np.uint64}[w]
    assert np.array_equal(np.ascontiguousarray(a).view(u), np.ascontiguousarray(b).view(u))


CONTEXTS = [{}, {"overflow_mode": "saturation"}, {"subnormals": "flush"}, {"ftz": True}, {"op_model": "exact"},
            {"op_model": "ascendc"}, {"op_model": "tbe_v100"}, {"impl_mode": "high_performance"}]
_IDS = lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "default"   # noqa: E731
SHAPES = [(16,), (32,), (), (4, 8), (0,)]


# ------------------------------------------------------------------------------ f32_ring_steps

#: (op function, oracle: the steps in float64, each rounded to float32)
def _r(v):
    return np.asarray(np.asarray(v, np.float64).astype(F), np.float64)


RING = {
    "RsqrtGrad": (agr.rsqrt_grad, lambda y, d: _r(_r(_r(_r(y * y) * y) * d) * -0.5)),
    "SigmoidGrad": (agr.sigmoid_grad, lambda y, d: _r(_r(y - _r(y * y)) * d)),
    "ReciprocalGrad": (agr._reciprocal_grad, lambda y, d: _r(_r(_r(y * -1.0) * y) * d)),
    # (op_model="ascendc": the arch35 kernel's order)
    "SigmoidGrad-ascendc": (agr.sigmoid_grad, lambda y, d: _r(_r(d * _r(1.0 - y)) * y)),
}


def _off(monkeypatch):
    monkeypatch.setattr(agr, "f32_ring_steps", lambda ctx, fn, *xs: f32_steps(ctx, fn, *xs))


@pytest.mark.parametrize("name", RING)
@pytest.mark.parametrize("ctx_kw", CONTEXTS, ids=_IDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_ring_steps_are_f32_steps(name, ctx_kw, dtype, monkeypatch):
    fn, oracle = RING[name]
    if name == "SigmoidGrad-ascendc" and ctx_kw.get("op_model") != "ascendc":
        pytest.skip("the ascendc order only")
    if name == "SigmoidGrad" and ctx_kw.get("op_model") == "ascendc":
        oracle = RING["SigmoidGrad-ascendc"][1]
    rng = np.random.default_rng(len(name) * 7 + len(ctx_kw) + len(dtype))
    for shape in SHAPES:
        for make in (_hostile, _finite, _finite):
            y, d = make(rng, shape), make(rng, shape)
            if dtype == "float16":
                with np.errstate(all="ignore"):
                    y, d = y.astype(np.float16), d.astype(np.float16)
            ctx = OpContext(dtype=dtype, **ctx_kw)
            got = fn(y, d, ctx=ctx)
            with monkeypatch.context() as m:
                _off(m)
                ref = OpContext(dtype=dtype, **ctx_kw)
                want = fn(y, d, ctx=ref)
            _same(got, want)
            assert ctx.status == ref.status
            if dtype == "float32" and not ctx_kw.get("subnormals") and ctx.status == 0:
                with np.errstate(all="ignore"):
                    _same(got, oracle(y.astype(np.float64), d.astype(np.float64)).astype(F), view=False)


def test_ring_steps_taken_and_declined(monkeypatch):
    """The fast path runs fn once on finite data (no f32_steps), and hands an Inf / NaN result to f32_steps."""
    from ascend_emu.ops import _util
    calls = []
    real = _util.f32_steps
    monkeypatch.setattr(_util, "f32_steps", lambda *a: calls.append(1) or real(*a))
    y, d = np.array([1.5, -2.0], F), np.array([3.0, 0.25], F)
    agr.rsqrt_grad(y, d, ctx=OpContext(dtype="float32"))
    assert not calls
    agr.rsqrt_grad(np.array([1e30, 1.0], F), d, ctx=OpContext(dtype="float32"))
    assert calls


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("name", ["RsqrtGrad", "SigmoidGrad", "ReciprocalGrad"])
def test_ring_steps_scalar_against_empty(name, mode, monkeypatch):
    """A 0-d y (or dy) broadcast against an empty one: the empty result is finite, but the 0-d steps (y * y = Inf)
    are instructions whose Inf the register sees (0x20), as the path switched off records it."""
    fn = RING[name][0]
    for y, d in ((np.asarray(F(1e20)), np.zeros((0,), F)), (np.zeros((0, 3), F), np.asarray(F(3e38))),
                 (np.full((1, 0), F(1e20)), np.ones((2, 1), F)), (np.zeros((0,), F), np.zeros((0,), F))):
        ctx = OpContext(dtype="float32", overflow_mode=mode)
        got = fn(y, d, ctx=ctx)
        with monkeypatch.context() as m:
            _off(m)
            ref = OpContext(dtype="float32", overflow_mode=mode)
            want = fn(y, d, ctx=ref)
        _same(got, want)
        assert ctx.status == ref.status, (y.shape, d.shape, ctx.status, ref.status)
    assert ref.status == 0   # the last pair: empty steps, nothing to record


@pytest.mark.parametrize("ctx_kw", [{"subnormals": "flush"}, {"subnormals": "flush", "overflow_mode": "saturation"},
                                    {"subnormals": "flush", "ftz": True}], ids=_IDS)
@pytest.mark.parametrize("name", ["RsqrtGrad", "SigmoidGrad", "ReciprocalGrad"])
def test_ring_steps_flushed_subnormals(name, ctx_kw, monkeypatch):
    """Finite data whose steps make subnormals: under flushed subnormals f32_steps flushes each step (to +-0), so the
    fast path must decline there (no Inf / NaN sends it back); the raw float32 steps keep them (the test bites)."""
    fn = RING[name][0]
    pairs = [(np.array([1e-45, 0.5, 2.0 ** -70, -2.0 ** -40, 2.0 ** -45], F), np.array([1.0, 1.0, 1.0, 3.0, 1.0], F)),
             (np.array([2.0 ** -50, 3.0], F), np.array([2.0 ** -30, 1.0], F))]
    differs = False
    for y, d in pairs:
        ctx = OpContext(dtype="float32", **ctx_kw)
        got = fn(y, d, ctx=ctx)
        with monkeypatch.context() as m:
            _off(m)
            ref = OpContext(dtype="float32", **ctx_kw)
            want = fn(y, d, ctx=ref)
        _same(got, want)
        assert ctx.status == ref.status
        raw = OpContext(dtype="float32")
        differs |= not np.array_equal(got.view(np.uint32), fn(y, d, ctx=raw).view(np.uint32))
    assert differs, "no step made a subnormal: the data does not test the subnormals guard"


# ------------------------------------------------------------------------------ f32 unary

UNARY = {"neg": lambda x: -x, "abs": np.abs, "square": lambda x: x * x, "sqrt": np.sqrt,
         "reciprocal": lambda x: 1.0 / x}


@pytest.mark.parametrize("op", UNARY)
@pytest.mark.parametrize("ctx_kw", CONTEXTS, ids=_IDS)
def test_f32_unary_is_vector(op, ctx_kw, monkeypatch):
    rng = np.random.default_rng(len(op) * 13 + len(ctx_kw))
    for shape in SHAPES:
        for make in (_hostile, _finite, _finite):
            x = make(rng, shape, positive=op == "sqrt" and make is _finite)
            for arg in (x, x.T if x.ndim == 2 else x, np.broadcast_to(x.reshape(-1)[:1], (3, 2)) if x.size else x):
                ctx = OpContext(dtype="float32", **ctx_kw)
                got = math_ops.vec(ctx, op, arg)
                with monkeypatch.context() as m:
                    m.setattr(math_ops, "_f32_unary", lambda *a: None)
                    ref = OpContext(dtype="float32", **ctx_kw)
                    want = math_ops.vec(ref, op, arg)
                _same(got, want)
                assert ctx.status == ref.status
                if not ctx_kw.get("subnormals") and not ctx_kw.get("ftz") and ctx.status == 0:
                    with np.errstate(all="ignore"):
                        _same(got, np.asarray(UNARY[op](np.asarray(arg, np.float64))).astype(F), view=False)


def test_f32_unary_neg_of_nan_and_zero():
    """Neg flips the sign of -0, +0; a NaN or Inf goes to the kernel (vector): its sign and status as before."""
    ctx = OpContext(dtype="float32")
    y = math_ops.vec(ctx, "neg", np.array([0.0, -0.0, 1e-45], F))
    _same(y, np.array([-0.0, 0.0, -1e-45], F))
    assert ctx.status == 0
    ctx = OpContext(dtype="float32")
    y = math_ops.vec(ctx, "neg", np.array([np.inf, 1.0], F))
    _same(y, np.array([-np.inf, -1.0], F))
    assert ctx.status == 0x20


@pytest.mark.parametrize("op", UNARY)
def test_f32_unary_empty_views(op, monkeypatch):
    """Empty arrays of every stride pattern (a reshaped (0,) has no zero stride; numpy's ufunc gives its empty result
    strides (0, 0), vector a fresh C array): the same view-ness as the path switched off."""
    e = np.zeros(0, F)
    for x in (e, e.reshape(3, 0), e.reshape(0, 3), e.reshape(0, 3).T, np.zeros((3, 0), F), np.zeros((2, 0, 4), F),
              e.reshape(2, 0, 4)[:, :, ::2]):
        ctx = OpContext(dtype="float32")
        got = math_ops.vec(ctx, op, x)
        with monkeypatch.context() as m:
            m.setattr(math_ops, "_f32_unary", lambda *a: None)
            ref = OpContext(dtype="float32")
            want = math_ops.vec(ref, op, x)
        _same(got, want)
        assert ctx.status == ref.status == 0


#: finite float32 data whose neg / abs / sqrt / reciprocal differ when subnormals are flushed (inputs or results)
#: or under cce_ftz (sqrt of a subnormal, a reciprocal that is one): no Inf / NaN sends them back to vector
_SUBNORMAL_DATA = {"neg": [1e-45, 2.0 ** -130, -2.0 ** -140, 4.0], "abs": [-1e-45, 2.0 ** -130, -2.0 ** -140, 4.0],
                   "sqrt": [1e-45, 2.0 ** -130, 2.0 ** -140, 4.0], "reciprocal": [2.0 ** 127, -3e38, 1e-20, 4.0]}


@pytest.mark.parametrize("ctx_kw", [{"ftz": True}, {"subnormals": "flush"}, {"ftz": True, "subnormals": "flush"},
                                    {"ftz": True, "overflow_mode": "saturation"}], ids=_IDS)
@pytest.mark.parametrize("op", _SUBNORMAL_DATA)
def test_f32_unary_subnormal_contexts(op, ctx_kw, monkeypatch):
    """Finite data only: the path must decline under cce_ftz and flushed subnormals by its guards alone."""
    x = np.array(_SUBNORMAL_DATA[op], F)
    ctx = OpContext(dtype="float32", **ctx_kw)
    got = math_ops.vec(ctx, op, x)
    with monkeypatch.context() as m:
        m.setattr(math_ops, "_f32_unary", lambda *a: None)
        ref = OpContext(dtype="float32", **ctx_kw)
        want = math_ops.vec(ref, op, x)
    _same(got, want)
    assert ctx.status == ref.status
    if ctx_kw.get("subnormals") or op in ("sqrt", "reciprocal"):   # (cce_ftz keeps neg's and abs's subnormals)
        assert not np.array_equal(got.view(np.uint32), np.asarray(math_ops._F32_UNARY[op](x)).view(np.uint32))


# ------------------------------------------------------------------------------ softmax cross entropy

def _sce_steps(ctx, logits, labels):
    """The op-by-op float32 steps, step32 after every one (the code _sce_unstepped stands for)."""
    from ascend_emu.ops.activation_grad_ops import _NEG_ONE
    x, lab = np.broadcast_arrays(widen(ctx, logits), widen(ctx, labels))
    axis = (x.ndim - 1,)
    f32 = dict(dtype="float32", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals, op_model=ctx.op_model,
               impl_mode=ctx.impl_mode)
    with np.errstate(all="ignore"):
        s = step32(ctx, x - x.max(axis=-1, keepdims=True))
        e, st = vector("exp", s, **f32)
        ctx.record(st)
        total = step32(ctx, sum_f32(ctx, np.ascontiguousarray(e), axis))[..., None]
        back = step32(ctx, step32(ctx, e / total) - lab)
        lg, st = vector("log", total, **f32)
        ctx.record(st)
        t = step32(ctx, step32(ctx, lab * step32(ctx, s - lg)) * _NEG_ONE)
        loss = step32(ctx, sum_f32(ctx, np.ascontiguousarray(t), axis))
    return finish(ctx, loss), finish(ctx, back)


SCE_CONTEXTS = [{}, {"subnormals": "flush"}, {"op_model": "ascendc"}, {"op_model": "tbe_v100"},
                {"impl_mode": "high_performance"}, {"overflow_mode": "saturation"},
                {"overflow_mode": "saturation", "op_model": "tbe_v100"},
                {"overflow_mode": "saturation", "subnormals": "flush"}]


def _logits(rng, shape, kind, dtype):
    if kind == "hostile":
        x = _hostile(rng, shape)
    elif kind == "wide":     # exp underflows to 0 / subnormals, rows sums of 1 value
        x = _finite(rng, shape, lo=0, hi=9)
    else:
        x = _finite(rng, shape, lo=-3, hi=4)
    if shape[0] > 3:
        x[0] = -np.inf    # a row of -Inf: s = NaN
        x[1, 0] = np.inf
        x[2, :] = F(3e38)
    with np.errstate(all="ignore"):
        return x.astype(dtype)


@pytest.mark.parametrize("ctx_kw", SCE_CONTEXTS, ids=_IDS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_sparse_sce_is_the_stepped_path(ctx_kw, dtype):
    rng = np.random.default_rng(len(ctx_kw) * 5 + len(dtype))
    for shape in [(32, 10), (5, 3), (1, 1), (7, 16)]:
        for kind in ("hostile", "wide", "plain", "plain"):
            x = _logits(rng, shape, kind, dtype)
            lab = rng.integers(0, shape[1], shape[0])
            ctx = OpContext(dtype=dtype, **ctx_kw)
            loss, back = grad_ops.sparse_softmax_cross_entropy(x, lab, ctx=ctx)
            onehot = np.zeros(shape, np.float64)
            onehot[np.arange(shape[0]), lab] = 1.0
            ref = OpContext(dtype=dtype, **ctx_kw)
            wl, wb = _sce_steps(ref, x, onehot)
            _same(loss, wl)
            _same(back, wb)
            assert ctx.status == ref.status, (kind, shape, ctx.status, ref.status)


@pytest.mark.parametrize("ctx_kw", SCE_CONTEXTS, ids=_IDS)
def test_dense_sce_hostile_labels(ctx_kw):
    """Dense labels with Inf, NaN, 0 and huge values: where only the labels are not finite, only the steps that read
    them (back, the loss's product) see it."""
    rng = np.random.default_rng(11 + len(ctx_kw))
    for shape in [(32, 10), (4, 5), (6,)]:
        for _ in range(6):
            x = _logits(rng, shape if len(shape) == 2 else (1,) + shape, "plain", "float32").reshape(shape)
            lab = _hostile(rng, shape) if rng.random() < 0.7 else _finite(rng, shape, lo=-2, hi=120)
            ctx = OpContext(dtype="float32", **ctx_kw)
            loss, back = grad_ops.softmax_cross_entropy(x, lab, ctx=ctx)
            ref = OpContext(dtype="float32", **ctx_kw)
            wl, wb = _sce_steps(ref, x, lab)
            _same(loss, wl)
            _same(back, wb)
            assert ctx.status == ref.status


def test_sparse_sce_bad_label_message():
    from ascend_emu.errors import AscendEmuError
    with pytest.raises(AscendEmuError, match="label 10 is outside"):
        grad_ops.sparse_softmax_cross_entropy(np.zeros((2, 10), F), np.array([1, 10]), ctx=OpContext())
    with pytest.raises(AscendEmuError, match="label -1 is outside"):
        grad_ops.sparse_softmax_cross_entropy(np.zeros((2, 10), F), np.array([-1, 10]), ctx=OpContext())
    loss, back = grad_ops.sparse_softmax_cross_entropy(np.zeros((0, 10), F), np.zeros(0, np.int64), ctx=OpContext())
    assert loss.shape == (0,) and back.shape == (0, 10)
    with pytest.raises(ValueError, match="zero-size"):   # no label to check: numpy's max of no classes, as before
        grad_ops.sparse_softmax_cross_entropy(np.zeros((0, 0), F), np.zeros(0, np.int64), ctx=OpContext())


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_sce_unstepped_taken_and_declined(mode, monkeypatch):
    """Finite logits: no step32 at all (the unstepped path); under saturation a row of -Inf (s = NaN) goes back to
    the stepped path, under inf_nan it stays (and records 0x20)."""
    from ascend_emu.ops import _util
    calls = []
    real = _util.step32
    monkeypatch.setattr(_util, "step32", lambda ctx, v: calls.append(1) or real(ctx, v))
    x = np.linspace(-3, 3, 40, dtype=F).reshape(4, 10)
    lab = np.array([0, 3, 9, 5])
    ctx = OpContext(dtype="float32", overflow_mode=mode)
    grad_ops.sparse_softmax_cross_entropy(x, lab, ctx=ctx)
    assert ctx.status == 0 and len(calls) == 2   # finish's two (float32 output)
    x[1] = -np.inf
    ctx = OpContext(dtype="float32", overflow_mode=mode)
    grad_ops.sparse_softmax_cross_entropy(x, lab, ctx=ctx)
    assert ctx.status == 0x20 and (len(calls) > 4) == (mode == "saturation")


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_sce_multicore_launch(mode):
    """A multi-core launch (a row of 2,000 split in 7 sums, their order drawn from the launch's generator; 2 chunks
    would commute): under saturation a non-finite value must not cost a first unstepped attempt (its sums would draw
    the stepped path's order), so the op is the stepped path on a fresh launch, bits and status, finite rows and rows
    with Inf / NaN / overflow."""
    from ascend_emu.numerics.multicore import Launch
    rng = np.random.default_rng(23)
    seen = 0
    for i in range(16):
        x = _hostile(rng, (1, 2000)) if i % 4 == 3 else _finite(rng, (1, 2000), lo=-3, hi=4)
        lab = _finite(rng, (1, 2000), lo=-2, hi=2)
        if i % 4 in (1, 2):   # finite logits, so an order-sensitive row sum, and one label that makes back Inf
            lab[0, 7] = F(np.inf) if i % 4 == 1 else F(3e38)
        kw = dict(dtype="float32", overflow_mode=mode)
        ctx = OpContext(multicore=Launch("reduce", "sce", 7, i, 32, 48), **kw)
        loss, back = grad_ops.softmax_cross_entropy(x, lab, ctx=ctx)
        ref = OpContext(multicore=Launch("reduce", "sce", 7, i, 32, 48), **kw)
        wl, wb = _sce_steps(ref, x, lab)
        _same(loss, wl)
        _same(back, wb)
        assert ctx.status == ref.status
        seen += ctx.status != 0
    assert seen   # some launch saw an Inf / NaN


@pytest.mark.parametrize("ctx_kw", SCE_CONTEXTS, ids=_IDS)
def test_dense_sce_overflowing_steps(ctx_kw):
    """Labels that make lab * (s - lg) overflow (t Inf while its row's sum may saturate) and rows of finite t whose
    sum overflows (loss Inf): each step's own Inf, the unstepped path must see it as the stepped path does."""
    x = np.array([[0.0, -3.0, -7.5, 1.0], [2.0, -1.0, 0.5, -9.0], [0.0, 0.0, 0.0, 0.0], [-4.0, 4.0, 0.0, 1.0]], F)
    for big in (1e38, 3e38, -3e38, 2e37, 1.7e38):
        for row in range(4):
            lab = np.zeros_like(x)
            lab[row] = big
            lab[(row + 1) % 4, :2] = (big, -big)
            ctx = OpContext(dtype="float32", **ctx_kw)
            loss, back = grad_ops.softmax_cross_entropy(x, lab, ctx=ctx)
            ref = OpContext(dtype="float32", **ctx_kw)
            wl, wb = _sce_steps(ref, x, lab)
            _same(loss, wl)
            _same(back, wb)
            assert ctx.status == ref.status


@pytest.mark.parametrize("ctx_kw", SCE_CONTEXTS + [{"op_model": "exact"}, {"op_model": "exact", "subnormals": "flush"}],
                         ids=_IDS)
def test_sparse_sce_is_the_dense_op_on_float64_one_hot(ctx_kw):
    """The sparse op's float32 one-hot (an index pair for (batch, classes), put_along_axis otherwise) gives what the
    dense op gives on main's float64 one-hot, exact op model included; 2-D and 3-D logits."""
    rng = np.random.default_rng(3 + len(ctx_kw))
    for shape in [(32, 10), (3, 4, 6), (1, 1), (2, 1, 5)]:
        for kind in ("hostile", "plain"):
            if len(shape) == 2:
                x = _logits(rng, shape, kind, "float16")
            else:
                with np.errstate(over="ignore"):   # fp16 overflow: Inf logits wanted
                    x = (_hostile(rng, shape) if kind == "hostile" else _finite(rng, shape)).astype(np.float16)
            lab = rng.integers(0, shape[-1], shape[:-1])
            onehot = np.zeros(shape, np.float64)
            np.put_along_axis(onehot, lab[..., None], 1.0, axis=-1)
            ctx = OpContext(dtype="float16", **ctx_kw)
            got = grad_ops.sparse_softmax_cross_entropy(x, lab, ctx=ctx)
            ref = OpContext(dtype="float16", **ctx_kw)
            want = grad_ops.softmax_cross_entropy(x, onehot, ctx=ref)
            for g, w in zip(got, want):
                _same(g, w)
            assert ctx.status == ref.status

"""The losses and log-domain ops that follow CANN's TBE kernels step by step, bit for bit.

Each oracle is the kernel's instruction list as read in canndev ops/built-in/tbe/impl/dynamic/ (the public
mirror dengguojie/vue-element-admin), written out in numpy float32: 16-bit inputs widened exactly, every
instruction one IEEE float32 operation, exp and log correctly rounded float32 (float64 rounded once: impl_mode
high_precision), reduce_max exact, reduce_sum a float32 running sum in row order (the order NUMERICS.md section 2
fixes for the registry's ReduceSum), the outputs cast to the input dtype nearest-even.
"""
import numpy as np
import pytest

from ascend_emu.ops import OpContext, run_op

F32 = np.float32


def _exp(v):
    with np.errstate(all="ignore"):
        return np.exp(v.astype(np.float64)).astype(F32)


def _log(v):
    with np.errstate(all="ignore"):
        return np.log(v.astype(np.float64)).astype(F32)


def _row_sum(v):
    acc = v[..., 0].copy()
    for j in range(1, v.shape[-1]):
        acc = (acc + v[..., j]).astype(F32)
    return acc


def _sce_oracle(x, labels):
    """softmax_cross_entropy_with_logits_compute: reduce_max, vsub, vexp, reduce_sum, vdiv, vlog, vsub, vmul,
    vmuls -1, reduce_sum; backprop = vsub(div, labels)."""
    x, lab = x.astype(F32), labels.astype(F32)
    with np.errstate(all="ignore"):
        sub = x - x.max(axis=-1, keepdims=True)
        e = _exp(sub)
        total = _row_sum(e)[..., None]
        div = e / total
        lg = _log(total)
        muls = (lab * (sub - lg)) * F32(-1)
        return _row_sum(muls), div - lab


def _rows(r, n, c, dtype, scale):
    return (r.standard_normal((n, c)) * scale).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_softmax_cross_entropy_is_the_kernels_steps(dtype):
    """Random logits of three scales (softmax peaked or flat), soft and one-hot labels, row lengths 1 to 1000."""
    r = np.random.default_rng(11)
    for c in (1, 7, 64, 1000):
        for scale in (0.5, 4.0, 30.0):
            x = _rows(r, 16, c, dtype, scale)
            soft = r.dirichlet(np.ones(c), 16).astype(dtype)
            onehot = np.eye(c, dtype=dtype)[r.integers(0, c, 16)]
            for lab in (soft, onehot):
                ctx = OpContext(dtype=np.dtype(dtype).name)
                loss, back = run_op("SoftmaxCrossEntropyWithLogits", x, lab, ctx=ctx)
                rl, rb = _sce_oracle(x, lab)
                assert loss.dtype == back.dtype == dtype and loss.shape == (16,)
                np.testing.assert_array_equal(loss, rl.astype(dtype))
                np.testing.assert_array_equal(back, rb.astype(dtype))
                assert ctx.status == 0


def test_sparse_softmax_cross_entropy_is_the_one_hot_kernel():
    """SparseSoftmaxCrossEntropyWithLogits = OneHotD + SoftmaxCrossEntropyWithLogits (GE's fusion pass): the same
    steps on the one-hot labels."""
    r = np.random.default_rng(12)
    x = _rows(r, 32, 10, np.float16, 3.0)
    t = r.integers(0, 10, 32).astype(np.int32)
    loss, back = run_op("SparseSoftmaxCrossEntropyWithLogits", x, t, ctx=OpContext(dtype="float16"))
    rl, rb = _sce_oracle(x, np.eye(10, dtype=np.float16)[t])
    np.testing.assert_array_equal(loss, rl.astype(np.float16))
    np.testing.assert_array_equal(back, rb.astype(np.float16))


def test_softmax_cross_entropy_steps_differ_from_float64():
    """The kernel's float32 steps against the float64 model (op_model="exact"): some float32 outputs differ."""
    r = np.random.default_rng(13)
    x, lab = _rows(r, 64, 100, F32, 4.0), r.dirichlet(np.ones(100), 64).astype(F32)
    k = run_op("SoftmaxCrossEntropyWithLogits", x, lab, ctx=OpContext(dtype="float32"))
    e = run_op("SoftmaxCrossEntropyWithLogits", x, lab, ctx=OpContext(dtype="float32", op_model="exact"))
    assert (k[0] != e[0]).any() and (k[1] != e[1]).any()
    np.testing.assert_allclose(k[0], e[0], rtol=1e-5)


def _log_softmax_oracle(x, model):
    """log_softmax_v2_compute: reduce_max, vsub in the input dtype (one rounding of the exact difference), cast to
    float32, vexp, reduce_sum, vlog, vsub; the Ascend C kernel subtracts in float32."""
    m = x.max(axis=-1, keepdims=True)
    if model == "ascendc":
        d = (x.astype(F32) - m.astype(F32)).astype(F32)
    else:
        d = (x.astype(np.float64) - m.astype(np.float64)).astype(x.dtype).astype(F32)
    with np.errstate(all="ignore"):
        return d - _log(_row_sum(_exp(d))[..., None])


@pytest.mark.parametrize("model", ["tbe_v220", "ascendc"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_log_softmax_is_the_kernels_steps(dtype, model):
    r = np.random.default_rng(21)
    for c in (1, 5, 128, 1000):
        for scale in (0.5, 4.0, 30.0):
            x = _rows(r, 8, c, dtype, scale)
            ctx = OpContext(dtype=np.dtype(dtype).name, op_model=model)
            (ours,) = run_op("LogSoftmax", x, ctx=ctx)
            ref = _log_softmax_oracle(x, model).astype(dtype)
            assert ours.dtype == dtype
            np.testing.assert_array_equal(ours, ref)
            assert ctx.status == 0


def test_log_softmax_fp16_difference_is_rounded_to_fp16_first():
    """TBE subtracts the maximum in fp16, so x - max loses the bits below the maximum's ulp before the exp; the
    Ascend C kernel subtracts in float32. On logits of scale 4 (100 classes) that changes a fifth of the fp16
    outputs; the Ascend C kernel's differ from the float64 model almost nowhere."""
    x = _rows(np.random.default_rng(5), 256, 100, np.float16, 4.0)
    tbe, ac, exact = (run_op("LogSoftmax", x, ctx=OpContext(dtype="float16", op_model=m))[0]
                      for m in ("tbe_v220", "ascendc", "exact"))
    assert (tbe != ac).mean() > 0.1 and (ac != exact).mean() < 0.01


def _softplus_steps(x):
    """softplus_compute (and softplus_dag.h): vmaxs 0, vmins 0, vmuls -1, vexp, vadds 1, vlog, vadd; vexp, vadds 1,
    vlog; vadd; vadds -ln2 (the float32 constant)."""
    x = x.astype(F32)
    with np.errstate(all="ignore"):
        p = np.where(np.isnan(x), x, np.maximum(x, F32(0)))
        n = np.where(np.isnan(x), x, np.minimum(x, F32(0)))
        a = p * F32(-1)
        b = _exp(a)
        c = b + F32(1)
        d = _log(c)
        pos = d + p
        e = _exp(n)
        f = e + F32(1)
        neg = _log(f)
        s = pos + neg
        y = s + F32(-0.69314718055994530941723212145818)
    return [p, n, a, b, c, d, pos, e, f, neg, s, y]


@pytest.mark.parametrize("model", ["tbe_v220", "ascendc"])
def test_softplus_fp16_every_pattern(model):
    """Every fp16 pattern: bits (NaN matching NaN) and status against the kernel's steps, inf_nan."""
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    ctx = OpContext(dtype="float16", op_model=model)
    (ours,) = run_op("Softplus", x, ctx=ctx)
    steps = _softplus_steps(x)
    with np.errstate(all="ignore"):
        ref = steps[-1].astype(np.float16)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    np.testing.assert_array_equal(ours[~nan].view(np.uint16), ref[~nan].view(np.uint16))
    assert bool(ctx.status & 0x20) == any((~np.isfinite(s)).any() for s in steps + [ref])


def test_softplus_steps_differ_from_the_float64_model():
    """The kernel's steps against op_model="exact" (float64, one rounding): fp16 results that differ, counted."""
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    x = x[np.isfinite(x)]
    (k,) = run_op("Softplus", x, ctx=OpContext(dtype="float16"))
    (e,) = run_op("Softplus", x, ctx=OpContext(dtype="float16", op_model="exact"))
    assert (k.view(np.uint16) != e.view(np.uint16)).sum() > 100

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

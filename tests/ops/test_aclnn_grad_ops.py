"""The torch path's backward kernels (_SiluGrad, _LayerNormGradV3) bit for bit against oracles written from their
CANN sources (the TBE silu_grad.py compute, ops-nn's layer_norm_grad_v3_transpose.h), one step at a time."""
import ml_dtypes
import numpy as np
import pytest

from ascend_emu.ops import OpContext, run_op

f32 = np.float32


def _exp32(v):
    """float32 exp, correctly rounded (the vector unit's float32 exp is; NUMERICS.md section 2)."""
    with np.errstate(over="ignore"):
        return np.exp(v.astype(np.float64)).astype(f32)


def silu_grad_oracle(dy, x, dtype):
    """silu_grad_compute: widen; B = 1 / (exp(x * -1) + 1); dx = dy * (B * (1 + (1 - B) * x)); cast (RINT)."""
    d, v = dy.astype(f32), x.astype(f32)
    with np.errstate(all="ignore"):
        b = f32(1) / (_exp32(v * f32(-1)) + f32(1))
        r = d * (b * (f32(1) + (f32(1) - b) * v))
    return r if dtype == np.float32 else r.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_silu_grad_every_16bit_input(dtype):
    """Every fp16 / bf16 pattern of x (NaN matching NaN), with random gradients."""
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(dtype)
    dy = (np.random.default_rng(1).standard_normal(65536) * 2).astype(dtype)
    (got,) = run_op("_SiluGrad", dy, x, ctx=OpContext(dtype=np.dtype(dtype).name))
    want = silu_grad_oracle(dy, x, dtype)
    g, w = got.astype(f32), want.astype(f32)
    same = (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))
    assert same.all(), np.flatnonzero(~same)[:5]


def test_silu_grad_float32():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(4096) * 8).astype(f32)
    dy = rng.standard_normal(4096).astype(f32)
    (got,) = run_op("_SiluGrad", dy, x, ctx=OpContext(dtype="float32"))
    assert np.array_equal(got.view(np.uint32), silu_grad_oracle(dy, x, f32).view(np.uint32))


def halving_sum(row):
    """DoReduce: the rows past the largest power of two added onto the first ones, then halves added down."""
    v = [f32(a) for a in row]
    p = 1
    while p * 2 <= len(v):
        p *= 2
    for i in range(len(v) - p):
        v[i] = f32(v[i] + v[p + i])
    v = v[:p]
    while len(v) > 1:
        h = len(v) // 2
        v = [f32(v[i] + v[i + h]) for i in range(h)]
    return v[0]


def layer_norm_grad_oracle(dy, x, rstd, mean, gamma, dtype):
    """ProcessBasicBlock, one row at a time: xhat = (x - mean) rstd; g = dy gamma; pd_x = ((g - xhat (sum(g xhat)
    coff)) - sum(g) coff) rstd; pd_x cast CAST_ROUND for bf16, RINT for fp16; pd_gamma, pd_beta row sums."""
    rows, n = x.shape
    coff = f32(1.0 / n)
    gam = gamma.astype(f32)
    out = np.empty((rows, n), f32)
    for r in range(rows):
        xv, dv = x[r].astype(f32), dy[r].astype(f32)
        xhat = (xv - mean[r]) * rstd[r]
        g = dv * gam
        r3 = f32(halving_sum(g * xhat) * coff)
        o = g - xhat * r3
        r2 = f32(halving_sum(g) * coff)
        out[r] = (o - r2) * rstd[r]
    if dtype == ml_dtypes.bfloat16:
        # CAST_ROUND: nearest, ties away from zero (a tie of bf16 is a float32 with exactly 0x8000 below)
        bits = out.view(np.uint32)
        up = (bits & 0xFFFF) >= 0x8000
        pd_x = ((bits >> 16) + up).astype(np.uint16).view(ml_dtypes.bfloat16)
    else:
        pd_x = out.astype(dtype)
    xhat_all = (x.astype(f32) - mean[:, None]) * rstd[:, None]
    pd_gamma = np.zeros(n, f32)
    pd_beta = np.zeros(n, f32)
    for r in range(rows):                        # the registry's float32 ReduceSum: sequential over the rows
        pd_gamma = pd_gamma + xhat_all[r] * dy[r].astype(f32)
        pd_beta = pd_beta + dy[r].astype(f32)
    return pd_x, pd_gamma, pd_beta


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
@pytest.mark.parametrize("n", [64, 100])
def test_layer_norm_grad_v3_steps(dtype, n):
    rng = np.random.default_rng(n)
    rows = 6
    x = (rng.standard_normal((rows, n)) * 3 + 1).astype(dtype)
    dy = rng.standard_normal((rows, n)).astype(dtype)
    gamma = rng.standard_normal(n).astype(dtype)
    xf = x.astype(np.float64)
    mean = xf.mean(-1).astype(f32)
    rstd = (1 / np.sqrt(xf.var(-1) + 1e-5)).astype(f32)
    got = run_op("_LayerNormGradV3", dy, x, rstd, mean, gamma, ctx=OpContext(dtype=np.dtype(dtype).name))
    want = layer_norm_grad_oracle(dy, x, rstd, mean, gamma, dtype)
    assert got[0].dtype == np.dtype(dtype) and got[1].dtype == got[2].dtype == f32
    bits = np.uint32 if dtype == np.float32 else np.uint16
    assert np.array_equal(got[0].view(bits), want[0].view(bits))
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])


def test_layer_norm_grad_v3_rounds_bf16_ties_away():
    """dy = (1, 1, -1, -1), x = (1, -1, 1, -1), mean 0, gamma 1: both row sums are 0, so pd_x = dy * rstd; with
    rstd = 1 + 2^-8 that is a bf16 tie between 1 and 1 + 2^-7, which CAST_ROUND takes away from zero."""
    x = np.array([[1, -1, 1, -1]], ml_dtypes.bfloat16)
    dy = np.array([[1, 1, -1, -1]], ml_dtypes.bfloat16)
    gamma = np.ones(4, ml_dtypes.bfloat16)
    rstd, mean = np.array([1 + 2.0 ** -8], f32), np.array([0], f32)
    pd_x, _, _ = run_op("_LayerNormGradV3", dy, x, rstd, mean, gamma, ctx=OpContext(dtype="bfloat16"))
    t = f32(1 + 2.0 ** -7)                                 # nearest even would give 1
    assert np.array_equal(pd_x.astype(f32), np.array([[t, t, -t, -t]], f32))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_log_softmax_grad_steps(dtype):
    """log_softmax_grad_compute: widen; dy - exp(y) * sum(dy) in float32; one rounding (RINT)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 37)) * 3
    y = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(dtype)
    dy = rng.standard_normal((5, 37)).astype(dtype)
    (got,) = run_op("_LogSoftmaxGrad", dy, y, ctx=OpContext(dtype=np.dtype(dtype).name))
    d = dy.astype(f32)
    s = np.zeros(5, f32)
    for j in range(37):                                  # the float32 ReduceSum, sequential
        s = s + d[:, j]
    want = (d - _exp32(y.astype(f32)) * s[:, None]).astype(dtype)
    bits = np.uint32 if dtype == np.float32 else np.uint16
    assert np.array_equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_grad_steps(reduction):
    """NLLLossGrad's normal tiling: ((weight[t] * y_grad) * -1) / total_weight at [i, t], zero elsewhere; a target
    outside the classes leaves its row zero."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 10)).astype(f32)
    t = np.array([3, 0, 9, 12, 5, 5], np.int64)          # 12: outside [0, 10)
    w = rng.uniform(0.5, 2, 10).astype(f32)
    g = rng.standard_normal(6 if reduction == "none" else 1).astype(f32)
    tw = np.array([w[[3, 0, 9, 5, 5]].sum()], f32)
    (got,) = run_op("_NLLLossGrad", x, g, t, w, tw, ctx=OpContext(dtype="float32"), reduction=reduction)
    want = np.zeros((6, 10), f32)
    for i in range(6):
        if 0 <= t[i] < 10:
            v = f32(f32(w[t[i]] * g[i if reduction == "none" else 0]) * f32(-1))
            want[i, t[i]] = f32(v / tw[0]) if reduction == "mean" else v
    assert np.array_equal(got, want)

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


def _round_away16(x):
    """float64 values rounded to fp16 with ties away from zero (CAST_ROUND), normal and subnormal."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    _, e = np.frexp(a)
    q = np.where(a < 2.0 ** -14, 2.0 ** -24, np.ldexp(1.0, e - 11))
    return (np.sign(x) * np.floor(a / q + 0.5) * q).astype(np.float16)


def fa_grad_oracle(q, k, v, do, o, m, l, mask, scale, block=128, round_p=True):
    """SubGrapA / SubGrapB / post of the arch22 kernel with exact products: P = exp(S scale - max) / sum (float32),
    P16 = CAST_ROUND(P); dS = (dO V^T - sum(dO O)) P, dS16 = CAST_ROUND(dS); block sums of the products in float32;
    dQ, dK times scale; CAST_ROUND."""
    f64 = np.float64
    s = ((q.astype(f64) @ np.swapaxes(k.astype(f64), -1, -2)).astype(f32) * f32(scale)).astype(f32)
    s = np.where(mask, f32(-np.finfo(f32).max), s).astype(f32)
    p = (_exp32((s - m[..., None]).astype(f32)) / l[..., None]).astype(f32)
    p16 = _round_away16(p) if round_p else p
    dp = (do.astype(f64) @ np.swapaxes(v.astype(f64), -1, -2)).astype(f32)
    dsum = np.zeros(q.shape[:-1], f32)
    for j in range(q.shape[-1]):
        dsum = (dsum + do[..., j].astype(f32) * o[..., j].astype(f32)).astype(f32)
    ds16 = _round_away16(((dp - dsum[..., None]) * p).astype(f32))
    dq = np.zeros(q.shape, f32)
    for j in range(0, k.shape[-2], block):
        dq = (dq + (ds16[..., j:j + block].astype(f64) @ k[..., j:j + block, :].astype(f64)).astype(f32)).astype(f32)
    dk = np.zeros(k.shape, f32)
    dv = np.zeros(v.shape, f32)
    for i in range(0, q.shape[-2], block):
        t = np.swapaxes(ds16[..., i:i + block, :], -1, -2).astype(f64)
        dk = (dk + (t @ q[..., i:i + block, :].astype(f64)).astype(f32)).astype(f32)
        t = np.swapaxes(p16[..., i:i + block, :], -1, -2).astype(f64)
        dv = (dv + (t @ do[..., i:i + block, :].astype(f64)).astype(f32)).astype(f32)
    return tuple(_round_away16(g) for g in ((dq * f32(scale)).astype(f32), (dk * f32(scale)).astype(f32), dv))


def test_flash_attention_score_grad_fp16_against_oracle():
    rng = np.random.default_rng(9)
    s1 = s2 = 160
    q, k, v, do = (rng.standard_normal((1, 2, s1, 16)).astype(np.float16) for _ in range(4))
    mask = np.broadcast_to(np.triu(np.ones((s1, s2), bool), 1), (1, 2, s1, s2))
    ctx = OpContext(dtype="float16")
    o, _, m, l = run_op("_FlashAttentionScore", q, k, v, mask, ctx=ctx, scale_value=0.25, has_mask=True,
                        with_stats=True)
    got = run_op("_FlashAttentionScoreGrad", q, k, v, do, o, m, l, mask, ctx=OpContext(dtype="float16"),
                 scale_value=0.25, has_mask=True)
    want = fa_grad_oracle(q, k, v, do, o, m, l, mask, 0.25)
    for g, w in zip(got, want):
        assert g.dtype == np.float16 and g.shape == w.shape
        # the oracle's products are exact, the cube's float32: a one-bit difference can move a P or dS across an
        # fp16 rounding boundary; the rest are the same bits
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
        assert np.mean(g == w) > 0.995 and diff.max() <= 2.0 ** -9 * np.abs(w).max(), (np.mean(g == w), diff.max())
    # P rounded to fp16 before dV = P^T dO: without that rounding dV parts from the kernel's far more often
    unrounded = fa_grad_oracle(q, k, v, do, o, m, l, mask, 0.25, round_p=False)[2]
    assert np.mean(got[2] == unrounded) < 0.9


def gelu_grad_oracle(dy, x, dtype):
    """gelu_grad_compute transcribed: float32 steps, the kernel's constants, one RINT cast."""
    d, v = dy.astype(f32), x.astype(f32)
    cs, sq, c4, c5 = f32(0.044715), f32(0.7978846), f32(0.0535161122), f32(0.3989422804)
    with np.errstate(all="ignore"):
        u = (v * v * v * cs + v) * sq
        a = np.abs(u)
        e = _exp32(a * f32(-2))
        t = (u - e * u) / ((e + f32(1)) * (a + f32(2.0 ** -126)))
        g = (t + f32(1)) * f32(0.5) + (v * v * c4 + c5) * ((t * t * f32(-1) + f32(1)) * v)
        r = d * g + f32(0) * f32(0)
    return r if dtype == np.float32 else r.astype(dtype)


def test_gelu_grad_every_fp16_input():
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    dy = np.random.default_rng(3).standard_normal(65536).astype(np.float16)
    (got,) = run_op("_GeluGrad", dy, x, np.zeros_like(x), ctx=OpContext(dtype="float16"))
    want = gelu_grad_oracle(dy, x, np.float16)
    g, w = got.astype(f32), want.astype(f32)
    same = (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))
    assert same.all(), np.flatnonzero(~same)[:5]
    # the tanh form's derivative, not the erf form's: they part (by up to ~2e-4 relative) on most inputs
    fin = np.isfinite(x) & (np.abs(x.astype(f32)) < 4)
    xe = x[fin].astype(np.float64)
    import math
    erf_d = 0.5 * (1 + np.vectorize(math.erf)(xe / math.sqrt(2))) + xe * np.exp(-xe * xe / 2) / math.sqrt(2 * math.pi)
    assert np.mean(g[fin] != (dy[fin].astype(np.float64) * erf_d).astype(np.float16).astype(f32)) > 0.05

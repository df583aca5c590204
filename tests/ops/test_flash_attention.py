"""_FlashAttentionScore against an oracle written from ASCEND-FACTS.md 13.5 (ops-transformer's kernel steps)."""
import numpy as np
import pytest

from ascend_emu.ops import OpContext, run_op


def round_away16(x):
    """Oracle: float64 values rounded to float16 with ties away from zero (CAST_ROUND), normal and subnormal."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    m, e = np.frexp(a)
    q = np.where(a < 2.0 ** -14, 2.0 ** -24, np.ldexp(1.0, e - 11))     # the fp16 quantum of each value
    return (np.sign(x) * np.floor(a / q + 0.5) * q).astype(np.float16)


def oracle(q, k, v, mask, scale, block):
    """S = QK^T (exact products, float32 result), * scale in float32, masked -> -FLT_MAX, online softmax per S2
    block in float32, P rounded ties-away to fp16, O += P V (float32), O / l, rounded ties-away."""
    f32 = np.float32
    q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
    lead = q.shape[:-1]
    m = np.full(lead + (1,), -np.inf, f32)
    lsum = np.zeros(lead + (1,), f32)
    o = np.zeros(lead + (v.shape[-1],), f32)
    for j in range(0, k.shape[-2], block):
        s = (q64 @ np.swapaxes(k64[..., j:j + block, :], -1, -2)).astype(f32) * f32(scale)
        s = np.where(mask[..., j:j + block], f32(-np.finfo(f32).max), s).astype(f32)
        mn = np.maximum(m, s.max(-1, keepdims=True))
        p = np.exp((s - mn).astype(np.float64)).astype(f32)
        alpha = np.exp((m - mn).astype(np.float64)).astype(f32)
        lsum = (lsum * alpha + p.astype(np.float64).sum(-1, keepdims=True).astype(f32)).astype(f32)
        pv = (round_away16(p).astype(np.float64) @ v64[..., j:j + block, :]).astype(f32)
        o = (o * alpha + pv).astype(f32)
        m = mn
    return round_away16((o / lsum).astype(np.float64))


@pytest.mark.parametrize("s", [40, 200])
def test_flash_attention_score_fp16_against_oracle(s):
    rng = np.random.default_rng(s)
    q, k, v = (rng.standard_normal((1, 2, s, 16)).astype(np.float16) for _ in range(3))
    mask = np.broadcast_to(np.triu(np.ones((s, s), bool), 1), (1, 2, s, s))
    scale = 0.25
    o, lse = run_op("_FlashAttentionScore", q, k, v, mask, ctx=OpContext(dtype="float16"), scale_value=scale,
                    has_mask=True)
    want = oracle(q, k, v, mask, scale, 128)
    assert o.dtype == np.float16 and lse.dtype == np.float32 and lse.shape == (1, 2, s)
    # the oracle sums exactly, the cube in float32: where a score or exp differs in its last float32 bit and P
    # sits on an fp16 rounding boundary, P rounds one fp16 unit (<= 2^-11 for P < 1) apart, moving O by at most
    # that times |v| / l (l >= 1); elsewhere O differs by at most one fp16 unit
    diff = np.abs(o.astype(np.float64) - want.astype(np.float64))
    unit = np.maximum(np.abs(want.astype(np.float64)), 2.0 ** -14) * 2.0 ** -10
    assert np.all(diff <= np.maximum(unit, 2.0 ** -11 * np.abs(v).max()))
    assert np.mean(diff > unit) < 0.001 and np.mean(o == want) > 0.99
    # the float32 softmax itself: rows sum to one before the rounding of O
    full = (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)) * scale
    full = np.where(mask, -np.inf, full)
    ref_lse = np.log(np.exp(full - full.max(-1, keepdims=True)).sum(-1)) + full.max(-1)
    assert np.abs(lse - ref_lse).max() < 1e-5

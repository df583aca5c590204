"""The elementwise gradients that follow CANN's kernels step by step (ops/activation_grad_ops.py), bit for bit.

The oracle of each op is its kernel's instruction list as read in the source (canndev
ops/built-in/tbe/impl/dynamic/*_grad.py for the 910 and 910B, hicann/ops-nn arch35 for the 950's
op_model="ascendc"), written out here as numpy float32 operations: 16-bit inputs widened exactly, every
instruction one IEEE float32 operation, exp the correctly rounded float32 exp (float64 exp rounded once: the
default impl_mode high_precision), the result cast to fp16 nearest-even; status 0x20 when any instruction or the
result is Inf or NaN. Every fp16 pattern is tried as the op's first input against fixed second inputs, and as
the second against random first inputs.
"""
import zlib

import numpy as np
import pytest

from ascend_emu.ops import OpContext, run_op

F32 = np.float32
EVERY16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
RANDOM16 = np.random.default_rng(77).integers(0, 65536, 65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
# second inputs: ordinary, negative, large, tiny (subnormal), zero, the largest fp16
SECONDS = [0.3, -7.5, 1000.0, 6e-8, 0.0, -65504.0]


def _exp32(v):
    with np.errstate(all="ignore"):
        return np.exp(v.astype(np.float64)).astype(F32)


# op, op_model -> (first input, second input) as float32 -> the kernel's instruction results, in order
KERNELS = {
    # sigmoid_grad.py: vmul(y, y), vsub(y, .), vmul(., dy)
    ("SigmoidGrad", "tbe_v220"): lambda y, dy: [y * y, y - y * y, (y - y * y) * dy],
    # sigmoid_grad_f16.h: Sub(1, y), Mul(dy, .), Mul(., y)
    ("SigmoidGrad", "ascendc"): lambda y, dy: [F32(1) - y, dy * (F32(1) - y), (dy * (F32(1) - y)) * y],
    # rsqrt_grad.py: vmul(y, y), vmul(., y), vmul(., dy), vmuls(., -0.5)
    ("RsqrtGrad", "tbe_v220"): lambda y, dy: [y * y, (y * y) * y, ((y * y) * y) * dy,
                                              (((y * y) * y) * dy) * F32(-0.5)],
    # reciprocal_grad.py / inv_grad.py: vmuls(y, -1), vmul(., y), vmul(., dy)
    ("ReciprocalGrad", "tbe_v220"): lambda y, dy: [y * F32(-1), (y * F32(-1)) * y, ((y * F32(-1)) * y) * dy],
    ("InvGrad", "tbe_v220"): lambda y, dy: [y * F32(-1), (y * F32(-1)) * y, ((y * F32(-1)) * y) * dy],
    # softplus_grad.py (inputs dy, x): vexp(x), vadds(., 1), vdiv(exp, .), vmul(dy, .)
    ("SoftplusGrad", "tbe_v220"): lambda dy, x: [_exp32(x), _exp32(x) + F32(1), _exp32(x) / (_exp32(x) + F32(1)),
                                                 dy * (_exp32(x) / (_exp32(x) + F32(1)))],
    # softplus_grad_dag.h: Muls(x, -1), Exp, Adds(., 1), Reciprocal, Mul(dy, .)
    ("SoftplusGrad", "ascendc"): lambda dy, x: [x * F32(-1), _exp32(x * F32(-1)), _exp32(-x) + F32(1),
                                                F32(1) / (_exp32(-x) + F32(1)),
                                                dy * (F32(1) / (_exp32(-x) + F32(1)))],
}


def _oracle(op, model, a, b):
    with np.errstate(all="ignore"):
        steps = KERNELS[(op, model)](a.astype(F32), b.astype(F32))
        out = steps[-1].astype(np.float16)
    bad = ~np.isfinite(out)
    for s in steps:
        bad |= ~np.isfinite(s)
    return out, bool(bad.any())


def _same(ours, ref):
    ours, ref = ours.view(np.uint16), ref.view(np.uint16)
    nan_o, nan_r = (ours & 0x7FFF) > 0x7C00, (ref & 0x7FFF) > 0x7C00
    np.testing.assert_array_equal(nan_o, nan_r)
    np.testing.assert_array_equal(ours[~nan_o], ref[~nan_r])


@pytest.mark.parametrize("op,model", sorted(KERNELS))
def test_grad_kernel_fp16_every_pattern(op, model):
    """Every fp16 first input against six second inputs, and every fp16 second input against random first
    inputs: bits and status as the kernel's float32 steps give them (inf_nan)."""
    pairs = [(EVERY16, np.full(EVERY16.shape, np.float16(v))) for v in SECONDS] + [(RANDOM16, EVERY16)]
    for a, b in pairs:
        ctx = OpContext(dtype="float16", op_model=model)
        (ours,) = run_op(op, a, b, ctx=ctx)
        ref, bad = _oracle(op, model, a, b)
        assert ours.dtype == np.float16
        _same(ours, ref)
        assert bool(ctx.status & 0x20) == bad, (op, model)


@pytest.mark.parametrize("op,model", sorted(KERNELS))
def test_grad_kernel_float32_random(op, model):
    """float32 inputs over a wide range of magnitudes (products overflow and underflow): the kernel's steps,
    bit for bit, and the status (inf_nan)."""
    r = np.random.default_rng(zlib.crc32((op + model).encode()))
    a = (r.standard_normal(8192) * np.exp2(r.integers(-70, 70, 8192))).astype(F32)
    b = (r.standard_normal(8192) * np.exp2(r.integers(-70, 70, 8192))).astype(F32)
    if op == "SigmoidGrad":
        a = r.uniform(0, 1, 8192).astype(F32)
    ctx = OpContext(dtype="float32", op_model=model)
    (ours,) = run_op(op, a, b, ctx=ctx)
    with np.errstate(all="ignore"):
        steps = KERNELS[(op, model)](a, b)
    np.testing.assert_array_equal(ours, steps[-1])
    assert bool(ctx.status & 0x20) == any((~np.isfinite(s)).any() for s in steps)


def test_grad_kernels_differ_from_the_old_orders():
    """The kernel orders change bits against the orders modelled before (TF's): float32 inputs of one binade."""
    r = np.random.default_rng(3)
    y, dy = r.uniform(0.05, 1, 4096).astype(F32), r.uniform(-2, 2, 4096).astype(F32)
    with np.errstate(all="ignore"):
        old = {"RsqrtGrad": (F32(-0.5) * (dy * y)) * (y * y), "ReciprocalGrad": ((-dy) * y) * y,
               "SigmoidGrad": (dy * (F32(1) - y)) * y, "SoftplusGrad": dy / (np.exp(-y) + F32(1))}
    for op, o in old.items():
        args = (dy, y) if op == "SoftplusGrad" else (y, dy)
        (ours,) = run_op(op, *args, ctx=OpContext(dtype="float32"))
        assert (ours != o).sum() > 0, op


def test_softplus_grad_exp_overflow_is_nan_or_saturates():
    """fp16 x = 100: TBE's e^x overflows float32, e / (e + 1) = Inf / Inf = NaN (status set) under inf_nan; under
    saturation e = FLT_MAX, e + 1 = FLT_MAX, the quotient 1, so dx = dy (status set). The 950's form gives dy."""
    x, dy = np.array([100.0], np.float16), np.array([0.25], np.float16)
    inf = OpContext(dtype="float16", overflow_mode="inf_nan")
    (a,) = run_op("SoftplusGrad", dy, x, ctx=inf)
    assert np.isnan(a[0]) and inf.status & 0x20
    sat = OpContext(dtype="float16", overflow_mode="saturation")
    (b,) = run_op("SoftplusGrad", dy, x, ctx=sat)
    assert b[0] == np.float16(0.25) and sat.status & 0x20
    ac = OpContext(dtype="float16", op_model="ascendc")
    (c,) = run_op("SoftplusGrad", dy, x, ctx=ac)
    assert c[0] == np.float16(0.25) and ac.status == 0


def test_rsqrt_grad_float32_saturates_each_step():
    """float32 y = 1e13, dy = 1e-3: y^3 overflows; under saturation the kernel's next vmul reads FLT_MAX,
    so dx = fl(fl(FLT_MAX * 1e-3) * -0.5), finite, status set; under inf_nan -Inf."""
    y, dy = np.array([1e13], F32), np.array([1e-3], F32)
    sat = OpContext(dtype="float32", overflow_mode="saturation")
    (a,) = run_op("RsqrtGrad", y, dy, ctx=sat)
    assert a[0] == (np.finfo(F32).max * F32(1e-3)) * F32(-0.5) and sat.status & 0x20
    inf = OpContext(dtype="float32", overflow_mode="inf_nan")
    (b,) = run_op("RsqrtGrad", y, dy, ctx=inf)
    assert b[0] == -np.inf and inf.status & 0x20


def _neg_pos(x, zero):
    """vmin / vmax of x with zero (NaN propagates)."""
    nan = np.isnan(x)
    return np.where(nan | (x < zero), x, zero), np.where(nan | (x > zero), x, zero)


def _elu_steps(x):
    """elu.py: vmins(x, 0), vmaxs(x, 0), vexp, vadds -1, vaxpy(., max, alpha = 1)."""
    neg, pos = _neg_pos(x, F32(0))
    e = _exp32(neg)
    em1 = e + F32(-1)
    return [neg, pos, e, em1, em1 + pos]


def _selu_steps(x):
    """selu.py: z = vmuls(x, 0); vmin(x, z), vmax(x, z); vexp, vadds -1, vmuls 1.75809934085; vmuls 1.05070098736;
    vadd."""
    z = x * F32(0)
    neg, pos = _neg_pos(x, z)
    e = _exp32(neg)
    em1 = e + F32(-1)
    nm = em1 * F32(1.75809934085)
    pm = pos * F32(1.05070098736)
    return [z, neg, pos, e, em1, nm, pm, nm + pm]


@pytest.mark.parametrize("op,steps", [("Elu", _elu_steps), ("Selu", _selu_steps)])
def test_elu_selu_fp16_every_pattern(op, steps):
    """Every fp16 pattern: bits (NaN matching NaN) and status against the kernel's float32 steps (inf_nan)."""
    ctx = OpContext(dtype="float16")
    (ours,) = run_op(op, EVERY16, ctx=ctx)
    with np.errstate(all="ignore"):
        st = steps(EVERY16.astype(F32))
        ref = st[-1].astype(np.float16)
    _same(ours, ref)
    assert bool(ctx.status & 0x20) == any((~np.isfinite(s)).any() for s in st + [ref])


@pytest.mark.parametrize("op,steps", [("Elu", _elu_steps), ("Selu", _selu_steps)])
def test_elu_selu_float32_random(op, steps):
    x = (np.random.default_rng(9).standard_normal(8192) * np.exp2(np.random.default_rng(10).integers(-30, 8, 8192)))
    x = x.astype(F32)
    (ours,) = run_op(op, x, ctx=OpContext(dtype="float32"))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(ours, steps(x)[-1])


def test_elu_of_tiny_negatives_is_zero():
    """exp(x) - 1 with no expm1: for float32 x in (-2^-25, 0) exp(x) rounds to 1, so Elu gives +0 where expm1
    (op_model="exact") keeps x; over every negative fp16 x the kernel's steps change 291 outputs."""
    x = np.array([-1e-9, -3.0], F32)
    (k,) = run_op("Elu", x, ctx=OpContext(dtype="float32"))
    (e,) = run_op("Elu", x, ctx=OpContext(dtype="float32", op_model="exact"))
    assert k[0] == 0 and not np.signbit(k[0]) and e[0] == x[0]
    neg = EVERY16[np.isfinite(EVERY16) & (EVERY16 < 0)]
    (k,) = run_op("Elu", neg, ctx=OpContext(dtype="float16"))
    (e,) = run_op("Elu", neg, ctx=OpContext(dtype="float16", op_model="exact"))
    assert (k != e).sum() == 291


def _div_no_nan_steps(x, y, dtype):
    """div_no_nan.py in the input dtype, each instruction the exact result rounded once (float64 then the dtype:
    innocuous double rounding): vabs, vmins(help_min), vmuls(help_rec_one), vmuls(help_rec_sec) (twice for float32),
    vadds -1, vadd(y, .), vdiv(x, .), vmul(., idx)."""
    tiny, r1, r2 = (2.0 ** -24, 2.0 ** 12, 2.0 ** 12) if dtype == np.float16 else (2.0 ** -126, 2.0 ** 38, 2.0 ** 44)
    r = lambda v: np.asarray(v, np.float64).astype(dtype).astype(np.float64)   # noqa: E731
    x, y = x.astype(np.float64), y.astype(np.float64)
    with np.errstate(all="ignore"):
        a = r(np.abs(y))
        m = r(np.where(np.isnan(a) | (a < tiny), a, tiny))
        idx = r(r(m * r1) * r2)
        steps = [a, m, idx]
        if dtype == np.float32:
            idx = r(idx * r2)
            steps.append(idx)
        n = r(idx - 1)
        d = r(y + n)
        q = r(x / d)
        res = r(q * idx)
    return steps + [n, d, q, res]


def test_div_no_nan_fp16_every_pattern():
    """Every fp16 x against divisors 0, -0, the smallest subnormal, 1.5, -7, Inf, NaN, and every fp16 y against
    random x: bits (NaN matching NaN) and status. y == 0 gives x / -1 * 0: -0 for x > 0, NaN for an infinite x."""
    ys = [0.0, -0.0, 2.0 ** -24, 1.5, -7.0, np.inf, np.nan]
    pairs = [(EVERY16, np.full(EVERY16.shape, np.float16(v))) for v in ys] + [(RANDOM16, EVERY16)]
    for x, y in pairs:
        ctx = OpContext(dtype="float16")
        (ours,) = run_op("DivNoNan", x, y, ctx=ctx)
        steps = _div_no_nan_steps(x, y, np.float16)
        _same(ours, steps[-1].astype(np.float16))
        assert bool(ctx.status & 0x20) == any((~np.isfinite(s)).any() for s in steps)
    (z,) = run_op("DivNoNan", np.array([3.0, -3.0, np.inf], np.float16), np.zeros(3, np.float16))
    assert np.signbit(z[0]) and z[0] == 0 and not np.signbit(z[1]) and np.isnan(z[2])


def test_div_no_nan_float32_random_with_subnormal_divisors():
    """float32 x and y over a wide range, y subnormal in about a tenth of the elements (where the kernel's index is not
    0 or 1 and its quotient is scaled), bit for bit."""
    r = np.random.default_rng(31)
    x = (r.standard_normal(8192) * np.exp2(r.integers(-60, 60, 8192))).astype(F32)
    y = (r.standard_normal(8192) * np.exp2(r.integers(-149, 60, 8192))).astype(F32)
    y[::7] = 0
    ctx = OpContext(dtype="float32")
    (ours,) = run_op("DivNoNan", x, y, ctx=ctx)
    steps = _div_no_nan_steps(x, y, np.float32)
    np.testing.assert_array_equal(ours, steps[-1].astype(F32))
    sub = (y != 0) & (np.abs(y) < np.finfo(F32).tiny)
    with np.errstate(all="ignore"):
        plain = (x[sub].astype(np.float64) / y[sub]).astype(F32)
    assert sub.sum() > 500 and (ours[sub] != plain).mean() > 0.5


def test_mul_no_nan_tbe_is_a_plain_multiply():
    """TBE mul_no_nan_compute is one vmul: Inf * 0 is NaN (status), -2 * 0 is -0; the 950's kernel and op_model exact
    select 0 where y == 0."""
    x, y = np.array([np.inf, np.nan, -2.0, 2.0], F32), np.array([0.0, 0.0, 0.0, 3.0], F32)
    ctx = OpContext(dtype="float32")
    (p,) = run_op("MulNoNan", x, y, ctx=ctx)
    assert np.isnan(p[0]) and np.isnan(p[1]) and p[2] == 0 and np.signbit(p[2]) and p[3] == 6 and ctx.status & 0x20
    for model in ("ascendc", "exact"):
        (q,) = run_op("MulNoNan", x, y, ctx=OpContext(dtype="float32", op_model=model))
        np.testing.assert_array_equal(q, np.array([0.0, 0.0, 0.0, 6.0], F32))

"""Vector unit and reductions against the float64 models in tests/naive.py, bit for bit.

Every fp16 and every bf16 input goes through every unary op; every pair of fp16 operands
(2**32) goes through add, mul and SquaredDifference in test_fp16_pairs.py.
"""
from __future__ import annotations

import importlib
import math
import zlib

import ml_dtypes
import numpy as np
import pytest

import naive
from ascend_emu import AscendEmuError
from ascend_emu.numerics import policy as config
from ascend_emu.kernels import vector as kv
from ascend_emu.kernels.cast import HW_HALF
from ascend_emu.numerics import REDUCE_OPS, VECTOR_OPS, cast, reduce, vector

F16, BF16 = np.float16, ml_dtypes.bfloat16
ALL16 = np.arange(65536, dtype=np.uint16)
UNARY = ("neg", "abs", "square", "sqrt", "rsqrt", "reciprocal", "exp", "expm1", "log", "log1p", "tanh",
         "sigmoid", "relu", "relu6", "erf", "erfc", "softplus", "softsign", "gelu", "leaky_relu")
BINARY = ("add", "sub", "mul", "realdiv", "maximum", "minimum", "squared_difference", "pow")


def _assert_bits(got, want, fmt, what):
    eq = naive.bits_equal(got, want, fmt)
    if not eq.all():
        i = np.flatnonzero(~eq.ravel())[:5]
        raise AssertionError(f"{what}: {np.count_nonzero(~eq)} mismatches at flat {i}: got "
                             f"{np.asarray(got).view(np.uint16).ravel()[i]} want {np.asarray(want).ravel()[i]}")


def _rand_bits(rng, n, fmt):
    """Random 16-bit patterns: all classes, and a share of ordinary values that do not overflow."""
    raw = rng.integers(0, 65536, n, dtype=np.uint16)
    tame = (rng.standard_normal(n) * 4).astype(naive.FORMATS[fmt]).view(np.uint16)
    return np.where(rng.random(n) < 0.5, raw, tame).astype(np.uint16)


@pytest.mark.skipif(not HW_HALF, reason="no hardware fp16 conversions on this host")
def test_hardware_and_integer_paths_agree():
    """fp16 + - * / through the CPU's conversions equal the integer rounding path, every mode."""
    rng = np.random.default_rng(12)
    a = rng.integers(0, 65536, 2 ** 20, dtype=np.uint16)
    b = rng.integers(0, 65536, 2 ** 20, dtype=np.uint16)
    o1 = np.empty_like(a)
    o2 = np.empty_like(a)
    for code in (kv.ADD, kv.SUB, kv.MUL, kv.REALDIV, kv.SQUARED_DIFFERENCE):
        for overflow in (0, 1):
            for subnormal in (0, 1):
                s1 = kv.arith_f16_hw(code, a, b, o1, overflow, subnormal)
                s2 = kv.binary16(code, a, b, o2, False, overflow, subnormal, True)
                _assert_bits(o1, o2, "float16", f"op {code} overflow {overflow} flush {subnormal}")
                assert bool(s1) == bool(s2)


# ------------------------------------------------------------------ every 16-bit input of every unary op

@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", UNARY + ("gelu_approximate",))
def test_unary_every_input(op, fmt):
    x = ALL16.view(naive.FORMATS[fmt])
    attrs = {"approximate": True} if op == "gelu_approximate" else {}
    name = "gelu" if op == "gelu_approximate" else op
    for ov in ("inf_nan", "saturation"):
        got, st = vector(name, x, dtype=fmt, overflow_mode=ov, op_model="exact", **attrs)
        assert got.dtype == naive.FORMATS[fmt] and got.shape == x.shape
        want, wst = naive.vector16(name, fmt, ALL16, overflow_mode=ov, **attrs)
        _assert_bits(got, want, fmt, f"{op} {fmt} {ov}")
        assert st == wst == 0x20  # the inputs hold Inf and NaN


@pytest.mark.parametrize("alpha", [0.2, 0.01, 0.3333])
def test_leaky_relu_alpha_is_rounded_first(alpha):
    x = ALL16.view(F16)
    got, _ = vector("leaky_relu", x, alpha=alpha)
    want, _ = naive.vector16("leaky_relu", "float16", ALL16, alpha=alpha)
    _assert_bits(got, want, "float16", f"leaky_relu {alpha}")
    assert got[np.float16(-1.0).view(np.uint16)] == -np.float16(alpha)


def test_high_performance_is_within_one_ulp():
    """The exact model: float32 libm then a second rounding, never more than 1 ulp from the float64 model."""
    x = ALL16.view(F16)
    finite = np.isfinite(x)
    for op in ("exp", "log", "tanh", "sigmoid", "erf", "rsqrt", "gelu", "softplus", "expm1"):
        hp, _ = vector(op, x, impl_mode="high_performance", op_model="exact")
        ref, _ = vector(op, x, op_model="exact")
        both = finite & np.isfinite(hp) & np.isfinite(ref)
        d = np.abs(hp.view(np.uint16)[both].astype(np.int32) - ref.view(np.uint16)[both].astype(np.int32))
        sign_flip = np.signbit(hp[both]) != np.signbit(ref[both])
        assert (d[~sign_flip] <= 1).all(), op
        assert np.array_equal(np.isnan(hp), np.isnan(ref)), op
    for op in ("add", "mul", "realdiv"):  # basic ops do not depend on impl_mode
        a = ALL16[:65534:7].view(F16)
        b = ALL16[3::7].view(F16)
        r1, _ = vector(op, a, b, impl_mode="high_performance")
        r2, _ = vector(op, a, b)
        _assert_bits(r1, r2, "float16", op)


# ------------------------------------------------------------------ random inputs, other binary ops, bf16

@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", BINARY)
def test_binary_random(op, fmt):
    rng = np.random.default_rng(zlib.crc32(f"{op} {fmt}".encode()))   # the same data in every process
    a = _rand_bits(rng, 2 ** 17, fmt)
    b = _rand_bits(rng, 2 ** 17, fmt)
    for ov in ("inf_nan", "saturation"):
        got, st = vector(op, a.view(naive.FORMATS[fmt]), b.view(naive.FORMATS[fmt]), dtype=fmt, overflow_mode=ov)
        want, wst = naive.vector16(op, fmt, a, b, overflow_mode=ov)
        _assert_bits(got, want, fmt, f"{op} {fmt} {ov}")
        assert st == wst


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_pow_special_cases_with_nan(fmt):
    """pow's special cases as C99 / IEEE 754 pow has them: pow(x, +-0) = 1 and pow(+1, y) = 1 for every x and y,
    NaN included, signalling or quiet (the widening quiets it, as the CPU's does); any other NaN operand gives
    NaN with status 0x20. Every NaN pattern of the format against 1 and +-0, and against other values."""
    bits = ALL16.view(naive.FORMATS[fmt])
    nans = ALL16[np.isnan(bits.astype(np.float32))]
    one, zero, nzero = (np.asarray(v, naive.FORMATS[fmt]).view(np.uint16) for v in (1.0, 0.0, -0.0))
    others = np.asarray([2.0, -1.0, 0.5, np.inf, -np.inf], naive.FORMATS[fmt]).view(np.uint16)
    for a, b, value in ((np.full(nans.size, one), nans, 1.0), (nans, np.full(nans.size, zero), 1.0),
                        (nans, np.full(nans.size, nzero), 1.0),
                        (np.repeat(nans, others.size), np.tile(others, nans.size), None),
                        (np.tile(others, nans.size), np.repeat(nans, others.size), None)):
        for ov in ("inf_nan", "saturation"):
            got, st = vector("pow", a.view(naive.FORMATS[fmt]), b.view(naive.FORMATS[fmt]), dtype=fmt, overflow_mode=ov)
            want, wst = naive.vector16("pow", fmt, a, b, overflow_mode=ov)
            _assert_bits(got, want, fmt, f"pow {fmt} {ov}")
            assert st == wst
            g = got.astype(np.float32)
            if value is not None:
                assert (g == value).all() and st == 0
            else:
                assert (np.isnan(g) if ov == "inf_nan" else g == 0).all() and st == 0x20


@pytest.mark.parametrize("op", ["add", "mul", "realdiv", "sub"])
def test_bf16_all_b_for_many_a(op):
    """Every bf16 b against 48 a values spread over the exponent range (3.1M pairs)."""
    rng = np.random.default_rng(11)
    av = np.concatenate([rng.integers(0, 65536, 40), [0x0001, 0x0080, 0x7F7F, 0x3F80, 0x8001, 0xFF7F, 0x0000, 0x8000]]
                        ).astype(np.uint16)
    a = np.repeat(av, 65536)
    b = np.tile(ALL16, av.size)
    got, st = vector(op, a.view(BF16), b.view(BF16), dtype="bfloat16")
    want, wst = naive.vector16(op, "bfloat16", a, b)
    _assert_bits(got, want, "bfloat16", op)
    assert st == wst


def test_squared_difference_rounds_twice():
    """vsub then vmul, each rounded: differs from rounding the exact square once."""
    a = np.float16([1.0 + 2 ** -10, 200.0, 200.0])
    b = np.float16([-(2.0 ** -11) * (1 + 2 ** -10), -55.0, -200.0])
    got, st = vector("squared_difference", a, b)
    exact = (a[0].astype(np.float64) - b[0].astype(np.float64)) ** 2
    assert got[0] == np.float16(1 + 4 * 2 ** -10) and np.float16(exact) == np.float16(1 + 3 * 2 ** -10)
    assert got[1] == 65024.0 and np.isposinf(got[2]) and st == 0x20


# ------------------------------------------------------------------ float32 compute dtype

def test_float32_basic_ops_are_ieee():
    rng = np.random.default_rng(5)
    with np.errstate(all="ignore"):
        a = (rng.standard_normal(10000) * np.exp2(rng.integers(-130, 128, 10000))).astype(np.float32)
        b = (rng.standard_normal(10000) * np.exp2(rng.integers(-130, 128, 10000))).astype(np.float32)
        for op, f in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("realdiv", np.divide),
                      ("maximum", np.maximum), ("minimum", np.minimum)):
            got, st = vector(op, a, b, dtype="float32")
            want = f(a, b)
            assert got.dtype == np.float32 and np.array_equal(got, want, equal_nan=True), op
            assert st == (0x20 if not np.isfinite(want).all() else 0)
        got, _ = vector("sqrt", np.abs(a), dtype="float32")
        assert np.array_equal(got, np.sqrt(np.abs(a)))


@pytest.mark.parametrize("op", ["exp", "log", "tanh", "sigmoid", "erf", "rsqrt", "pow", "gelu"])
def test_float32_transcendentals_round_float64_once(op):
    """The exact model in float32 (the sourced kernels are tested below)."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(5000) * 8).astype(np.float32)
    if op in ("log", "rsqrt"):
        x = np.abs(x)
    with np.errstate(all="ignore"):
        if op == "pow":
            y = np.abs(rng.standard_normal(5000)).astype(np.float32) * 3
            got, _ = vector(op, np.abs(x), y, dtype="float32")
            want = np.power(np.abs(x).astype(np.float64), y.astype(np.float64)).astype(np.float32)
        else:
            got, _ = vector(op, x, dtype="float32", op_model="exact")
            f = naive.UNARY64[op]
            want = np.asarray(f(x.astype(np.float64)), dtype=np.float64).astype(np.float32)
    assert np.array_equal(got, want, equal_nan=True)


# ------------------------------------------------------------------ the sourced CANN kernels, step by step

#: (vector op, op_model) -> the oracle's kernel in tests/naive.py
SOURCED = {
    ("gelu", "tbe_v100"): "gelu_v100", ("gelu", "tbe_v220"): "gelu_v220", ("gelu", "ascendc"): "gelu_ascendc",
    ("tanh", "tbe_v220"): "tanh_tbe", ("tanh", "ascendc"): "tanh_ascendc",
    ("sigmoid", "tbe_v220"): "sigmoid16_tbe", ("sigmoid", "ascendc"): "sigmoid",
    ("exp", "tbe_v220"): "exp", ("exp", "ascendc"): "exp",
    ("rsqrt", "tbe_v220"): "rsqrt", ("rsqrt", "ascendc"): "rsqrt",
}


@pytest.mark.parametrize("impl_mode", config.IMPL_MODES)
@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("op, model", list(SOURCED))
def test_sourced_kernel_every_input(op, model, fmt, impl_mode):
    """Every 16-bit input, both overflow modes, bit for bit and status against the step-by-step oracle."""
    x = ALL16.view(naive.FORMATS[fmt])
    kernel = SOURCED[op, model]
    for ov in ("inf_nan", "saturation"):
        got, st = vector(op, x, dtype=fmt, overflow_mode=ov, impl_mode=impl_mode, op_model=model)
        if kernel == "sigmoid16_tbe":
            want, wst = naive.sigmoid16_tbe(fmt, ALL16, ov, impl_mode)
        else:
            want, wst = naive.steps16(kernel, fmt, ALL16, ov, impl_mode)
        _assert_bits(got, want, fmt, f"{op} {model} {fmt} {ov} {impl_mode}")
        assert st == wst == 0x20  # the inputs hold Inf and NaN


def test_sourced_kernels_share_between_models_and_ignore_approximate():
    """TBE's tanh, sigmoid, exp and rsqrt are the same on v100 and v220; CANN's Gelu is the tanh form
    whatever the graph asked for."""
    x = ALL16.view(F16)
    for op in ("tanh", "sigmoid", "exp", "rsqrt"):
        _assert_bits(vector(op, x, op_model="tbe_v100")[0], vector(op, x, op_model="tbe_v220")[0], "float16", op)
    for model in ("tbe_v100", "tbe_v220", "ascendc"):
        _assert_bits(vector("gelu", x, op_model=model, approximate=True)[0],
                     vector("gelu", x, op_model=model)[0], "float16", model)
    # the models differ where the sources differ: v100 and v220 Gelu on fp16 (and from the exact model)
    v100, v220 = vector("gelu", x, op_model="tbe_v100")[0], vector("gelu", x, op_model="tbe_v220")[0]
    assert not naive.bits_equal(v100, v220, "float16").all()
    exact = vector("gelu", x, op_model="exact")[0]
    small = np.isfinite(x) & (np.abs(x.astype(np.float32)) < 8)
    assert 0.05 < np.mean(~naive.bits_equal(v220, exact, "float16")[small]) < 0.2


def _edge_f32(rng):
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 3.4028235e38, -3.4028235e38,
                      88.72, 89.0, -87.3, -104.0, 0.6, -0.6, 0.59999996, 9.010913848876953125, -9.01091385,
                      2.0 ** -14, 2.0 ** -126, 1e-3, -1e-3, 10.5, -10.5, 11.0, -11.0], dtype=np.float32)
    normal = (rng.standard_normal(20000) * 6).astype(np.float32)
    raw = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([edges, normal, raw])


@pytest.mark.parametrize("op, model", list(SOURCED))
def test_sourced_kernel_float32(op, model):
    """float32 compute dtype: random, raw-pattern and edge inputs, every step a float32 operation."""
    x = _edge_f32(np.random.default_rng(11))
    kernel = "sigmoid" if SOURCED[op, model] == "sigmoid16_tbe" else SOURCED[op, model]
    for ov in ("inf_nan", "saturation"):
        for impl_mode in config.IMPL_MODES:
            got, st = vector(op, x, dtype="float32", overflow_mode=ov, impl_mode=impl_mode, op_model=model)
            want, bad = naive.steps32(kernel, x, ov, impl_mode, 2.0 ** -126)
            fin = np.isfinite(want)
            if ov == "saturation":
                want = np.where(np.isnan(want), np.float32(0), np.clip(want, -3.4028235e38, 3.4028235e38))
            assert got.dtype == np.float32
            same = (got.view(np.uint32) == want.astype(np.float32).view(np.uint32)) | (np.isnan(got) & np.isnan(want))
            assert same.all(), (op, model, ov, impl_mode, x[~same][:4], got[~same][:4], want[~same][:4])
            assert st == (0x20 if (bad or not fin.all()) else 0)


def test_fma_of_the_ascendc_tanh_rounds_once():
    """MulDstAdd is a fused multiply-add: cases where rounding the float64 sum to float32 rounds twice."""
    rng = np.random.default_rng(12)
    a = (rng.integers(1 << 12, 1 << 13, 4000) / 4096.0).astype(np.float32)
    b = (rng.integers(1 << 12, 1 << 13, 4000) / 4096.0 * 3.0).astype(np.float32)
    c = (rng.choice([-1.0, 1.0], 4000) * 2.0 ** -50).astype(np.float32)
    got = np.array([kv.fma_f32(p, q, r) for p, q, r in zip(a, b, c)], dtype=np.float32)
    want = naive.fma32(a, b, c)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert (want != (a.astype(np.float64) * b + c).astype(np.float32)).sum() > 20  # double rounding cases exist


def test_float32_saturation_and_flush():
    big = np.float32([3e38, -3e38, 1.0])
    got, st = vector("mul", big, np.float32(10), dtype="float32")
    assert np.isinf(got[:2]).all() and st == 0x20
    got, st = vector("mul", big, np.float32(10), dtype="float32", overflow_mode="saturation")
    assert got.tolist()[:2] == [float(np.finfo(np.float32).max), -float(np.finfo(np.float32).max)] and st == 0x20
    got, _ = vector("sub", np.float32([np.inf]), np.float32([np.inf]), dtype="float32", overflow_mode="saturation")
    assert got.view(np.uint32)[0] == 0
    tiny = np.float32([1e-39, -1e-39, 2e-38])
    got, _ = vector("mul", tiny, np.float32(1.0), dtype="float32", subnormals="flush")
    assert got.view(np.uint32).tolist() == [0, 0x80000000, np.float32(2e-38).view(np.uint32)]


# ------------------------------------------------------------------ overflow, status, flush in 16 bits

def test_overflow_modes_fp16():
    a = np.float16([60000, -60000, 1, np.inf])
    b = np.float16([60000, -60000, 1, -np.inf])
    got, st = vector("add", a, b)
    assert np.isinf(got[0]) and np.isinf(got[1]) and got[2] == 2 and np.isnan(got[3]) and st == 0x20
    got, st = vector("add", a, b, overflow_mode="saturation")
    assert got.tolist()[:3] == [65504.0, -65504.0, 2.0] and got.view(np.uint16)[3] == 0 and st == 0x20
    got, st = vector("add", a[2:3], b[2:3])
    assert st == 0
    got, st = vector("exp", np.float16([12.0]))
    assert np.isinf(got[0]) and st == 0x20
    got, st = vector("exp", np.float16([12.0]), dtype="bfloat16")  # input cast fp16 -> bf16, then exp
    assert float(got[0]) == float(ml_dtypes.bfloat16(math.exp(12.0))) and st == 0
    got, st = vector("realdiv", np.float16([1.0, 0.0]), np.float16([0.0, 0.0]))
    assert np.isposinf(got[0]) and np.isnan(got[1]) and st == 0x20
    got, st = vector("log", np.float16([-1.0]), overflow_mode="saturation")
    assert got.view(np.uint16)[0] == 0 and st == 0x20


def test_subnormal_flush_fp16():
    sub = np.float16([2 ** -20, -(2 ** -20), 2 ** -14])
    got, _ = vector("mul", sub, np.float16(1.0), subnormals="flush")
    assert got.view(np.uint16).tolist() == [0, 0x8000, 0x0400]
    got, _ = vector("mul", np.float16([2 ** -10]), np.float16([2 ** -10]), subnormals="flush")
    assert got.view(np.uint16)[0] == 0  # 2**-20 is subnormal in fp16
    got, _ = vector("mul", np.float16([2 ** -10]), np.float16([2 ** -10]))
    assert got[0] == np.float16(2 ** -20)


def test_input_casts_and_broadcasting():
    a = np.arange(12, dtype=np.float32).reshape(3, 1, 4) * 1000
    b = np.float16([[1.0], [2.0]])
    got, st = vector("mul", a, b)
    assert got.shape == (3, 2, 4) and got.dtype == np.float16 and st == 0
    a16, _ = cast(a, "float16")
    want, _ = naive.vector16("mul", "float16", np.broadcast_to(a16, (3, 2, 4)).view(np.uint16),
                             np.broadcast_to(b, (3, 2, 4)).view(np.uint16))
    _assert_bits(got, want, "float16", "broadcast mul")
    got, st = vector("add", np.float32([1e5]), np.float16([1.0]))  # the input cast overflows
    assert np.isinf(got[0]) and st == 0x120
    got, st = vector("add", 1.5, 2)  # python scalars
    assert got.shape == () and float(got) == 3.5 and st == 0
    strided = np.arange(40, dtype=np.float16)[::3]
    got, _ = vector("square", strided)
    assert np.array_equal(got, strided * strided)


def test_select():
    cond = np.array([[True], [False]])
    a = np.float16([1, 2, np.inf])
    b = np.float16([-1, -2, -3])
    got, st = vector("select", cond, a, b)
    assert got.tolist() == [[1, 2, np.inf], [-1, -2, -3]] and st == 0x20
    got, st = vector("select", np.array([False, False, False]), a, b)
    assert st == 0
    got, st = vector("select", np.array([True, False]), np.float32([1, 2]), np.float32([3, 4]), dtype="float32")
    assert got.tolist() == [1, 4] and st == 0
    got, _ = vector("select", np.array([True, False]), np.float32([1, 2]), np.float32([3, 4]), dtype="bfloat16")
    assert got.dtype == BF16 and got.astype(np.float32).tolist() == [1, 4]
    with pytest.raises(AscendEmuError, match="boolean condition"):
        vector("select", np.array([1, 0]), a[:2], b[:2])


def test_vector_ops_registry_is_covered():
    tested = set(UNARY) | set(BINARY) | {"select"}
    assert tested == set(VECTOR_OPS)


@pytest.mark.parametrize("call, match", [
    (lambda: vector("softmax", np.ones(2)), "unknown vector op 'softmax'; choose one of: abs, add"),
    (lambda: vector("add", np.ones(2)), "vector op 'add' takes 2 inputs, got 1"),
    (lambda: vector("exp", np.ones(2), np.ones(2)), "vector op 'exp' takes 1 input, got 2"),
    (lambda: vector("relu", np.ones(2), alpha=0.1), "vector op 'relu' has no attribute 'alpha'; it takes: no attr"),
    (lambda: vector("add", np.ones(2), np.ones(2), dtype="int8"), "unknown dtype 'int8'; choose one of"),
    (lambda: vector("add", np.ones(2), np.ones(2), dtype=np.float64), "unsupported compute dtype 'float64'"),
    (lambda: vector("exp", np.ones(2), impl_mode="fast"), "unknown impl_mode 'fast'; choose one of: high_precision"),
    (lambda: vector("exp", np.ones(2), op_model="tbe"), "unknown op_model 'tbe'; choose one of: tbe_v100, tbe_v220"),
    (lambda: reduce("mean", np.ones(2), op_model="cann"), "unknown op_model 'cann'; choose one of: tbe_v100"),
    (lambda: vector("add", np.ones(2), np.ones(3)), r"input shapes \(2,\) and \(3,\) do not broadcast"),
    (lambda: vector("add", np.array(["x"]), np.ones(1)), "must be a real numeric array"),
    (lambda: vector("add", np.ones(2), np.ones(2), overflow_mode="clip"), "unknown overflow_mode 'clip'"),
])
def test_vector_bad_arguments(call, match):
    with pytest.raises(AscendEmuError, match=match):
        call()


# ------------------------------------------------------------------ reductions

def _reduce_oracle(op, x16, axes, fmt, acc, model="exact"):
    """Sequential row-major reduction in float32 (or in fmt when acc == fmt), rounded once. Mean by
    ``model``: the sum over n ("exact"), the sum of x * (1/n) ("tbe"), the sum times 1/n ("ascendc")."""
    kept = tuple(d for d in range(x16.ndim) if d not in axes)
    x2 = np.transpose(x16, kept + axes).reshape(-1, int(np.prod([x16.shape[d] for d in axes])))
    v = naive.to_f64(x2.view(np.uint16), fmt)
    n = v.shape[1]
    cof = np.float32(1) / np.float32(n)
    with np.errstate(all="ignore"):
        if acc == "float32":
            v = v.astype(np.float32)
            if op == "mean" and model == "tbe":
                v = v * cof
            if op in ("sum", "mean"):
                r = np.add.accumulate(v, axis=1)[:, -1]
            elif op == "prod":
                r = np.multiply.accumulate(v, axis=1)[:, -1]
            else:
                r = (np.max if op == "max" else np.min)(v, axis=1)
            if op == "mean":
                r = r / np.float32(n) if model == "exact" else (r * cof if model == "ascendc" else r)
            return naive.round_f64(r.astype(np.float64), fmt)
        cols = x2.view(np.uint16)
        nonfinite = False
        if op == "mean" and model == "tbe":   # x * cof in fmt, cof itself held in fmt
            c16, _ = naive.cast_bits(np.array([cof]), fmt)
            prods = []
            for j in range(n):
                b, st = naive.vector16("mul", fmt, cols[:, j], np.broadcast_to(c16, cols[:, j].shape))
                prods.append(b)
                nonfinite |= bool(st)
            cols = np.stack(prods, axis=1)
        bits = cols[:, 0].copy()
        for j in range(1, n):
            step = {"sum": "add", "mean": "add", "prod": "mul", "max": "maximum", "min": "minimum"}[op]
            bits, st = naive.vector16(step, fmt, bits, cols[:, j])
            nonfinite |= bool(st)
        if op == "mean" and model != "tbe":
            s32 = naive.to_f64(bits, fmt).astype(np.float32)
            r, st = naive.round_f64((s32 / np.float32(n) if model == "exact" else s32 * cof).astype(np.float64), fmt)
            return r, nonfinite or st
        return bits, nonfinite


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_against_oracle(op, fmt):
    rng = np.random.default_rng(zlib.crc32(f"{op} {fmt}".encode()))   # the same data in every process
    x = (rng.standard_normal((3, 37, 5)) * (1.2 if op == "prod" else 50)).astype(naive.FORMATS[fmt])
    for axis in (None, 1, (0, 2), -1, (2, 0)):
        axes = tuple(range(3)) if axis is None else tuple(sorted(a % 3 for a in ((axis,) if isinstance(axis, int) else axis)))
        for acc in ("float32", fmt):
            for model in ("tbe_v100", "tbe_v220", "ascendc", "exact"):
                got, st = reduce(op, x, axis=axis, dtype=fmt, accumulate=acc, op_model=model)
                want, wst = _reduce_oracle(op, x, axes, fmt, acc, model.split("_")[0])
                _assert_bits(got.ravel(), want, fmt, f"{op} axis={axis} acc={acc} {model}")
                assert got.shape == tuple(x.shape[d] for d in range(3) if d not in axes)
                assert st == (0x20 if wst else 0)
        kd, _ = reduce(op, x, axis=axis, keepdims=True, dtype=fmt)
        assert kd.shape == tuple(1 if d in axes else x.shape[d] for d in range(3))


def test_reduce_float32():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 1000)).astype(np.float32)
    got, st = reduce("sum", x, axis=1, dtype="float32")
    assert np.array_equal(got, np.add.accumulate(x, axis=1)[:, -1]) and st == 0
    got, _ = reduce("mean", x, axis=0, dtype="float32")
    assert np.array_equal(got, np.add.accumulate(x, axis=0)[-1] / np.float32(4))
    cof = np.float32(1) / np.float32(1000)
    for model, want in (("tbe_v100", np.add.accumulate(x * cof, axis=1)[:, -1]),
                        ("ascendc", np.add.accumulate(x, axis=1)[:, -1] * cof),
                        ("exact", np.add.accumulate(x, axis=1)[:, -1] / np.float32(1000))):
        got, _ = reduce("mean", x, axis=1, dtype="float32", op_model=model)
        assert np.array_equal(got, want), model
    got, _ = reduce("max", x, dtype="float32")
    assert got == x.max()
    with pytest.raises(AscendEmuError, match="unsupported accumulate 'float16' for dtype float32"):
        reduce("sum", x, dtype="float32", accumulate="float16")


def test_reduce_fp16_accumulator_pitfall():
    """ReduceSum left in fp16 stalls at 2048 (2048 + 1 rounds back to 2048)."""
    ones = np.ones(4096, dtype=np.float16)
    s32, st = reduce("sum", ones)
    s16, _ = reduce("sum", ones, accumulate="float16")
    assert float(s32) == 4096.0 and float(s16) == 2048.0 and st == 0
    m16, _ = reduce("mean", ones, accumulate="float16")
    assert float(m16) == 0.5


def test_reduce_overflow_status_and_modes():
    x = np.float16([60000, 60000, -60000])
    got, st = reduce("sum", x)  # the float32 accumulator holds 120000, then 60000
    assert float(got) == 60000.0 and st == 0
    got, st = reduce("sum", x, accumulate="float16")  # 60000 + 60000 overflows an fp16 accumulator
    assert np.isposinf(got) and st == 0x20
    got, st = reduce("sum", x, accumulate="float16", overflow_mode="saturation")
    assert float(got) == 65504.0 - 60000.0 and st == 0x20
    got, st = reduce("sum", x[:2])
    assert np.isposinf(got) and st == 0x20
    got, st = reduce("sum", x[:2], overflow_mode="saturation")
    assert float(got) == 65504.0 and st == 0x20
    got, st = reduce("max", np.float16([1, np.nan, 3]))
    assert np.isnan(got) and st == 0x20
    got, st = reduce("sum", np.zeros((2, 0), np.float16), axis=1)
    assert got.tolist() == [0.0, 0.0] and st == 0
    got, st = reduce("prod", np.zeros((0,), np.float16))
    assert float(got) == 1.0


@pytest.mark.parametrize("call, match", [
    (lambda: reduce("median", np.ones(3)), "unknown reduce op 'median'; choose one of: sum, mean, max, min, prod"),
    (lambda: reduce("sum", np.ones((2, 3)), axis=2), "reduce axis 2 is out of range for an array of 2 dimension"),
    (lambda: reduce("sum", np.ones((2, 3)), axis=(1, -1)), "reduce axis 1 is repeated"),
    (lambda: reduce("sum", np.ones(3), accumulate="float64"), "unsupported accumulate 'float64' for dtype float16; "
                                                              "choose one of: float32, float16"),
    (lambda: reduce("max", np.ones((2, 0)), axis=1), "reduce 'max' over an empty axis"),
    (lambda: reduce("sum", np.array(["a"])), "must be a real numeric array"),
])
def test_reduce_bad_arguments(call, match):
    with pytest.raises(AscendEmuError, match=match):
        call()


@pytest.mark.parametrize("op,fn", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                   ("realdiv", np.divide)])
@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_float32_binary_ops_against_ieee_with_the_overflow_model(op, fn, mode):
    """float32 add/sub/mul/div: one IEEE operation (numpy's), then the overflow model; both the fast path
    (all results finite) and the kernel (an Inf/NaN somewhere) are exercised."""
    from ascend_emu import vector

    rng = np.random.default_rng(5)
    specials = np.array([0.0, -0.0, 1e-45, -1e-45, 1.2e-38, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan, 1.0, -2.5],
                        np.float32)
    x = np.concatenate([rng.standard_normal(4000).astype(np.float32) * np.float32(10) ** rng.integers(-18, 19, 4000)
                        .astype(np.float32), specials, np.repeat(specials, len(specials))])
    y = np.concatenate([rng.standard_normal(4000).astype(np.float32) * np.float32(10) ** rng.integers(-18, 19, 4000)
                        .astype(np.float32), specials[::-1], np.tile(specials, len(specials))])
    fmax = np.float32(np.finfo(np.float32).max)
    for xs, ys in ((x[:4000], y[:4000]), (x, y)):    # all finite (the fast path), then with specials
        with np.errstate(all="ignore"):
            want = fn(xs, ys)
        bad = ~np.isfinite(want)
        if mode == "saturation":
            want = np.where(np.isnan(want), np.float32(0), np.clip(want, -fmax, fmax)).astype(np.float32)
        got, st = vector(op, xs, ys, dtype="float32", overflow_mode=mode)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        assert bool(st) == bool(bad.any())
        assert bad.any() == (xs is x)


@pytest.mark.parametrize("op", ["relu", "relu6", "squared_difference"])
@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_float32_numpy_fast_paths_equal_the_kernel(op, mode):
    """float32 relu and relu6 (one pass of kernels/clamp.py) and squared_difference (numpy) take a fast path
    when every value is finite: bit for bit the kernel's results and status, checked against the kernel
    itself (and an Inf/NaN falls back to it)."""
    from ascend_emu import vector
    from ascend_emu.kernels import vector as kv
    from ascend_emu.numerics.policy import OVERFLOW_MODES, SUBNORMAL_MODES

    rng = np.random.default_rng(11)
    specials = np.array([0.0, -0.0, 1e-45, -1e-45, 1.2e-38, -1.2e-38, 1e19, -1e19, 6.0, 5.9999995, 6.0000005,
                         -6.0, 1.0, -2.5], np.float32)

    def values(lo, hi, n=70000):   # |values| from 10**lo to 10**hi, both signs, plus specials
        v = rng.standard_normal(n) * 10.0 ** rng.integers(lo, hi, n)
        return np.concatenate([v.astype(np.float32), specials, np.repeat(specials, len(specials))])
    code = {"relu": kv.RELU, "relu6": kv.RELU6, "squared_difference": kv.SQUARED_DIFFERENCE}[op]
    oc, sc = OVERFLOW_MODES[mode], SUBNORMAL_MODES["keep"]
    nonfinite = np.array([np.inf, -np.inf, np.nan, 3.4e38], np.float32)
    cases = [(values(-25, 18), values(-25, 18), False),              # finite results: the fast path
             (values(-45, 38), values(-45, 38), op == "squared_difference"),   # squares overflow
             (np.concatenate([values(-5, 5), nonfinite]), np.concatenate([values(-5, 5), nonfinite[::-1]]), True)]
    for xs, ys, bad in cases:
        assert np.isfinite(xs).all() or bad
        want = np.empty_like(xs)
        if op == "squared_difference":
            st_want = kv.binary_f32(code, xs, ys, want, oc, sc, True)
            got, st = vector(op, xs, ys, dtype="float32", overflow_mode=mode)
        else:
            st_want = kv.unary_f32(code, xs, want, oc, sc, True, 0.0)
            got, st = vector(op, xs, dtype="float32", overflow_mode=mode)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        assert bool(st) == bool(st_want) == bad


@pytest.mark.parametrize("op", ["neg", "abs", "square", "sqrt", "reciprocal"])
@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_float32_unary_numpy_fast_path_equals_the_kernel(op, mode, monkeypatch):
    """float32 neg, abs, square, sqrt and reciprocal take numpy's IEEE operation when every result is finite:
    bit for bit the kernel's results and status (in both of its evaluation widths), on every class of float32
    bit pattern; the kernel is not called for finite results and reruns the op on an Inf/NaN."""
    import importlib

    from ascend_emu import vector
    from ascend_emu.kernels import vector as kv
    from ascend_emu.numerics.policy import OVERFLOW_MODES, SUBNORMAL_MODES

    rng = np.random.default_rng(17)
    code = getattr(kv, op.upper())
    oc, sc = OVERFLOW_MODES[mode], SUBNORMAL_MODES["keep"]
    anything = rng.integers(0, 2 ** 32, 300000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    specials = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38, 1.8446743e19, 1.8446744e19,
                         3.4028235e38, 2.9387359e-39, 2.938736e-39, 1.0, -2.5], np.float32)
    finite = anything[np.isfinite(anything)]
    safe = {"neg": finite, "abs": finite, "sqrt": np.abs(finite),                  # every result finite
            "square": finite[np.abs(finite) < 1.8e19],
            "reciprocal": finite[(np.abs(finite) > 2.95e-39)]}[op]
    calls = []
    kernel = kv.unary_f32

    def counted(*a):
        calls.append(1)
        return kernel(*a)
    monkeypatch.setattr(kv, "unary_f32", counted)
    for xs, fast in ((safe, True), (np.concatenate([anything, specials, -specials]), False)):
        got, st = vector(op, xs, dtype="float32", overflow_mode=mode)
        assert bool(calls) != fast
        calls.clear()
        for use64 in (True, False):
            want = np.empty_like(xs)
            st_want = kernel(code, xs, want, oc, sc, use64, 0.0)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
            assert bool(st) == bool(st_want) == (not fast)
    assert importlib.import_module("ascend_emu.numerics.vector")._kv is kv


def test_float32_binary_ops_broadcast_as_the_flat_kernel():
    """vector()'s float32 + - * / on broadcast operands (numpy broadcasting, no flat copies) against the
    binary_f32 kernel on the explicitly broadcast flat arrays: bits and status, Inf/NaN included."""
    rng = np.random.default_rng(31)
    a = (rng.standard_normal((4, 5, 16)) * np.exp2(rng.integers(-130, 127, (4, 5, 16)))).astype(np.float32)
    b = (rng.standard_normal((16,)) * 4).astype(np.float32)
    b[3] = 0.0
    for x, y in ((a, b), (b, a), (a[:, :1], a), (np.float32(2.5) * np.ones((), np.float32), a)):
        for op, code in (("add", kv.ADD), ("sub", kv.SUB), ("mul", kv.MUL), ("realdiv", kv.REALDIV)):
            for ov in ("inf_nan", "saturation"):
                got, st = vector(op, x, y, dtype="float32", overflow_mode=ov)
                shape = np.broadcast_shapes(x.shape, y.shape)
                fx, fy = (np.ascontiguousarray(np.broadcast_to(v, shape)).reshape(-1) for v in (x, y))
                want = np.empty(fx.size, np.float32)
                wst = kv.binary_f32(code, fx, fy, want, 1 if ov == "saturation" else 0, 0, True)
                assert got.shape == shape and got.dtype == np.float32 and got.flags.c_contiguous
                np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))
                assert bool(st) == bool(wst)


@pytest.mark.parametrize("exponent", [2.0, np.float32(2.0), np.asarray([[2.0]], np.float16), np.float32(2.0004),
                                      np.asarray(2, np.int32), np.float32(2.5), np.asarray([[[2.0]]], np.float32)],
                         ids=repr)
def test_fp16_pow_of_two_every_input(exponent, monkeypatch):
    """fp16 x ** 2 (RMSNorm's Pow) takes square's exact product rounded once (numerics/vector._squares): every
    fp16 pattern, both overflow modes, against the float64 oracle's pow, bits and status; with subnormals
    flushed, the transcendental path's bits and status. Not taken: an exponent that is not 2 once cast to
    fp16 (2.5), or one of more dimensions than the base (the result would be larger)."""
    nvec = importlib.import_module("ascend_emu.numerics.vector")
    calls = []
    real = nvec.vector
    monkeypatch.setattr(nvec, "vector", lambda op, *a, **k: calls.append(op) or real(op, *a, **k))
    x = ALL16.view(F16).reshape(256, 256)
    e16 = np.asarray(exponent).astype(np.float64).astype(F16).ravel()[0]
    taken = e16 == 2 and np.ndim(exponent) <= 2
    for ov in ("inf_nan", "saturation"):
        for sub in ("keep", "flush"):
            calls.clear()
            got, st = real("pow", x, exponent, overflow_mode=ov, subnormals=sub)
            assert calls == (["square"] if taken else []), calls
            if sub == "keep":
                want, wst = naive.vector16("pow", "float16", ALL16, np.full(ALL16.shape, e16.view(np.uint16)),
                                           overflow_mode=ov)
            else:
                with monkeypatch.context() as m:
                    m.setattr(nvec, "_squares", lambda inputs: False)
                    want, wst = real("pow", x, exponent, overflow_mode=ov, subnormals=sub)
            _assert_bits(got.reshape(-1), np.asarray(want).reshape(-1), "float16", f"pow {exponent!r} {ov} {sub}")
            assert st == wst

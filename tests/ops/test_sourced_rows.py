"""Softmax and LayerNorm in one pass per row (kernels/composite.py) against the step-by-step path they
replace (ops/sourced.py with the row kernels switched off): same bits, same status, on hostile data.

Finite data takes the row kernels (asserted); data where a step gives Inf or NaN (NaN and Inf inputs,
masked rows of -inf, fp16 overflow of x - max, float32 overflow of (x - mean)^2) must fall back and
still match. Every SoC model, both impl modes, both overflow modes, flushing, fp16 / bf16 / float32.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu.ops import OpContext
from ascend_emu.ops import sourced

BF16 = ml_dtypes.bfloat16
MODELS = ("tbe_v100", "tbe_v220", "ascendc")
MODES = [("inf_nan", "keep", "high_precision"), ("saturation", "keep", "high_precision"),
         ("inf_nan", "keep", "high_performance"), ("inf_nan", "flush", "high_precision")]
DTYPES = (np.float16, BF16, np.float32)


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def _run(fn, dtype, model, mode, *args, rows=True, monkeypatch=None):
    """(result, status, took the row kernel) of fn(ctx, *args), the row kernels on or off."""
    overflow, sub, impl = mode
    ctx = OpContext(dtype=np.dtype(dtype).name, op_model=model, overflow_mode=overflow, subnormals=sub,
                    impl_mode=impl)
    took = []
    base = "_softmax_rows" if fn is sourced.softmax else "_layer_norm_rows"
    names = (base, base + "_f16")   # the float32 row kernels and the fp16 one-pass ones (fp16 in and out)
    reals = [getattr(sourced, name) for name in names]

    def spy(real):
        def call(*a):
            y = real(*a) if rows else None
            took.append(y is not None)
            return y
        return call
    for name, real in zip(names, reals):
        monkeypatch.setattr(sourced, name, spy(real))
    with np.errstate(all="ignore"):
        y = fn(ctx, *args)
    for name, real in zip(names, reals):
        monkeypatch.setattr(sourced, name, real)
    return y, ctx.status, any(took)


def _same(fn, dtype, model, mode, *args, monkeypatch):
    y, st, took = _run(fn, dtype, model, mode, *args, monkeypatch=monkeypatch)
    want, wst, _ = _run(fn, dtype, model, mode, *args, rows=False, monkeypatch=monkeypatch)
    got, ref = _bits(y), _bits(want)
    if not np.array_equal(got, ref):
        i = np.flatnonzero(got.ravel() != ref.ravel())[:5]
        raise AssertionError(f"{np.count_nonzero(got != ref)} mismatches at {i}: got {got.ravel()[i]} "
                             f"want {ref.ravel()[i]}")
    assert st == wst
    return took


def _finite_softmax_inputs(dtype, rng):
    """Finite hostile rows: huge spreads (exp underflowing to 0 and to subnormals), -0 and +0, subnormals,
    constant rows, the 16-bit format's extremes, long rows (several 32-element exp blocks), a row of one."""
    big = float(np.finfo(np.float16).max) if dtype == np.float16 else 3e38
    x = (rng.standard_normal((3, 5, 37)) * 12).astype(np.float32)
    x[0, 0] = 0.0
    x[0, 1, ::2] = -0.0
    x[0, 2] = np.linspace(-200, 0, 37)
    x[0, 3, :] = 7.0
    x[1, 0, :] = np.float32(6e-8) if dtype == np.float16 else np.float32(1e-40)
    x[1, 1, :4] = [big, big / 2, 0.0, -0.0]
    x[1, 1, 4:] = 1.0
    x[1, 2] = -np.abs(x[1, 2]) * 30
    x = x.astype(dtype)
    return [x, np.asarray(rng.standard_normal((2, 3, 300)) * 4, dtype=dtype), np.ones((4, 1), dtype=dtype)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mode", MODES, ids="-".join)
def test_softmax_rows_finite(dtype, model, mode, monkeypatch):
    rng = np.random.default_rng(3)
    for x in _finite_softmax_inputs(dtype, rng):
        took = _same(sourced.softmax, dtype, model, mode, x, monkeypatch=monkeypatch)
        assert took == (mode[1] == "keep")


def _every_difference(dtype):
    """Rows of 256 of a 16-bit dtype holding +0 (each row's maximum) and every finite negative pattern and -0
    once: x - max = x, so every d the row kernel's exp table can be asked for (d <= 0) occurs."""
    bits = np.arange(0x8000, 0xFC00 if dtype == np.float16 else 0xFF80, dtype=np.uint32).astype(np.uint16)
    per = 255
    rows = -(-bits.size // per)
    tail = np.zeros(rows * per, dtype=np.uint16)                   # the last row's tail: +0
    tail[:bits.size] = bits
    x = np.concatenate([np.zeros((rows, 1), dtype=np.uint16), tail.reshape(rows, per)], axis=1)   # column 0: +0
    assert np.array_equal(np.unique(x), np.concatenate([[0], bits]))
    return x.view(dtype)


@pytest.mark.parametrize("dtype", (np.float16, BF16), ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("impl", ("high_precision", "high_performance"))
def test_softmax_exp_table_is_the_vector_exp(dtype, impl):
    """Every entry of the row kernel's exp table (all 65,536 16-bit patterns but NaNs) is the float32 vector
    exp of the step path (ops.math_ops.vec) of that value, bit for bit."""
    from ascend_emu.ops.math_ops import vec

    w = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(dtype).astype(np.float32)
    ctx = OpContext(dtype="float32", op_model="tbe_v220", impl_mode=impl)
    with np.errstate(all="ignore"):
        want = vec(ctx, "exp", w)
    got = sourced._exp_table(dtype == BF16, impl == "high_precision")
    keep = ~np.isnan(w)
    assert keep.sum() == (63490 if dtype == np.float16 else 65282)   # all but the NaNs
    assert np.array_equal(_bits(got)[keep], _bits(want)[keep])


@pytest.mark.parametrize("impl", ("high_precision", "high_performance"))
def test_softmax_f16_kernel_table_nan_where_nonfinite(impl):
    """The fp16 one-pass kernel's table (all 65,536 patterns): the exp table where the pattern is finite, NaN at
    every Inf and NaN pattern (so a bad x - max makes its row's sum NaN, the kernel's one check)."""
    plain = sourced._exp_table(False, impl == "high_precision")
    got = sourced._exp_table_nonfinite_nan(impl == "high_precision")
    bad = ~np.isfinite(np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16))
    assert bad.sum() == 2048 and np.isnan(got[bad]).all()
    assert np.array_equal(_bits(got)[~bad], _bits(plain)[~bad])
    assert not got.flags.writeable


@pytest.mark.parametrize("dtype", (np.float16, BF16), ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("impl", ("high_precision", "high_performance"))
def test_softmax_rows_exp_table_every_difference(dtype, impl, monkeypatch):
    """The 16-bit x - max of TBE's softmax read from the kernel's exp table (kernels/composite.softmax_exp_table):
    every reachable difference (every finite 16-bit value <= 0), against the step path's vexp, bit for bit."""
    x = _every_difference(dtype)
    took = _same(sourced.softmax, dtype, "tbe_v220", ("inf_nan", "keep", impl), x, monkeypatch=monkeypatch)
    assert took


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mode", MODES[:2], ids="-".join)
def test_softmax_rows_fall_back(dtype, model, mode, monkeypatch):
    """A NaN, +Inf, a masked row of -inf, a row with some -inf, an x - max that overflows fp16: the steps
    decide (and the answer is theirs)."""
    rng = np.random.default_rng(4)
    base = (rng.standard_normal((4, 6, 19)) * 3).astype(np.float32)
    cases = []
    for r, v in ((0, np.nan), (1, np.inf), (2, -np.inf)):
        c = base.copy()
        c[r, 1, 3] = v
        cases.append(c)
    c = base.copy()
    c[3, 2, :] = -np.inf
    cases.append(c)
    if dtype == np.float16:
        c = base.copy()
        c[1, 1, :2] = [60000.0, -60000.0]           # x - max = -120000: fp16 overflow in TBE's 16-bit step
        cases.append(c)
    for c in cases:
        x = c.astype(dtype)
        took = _same(sourced.softmax, dtype, model, mode, x, monkeypatch=monkeypatch)
        assert not took or (model == "ascendc" and np.isfinite(c).all())


def _ln_params(rng, n):
    return (rng.standard_normal(n) * 0.5 + 1).astype(np.float32), rng.standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mode", MODES, ids="-".join)
def test_layer_norm_rows_finite(dtype, model, mode, monkeypatch):
    """Random rows, constant rows (var 0), -0, subnormals, gamma/beta as vectors, with leading ones, of 16-bit
    dtype, absent; one and two trailing axes."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 6, 40)) * 5).astype(np.float32)
    x[0, 0] = 3.0
    x[0, 1, ::2] = -0.0
    x[0, 1, 1::2] = 0.0
    x[1, 0] = np.float32(1e-41) if dtype != np.float16 else np.float32(6e-8)
    x[2, 3] *= 1e4 if dtype != np.float16 else 1.0
    x = x.astype(dtype)
    g, b = _ln_params(rng, 40)
    for gamma, beta, axes in ((g, b, (2,)), (g[None, None, :], b, (2,)), (g.astype(np.float16), None, (2,)),
                              (None, b, (2,)), (None, None, (2,)), (g, b, (1, 2)),
                              (np.tile(g, (6, 1)), np.tile(b, (6, 1)), (1, 2))):
        took = _same(sourced.layer_norm, dtype, model, mode, x, gamma, beta, 1e-5, axes, monkeypatch=monkeypatch)
        assert took == (mode[1] == "keep")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mode", MODES[:3], ids="-".join)
def test_layer_norm_rows_fall_back(dtype, model, mode, monkeypatch):
    """NaN and Inf inputs, (x - mean)^2 overflowing float32, a gamma that overflows the output, a gamma
    varying along a kept axis, a non-trailing axis: the steps decide."""
    rng = np.random.default_rng(6)
    base = (rng.standard_normal((3, 4, 24)) * 2).astype(np.float32)
    g, b = _ln_params(rng, 24)
    cases = []
    for v in (np.nan, np.inf, -np.inf):
        c = base.copy()
        c[1, 2, 5] = v
        cases.append((c, g, b, (2,), False))
    if dtype != np.float16:
        c = base.copy()
        c[2, 1, :2] = [3e38, -3e38]                   # (x - mean)^2 overflows
        cases.append((c, g, b, (2,), False))
        cases.append((base, np.full(24, 3e38, np.float32), None, (2,), False))    # y * gamma overflows
    cases.append((base, rng.standard_normal((4, 24)).astype(np.float32), b, (2,), False))   # varies along axis 1
    cases.append((base, None, None, (1,), False))
    for c, gamma, beta, axes, _ in cases:
        took = _same(sourced.layer_norm, dtype, model, mode, c.astype(dtype), gamma, beta, 1e-5, axes,
                     monkeypatch=monkeypatch)
        assert not took


@pytest.mark.parametrize("mode", MODES[:2], ids="-".join)
def test_layer_norm_f16_rounding_overflow_falls_back(mode, monkeypatch):
    """fp16 LayerNorm whose float32 result is finite but rounds past 65504 (gamma 1e5): the one-pass fp16 kernel
    declines and the status and saturation are the steps' own."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((12, 64)) * 3).astype(np.float16)
    g = np.full(64, 1e5, np.float32)
    for model in MODELS:
        _same(sourced.layer_norm, np.float16, model, mode, x, g, None, 1e-5, (1,), monkeypatch=monkeypatch)


@pytest.mark.skipif(not __import__("ascend_emu.kernels.cast", fromlist=["HW_HALF"]).HW_HALF,
                    reason="the fp16 one-pass kernels need the CPU's fp16 conversion")
def test_fp16_rows_take_the_one_pass_kernels(monkeypatch):
    """fp16 Softmax and LayerNorm with finite results run the fp16-in, fp16-out kernels (not the float32 row
    kernels and a separate rounding)."""
    from ascend_emu.kernels import composite as kc

    def no(*a):
        raise AssertionError("the float32 row kernel ran")
    monkeypatch.setattr(kc, "softmax_rows", no)
    monkeypatch.setattr(kc, "layer_norm_rows", no)
    x = np.random.default_rng(8).standard_normal((20, 48)).astype(np.float16)
    for model in MODELS:
        ctx = OpContext(dtype="float16", op_model=model)
        sourced.softmax(ctx, x, -1)
        sourced.layer_norm(ctx, x, None, None, 1e-5, (1,))
        assert ctx.status == 0


# ---- the fp16 one-pass kernels check the input's and the output's fp16 bits instead of every step (their
# docstrings say why): their verdict must still be the steps' own for a bad value in any place of a block of rows
# (the first, an interleaved block of 8, the rows after the last full 8, a second block of 32 rows), in gamma or
# beta, or a float32 step past FLT_MAX

_HW = pytest.mark.skipif(not __import__("ascend_emu.kernels.cast", fromlist=["HW_HALF"]).HW_HALF,
                         reason="the fp16 one-pass kernels need the CPU's fp16 conversion")
F16_MODES = [("inf_nan", "keep", "high_precision"), ("saturation", "keep", "high_performance")]
ROWS = 45          # one block of 32 rows (four of 8) and one of 13 (one of 8 and five rows alone)
PLACES = (0, 7, 12, 31, 33, 40, 44)   # first row, an 8-block's last, ..., rows computed alone


def _bad_at_places(fn, model, mode, base, step, *args, monkeypatch):
    """A NaN, an Inf and a -Inf at each row of PLACES in turn (row i's column ``i * step``): the row kernels must
    hand every one back, the full path's bits and status (``_same``)."""
    for i, r in enumerate(PLACES):
        for v in (np.nan, np.inf, -np.inf):
            x = base.copy()
            x[r, (i * step) % base.shape[1]] = v
            assert not _same(fn, np.float16, model, mode, x, *args, monkeypatch=monkeypatch)


@_HW
def test_fp16_softmax_takes_rows_of_negative_values(monkeypatch):
    """Rows whose maximum is negative (composite._max16 finds it on keys with the negative patterns' magnitude bits
    flipped; a plain integer maximum of the bits would pick the smallest): the fp16 one-pass kernel takes them and
    gives the steps' bits and status."""
    from ascend_emu.kernels import composite as kc

    def no(*a):
        raise AssertionError("the float32 row kernel ran")
    x = -np.abs(np.random.default_rng(21).standard_normal((64, 24))).astype(np.float16)
    x[::4] -= np.float16(3)
    x[1::8, 0] = -np.float16(0.0)
    for model in MODELS:
        for mode in F16_MODES:
            want, wst, _ = _run(sourced.softmax, np.float16, model, mode, x, rows=False, monkeypatch=monkeypatch)
            with monkeypatch.context() as m:
                m.setattr(kc, "softmax_rows", no)
                y, st, took = _run(sourced.softmax, np.float16, model, mode, x, monkeypatch=monkeypatch)
            assert took and st == wst
            np.testing.assert_array_equal(_bits(y), _bits(want))


@pytest.mark.parametrize("mode", F16_MODES, ids="-".join)
@pytest.mark.parametrize("model", ("tbe_v220", "ascendc"))
@_HW
def test_softmax_f16_bad_anywhere_falls_back(model, mode, monkeypatch):
    rng = np.random.default_rng(11)
    base = (rng.standard_normal((ROWS, 24)) * 3).astype(np.float16)
    assert _same(sourced.softmax, np.float16, model, mode, base, monkeypatch=monkeypatch)
    # rows whose maximum is a zero (composite._max16 orders -0 below +0), in 8-blocks and alone, the largest and
    # smallest finite values
    z = base.copy()
    z[[2, 9, 42, 44]] = -np.abs(z[[2, 9, 42, 44]])
    z[2, :2] = [-0.0, 0.0]
    z[9, :2] = [0.0, -0.0]
    z[42, ::3] = -0.0
    z[44, 5] = 0.0
    z[30, :3] = [65504.0, 65000.0, 6e-8]
    z[43, :] = -65504.0
    assert _same(sourced.softmax, np.float16, model, mode, z, monkeypatch=monkeypatch)
    _bad_at_places(sourced.softmax, model, mode, base, 5, monkeypatch=monkeypatch)
    if model != "ascendc":          # TBE's x - max in fp16: -120000 overflows it
        for r in PLACES:
            x = base.copy()
            x[r, :2] = [60000.0, -60000.0]
            assert not _same(sourced.softmax, np.float16, model, mode, x, monkeypatch=monkeypatch)


@pytest.mark.parametrize("mode", F16_MODES, ids="-".join)
@pytest.mark.parametrize("model", ("tbe_v100", "ascendc"))
@_HW
def test_layer_norm_f16_bad_anywhere_falls_back(model, mode, monkeypatch):
    rng = np.random.default_rng(12)
    base = (rng.standard_normal((ROWS, 40)) * 4).astype(np.float16)
    base[3, ::2] = -0.0              # -0 results kept through y * g and y + b (no beta: y stays -0)
    base[3, 1::2] = 0.0
    base[20, :] = np.float16(6e-8)   # var 0: rstd = 1 / sqrt(eps)
    base[41, :] = 65504.0            # the largest fp16 in a row computed alone
    g = (rng.standard_normal(40) * 0.5 + 1).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    for gamma, beta in ((g, b), (g, None), (None, b), (None, None)):
        assert _same(sourced.layer_norm, np.float16, model, mode, base, gamma, beta, 1e-5, (1,),
                     monkeypatch=monkeypatch)
    _bad_at_places(sourced.layer_norm, model, mode, base, 7, g, b, 1e-5, (1,), monkeypatch=monkeypatch)
    # gamma and beta: y * gamma past FLT_MAX (Inf before the rounding), Inf * 0 (NaN), a NaN gamma, an Inf beta,
    # a y * gamma finite in float32 but past fp16's 65504 (only the rounding overflows), and eps 0 on a var-0 row
    # (rstd = 1 / 0)
    huge = g.copy()
    huge[5] = 3e38
    zero_inf = np.zeros(40, np.float32)
    zero_inf[0] = np.inf
    nan_g = g.copy()
    nan_g[39] = np.nan
    inf_b = b.copy()
    inf_b[17] = -np.inf
    big = np.full(40, 1e5, np.float32)
    for gamma, beta, eps in ((huge, b, 1e-5), (zero_inf, None, 1e-5), (nan_g, b, 1e-5), (g, inf_b, 1e-5),
                             (None, None, 0.0)):
        assert not _same(sourced.layer_norm, np.float16, model, mode, base, gamma, beta, eps, (1,),
                         monkeypatch=monkeypatch)
    # only the rounding overflows: the float32 row kernel may take it, the fp16 one must not (its status is the
    # rounding's, which _same compares)
    _same(sourced.layer_norm, np.float16, model, mode, base, big, None, 1e-5, (1,), monkeypatch=monkeypatch)


def _ln_oracle(x, g, b, cof, eps):
    """(fp16 result, some step Inf or NaN) of LayerNorm's steps on fp16 rows x, each step a numpy float32 operation,
    every sum in order from the row's first element (ops/sourced.layer_norm's steps, rstd = 1 / sqrt(ve))."""
    with np.errstate(all="ignore"):
        xf = x.astype(np.float32)
        terms = xf * cof
        mean = np.add.accumulate(terms, axis=1, dtype=np.float32)[:, -1:]
        d = xf - mean
        q = (d * d) * cof
        var = np.add.accumulate(q, axis=1, dtype=np.float32)[:, -1:]
        ve = var + eps
        s = np.sqrt(ve)
        rstd = np.float32(1) / s
        steps = [terms, mean, d, d * d, q, var, ve, s, rstd, d * rstd]
        if g is not None:
            steps.append(steps[-1] * g)
        if b is not None:
            steps.append(steps[-1] + b)
        y = steps[-1].astype(np.float16)
    return y, not all(np.isfinite(t).all() for t in steps + [y])


def _softmax_oracle(x, sub16):
    """(fp16 result, some step Inf or NaN) of Softmax's steps on fp16 rows x: m = max, d = x - m (rounded to fp16:
    TBE), e = exp(d) (the float64 exp rounded once), in-order sum, e / sum; numpy float32 operations."""
    with np.errstate(all="ignore"):
        xf = x.astype(np.float32)
        d = xf - xf.max(axis=1, keepdims=True)
        if sub16:
            d = d.astype(np.float16).astype(np.float32)
        e = np.exp(d.astype(np.float64)).astype(np.float32)
        s = np.add.accumulate(e, axis=1, dtype=np.float32)[:, -1:]
        q = e / s
        y = q.astype(np.float16)
    return y, not all(np.isfinite(t).all() for t in (d, e, s, q, y))


@_HW
def test_f16_kernels_hand_back_every_non_finite_input_against_the_oracle():
    """The fp16 one-pass LayerNorm and Softmax kernels (and the float32 Softmax rows they share) test neither the
    inputs' bits, nor exp(d), nor var and sqrt(ve) (kernels/composite.py: implied by the checks kept): a NaN, Inf
    or -Inf in a row of an 8-block or a row alone, overflow through gamma, and finite hostile rows, each against the
    status (and on finite data the bits) of the steps computed one by one in numpy."""
    from ascend_emu.kernels import composite as kc
    from ascend_emu.ops import sourced as so

    rng = np.random.default_rng(4647)
    n = 24
    base = (rng.standard_normal((ROWS, n)) * 3).astype(np.float16)
    base[6] = 0.0
    base[6, ::2] = -0.0
    g = (rng.standard_normal(n) * 0.5 + 1).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    huge = g.copy()
    huge[3] = 3e38
    ext = base.copy()
    ext[5, :2] = [65504.0, -65504.0]            # the extremes: d = -131008, whose fp16 is -Inf (TBE only)
    cases = [base, ext]
    for i, r in enumerate(PLACES):
        for v in (np.nan, np.inf, -np.inf):
            x = base.copy()
            x[r, (i * 5) % n] = v
            cases.append(x)
    cof, eps = np.float32(1 / n), np.float32(1e-5)
    plain, nan_tab = so._exp_table(False, True), so._exp_table_nonfinite_nan(True)
    for x in cases:
        xb = x.view(np.uint16)
        for gg, bb in ((g, b), (huge, None), (None, b)):
            want, bad = _ln_oracle(x, gg, bb, cof, eps)
            ob = np.empty_like(xb)
            ok = kc.layer_norm_rows_f16(xb, np.zeros(0, np.float32) if gg is None else gg,
                                        np.zeros(0, np.float32) if bb is None else bb, ob, cof, eps, kc.RSTD_DIV)
            assert ok == (not bad)
            if ok:
                np.testing.assert_array_equal(ob, want.view(np.uint16))
        for sub, tab in ((kc.SUB_F32, np.zeros(0, np.float32)), (kc.SUB_F16_HW, plain), (kc.SUB_F16_HW, nan_tab)):
            want, bad = _softmax_oracle(x, sub != kc.SUB_F32)
            ob = np.empty_like(xb)
            assert kc.softmax_rows_f16(xb, ob, sub, True, tab) == (not bad)
            y = np.empty(x.shape, np.float32)
            assert kc.softmax_rows(x.astype(np.float32), y, sub, True, tab) == (not bad)
            if not bad:
                np.testing.assert_array_equal(ob, want.view(np.uint16))

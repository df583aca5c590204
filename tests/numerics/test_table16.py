"""The lookup-table path of the 16-bit unary ops against the vector kernel it tabulates.

Every variant (op code, format, overflow and subnormal codes, float64 or float32 evaluation, the
op's constant) and every one of the 65,536 input patterns: the table's result bits equal the
kernel's (``kernels.vector.unary16`` on all patterns at once), and each pattern's status equals
the kernel's status for that pattern alone. The gather then returns, for any array, what the
kernel returns. The oracle tests of tests/numerics/test_vector.py run through the table path too
(65,536 elements reach the table threshold).
"""
from __future__ import annotations

import itertools

import numpy as np
import numba
import pytest
from numba import njit

from ascend_emu.kernels import table16 as kt
from ascend_emu.kernels import vector as kv
from ascend_emu.numerics import unary_tables, vector

ALL16 = np.arange(65536, dtype=np.uint16)
CODES = list(range(kv.FIRST_STEPPED + 9))
assert kv.RSQRT_F32 == CODES[-1]  # a new op code must be added to the variants here


def _alphas(code):
    if code == kv.LEAKY_RELU:
        return (0.199951171875, 0.0, -0.0, 0.333251953125, -1.5)
    if code == kv.TANH_TBE:
        return (2.0 ** -14, 2.0 ** -126)
    return (0.0,)


@njit(cache=True)
def _one_by_one(code, idx, bf16, ov, sc, use64, alpha):
    """Status of the vector kernel on each pattern idx[k] alone."""
    st = np.empty(idx.size, dtype=np.int64)
    x = np.empty(1, dtype=np.uint16)
    out = np.empty(1, dtype=np.uint16)
    for k in range(idx.size):
        x[0] = idx[k]
        st[k] = kv.unary16(code, x, out, bf16, ov, sc, use64, alpha)
    return st


def _check_variant(code, bf16, ov, sc, use64, alpha):
    what = f"code {code} bf16 {bf16} overflow {ov} subnormal {sc} use64 {use64} alpha {alpha}"
    table = kt.unary16_table(code, bf16, ov, sc, use64, alpha)
    want = np.empty(65536, dtype=np.uint16)
    want_st = kv.unary16(code, ALL16, want, bf16, ov, sc, use64, alpha)
    bits = (table & 0xFFFF).astype(np.uint16)
    status = (table >> 16).astype(np.int64)
    bad = np.flatnonzero(bits != want)
    assert bad.size == 0, f"{what}: {bad.size} results differ, first at pattern {bad[:4]}"
    quiet = ALL16[status == 0]
    # the kernel's status of a set is the OR of its elements': 0 on the quiet set proves each is 0
    assert kv.unary16(code, quiet, np.empty_like(quiet), bf16, ov, sc, use64, alpha) == 0, what
    loud = ALL16[status != 0]
    threads = numba.get_num_threads()
    numba.set_num_threads(1)  # a 1-element call on a thread pool would spend its time waking the workers
    try:
        each = _one_by_one(code, loud, bf16, ov, sc, use64, alpha)
    finally:
        numba.set_num_threads(threads)
    assert np.array_equal(each, status[loud]), what
    # the gather: whole space, and a shuffled array with repeats across chunks
    out = np.empty(65536, dtype=np.uint16)
    assert kt.gather16(table, ALL16, out) == want_st and np.array_equal(out, want), what
    return table


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("code", CODES)
def test_table_equals_kernel_on_every_pattern(code, bf16):
    for ov, sc, use64 in itertools.product((0, 1), (0, 1), (False, True)):
        for alpha in _alphas(code):
            _check_variant(code, bf16, ov, sc, use64, alpha)


def test_gather_over_chunks_matches_the_kernel():
    rng = np.random.default_rng(17)
    x = rng.integers(0, 65536, 300_001, dtype=np.uint16)
    for code in (kv.EXP, kv.GELU_TBE_V220, kv.SIGMOID_TBE):
        table = kt.unary16_table(code, False, 0, 0, True, 0.0)
        want = np.empty_like(x)
        got = np.empty_like(x)
        assert kt.gather16(table, x, got) == kv.unary16(code, x, want, False, 0, 0, True, 0.0)
        assert np.array_equal(got, want)
        tame = x[(x & 0x7C00) < 0x4800]  # finite, |x| < 8: no status anywhere
        assert kt.gather16(table, tame, np.empty_like(tame)) == 0
        assert kt.gather16(table, x[:0], np.empty(0, np.uint16)) == 0


def test_wrapper_switches_to_the_table_with_the_same_results():
    unary_tables.clear()
    rng = np.random.default_rng(3)
    small = rng.standard_normal(40_000).astype(np.float16)
    first, st1 = vector("tanh", small)  # direct kernel: 40,000 elements seen
    assert not unary_tables._tables
    second, st2 = vector("tanh", small)  # 80,000 seen: the table is built and used
    assert len(unary_tables._tables) == 1
    assert np.array_equal(first.view(np.uint16), second.view(np.uint16)) and st1 == st2 == 0
    # the constant is part of the key, by its bits: leaky_relu with alpha 0.0 and -0.0 differ
    x = np.full(70_000, -1.0, dtype=np.float16)
    pos, _ = vector("leaky_relu", x, alpha=0.0)
    neg, _ = vector("leaky_relu", x, alpha=-0.0)
    assert not np.signbit(neg[0]) and np.signbit(pos[0])
    unary_tables.clear()


def test_table_cache_is_bounded():
    unary_tables.clear()
    for k in range(unary_tables.MAX_TABLES + 3):
        unary_tables.table(kv.LEAKY_RELU, False, 0, 0, True, float(k) / 64)
    assert len(unary_tables._tables) == unary_tables.MAX_TABLES
    unary_tables.clear()

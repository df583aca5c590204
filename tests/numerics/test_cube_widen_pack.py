"""A contiguous fp16 B is widened straight into the fast kernel's slabs (kernels/cube/operands.widen_pack_f16,
numerics/cube_core._widen_pack_ok): every fp16 pattern gives the slabs of widen_operands then pack_b (the route it
replaced), and products give that route's bits and status and the oracle's (tests/naive_cube.py) on hostile data."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels import cube as kcube
from ascend_emu.kernels.cube import epilogue as ke
from ascend_emu.kernels.cube.tree16 import _tail_columns
from ascend_emu.numerics import cube, cube_core

try:
    from . import naive_cube as naive
except ImportError:
    import naive_cube as naive

pytestmark = pytest.mark.skipif(not ke.HW_HALF, reason="the one-pass widening runs on fp16 hardware-conversion hosts")


def _old_slabs(w, flush):
    nb, K, N = w.shape
    v = np.empty(w.shape, np.float32)
    kcube.widen_operands(w.view(np.uint16).reshape(-1), v.reshape(-1).view(np.uint32), False, flush, ke.HW_HALF)
    Bp = kcube.empty_slabs(kcube.slab_shape(nb, N, cube_core._kp(K)))
    Bp[...] = np.float32(7.5)   # never read past the 2x2 block edge: compared only up to it
    kcube.pack_b(cube_core._padded(v, 1, cube_core._kp(K)), Bp)
    return Bp


@pytest.mark.parametrize("flush", [False, True], ids=["keep", "flush"])
@pytest.mark.parametrize("shape", [(1, 256, 256), (2, 225, 300), (1, 37, 1100)], ids=["square", "odd_k", "tiles"])
def test_every_fp16_pattern_packs_as_widen_then_pack_b(shape, flush):
    nb, K, N = shape
    # every pattern (Inf, NaNs with payloads, signalling ones, subnormals, -0) once per 65536 values, shuffled
    bits = (np.arange(nb * K * N, dtype=np.uint32) * 7 % (1 << 16)).astype(np.uint16)
    w = bits.view(np.float16).reshape(shape)
    old = _old_slabs(w, flush)
    new = kcube.empty_slabs(old.shape)
    new[...] = np.float32(-3.25)
    kcube.widen_pack_f16(w.view(np.uint16), new, flush)
    for jt in range(old.shape[1]):
        jn = min(N, (jt + 1) * kcube.NC) - jt * kcube.NC
        tc = _tail_columns(jn)
        assert np.array_equal(new[:, jt, ..., :tc].view(np.uint32), old[:, jt, ..., :tc].view(np.uint32)), jt


def _hostile(rng, shape, big=False):
    """fp16 over every binade (subnormals too), both signs, signed zeros, NaN-free; Infs in the first row only."""
    x = (rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-25.0, 6.0, shape))).astype(np.float16)
    flat = x.reshape(-1)
    flat[rng.random(flat.size) < 0.03] = 0.0
    flat[rng.random(flat.size) < 0.03] = -0.0
    x[..., 0, 3] = np.inf
    x[..., 0, 5] = -np.inf
    return x


KWS = [{}, {"out_dtype": "float32"}, {"out_dtype": "float32", "subnormals": "flush"}, {"overflow_mode": "saturation"},
       {"subnormals": "flush", "overflow_mode": "saturation"}]


def _count(monkeypatch):
    calls = []
    real = kcube.widen_pack_f16
    monkeypatch.setattr(cube_core._k, "widen_pack_f16", lambda *a: calls.append(1) or real(*a), raising=True)
    return calls


def test_matches_oracle(monkeypatch):
    rng = np.random.default_rng(21)
    M, K, N = 8, 200, 40
    a, w = _hostile(rng, (M, K)), _hostile(rng, (K, N))
    a[2, :] = np.float16(3000.0)   # a row whose fp16 outputs overflow
    w[7, 9] = np.float16(np.nan)
    calls = _count(monkeypatch)
    for kw in KWS + [{"bias": rng.normal(size=N).astype(np.float32)}]:
        ref, rst = naive.matmul(a, w, **kw)
        calls.clear()
        ours, st = cube.matmul(a, w, **kw)
        assert calls == [1]
        u = np.uint16 if ours.itemsize == 2 else np.uint32
        with np.errstate(invalid="ignore"):
            nan_o, nan_r = np.isnan(ours.astype(np.float64)), np.isnan(ref.astype(np.float64))
        assert (nan_o == nan_r).all() and np.array_equal(ours.view(u)[~nan_o], ref.view(u)[~nan_r]), kw
        assert st == rst, kw


@pytest.mark.parametrize("M, K, N, stacks", [(32, 512, 512, 0), (32, 250, 1100, 0), (16, 64, 96, 3)],
                         ids=["dense", "odd_k_tiles", "stacks"])
def test_matches_the_old_route(monkeypatch, M, K, N, stacks):
    rng = np.random.default_rng(M + K + N)
    lead = (stacks,) if stacks else ()
    a, w = _hostile(rng, lead + (M, K)), _hostile(rng, lead + (K, N))
    a[..., 2, :] = np.float16(3000.0)
    w[..., 1, 1] = np.float16(np.nan)
    calls = _count(monkeypatch)
    for kw in KWS:
        def run(ok):
            monkeypatch.setattr(cube_core, "_widen_pack_ok", ok)
            return cube.batch_matmul(a, w, **kw) if stacks else cube.matmul(a, w, **kw)
        calls.clear()
        old = run(lambda *x: False)
        new = run(_OK)
        assert calls == [1]
        u = np.uint16 if old[0].itemsize == 2 else np.uint32
        assert np.array_equal(new[0].view(u), old[0].view(u)), kw   # NaN payloads too
        assert new[1] == old[1], kw
        if kw == {}:
            assert old[1] & 0x100


_OK = cube_core._widen_pack_ok

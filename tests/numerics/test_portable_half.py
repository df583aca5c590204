"""A build without the CPU's fp16 conversion (kernels/cast.py ``HW_HALF`` False: no F16C, or a portable build with
``NUMBA_CPU_NAME`` set) compiles and runs the fp16 kernels: their ``hw`` branches are compiled there too (``hw`` is
an argument), and LLVM lowered their conversions to soft-float calls (``__truncsfhf2``, ``__extendhfsf2``) that
Numba's JIT cannot link: the process aborted (review of session 21). ``f32_to_f16_hw`` / ``f16_to_f32_hw`` now
compile to the software conversions there. The subprocess's results (a generic build) are the host's bit for bit."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from numba import njit

from ascend_emu.kernels import cast

_JOB = """
import sys
import numpy as np
from ascend_emu.kernels import cast
from ascend_emu.numerics import cube
assert not cast.HW_HALF
d = dict(np.load(sys.argv[1]))
out = {}
out["conv"] = cube.conv2d(d["x"], d["w"], strides=(1, 1), padding="SAME", dilations=(1, 1))[0]
out["conv16w"] = cube.conv2d(d["x"], d["w"].astype(np.float16), strides=(1, 1), padding="SAME", dilations=(1, 1))[0]
out["mm16"] = cube.matmul(d["a"], d["b"])[0]
out["mm32"] = cube.matmul(d["a"], d["b"], out_dtype="float32")[0]
np.savez(sys.argv[2], **out)
"""


def _operands():
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 8, 8, 16)).astype(np.float16)
    x[0, 0, 0, :4] = [np.float16(6e-8), -0.0, np.float16(65504), np.float16(-3e-5)]
    a, b = (rng.standard_normal((64, 512)) * 8).astype(np.float16), (rng.standard_normal((512, 512)) * 8).astype(np.float16)
    a[0], b[:, 0] = 300, 300     # an output past 65504
    return {"x": x, "w": rng.standard_normal((3, 3, 16, 32)).astype(np.float32),
            "a": a, "b": b}


def test_a_generic_build_runs_the_fp16_kernels_with_the_hosts_bits(tmp_path):
    from ascend_emu.numerics import cube

    if not cast.HW_HALF:
        pytest.skip("this host itself has no fp16 conversion: the rest of the suite runs that build")
    d = _operands()
    np.savez(tmp_path / "in.npz", **d)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), NUMBA_CPU_NAME="generic")
    r = subprocess.run([sys.executable, "-c", _JOB, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    theirs = np.load(tmp_path / "out.npz")
    ours = {"conv": cube.conv2d(d["x"], d["w"], strides=(1, 1), padding="SAME", dilations=(1, 1))[0],
            "conv16w": cube.conv2d(d["x"], d["w"].astype(np.float16), strides=(1, 1), padding="SAME",
                                   dilations=(1, 1))[0],
            "mm16": cube.matmul(d["a"], d["b"])[0], "mm32": cube.matmul(d["a"], d["b"], out_dtype="float32")[0]}
    for name, y in ours.items():
        assert y.dtype == theirs[name].dtype and y.shape == theirs[name].shape, name
        assert np.array_equal(y.view(np.uint8), theirs[name].view(np.uint8)), name
    assert np.isinf(ours["mm16"]).any()    # (fp16 outputs overflowed: the conversion's overflow exercised)


_soft_narrow = njit(cast._soft_f32_to_f16)
_soft_widen = njit(cast._soft_f16_to_f32)


@njit
def _narrow_all(xs, out, soft):
    for i in range(xs.size):
        out[i] = _soft_narrow(xs[i]) if soft else cast.f32_to_f16_hw(xs[i])


@njit
def _widen_all(bs, out, soft):
    for i in range(bs.size):
        out[i] = _soft_widen(bs[i]) if soft else cast.f16_to_f32_hw(bs[i])


@pytest.mark.skipif(not cast.HW_HALF, reason="the oracle is the host's conversion instruction")
def test_the_software_conversions_are_the_instructions():
    """Every fp16 pattern widened, and float32 values around every fp16 value (the value, the ties between
    neighbours and one float32 ulp either side, overflow past 65504, subnormals, signed zeros, Inf) narrowed: the
    software conversions give the instruction's bits (a NaN: a quiet NaN of its sign both ways; payloads aside)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    soft, hw = np.empty(bits.size, np.float32), np.empty(bits.size, np.float32)
    _widen_all(bits, soft, True)
    _widen_all(bits, hw, False)
    finite = (bits & 0x7C00) != 0x7C00
    assert np.array_equal(soft.view(np.uint32)[finite], hw.view(np.uint32)[finite])
    assert np.array_equal(np.isnan(soft), np.isnan(hw)) and np.array_equal(np.signbit(soft), np.signbit(hw))
    assert np.array_equal(soft.view(np.uint32)[~finite & ~np.isnan(hw)], hw.view(np.uint32)[~finite & ~np.isnan(hw)])
    v = hw[finite & np.isfinite(hw)].astype(np.float64)
    v = np.unique(v)
    mids = (v[:-1] + v[1:]) / 2         # the ties (exact in float32: fp16 has 11 significand bits)
    f = np.concatenate([v, mids, np.float32(65504 + 16), np.float32(65520), np.float32(1e6), np.float32(np.inf),
                        np.float32(3e-8), np.float32(2.9e-8)], axis=None).astype(np.float32)
    f = np.concatenate([f, -f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))])
    s16, h16 = np.empty(f.size, np.uint16), np.empty(f.size, np.uint16)
    _narrow_all(f, s16, True)
    _narrow_all(f, h16, False)
    assert np.array_equal(s16, h16)
    assert _soft_narrow(np.float32(np.nan)) & 0x7E00 == 0x7E00 and np.isnan(_soft_widen(np.uint16(0x7E00)))

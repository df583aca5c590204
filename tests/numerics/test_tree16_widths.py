"""The tree16 micro-kernel's two emissions give the same bits (kernels/cube/tree16.py ``VEC``): 8-lane vectors,
one row at a time, on an x86 host without AVX-512; 16-lane vectors (the 2x2 block) elsewhere and in a portable
build (``NUMBA_CPU_NAME`` set). A host runs only its own emission, so this test runs the other one in a
subprocess compiled for the host's CPU by name (a portable build: 16 lanes) and compares products and an
implicit-GEMM convolution (the ``_tab`` micro-kernel) bit for bit: fp16 overflow, signed zeros, subnormals
and rounding ties, no NaN: where NaNs of both signs
meet, the sign of the NaN that comes out may differ between the two (NUMERICS.md section 3)."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest

from ascend_emu.numerics import cube

# the module (the package's ``tree16`` is the kernel function of that name)
tree16 = importlib.import_module("ascend_emu.kernels.cube.tree16")

_JOB = r"""
import importlib
import sys
import numpy as np
from ascend_emu.numerics import cube
tree16 = importlib.import_module("ascend_emu.kernels.cube.tree16")
assert tree16.VEC == tree16.LANES, tree16.VEC
d = dict(np.load(sys.argv[1]))
out = {}
for name, kw in (("mm16", {}), ("mm32", {"out_dtype": "float32"}), ("mmbias", {"bias": d["bias"]})):
    out[name] = cube.matmul(d["a"], d["b"], **kw)[0]
out["conv"] = cube.conv2d(d["x"], d["w"], strides=(1, 1), padding="SAME", dilations=(1, 1), out_dtype="float32")[0]
np.savez(sys.argv[2], **out)
"""


def _operands():
    rng = np.random.default_rng(1616)

    def values(shape, scale):
        v = rng.standard_normal(shape) * scale
        flat = v.reshape(-1)
        idx = rng.choice(flat.size, flat.size // 50, replace=False)
        flat[idx] = rng.choice([65504.0, -65504.0, 0.0, -0.0, 6e-8, -6e-8, 2.0 ** -14], idx.size)
        return v.astype(np.float16)

    return {"a": values((133, 200), 4.0), "b": values((200, 97), 4.0),
            "bias": rng.standard_normal(97).astype(np.float32),
            "x": values((2, 12, 32, 16), 2.0), "w": values((3, 3, 16, 40), 0.5)}


def test_the_8_and_16_lane_micro_kernels_give_the_same_bits(tmp_path, monkeypatch):
    if tree16.VEC == tree16.LANES:
        pytest.skip("this host runs the 16-lane micro-kernel only (it has AVX-512, or is not x86)")
    from llvmlite import binding

    d = _operands()
    np.savez(tmp_path / "in.npz", **d)
    env = dict(os.environ, NUMBA_CPU_NAME=binding.get_host_cpu_name(), NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", _JOB, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    wide = np.load(tmp_path / "out.npz")
    from ascend_emu.numerics import conv as nconv

    tab = []
    real = nconv._k.matmul_tree16_tab
    monkeypatch.setattr(nconv._k, "matmul_tree16_tab", lambda *a: (tab.append(1), real(*a))[1])
    ours = {"mm16": cube.matmul(d["a"], d["b"])[0], "mm32": cube.matmul(d["a"], d["b"], out_dtype="float32")[0],
            "mmbias": cube.matmul(d["a"], d["b"], bias=d["bias"])[0],
            "conv": cube.conv2d(d["x"], d["w"], strides=(1, 1), padding="SAME", dilations=(1, 1),
                                out_dtype="float32")[0]}
    assert tab, "the convolution did not take the _tab micro-kernel"
    for name, y in ours.items():
        assert y.dtype == wide[name].dtype and y.shape == wide[name].shape, name
        assert not np.isnan(y).any() and np.isinf(y).any() == (y.dtype == np.float16), name
        assert np.array_equal(y.view(np.uint8), wide[name].view(np.uint8)), name

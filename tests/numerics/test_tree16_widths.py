"""The tree16 micro-kernel's two emissions give the same bits (kernels/cube/tree16.py ``VEC``): 8-lane vectors,
one row at a time, on an x86 host with AVX2 but no AVX-512; 16-lane vectors (the 2x2 block) elsewhere and in a
portable build (``NUMBA_CPU_NAME`` set). A host runs only its own emission, so this test runs the other one in a
subprocess: on an AVX2 host compiled for the host's CPU by name (a portable build: 16 lanes), on an AVX-512 host with
LLVM's host features seen without AVX-512 (8 lanes). It compares products, an implicit-GEMM convolution (the
``_tab`` micro-kernel), two weight gradients (the ``_gather`` micro-kernel's 32-column groups of two halves and
first halves alone) and an input gradient (its pixel classes as the gather's rows) bit for bit: fp16 overflow,
signed zeros, subnormals and rounding ties, no NaN: where NaNs of both signs meet, the sign of the NaN that comes
out may differ between the two (NUMERICS.md section 3)."""
from __future__ import annotations

import importlib
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from ascend_emu.numerics import cube

# the module (the package's ``tree16`` is the kernel function of that name)
tree16 = importlib.import_module("ascend_emu.kernels.cube.tree16")

# the weight gradients of the gather micro-kernel's half groups: Cout 16 with the taps as rows (one group, its first
# half alone), and 16 channels at stride 2 (9 tap-row halves paired into 5 groups, the last alone)
DW = [("dw16", "x3", "dy16", (1, 1), ((1, 1), (1, 1))), ("dw2", "x16", "dy32", (2, 2), ((0, 1), (0, 1)))]

# on an AVX-512 host the subprocess is the 8-lane one: LLVM's host features seen without AVX-512 (tree16 decides VEC
# from them at import), compiled for the host as the AVX2 host's own build is for it
_NARROW = r"""
from llvmlite import binding as _b
_features = _b.get_host_cpu_features


def _no_avx512():
    f = _features()
    for k in list(f):
        if k.startswith("avx512"):
            f[k] = False
    return f


_b.get_host_cpu_features = _no_avx512
"""

_JOB = "DW = " + repr(DW) + r"""
import importlib
import sys
import numpy as np
from ascend_emu.numerics import cube
tree16 = importlib.import_module("ascend_emu.kernels.cube.tree16")
assert tree16.VEC == int(sys.argv[3]), (tree16.VEC, sys.argv[3])
d = dict(np.load(sys.argv[1]))
out = {}
for name, kw in (("mm16", {}), ("mm32", {"out_dtype": "float32"}), ("mmbias", {"bias": d["bias"]})):
    out[name] = cube.matmul(d["a"], d["b"], **kw)[0]
out["conv"] = cube.conv2d(d["x"], d["w"], strides=(1, 1), padding="SAME", dilations=(1, 1), out_dtype="float32")[0]
for name, xk, dyk, s, p in DW:
    out[name] = cube.conv2d_backprop_filter(d[xk], d[dyk], (3, 3), s, p, (1, 1), out_dtype="float32")[0]
out["dx"] = cube.conv2d_backprop_input(d["dy32"], d["w32"], (2, 2), ((1, 2), (1, 2)), (1, 1), out_dtype="float32")[0]
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
            "x": values((2, 12, 32, 16), 2.0), "w": values((3, 3, 16, 40), 0.5),
            "x3": values((2, 8, 16, 3), 2.0), "dy16": values((2, 8, 16, 16), 2.0),
            "x16": values((2, 8, 32, 16), 2.0), "dy32": values((2, 4, 16, 32), 2.0), "w32": values((3, 3, 16, 32), 0.5)}


def test_the_8_and_16_lane_micro_kernels_give_the_same_bits(tmp_path, monkeypatch):
    from llvmlite import binding

    features = binding.get_host_cpu_features()
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    if tree16.VEC == 8:
        job, other = _JOB, tree16.LANES   # the portable build: 16 lanes
        env["NUMBA_CPU_NAME"] = binding.get_host_cpu_name()
    elif platform.machine().lower() in ("x86_64", "amd64") and features.get("avx2", False):
        job, other = _NARROW + _JOB, 8
        env.pop("NUMBA_CPU_NAME", None)
    else:
        pytest.skip("no 8-lane emission on this host (not an x86 host with AVX2)")
    d = _operands()
    np.savez(tmp_path / "in.npz", **d)
    r = subprocess.run([sys.executable, "-c", job, str(tmp_path / "in.npz"), str(tmp_path / "out.npz"), str(other)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    wide = np.load(tmp_path / "out.npz")
    from ascend_emu.numerics import conv as nconv

    tab, gather = [], []
    real, real_g = nconv._k.matmul_tree16_tab, nconv._k.matmul_tree16_gather
    monkeypatch.setattr(nconv._k, "matmul_tree16_tab", lambda *a: (tab.append(1), real(*a))[1])
    monkeypatch.setattr(nconv._k, "matmul_tree16_gather", lambda *a: (gather.append(a[9].shape), real_g(*a))[1])
    ours = {"mm16": cube.matmul(d["a"], d["b"])[0], "mm32": cube.matmul(d["a"], d["b"], out_dtype="float32")[0],
            "mmbias": cube.matmul(d["a"], d["b"], bias=d["bias"])[0],
            "conv": cube.conv2d(d["x"], d["w"], strides=(1, 1), padding="SAME", dilations=(1, 1),
                                out_dtype="float32")[0]}
    for name, xk, dyk, s, p in DW:
        ours[name] = cube.conv2d_backprop_filter(d[xk], d[dyk], (3, 3), s, p, (1, 1), out_dtype="float32")[0]
    assert tab, "the convolution did not take the _tab micro-kernel"
    assert gather == [(27, 16), (32, 144)], gather   # both weight gradients took the gather micro-kernel
    ours["dx"] = cube.conv2d_backprop_input(d["dy32"], d["w32"], (2, 2), ((1, 2), (1, 2)), (1, 1),
                                            out_dtype="float32")[0]
    assert gather[2:] == [(512, 16)] * 4, gather   # the input gradient: its four pixel classes took the gather
    for name, y in ours.items():
        assert y.dtype == wide[name].dtype and y.shape == wide[name].shape, name
        assert not np.isnan(y).any() and np.isinf(y).any() == (y.dtype == np.float16), name
        assert np.array_equal(y.view(np.uint8), wide[name].view(np.uint8)), name


@pytest.mark.parametrize("i0, i1, j0, jn", [(0, 128, 0, 512), (128, 255, 512, 300), (0, 5, 0, 10), (6, 8, 16, 33)])
def test_tile_init_and_store_follow_the_tile_layout(i0, i1, j0, jn):
    """A work item's tile (kernels/cube/tree16.py): element (p, g, s, l) is output row i0 + 2p + (s & 1), column
    j0 + 32g + 16(s >> 1) + l. ``_tile_init`` fills it from the bias (per column: past the last column the last
    one's; per row: an odd last row repeats the row before), ``_tile_store`` writes the rows and columns inside
    the item, by whole 16-column vectors where out's columns are contiguous and one by one where not."""
    rng = np.random.default_rng(i1 + jn)
    npair = (i1 - i0 + 1) // 2
    ng = tree16._tail_columns(jn) // 32
    p, g, s, l = np.indices((npair, ng, 4, 16))
    rows = np.minimum(i0 + 2 * p + (s & 1), i1 - 1)
    cols = 32 * g + 16 * (s >> 1) + l
    bias = rng.standard_normal((2, 1024)).astype(np.float32)
    tile = np.empty((npair, ng, 4, 16), np.float32)
    tree16._tile_init(tile, bias, 1, False, i0, i1, j0, jn, npair, ng)
    np.testing.assert_array_equal(tile, bias[1, j0 + np.minimum(cols, jn - 1)])
    tree16._tile_init(tile, bias, 0, True, i0, i1, j0, jn, npair, ng)
    np.testing.assert_array_equal(tile, bias[0, rows])
    tile = rng.standard_normal((npair, ng, 4, 16)).astype(np.float32)
    inside = (i0 + 2 * p + (s & 1) < i1) & (cols < jn)
    for step in (1, 3):
        whole = np.full((300, 1024 * step), -7.0, np.float32)
        out = whole[:, ::step]
        tree16._tile_store(tile, out, i0, i1, j0, jn, npair, ng)
        want = np.full((300, 1024), -7.0, np.float32)
        want[rows[inside], j0 + cols[inside]] = tile[inside]
        np.testing.assert_array_equal(out, want)
        skipped = np.ones(whole.shape[1], bool)
        skipped[::step] = False
        assert (whole[:, skipped] == -7.0).all()   # nothing written between the view's columns
        back = np.full((300, 1024), -7.0, np.float32)[::-1, ::-1]   # negative strides: no 16-column vectors
        tree16._tile_store(tile, back, i0, i1, j0, jn, npair, ng)
        np.testing.assert_array_equal(back, want)

"""The implicit GEMMs of the convolutions (kernels/cube matmul_tree16_gather: the micro-kernel reads the
patches where they lie in the padded input, no im2col matrix or packed patch slabs) against the packed
products they replace, bit for bit and status for status:

- conv2d with the pixels as rows and channels in runs of 16 (numerics.conv._runs16), against the im2col
  product; conv2d with the pixels as columns at stride 1 along rows of 16k pixels (matmul_tree16_tab: B's
  rows, the taps x channels, read from planar x in place), against the packed im2col (im2col_packed);
- conv2d_backprop_filter with 16 output pixels of a row at a compiled stride (numerics.conv_grad._filter_grad_gather),
  and with a few channels at stride 1 along rows (the taps x channels as rows, read from planar x; dy's rows
  in place), against the packed patches, also split over the cube cores;
- conv2d_backprop_input's pixel classes (matmul_tree16_tab: B's rows, dy's channels, read from planar dy in
  place) where every kept K block is 16 channels of one tap and grid rows are runs of 16 pixels, against
  the packed class patches (dx_class_packed).

The replaced paths run with ``numerics.conv._IMPLICIT`` False.

NaN operands (either, both signs) keep the packed products: which of two NaNs meeting in a sum comes out
depends on the compiled code's operand order (tested: the same NaNs as before). Hostile data: +-Inf, 65504 and sums beyond it, fp16 subnormals,
-0, saturation, flush, float32 / bf16 / fp32 operands, bias and a fused epilogue, odd shapes, batch 1,
strides 1 and 2, SAME / VALID / explicit pads, dilations, both K orders. Each test also counts that the
implicit kernel really ran, so a path that always declines fails too.
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.numerics import conv as nconv
from ascend_emu.numerics import memo
from ascend_emu.numerics import conv_grad as ngrad
from ascend_emu.numerics.cube_core import Epilogue
from ascend_emu.numerics.policy import CubeModel, bfloat16

from tests.numerics.test_cube_backprop import _dz_pads, _geometry, _launch

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


def _values(rng, shape, kind, scale=1.0, nan=False):
    x = rng.standard_normal(shape) * scale
    f = x.reshape(-1)
    if kind == "hostile":
        idx = rng.choice(f.size, max(2, f.size // 12), replace=False)
        specials = [np.inf, -np.inf, 0.0, -0.0, 6e-8, -3e-8, 65504.0, -65504.0, 7e4, -7e4, 3e-39, 2.0 ** -20]
        f[idx] = rng.choice(specials + ([np.nan, -np.nan] * 3 if nan else []), idx.size)
    elif kind == "big":   # sums beyond fp16's range
        x *= 300.0
    return x


class _Ran:
    """Counts the calls of an implicit kernel (wraps kernels.cube.<name> as conv.py reads it)."""

    def __init__(self, monkeypatch, name="matmul_tree16_gather"):
        self.n = 0
        orig = getattr(nconv._k, name)

        def wrapped(*a):
            self.n += 1
            return orig(*a)
        monkeypatch.setattr(nconv._k, name, wrapped)


def _same(got, want, msg):
    assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape, msg
    np.testing.assert_array_equal(got[0].view(np.uint8), want[0].view(np.uint8), err_msg=msg)
    assert got[1] == want[1], (msg, hex(got[1]), hex(want[1]))


# ------------------------------------------------------------------------------ conv2d

FORWARD = [((2, 9, 11, 16), (3, 3, 16, 32), dict(strides=(2, 2), padding="SAME")),         # the benchmark's layer 2
           ((1, 7, 9, 32), (3, 3, 32, 64), dict(strides=(1, 1), padding="VALID")),
           ((1, 6, 7, 16), (2, 3, 16, 300), dict(strides=(1, 2), padding=[[1, 2], [0, 1]])),  # Cout >= 256: not flipped
           ((2, 8, 6, 16), (3, 2, 16, 32), dict(padding="SAME", dilations=(2, 1))),
           ((1, 5, 6, 20), (3, 3, 20, 32), dict(padding="SAME", model=CubeModel(conv_k_order="c1hwc0")))]
FMODES = [dict(), dict(overflow_mode="saturation"), dict(out_dtype="float32"), dict(operand_dtype="bfloat16"),
          dict(operand_dtype="float32", out_dtype="float32"), dict(subnormals="flush")]


def _forward(monkeypatch, x, w, kw, chain=None):
    def run():
        k = dict(kw)
        if chain is not None:
            k["epilogue"] = Epilogue(chain[0], [x, w] + chain[1], chain[2])
            k["out_dtype"] = "float32"
        return nconv.conv2d(x, w, **k)
    got = run()
    with monkeypatch.context() as m:
        m.setattr(nconv, "_IMPLICIT", False)
        want = run()
    _same(got, want, f"conv2d x {x.shape} {x.dtype} w {w.shape} {kw}")


@pytest.mark.parametrize("kind", ["normal", "hostile", "big"])
@pytest.mark.parametrize("mode", range(len(FMODES)))
def test_conv2d_implicit_gemm_is_the_im2col_product(kind, mode, monkeypatch):
    rng = np.random.default_rng(3100 + 10 * mode + len(kind))
    ran = _Ran(monkeypatch)
    for xs, ws, geo in FORWARD:
        for xdt in (np.float16, np.float32):
            x = _values(rng, xs, kind).astype(xdt)
            w = _values(rng, ws, kind, 0.3).astype(np.float16 if mode != 4 else np.float32)
            bias = _values(rng, ws[3:], "normal").astype(np.float32) if xdt == np.float16 else None
            _forward(monkeypatch, x, w, dict(geo, bias=bias, **FMODES[mode]))
    assert ran.n >= 2 * len(FORWARD)


@pytest.mark.parametrize("where", ["x", "w", "both"])
def test_conv2d_implicit_gemm_with_nan_operands(where, monkeypatch):
    """+NaN and -NaN that can meet in one sum: which comes out depends on the compiled code's operand order,
    so NaN operands take the im2col product (the same NaNs as before)."""
    rng = np.random.default_rng(3200 + len(where))
    ran = _Ran(monkeypatch)
    for xs, ws, geo in FORWARD * 3:
        x = _values(rng, xs, "hostile", nan=where in ("x", "both")).astype(np.float16)
        w = _values(rng, ws, "hostile", 0.3, nan=where in ("w", "both")).astype(np.float16)
        for ov in ("inf_nan", "saturation"):
            _forward(monkeypatch, x, w, dict(geo, out_dtype="float32", overflow_mode=ov))
            # a frozen filter (a replay's constant): its NaN test is memoized (numerics.conv._filter_nan), twice
            wf = memo.freeze(w.copy())
            for _ in range(2):
                _forward(monkeypatch, x, wf, dict(geo, out_dtype="float32", overflow_mode=ov))
    assert ran.n == 0


@pytest.mark.parametrize("kind", ["normal", "hostile"])
def test_conv2d_implicit_gemm_with_a_fused_epilogue(kind, monkeypatch):
    rng = np.random.default_rng(3300)
    ran = _Ran(monkeypatch)
    x = _values(rng, (3, 16, 16, 16), kind).astype(np.float16)
    w = _values(rng, (3, 3, 16, 32), kind, 0.3).astype(np.float16)
    b = _values(rng, (32,), "normal").astype(np.float16)
    for ov in ("inf_nan", "saturation"):
        _forward(monkeypatch, x, w, dict(strides=(2, 2), padding="SAME", overflow_mode=ov),
                 ([("add", (-1, 2))], [b], "float16"))
        _forward(monkeypatch, x, w, dict(strides=(1, 1), padding="SAME", overflow_mode=ov),
                 ([("add", (-1, 2)), ("relu", (-1,))], [b], "float16"))
    assert ran.n == 4


PLANAR = [((2, 8, 16, 3), (3, 3, 3, 16), dict(padding="SAME")),                     # the benchmark's layer 1
          ((1, 5, 32, 5), (3, 2, 5, 24), dict(padding=[[1, 0], [0, 1]])),
          ((2, 9, 16, 4), (2, 3, 4, 8), dict(strides=(2, 1), padding="SAME", dilations=(2, 1))),
          ((1, 4, 16, 8), (1, 1, 8, 16), dict(padding="VALID")),                    # 1x1: the 16-bit im2col path
          ((1, 6, 32, 20), (3, 3, 20, 40), dict(padding="SAME", model=CubeModel(conv_k_order="c1hwc0"))),
          ((1, 6, 15, 3), (3, 3, 3, 16), dict(padding="SAME"))]                     # rows of 15 pixels: declines


@pytest.mark.parametrize("kind", ["normal", "hostile", "big"])
@pytest.mark.parametrize("mode", range(len(FMODES)))
def test_conv2d_planar_implicit_gemm_is_the_packed_im2col_product(kind, mode, monkeypatch):
    """The pixels-as-columns product with B read from planar x in place (stride 1 along rows of 16k pixels)."""
    rng = np.random.default_rng(3900 + 10 * mode + len(kind))
    ran = _Ran(monkeypatch, "matmul_tree16_tab")
    for xs, ws, geo in PLANAR:
        for xdt in (np.float16, np.float32):
            x = _values(rng, xs, kind).astype(xdt)
            w = _values(rng, ws, kind, 0.3).astype(np.float16 if mode != 4 else np.float32)
            bias = _values(rng, ws[3:], "normal").astype(np.float32) if xdt == np.float16 else None
            _forward(monkeypatch, x, w, dict(geo, bias=bias, **FMODES[mode]))
    assert ran.n == 2 * (len(PLANAR) - 1)


def test_conv2d_planar_implicit_gemm_with_a_fused_epilogue_and_nan(monkeypatch):
    rng = np.random.default_rng(4000)
    ran = _Ran(monkeypatch, "matmul_tree16_tab")
    x = _values(rng, (3, 16, 16, 3), "hostile").astype(np.float16)
    w = _values(rng, (3, 3, 3, 16), "hostile", 0.3).astype(np.float16)
    b = _values(rng, (16,), "normal").astype(np.float16)
    for ov in ("inf_nan", "saturation"):
        _forward(monkeypatch, x, w, dict(padding="SAME", overflow_mode=ov), ([("add", (-1, 2))], [b], "float16"))
        _forward(monkeypatch, x, w, dict(padding="SAME", overflow_mode=ov),
                 ([("add", (-1, 2)), ("relu", (-1,))], [b], "float16"))
    assert ran.n == 4
    for where in ("x", "w", "both"):   # NaN operands: the packed product
        xn = _values(rng, (3, 16, 16, 3), "hostile", nan=where != "w").astype(np.float16)
        wn = _values(rng, (3, 3, 3, 16), "hostile", 0.3, nan=where != "x").astype(np.float16)
        _forward(monkeypatch, xn, wn, dict(padding="SAME", out_dtype="float32"))
    assert ran.n == 4


# ------------------------------------------------------------------------------ conv2d_backprop_filter

FILTER = [((2, 8, 32, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),     # the benchmark's layer 2: 32 floats a pixel
          ((1, 6, 16, 16), 3, 3, 16, (1, 1), "SAME", (1, 1)),     # 16 floats a pixel
          ((2, 7, 16, 16), 2, 3, 5, (1, 1), "VALID", (2, 1)),     # Cout 5 (an odd row), dilated rows, OW 14: declines
          ((1, 9, 18, 16), 2, 3, 7, (1, 1), "VALID", (2, 1)),     # OW 16 with dilated rows, Cout 7
          ((1, 5, 31, 32), 3, 3, 48, (1, 2), "SAME", (1, 1)),     # 64 floats a pixel, odd width
          ((3, 4, 16, 48), 1, 3, 3, (1, 1), "SAME", (1, 1)),      # 48 floats a pixel, Cout 3
          ((1, 6, 32, 8), 3, 3, 24, (2, 2), "SAME", (1, 1))]      # tap rows of 24 floats: halves past the run
FMODES_B = [dict(), dict(overflow_mode="saturation"), dict(out_dtype="float32"), dict(subnormals="flush"),
            dict(operand_dtype="bfloat16", out_dtype="bfloat16"), dict(operand_dtype="float32", out_dtype="float32")]


def _filter(monkeypatch, x, dy, KH, KW, strides, pads, dil, seed=None, **kw):
    def run():
        mc = _launch(seed) if seed is not None else None
        return ngrad.conv2d_backprop_filter(x, dy, (KH, KW), strides, pads, dil, multicore=mc, **kw)
    got = run()
    with monkeypatch.context() as m:
        m.setattr(nconv, "_IMPLICIT", False)
        want = run()
    _same(got, want, f"backprop filter x {x.shape} {x.dtype} dy {dy.shape} {dy.dtype} {kw} seed {seed}")


@pytest.mark.parametrize("kind", ["normal", "hostile", "big"])
@pytest.mark.parametrize("mode", range(len(FMODES_B)))
def test_backprop_filter_implicit_gemm_is_the_packed_patches_product(kind, mode, monkeypatch):
    rng = np.random.default_rng(3400 + 10 * mode + len(kind))
    ran = _Ran(monkeypatch)
    for xs, KH, KW, CO, strides, padding, dil in FILTER:
        pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
        dy = _values(rng, (xs[0], OH, OW, CO), kind, 3.0).astype(np.float16)
        for xdt in (np.float16, np.float32):
            x = _values(rng, xs, kind).astype(xdt)
            _filter(monkeypatch, x, dy, KH, KW, strides, pads, dil, **FMODES_B[mode])
    assert ran.n >= 2 * (len(FILTER) - 1)


def test_backprop_filter_gather_tables_per_geometry(monkeypatch):
    """The filter gradient's cached gather tables (conv_grad._gather_blocks) never serve another geometry:
    geometries sharing all but the batch, the stride, Cout or the padded width, interleaved, twice, in other
    Fixpipe modes and over cube cores (other pixel ranges r0): every call the packed patches' bits and statuses."""
    rng = np.random.default_rng(3450)
    ran = _Ran(monkeypatch)
    geos = [((2, 8, 32, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),
            ((3, 8, 32, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),      # another batch
            ((2, 8, 32, 16), 3, 3, 16, (2, 2), "SAME", (1, 1)),      # another Cout
            ((2, 8, 64, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),      # another padded width
            ((2, 8, 32, 16), 3, 3, 32, (1, 1), "SAME", (1, 1)),      # stride 1
            ((2, 8, 32, 32), 3, 3, 32, (2, 2), "SAME", (1, 1))]      # another Cin: the padded shape alone differs
    ngrad._gather_blocks.cache_clear()      # (every geometry's first call makes its entry: order-independent)
    hits = ngrad._gather_blocks.cache_info().hits
    for rnd, modes in enumerate(([1, 0, 3, 2, 4, 0], [3, 1, 0, 4, 2, 1])):
        for gi in (range(len(geos)) if rnd == 0 else reversed(range(len(geos)))):
            xs, KH, KW, CO, strides, padding, dil = geos[gi]
            pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
            mode = FMODES_B[modes[gi]]
            dt = bfloat16 if mode.get("operand_dtype") == "bfloat16" else np.float16
            dy = _values(rng, (xs[0], OH, OW, CO), "hostile", 3.0).astype(dt)
            x = _values(rng, xs, "hostile").astype(dt)
            _filter(monkeypatch, x, dy, KH, KW, strides, pads, dil, seed=gi if rnd and gi % 2 else None, **mode)
    assert ran.n >= 2 * len(geos)
    assert ngrad._gather_blocks.cache_info().hits > hits


@pytest.mark.parametrize("where", ["x", "dy", "both"])
def test_backprop_filter_implicit_gemm_with_nan_operands(where, monkeypatch):
    """NaN operands take the packed patches' product (see test_conv2d_implicit_gemm_with_nan_operands)."""
    rng = np.random.default_rng(3500 + len(where))
    ran = _Ran(monkeypatch)
    for xs, KH, KW, CO, strides, padding, dil in FILTER * 2:
        pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
        x = _values(rng, xs, "hostile", nan=where in ("x", "both")).astype(np.float16)
        dy = _values(rng, (xs[0], OH, OW, CO), "hostile", nan=where in ("dy", "both")).astype(np.float16)
        for kw in (dict(out_dtype="float32"), dict(overflow_mode="saturation")):
            _filter(monkeypatch, x, dy, KH, KW, strides, pads, dil, **kw)
    assert ran.n == 0


def test_backprop_filter_implicit_gemm_over_cube_cores(monkeypatch):
    """Split by whole samples over the cube cores: each core's range starts at a sample, K blocks whole."""
    rng = np.random.default_rng(3600)
    ran = _Ran(monkeypatch)
    for xs, KH, KW, CO, strides, padding, dil in FILTER[:2]:
        xs = (5,) + xs[1:]
        pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
        x = _values(rng, xs, "hostile").astype(np.float16)
        dy = _values(rng, (5, OH, OW, CO), "hostile", 3.0).astype(np.float16)
        for seed in (1, 2, 3):
            _filter(monkeypatch, x, dy, KH, KW, strides, pads, dil, seed=seed)
            _filter(monkeypatch, x, dy, KH, KW, strides, pads, dil, seed=seed, overflow_mode="saturation")
    assert ran.n >= 12


def test_implicit_paths_decline_what_they_cannot_read_in_place():
    """Channels not in runs of 16, or rows of output pixels that are not whole K blocks: the packed paths."""
    assert not nconv._runs16(nconv._k_offsets(3, 3, 3, 34, 1, 1, "hwc"))
    assert nconv._runs16(nconv._k_offsets(3, 3, 16, 34, 1, 1, "hwc"))
    assert nconv._runs16(nconv._k_offsets(3, 3, 32, 34, 1, 1, "c1hwc0"))
    assert ngrad._filter_grad_gather(3, 3, 3, 1, 1, 1, 1, 32, 32) is None       # 3 floats a pixel
    assert ngrad._filter_grad_gather(3, 3, 16, 2, 2, 1, 1, 16, 12) is None      # OW not a multiple of 16
    assert ngrad._filter_grad_gather(3, 3, 16, 2, 2, 1, 2, 16, 16) is None      # dilated columns
    cols, per, slack = ngrad._filter_grad_gather(3, 3, 16, 2, 2, 1, 1, 16, 16)
    assert per == 3 and slack == 0 and cols.size == 144 and cols[48] == 48   # 9 halves: 5 groups, the last alone
    cols, per, slack = ngrad._filter_grad_gather(3, 3, 8, 2, 2, 1, 1, 16, 16)
    assert per == 2 and slack == 8 and cols.size == 72 and cols[24] == 32
    g0, g1 = ngrad._half_offsets(3, 3, 1000)   # tap rows' halves paired across rows; the odd last repeats
    assert list(g0) == [0, 32, 1016, 2000, 2032] and list(g1) == [16, 1000, 1032, 2016, 2032]


TAPS_ROWS = [((2, 9, 16, 3), 3, 3, 16, (1, 1), "SAME", (1, 1)),     # the benchmark's layer 1
             ((1, 8, 18, 5), 2, 3, 32, (2, 1), "VALID", (2, 1)),    # row stride 2, dilated rows
             ((3, 5, 32, 1), 3, 3, 48, (1, 1), "SAME", (1, 1)),
             ((1, 6, 16, 7), 1, 1, 64, (1, 1), "VALID", (1, 1)),
             ((1, 6, 16, 3), 3, 3, 24, (1, 1), "SAME", (1, 1))]     # Cout 24: declines


@pytest.mark.parametrize("kind", ["normal", "hostile", "big"])
@pytest.mark.parametrize("mode", range(len(FMODES_B)))
def test_backprop_filter_taps_as_rows_is_the_packed_patches_product(kind, mode, monkeypatch):
    """A few channels at stride 1 along rows: dw with the taps x channels as rows, x planar, dy in place."""
    rng = np.random.default_rng(4100 + 10 * mode + len(kind))
    ran = _Ran(monkeypatch)
    for xs, KH, KW, CO, strides, padding, dil in TAPS_ROWS:
        pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
        dy = _values(rng, (xs[0], OH, OW, CO), kind, 3.0).astype(np.float16)
        for xdt in (np.float16, np.float32):
            x = _values(rng, xs, kind).astype(xdt)
            _filter(monkeypatch, x, dy, KH, KW, strides, pads, dil, **FMODES_B[mode])
            _filter(monkeypatch, x, dy.astype(np.float32), KH, KW, strides, pads, dil, **FMODES_B[mode])
    assert ran.n == 4 * (len(TAPS_ROWS) - 1)


def test_backprop_filter_taps_as_rows_over_cube_cores_and_with_nan(monkeypatch):
    rng = np.random.default_rng(4200)
    ran = _Ran(monkeypatch)
    xs, KH, KW, CO, strides, padding, dil = TAPS_ROWS[0]
    xs = (5,) + xs[1:]
    pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    for kind in ("normal", "big"):   # (hostile data's Inf reaches nearly every output of so few channels)
        x = _values(rng, xs, kind).astype(np.float16)
        dy = _values(rng, (5, OH, OW, CO), kind, 3.0).astype(np.float16)
        for seed in (1, 2, 3):
            _filter(monkeypatch, x, dy, KH, KW, strides, pads, dil, seed=seed)
            _filter(monkeypatch, x, dy, KH, KW, strides, pads, dil, seed=seed, overflow_mode="saturation")
    assert ran.n >= 12
    n = ran.n
    for where in ("x", "dy", "both"):
        xn = _values(rng, xs, "hostile", nan=where != "dy").astype(np.float16)
        dyn = _values(rng, (5, OH, OW, CO), "hostile", 3.0, nan=where != "x").astype(np.float16)
        _filter(monkeypatch, xn, dyn, KH, KW, strides, pads, dil, out_dtype="float32")
    assert ran.n == n


# ------------------------------------------------------------------------------ conv2d_backprop_input

INPUT = [((2, 32, 32, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),     # the benchmark's layer 2: classes 16 wide
         ((1, 9, 32, 8), 3, 3, 16, (2, 2), "VALID", (1, 1)),      # cropping pads, odd class heights
         ((2, 5, 16, 3), 3, 2, 16, (1, 1), "SAME", (1, 1)),       # stride 1: one class 16 wide
         ((1, 6, 64, 4), 2, 3, 48, (1, 2), "SAME", (2, 1)),       # classes 32 wide, dilated rows, Cout 48
         ((1, 7, 18, 5), 3, 3, 16, (2, 2), "SAME", (1, 1)),       # classes 9 wide: declines
         # classes no tap reaches (+0 pixels): a 1x1 convolution at stride 2 (ResNet's shortcuts), and a 2-wide
         # kernel dilated by 2 at stride 2 along rows
         ((2, 32, 32, 16), 1, 1, 32, (2, 2), "VALID", (1, 1)),
         ((1, 8, 32, 4), 2, 2, 16, (2, 2), "VALID", (1, 2))]


def _input(monkeypatch, dy, w, strides, dzp, dil, **kw):
    def run():
        return ngrad.conv2d_backprop_input(dy, w, strides, dzp, dil, **kw)
    got = run()
    with monkeypatch.context() as m:
        m.setattr(nconv, "_IMPLICIT", False)
        want = run()
    _same(got, want, f"backprop input dy {dy.shape} {dy.dtype} w {w.shape} {kw}")


class _Both:
    """Counts the calls of either kernel conv2d_backprop_input's implicit route uses (matmul_tree16_tab, pixels as
    columns; matmul_tree16_gather, pixels as rows: conv_grad._PIXEL_ROWS)."""

    def __init__(self, monkeypatch):
        self.tab, self.gather = _Ran(monkeypatch, "matmul_tree16_tab"), _Ran(monkeypatch, "matmul_tree16_gather")

    @property
    def n(self):
        return self.tab.n + self.gather.n


IMODES = [dict(), dict(overflow_mode="saturation"), dict(out_dtype="float32"), dict(subnormals="flush"),
          dict(operand_dtype="bfloat16", out_dtype="bfloat16"), dict(operand_dtype="float32", out_dtype="float32")]


@pytest.mark.parametrize("kind", ["normal", "hostile", "big"])
@pytest.mark.parametrize("mode", range(len(IMODES)))
def test_backprop_input_implicit_gemm_is_the_packed_classes_product(kind, mode, monkeypatch):
    rng = np.random.default_rng(3700 + 10 * mode + len(kind))
    ran = _Both(monkeypatch)
    for xs, KH, KW, CO, strides, padding, dil in INPUT:
        _, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
        dzp = _dz_pads(xs, KH, KW, strides, padding, dil, OH, OW)
        w = _values(rng, (KH, KW, xs[3], CO), "normal", 0.3)   # finite: the dropped blocks of zeros
        # (dy not in the operand dtype, float32 under fp16 operands, runs the zero-inserted conv2d)
        for dt in ((np.float16, np.float32) if mode != 4 else (bfloat16,)):
            dy = _values(rng, (xs[0], OH, OW, CO), kind, 3.0).astype(dt)
            _input(monkeypatch, dy, w.astype(dt), strides, dzp, dil, **IMODES[mode])
    assert ran.n >= 4 + 4 + 1 + 2   # the classes of the first four geometries, once at least


def test_backprop_input_implicit_gemm_declines(monkeypatch):
    """NaN in dy, a non-finite filter or a bias (no blocks dropped), the NC1HWC0 order: the packed classes."""
    rng = np.random.default_rng(3800)
    ran = _Both(monkeypatch)
    xs, KH, KW, CO, strides, padding, dil = INPUT[0]
    _, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    dzp = _dz_pads(xs, KH, KW, strides, padding, dil, OH, OW)
    w = _values(rng, (KH, KW, xs[3], CO), "normal", 0.3).astype(np.float16)
    dy = _values(rng, (xs[0], OH, OW, CO), "hostile", 3.0, nan=True).astype(np.float16)
    for ov in ("inf_nan", "saturation"):
        _input(monkeypatch, dy, w, strides, dzp, dil, overflow_mode=ov, out_dtype="float32")
    dy = _values(rng, (xs[0], OH, OW, CO), "hostile", 3.0).astype(np.float16)
    w_inf = w.copy()
    w_inf[1, 1, 0, 0] = np.inf
    _input(monkeypatch, dy, w_inf, strides, dzp, dil)
    _input(monkeypatch, dy, w, strides, dzp, dil, bias=rng.standard_normal(xs[3]).astype(np.float32))
    _input(monkeypatch, dy, w, strides, dzp, dil, model=CubeModel(conv_k_order="c1hwc0"))
    assert ran.n == 0
    _input(monkeypatch, dy, w, strides, dzp, dil)
    assert ran.n == 4


def test_the_gather_kernel_reads_second_halves_from_their_own_table():
    """matmul_tree16_gather with arbitrary b_g / b_g1 tables (second halves before the first, overlapping, N % 32
    in 1..16 and 17..31, several column tiles) against matmul_tree16_small on the B those tables describe, bit for
    bit; and the up-front check covers b_g1 (its largest entry one float too far raises)."""
    from ascend_emu.kernels import cube as kc
    from ascend_emu.numerics.cube_core import _tiles

    rng = np.random.default_rng(7)
    for trial in range(40):
        M = int(rng.choice([1, 2, 3, 17, 33]))
        N = int(rng.choice([1, 5, 16, 17, 31, 32, 33, 48, 63, 520, 545]))
        nkb = int(rng.integers(1, 4))
        width = int(rng.choice([16, 32, 48, 64, 80]))
        fma = bool(rng.integers(2))
        a = rng.standard_normal((1, M, 16 * nkb)).astype(np.float32)
        b = rng.standard_normal(4000 + int(rng.integers(0, 50))).astype(np.float32)
        if fma:   # exact products only, as the fused first level needs
            a, b = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
        ngt = -(-N // 32)
        lim = b.size - 15 * width - 16
        b_q = np.sort(rng.integers(0, lim // 2, nkb)).astype(np.uintp)
        b_g = rng.integers(0, lim - int(b_q.max()), ngt).astype(np.uintp)
        b_g1 = rng.integers(0, lim - int(b_q.max()), ngt).astype(np.uintp)
        q, l, j = np.meshgrid(np.arange(nkb), np.arange(16), np.arange(N), indexing="ij")
        g, h, m = j // 32, (j % 32) // 16, j % 16
        B = b[b_q[q].astype(np.int64) + np.where(h == 1, b_g1[g], b_g[g]).astype(np.int64) + width * l + m]
        B = B.reshape(1, 16 * nkb, N)
        out = np.full((M, N), np.nan, np.float32)
        bias = rng.standard_normal((1, N)).astype(np.float32)
        a_rows = (np.arange(M) * 16 * nkb).astype(np.uintp)
        a_q = (np.arange(nkb) * 16).astype(np.uintp)
        kc.matmul_tree16_gather(a, a_rows, a_q, b, b_q, b_g, width, bias, False, out, _tiles(), fma,
                                int(rng.choice([1, 2, 16, 128])), b_g1)
        want = np.empty((1, M, N), np.float32)
        kc.matmul_tree16_small(a, B, bias, np.zeros(1, np.int64), np.zeros(1, np.int64), want, 16 * nkb, fma)
        assert np.array_equal(out.view(np.uint32), want[0].view(np.uint32)), (trial, M, N, nkb, width, fma)
    b = np.zeros(1000, np.float32)
    a = np.zeros((1, 2, 16), np.float32)
    for last, raises in ((1000 - 15 * 16 - 16, False), (1000 - 15 * 16 - 15, True)):
        args = (a, np.array([0, 16], np.uintp), np.zeros(1, np.uintp), b, np.zeros(1, np.uintp),
                np.zeros(2, np.uintp), 16, np.zeros((1, 40), np.float32), False, np.zeros((2, 40), np.float32),
                _tiles(), False, 128, np.array([0, last], np.uintp))
        if raises:
            with pytest.raises(ValueError):
                kc.matmul_tree16_gather(*args)
        else:
            kc.matmul_tree16_gather(*args)


# ------------------------------------------------------------------------------ the whole-output Fixpipe

def _whole_vs_classes(monkeypatch, dy, w, strides, dzp, dil, **kw):
    """conv2d_backprop_input's implicit route with the classes' products in one float32 output and one Fixpipe
    pass (conv_grad._WHOLE_FIXPIPE) against the same route's finish_grid_rows per class; returns how many
    products went to the whole output."""
    n = [0]
    orig = nconv._k.matmul_tree16_tab

    def counted(*a):
        n[0] += len(a) > 12 and a[12] is not None
        return orig(*a)
    with monkeypatch.context() as m:
        m.setattr(nconv._k, "matmul_tree16_tab", counted)
        got = ngrad.conv2d_backprop_input(dy, w, strides, dzp, dil, **kw)
        whole = n[0]
        m.setattr(ngrad, "_WHOLE_FIXPIPE", False)
        want = ngrad.conv2d_backprop_input(dy, w, strides, dzp, dil, **kw)
    _same(got, want, f"whole Fixpipe dy {dy.shape} {dy.dtype} w {w.shape} {kw}")
    return whole


@pytest.mark.parametrize("kind", ["normal", "hostile", "big"])
@pytest.mark.parametrize("mode", range(len(IMODES)))
def test_backprop_input_whole_fixpipe_is_the_class_by_class_fixpipe(kind, mode, monkeypatch):
    """Hostile dy (+-Inf: Inf and NaN accumulators; 65504 and beyond, sums past fp16's range; subnormals; -0),
    every Fixpipe mode and output dtype: the same bits and statuses as finish_grid_rows class by class."""
    rng = np.random.default_rng(3900 + 10 * mode + len(kind))
    monkeypatch.setattr(ngrad, "_PIXEL_ROWS", False)   # (the pixels-as-rows route: the next test)
    whole = 0
    for xs, KH, KW, CO, strides, padding, dil in INPUT:
        _, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
        dzp = _dz_pads(xs, KH, KW, strides, padding, dil, OH, OW)
        w = _values(rng, (KH, KW, xs[3], CO), "normal", 0.3)
        dt = np.float16 if mode != 4 else bfloat16
        dy = _values(rng, (xs[0], OH, OW, CO), kind, 3.0 if kind != "big" else 300.0).astype(dt)
        whole += _whole_vs_classes(monkeypatch, dy, w.astype(dt), strides, dzp, dil, **IMODES[mode])
    assert whole >= 4 + 4 + 1 + 2   # the classes of the first four geometries, once at least


def test_tab_kernel_out_rows_is_the_transposed_store():
    """matmul_tree16_tab with out_rows writes each column's values to its row: the transposed store's values
    (NaN and Inf operands included: the sums are the same code's), nothing else touched; a row past out raises."""
    from ascend_emu.kernels import cube as kc
    from ascend_emu.numerics.cube_core import _tiles
    rng = np.random.default_rng(3950)
    M, K, N, pitch = 13, 48, 80, 100
    A = rng.standard_normal((1, M, K)).astype(np.float32)
    b = rng.standard_normal(K * pitch + 64).astype(np.float32)
    b[rng.choice(b.size, 40, replace=False)] = rng.choice([np.inf, -np.inf, np.nan, -0.0, 1e-42], 40)
    tab = (np.arange(K, dtype=np.uintp) * np.uintp(pitch)).reshape(-1, 16)
    g0 = np.arange(0, N, 32, dtype=np.uintp)
    g1 = g0 + np.uintp(16)
    bias = rng.standard_normal((1, M)).astype(np.float32)
    want = np.full((N, M), 7.0, np.float32)
    kc.matmul_tree16_tab(A, b, tab, g0, g1, bias, True, want, _tiles(), False, 4, True)
    rows = rng.permutation(N + 9)[:N].astype(np.uintp)
    got = np.full((N + 9, M), 7.0, np.float32)
    kc.matmul_tree16_tab(A, b, tab, g0, g1, bias, True, got, _tiles(), False, 4, True, rows)
    np.testing.assert_array_equal(got[rows.astype(np.int64)].view(np.uint32), want.view(np.uint32))
    untouched = np.setdiff1d(np.arange(N + 9), rows.astype(np.int64))
    assert (got[untouched] == 7.0).all()
    with pytest.raises(ValueError):
        kc.matmul_tree16_tab(A, b, tab, g0, g1, bias, True, got[:N], _tiles(), False, 4, True, rows)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("flush", [False, True])
def test_planar_widened_is_the_operand_widening(bf16, flush):
    """kernels.cube.planar_widened (NHWC 16-bit bits to planar padded float32) against numpy, on every 16-bit
    pattern (NaN payloads, signalling NaNs, +-Inf, subnormals, -0): a few channels (the row-buffer loop) and
    many (the per-pixel loop), channels past the input's and the padding +0, every element written."""
    from ascend_emu.kernels import cube as kc
    from ascend_emu.kernels.codes import FLUSH, KEEP
    rng = np.random.default_rng(3960)
    allb = rng.permutation(np.arange(65536, dtype=np.uint32)).astype(np.uint16)
    for shape, (pt, pb, pl, pr), extra in [((4, 16, 32, 3), (1, 1, 1, 1), 1), ((4, 9, 8, 1), (1, 2, 0, 3), 3),
                                           ((2, 33, 31, 7), (0, 0, 2, 0), 0), ((4, 16, 32, 32), (2, 1, 2, 1), 0),
                                           ((3, 12, 16, 8), (0, 0, 0, 0), 2)]:
        bits = np.resize(allb, int(np.prod(shape))).reshape(shape)
        if bf16:
            u = bits.astype(np.uint32) << np.uint32(16)
            sub = ((bits & 0x7F80) == 0) & ((bits & 0x7F) != 0)
        else:
            u = bits.view(np.float16).astype(np.float32).view(np.uint32)
            sub = ((bits & 0x7C00) == 0) & ((bits & 0x3FF) != 0)
        if flush:
            u = np.where(sub, (bits.astype(np.uint32) & 0x8000) << np.uint32(16), u)
        want = np.zeros((shape[0], shape[3] + extra, shape[1] + pt + pb, shape[2] + pl + pr), np.uint32)
        want[:, :shape[3], pt:pt + shape[1], pl:pl + shape[2]] = u.transpose(0, 3, 1, 2)
        got = np.full(want.shape, 7.0, np.float32)
        kc.planar_widened(bits, got, pt, pl, bf16, FLUSH if flush else KEEP)
        np.testing.assert_array_equal(got.view(np.uint32), want, err_msg=f"{shape} {pt, pb, pl, pr} {extra}")


INPUT_ROWS = INPUT + [((1, 8, 32, 32), 3, 3, 16, (2, 2), "SAME", (1, 1)),    # 32 input channels: full column groups
                      ((2, 7, 16, 16), 2, 2, 32, (2, 1), [[1, 0], [0, 1]], (1, 1))]


@pytest.mark.parametrize("kind", ["normal", "hostile", "big"])
@pytest.mark.parametrize("mode", range(len(IMODES)))
def test_backprop_input_pixel_rows_is_the_tab_product(kind, mode, monkeypatch):
    """The classes' pixels as the product's rows (matmul_tree16_gather reading padded NHWC dy, conv_grad._PIXEL_ROWS)
    against the tab product (pixels as columns, read from planar dy), both into the whole output: the same bits and
    statuses on hostile data in every Fixpipe mode; the gather really ran."""
    rng = np.random.default_rng(3970 + 10 * mode + len(kind))
    n = [0]
    orig = nconv._k.matmul_tree16_gather

    def counted(*a):
        n[0] += len(a) > 14 and a[14] is not None
        return orig(*a)
    for xs, KH, KW, CO, strides, padding, dil in INPUT_ROWS:
        _, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
        dzp = _dz_pads(xs, KH, KW, strides, padding, dil, OH, OW)
        w = _values(rng, (KH, KW, xs[3], CO), "normal", 0.3)
        dt = np.float16 if mode != 4 else bfloat16
        dy = _values(rng, (xs[0], OH, OW, CO), kind, 3.0 if kind != "big" else 300.0).astype(dt)
        with monkeypatch.context() as m:
            m.setattr(nconv._k, "matmul_tree16_gather", counted)
            got = ngrad.conv2d_backprop_input(dy, w.astype(dt), strides, dzp, dil, **IMODES[mode])
            m.setattr(ngrad, "_PIXEL_ROWS", False)
            want = ngrad.conv2d_backprop_input(dy, w.astype(dt), strides, dzp, dil, **IMODES[mode])
        _same(got, want, f"pixel rows dy {dy.shape} {dy.dtype} w {w.shape} {IMODES[mode]}")
    assert n[0] >= 4 + 1 + 4 + 2   # the classes of the 16- and 32-channel geometries (a class no tap reaches: none)


def test_backprop_input_pixel_rows_tables_per_geometry(monkeypatch):
    """conv2d_backprop_input's per-geometry tables (conv_grad._pixel_rows_tables, _plan_runs16: cached) never serve
    another geometry: geometries that share the plan but not the batch, the in-channels or dy's padded size, and
    others, called interleaved, twice, each time in another Fixpipe mode (saturation / inf_nan, flushed
    subnormals, bf16, fp32 out): every call the bits and statuses of the route without the pixel rows (the tab
    product, no cached B), on hostile data; the cached tables were reused."""
    rng = np.random.default_rng(3990)
    geos = [((2, 32, 32, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),
            ((1, 32, 32, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),     # the plan of the first, another batch
            ((2, 32, 32, 32), 3, 3, 32, (2, 2), "SAME", (1, 1)),     # another in-channel count
            ((2, 32, 64, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),     # another width: another plan
            ((1, 8, 32, 32), 3, 3, 16, (2, 2), "SAME", (1, 1)),
            ((2, 7, 16, 16), 2, 2, 32, (2, 1), [[1, 0], [0, 1]], (1, 1)),
            ((2, 32, 32, 16), 1, 1, 32, (2, 2), "VALID", (1, 1))]   # classes no tap reaches
    ngrad._pixel_rows_tables.cache_clear()      # (the first pass makes the entries, the second hits them)
    hits = ngrad._pixel_rows_tables.cache_info().hits
    n = 0
    for rnd, modes in enumerate(([1, 0, 3, 4, 2, 1, 0], [0, 3, 1, 2, 4, 0, 3])):
        for gi in (range(len(geos)) if rnd == 0 else reversed(range(len(geos)))):
            xs, KH, KW, CO, strides, padding, dil = geos[gi]
            mode = IMODES[modes[gi]]
            _, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
            dzp = _dz_pads(xs, KH, KW, strides, padding, dil, OH, OW)
            dt = bfloat16 if mode.get("operand_dtype") == "bfloat16" else np.float16
            w = _values(rng, (KH, KW, xs[3], CO), "normal", 0.3).astype(dt)
            dy = _values(rng, (xs[0], OH, OW, CO), "hostile", 3.0).astype(dt)
            got = ngrad.conv2d_backprop_input(dy, w, strides, dzp, dil, **mode)
            with monkeypatch.context() as m:
                m.setattr(ngrad, "_PIXEL_ROWS", False)
                want = ngrad.conv2d_backprop_input(dy, w, strides, dzp, dil, **mode)
            _same(got, want, f"pass {rnd} dy {dy.shape} {dy.dtype} w {w.shape} {mode}")
            n += 1
    assert n == 2 * len(geos)
    assert ngrad._pixel_rows_tables.cache_info().hits >= hits + len(geos)


def test_gather_kernel_out_rows_is_the_row_store():
    """matmul_tree16_gather with out_rows writes each row's values to its row of out: the plain store's values
    (NaN and Inf operands included: the sums are the same code's), nothing else touched; a row past out raises."""
    from ascend_emu.kernels import cube as kc
    from ascend_emu.numerics.cube_core import _tiles
    rng = np.random.default_rng(3980)
    for M, N, K in ((37, 16, 48), (21, 40, 32), (8, 64, 16)):
        a = rng.standard_normal(M * K + 64).astype(np.float32)
        a[rng.choice(a.size, 30, replace=False)] = rng.choice([np.inf, -np.inf, np.nan, -0.0, 1e-42], 30)
        a_rows = (np.arange(M, dtype=np.uintp) * np.uintp(K))
        a_q = np.arange(0, K, 16, dtype=np.uintp)
        width = 16 if N <= 16 else 64
        b = rng.standard_normal(K * width + 64).astype(np.float32)
        b_q = np.arange(K // 16, dtype=np.uintp) * np.uintp(16 * width)
        b_g = np.arange(0, max(N, 32), 32, dtype=np.uintp)
        bias = rng.standard_normal((1, N)).astype(np.float32)
        want = np.full((M, N), 7.0, np.float32)
        kc.matmul_tree16_gather(a, a_rows, a_q, b, b_q, b_g, width, bias, False, want, _tiles(), False, 4)
        rows = rng.permutation(M + 5)[:M].astype(np.uintp)
        got = np.full((M + 5, N), 7.0, np.float32)
        kc.matmul_tree16_gather(a, a_rows, a_q, b, b_q, b_g, width, bias, False, got, _tiles(), False, 4, None, rows)
        np.testing.assert_array_equal(got[rows.astype(np.int64)].view(np.uint32), want.view(np.uint32))
        untouched = np.setdiff1d(np.arange(M + 5), rows.astype(np.int64))
        assert (got[untouched] == 7.0).all()
        with pytest.raises(ValueError):
            kc.matmul_tree16_gather(a, a_rows, a_q, b, b_q, b_g, width, bias, False, got[:M], _tiles(), False, 4, None,
                                    rows)

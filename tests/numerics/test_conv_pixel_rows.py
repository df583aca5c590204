"""conv2d with the pixels as the product's rows where whole 32-column groups of output channels allow it
(numerics.conv._pixels_as_rows) against the pixels-as-columns product it replaces (C^T, read back by the
Fixpipe): same bits and same status on hostile data (Inf, -0, fp16 subnormals, overflowing sums, saturation,
bias, fused epilogues, strides, padding, dilations, 1x1 filters, every operand dtype), and NaN operands
(+NaN and -NaN in the input or the filter), which must fall back to the columns product. The row path
must really run (counted), so a fast path that always declines fails here too."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.numerics import conv as nconv
from ascend_emu.numerics.cube_core import Epilogue

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

rng = np.random.default_rng(20261125)


def _values(shape, kind, scale=1.0, nan=False, every=40):
    x = rng.standard_normal(shape) * scale
    f = x.reshape(-1)
    if kind == "hostile":
        idx = rng.choice(f.size, max(1, f.size // every), replace=False)
        specials = [np.inf, -np.inf, 0.0, -0.0, 6e-8, -3e-8, 7e4, -7e4, 3e-39]
        f[idx] = rng.choice(specials + ([np.nan, -np.nan] if nan else []), idx.size)
    elif kind == "tiny":
        x *= 2.0 ** -17
        f[::3] = -0.0
    elif kind == "big":
        x *= 200.0
    return x


class _Rows:
    """Counts the row products that ran to the end and the ones that fell back (wraps _conv2d)."""

    def __init__(self, monkeypatch):
        self.ran = self.fell_back = 0
        orig = nconv._conv2d

        def wrapped(*a):
            r = orig(*a)
            if a[-1]:
                if r is None:
                    self.fell_back += 1
                else:
                    self.ran += 1
            return r
        monkeypatch.setattr(nconv, "_conv2d", wrapped)


def _compare(monkeypatch, x, w, kw, chain=None):
    def run():
        k = dict(kw)
        if chain is not None:
            k["epilogue"] = Epilogue(chain[0], [x, w] + chain[1], chain[2])
            k["out_dtype"] = "float32"
        return nconv.conv2d(x, w, **k)
    got, st = run()
    with monkeypatch.context() as m:
        m.setattr(nconv, "_pixels_as_rows", lambda *a: False)
        want, wst = run()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=str(kw))
    assert st == wst, (kw, hex(st), hex(wst))


GEOMETRIES = [((2, 9, 11, 16), (3, 3, 16, 32), dict(strides=(2, 2), padding="SAME")),
              ((2, 8, 8, 3), (3, 3, 3, 64), dict(strides=(1, 1), padding="SAME")),
              ((1, 12, 10, 5), (3, 2, 5, 32), dict(strides=(1, 2), padding="VALID", dilations=(2, 1))),
              ((3, 7, 7, 24), (1, 1, 24, 96), dict(padding="VALID")),
              ((2, 6, 6, 8), (5, 5, 8, 32), dict(padding=[[1, 2], [2, 0]]))]
MODES = [dict(), dict(overflow_mode="saturation"), dict(out_dtype="float32"), dict(operand_dtype="bfloat16"),
         dict(operand_dtype="float32", out_dtype="float32"), dict(subnormals="flush")]


@pytest.mark.parametrize("kind", ["normal", "hostile", "tiny", "big"])
@pytest.mark.parametrize("mode", range(len(MODES)))
def test_rows_product_is_the_columns_product(kind, mode, monkeypatch):
    rows = _Rows(monkeypatch)
    for xs, ws, geo in GEOMETRIES:
        for xdt in (np.float16, np.float32):
            x = _values(xs, kind).astype(xdt)
            w = _values(ws, kind, 0.3).astype(np.float16 if mode != 4 else np.float32)
            bias = _values(ws[3:], "normal").astype(np.float32) if xdt == np.float16 else None
            _compare(monkeypatch, x, w, dict(geo, bias=bias, **MODES[mode]))
    assert rows.ran >= len(GEOMETRIES) and rows.fell_back == 0


@pytest.mark.parametrize("kind", ["normal", "hostile"])
def test_rows_product_with_a_fused_epilogue(kind, monkeypatch):
    rows = _Rows(monkeypatch)
    x = _values((2, 9, 9, 16), kind).astype(np.float16)
    w = _values((3, 3, 16, 32), kind, 0.3).astype(np.float16)
    b = _values((32,), "normal").astype(np.float32)
    for ov in ("inf_nan", "saturation"):
        _compare(monkeypatch, x, w, dict(strides=(2, 2), padding="SAME", overflow_mode=ov),
                 ([("add", (-1, 2)), ("relu", (-1,))], [b], "float16"))
    assert rows.ran == 2


@pytest.mark.parametrize("where", ["x", "w", "both"])
def test_nan_operands_keep_the_columns_product(where, monkeypatch):
    """NaN signs can meet: the orientation decides which comes out, so the columns product runs."""
    rows = _Rows(monkeypatch)
    for xs, ws, geo in GEOMETRIES * 4:
        x = _values(xs, "hostile", nan=where in ("x", "both"), every=6).astype(np.float16)
        w = _values(ws, "hostile", 0.3, nan=where in ("w", "both"), every=6).astype(np.float16)
        _compare(monkeypatch, x, w, dict(geo, out_dtype="float32"))
    if where == "x":   # the filter passes _pixels_as_rows; im2col meets the input's NaN
        assert rows.fell_back >= 1
    else:
        assert rows.ran == rows.fell_back == 0

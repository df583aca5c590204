"""The fused cube ops' one-pass epilogue (Fixpipe + UB chain + rounding, kernels/cube/epilogue.py) against
the path it replaces: the float32 accumulator through ``finish_f32``, the chain step by step
(``fused_ops._chain``) and the rounding by the cast kernel (``fused_ops._round_to``).

Same bits and same status on hostile data (NaN, Inf, -0, subnormals, fp16 overflow, saturation), every
output dtype and operand shape; the epilogue must also really run (it is counted), so a fast path that
silently declines everything fails here too.
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.numerics import conv as nconv
from ascend_emu.numerics.cube_core import Epilogue
from ascend_emu.ops import OPS, OpContext
from ascend_emu.ops import fused_ops
from ascend_emu.numerics.policy import bfloat16

rng = np.random.default_rng(20261125)


def _step(op, *args):
    return {"op": op, "args": list(args), "attrs": {}, "name": op.lower()}


class _Count:
    """Counts the epilogue's applications (wraps Epilogue.apply)."""

    def __init__(self, monkeypatch):
        self.applied = self.declined = 0
        orig = Epilogue.apply

        def apply(ep, *a, **k):
            r = orig(ep, *a, **k)
            if r is None:
                self.declined += 1
            else:
                self.applied += 1
            return r
        monkeypatch.setattr(Epilogue, "apply", apply)


def _call(op, xs, kw, ctx_kw):
    ctx = OpContext(**ctx_kw)
    (y,) = OPS[op](*xs, ctx=ctx, **kw)
    return y, ctx.status


def _compare(op, xs, kw, ctx_kw, monkeypatch):
    """(fast, reference) outputs and statuses must agree bit for bit; returns the fast output."""
    got, st = _call(op, xs, kw, ctx_kw)
    with monkeypatch.context() as m:
        m.setattr(fused_ops, "_epilogue", lambda *a: None)
        m.setattr(Epilogue, "apply", lambda *a, **k: None)   # the plain Fixpipe's one pass too
        want, wst = _call(op, xs, kw, ctx_kw)
    assert got.dtype == want.dtype and got.shape == want.shape, (op, kw.get("chain"), ctx_kw)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{op} {kw.get('chain')} {ctx_kw}")
    assert st == wst, (op, kw.get("chain"), ctx_kw, hex(st), hex(wst))
    return got


def _values(kind, shape, scale=1.0):
    x = rng.standard_normal(shape) * scale
    if kind == "hostile":
        flat = x.reshape(-1)
        n = flat.size
        idx = rng.choice(n, size=max(1, n // 50), replace=False)
        flat[idx] = rng.choice([np.inf, -np.inf, np.nan, 0.0, -0.0, 6e-8, -3e-8, 7e4], size=idx.size)
    elif kind == "tiny":   # fp16-subnormal results and signed zeros
        x = x * 2.0 ** -20
        x.reshape(-1)[::7] = -0.0
    elif kind == "big":    # rounding to fp16 overflows, float32 stays finite
        x = x * 3e3
    return x


def _operand(spec, out_shape, kind, dt):
    """An extra input of the chain: 'vec' (C,), 'vec4' (1,..,1,C), 'scalar' (), 'full' (out shape), 'per_n'
    (N,1,..,1,C): not an epilogue operand, 'f64vec', 'f32full'."""
    C = out_shape[-1]
    shapes = {"vec": (C,), "vec4": (1,) * (len(out_shape) - 1) + (C,), "scalar": (), "full": out_shape,
              "per_n": (out_shape[0],) + (1,) * (len(out_shape) - 2) + (C,), "f64vec": (C,), "f32full": out_shape}
    v = _values(kind if kind != "big" else "normal", shapes[spec], 2.0)
    if spec == "f64vec":
        return v.astype(np.float64)
    if spec == "f32full":
        return v.astype(np.float32)
    return v.astype(dt)


CHAINS = {
    "bias_relu": ([_step("BiasAdd", -1, 2), _step("Relu", -1)], ["vec"]),
    "residual_relu": ([_step("AddV2", -1, 2), _step("Relu", -1)], ["full"]),
    "bn_relu6": ([_step("Mul", -1, 2), _step("AddV2", -1, 3), _step("Relu6", -1)], ["vec4", "f64vec"]),
    "sub_div": ([_step("Sub", 2, -1), _step("RealDiv", -1, 3)], ["f32full", "vec"]),
    "scale_neg": ([_step("Mul", -1, 2), _step("Sub", -1, 3)], ["scalar", "scalar"]),
    "div_by_acc": ([_step("RealDiv", 2, -1)], ["scalar"]),
    "per_sample": ([_step("Mul", -1, 2), _step("Relu", -1)], ["per_n"]),
    "relu_of_input": ([_step("Mul", -1, 2), _step("Relu", 3)], ["scalar", "full"]),
    # the running value as both operands of a step (the kernel's in-place loop reading it twice)
    "square_sub": ([_step("Mul", -1, -1), _step("Sub", -1, 2)], ["vec"]),
    # a lone bias add, and a vector plus the running value: the first step's add in the Fixpipe's copy loop
    # (both operand orders; a block with a non-finite sum falls back to the separate passes)
    "bias": ([_step("BiasAdd", -1, 2)], ["vec"]),
    "vec_plus_acc": ([_step("AddV2", 2, -1), _step("Mul", -1, 3)], ["vec", "scalar"]),
}

MODES = [dict(dtype="float16"), dict(dtype="float16", overflow_mode="saturation"),
         dict(dtype="float16", cube_out="float32"), dict(dtype="bfloat16"),
         dict(dtype="bfloat16", overflow_mode="saturation"), dict(dtype="float32"),
         dict(dtype="float16", subnormals="flush")]


def _cases():
    """(op type, inputs without the chain's operands, attrs, output shape)."""
    f = np.float16
    yield ("_FusedConv2D", [_values("normal", (2, 9, 9, 16)), _values("normal", (3, 3, 16, 32), 0.2)],
           dict(strides=[1, 1, 1, 1], padding="SAME"), (2, 9, 9, 32))          # C^T product (32 columns)
    yield ("_FusedConv2D", [_values("normal", (2, 6, 6, 8)), _values("normal", (1, 1, 8, 4), 0.5)],
           dict(strides=[1, 1, 1, 1], padding="VALID", bias=np.linspace(-1, 1, 4)), (2, 6, 6, 4))
    yield ("_FusedConv2D", [_values("normal", (1, 5, 5, 8)), _values("normal", (3, 3, 8, 260), 0.3)],
           dict(strides=[1, 2, 2, 1], padding="SAME"), (1, 3, 3, 260))
    yield ("_FusedConv2D", [_values("normal", (2, 8, 8, 24)), _values("normal", (3, 3, 24, 1), 0.3)],
           dict(base="DepthwiseConv2dNative", strides=[1, 1, 1, 1], padding="SAME",
                bias=np.full(24, -0.0)), (2, 8, 8, 24))
    yield ("_FusedMatMul", [_values("normal", (40, 32)), _values("normal", (32, 20), 0.3)], {}, (40, 20))
    yield ("_FusedMatMul", [_values("normal", (10, 24)), _values("normal", (300, 24), 0.3)],
           dict(transpose_b=True), (10, 300))
    # the cube's one-pass fp16 operand routes: dY W^T as C^T (cube_core._flip_ok), a weight widened into its slabs
    # (cube_core._widen_pack_ok)
    yield ("_FusedMatMul", [_values("normal", (16, 256)), _values("normal", (256, 256), 0.05)],
           dict(transpose_b=True), (16, 256))
    yield ("_FusedMatMul", [_values("normal", (24, 64)), _values("normal", (64, 300), 0.1)], {}, (24, 300))
    yield ("_FusedBatchMatMul", [_values("normal", (3, 8, 16)), _values("normal", (3, 16, 12), 0.3)], {}, (3, 8, 12))
    del f


@pytest.mark.parametrize("kind", ["normal", "hostile", "tiny", "big"])
def test_epilogue_matches_the_step_by_step_chain(kind, monkeypatch):
    count = _Count(monkeypatch)
    for op, base_xs, attrs, out_shape in _cases():
        for name, (chain, specs) in CHAINS.items():
            if name == "per_sample" and len(out_shape) < 3:
                continue
            for mode in MODES:
                dt = {"float16": np.float16, "bfloat16": bfloat16, "float32": np.float32}[mode["dtype"]]
                xs = [base_xs[0].astype(np.float32) if kind == "normal" else _values(kind, base_xs[0].shape),
                      base_xs[1]]
                xs = [x.astype(dt) for x in xs] + [_operand(s, out_shape, kind, dt) for s in specs]
                _compare(op, xs, dict(attrs, chain=chain), mode, monkeypatch)
    # the one pass really ran (and declined where it must: non-finite values, a per-sample operand)
    # (hostile inputs leave few all-finite accumulators: mostly saturation mode's mapped ones pass)
    assert count.applied > (10 if kind == "hostile" else 100), (count.applied, count.declined)
    if kind == "hostile":
        assert count.declined > 100


def test_chunked_transposed_convolution(monkeypatch):
    """The C^T product written chunk by chunk into one (C, R) buffer the epilogue reads."""
    monkeypatch.setattr(nconv, "_IM2COL_BYTES", 4 * 144 * 64)
    count = _Count(monkeypatch)
    x = _values("normal", (3, 11, 11, 16)).astype(np.float16)
    w = _values("normal", (3, 3, 16, 24), 0.2).astype(np.float16)
    for kind in ("normal", "hostile"):
        xs = [x if kind == "normal" else _values(kind, x.shape).astype(np.float16), w,
              _operand("vec", (3, 11, 11, 24), "normal", np.float16),
              _operand("full", (3, 11, 11, 24), kind, np.float16)]
        chain = [_step("BiasAdd", -1, 2), _step("AddV2", -1, 3), _step("Relu", -1)]
        for mode in MODES[:3]:
            _compare("_FusedConv2D", xs, dict(strides=[1, 1, 1, 1], padding="SAME", chain=chain), mode, monkeypatch)
    assert count.applied >= 3


def test_saturated_accumulators_take_the_one_pass():
    """Under saturation a non-finite accumulator becomes +-FLT_MAX / 0 with status 0x400, and the chain goes
    on from there in the one pass; the rounding saturates with status 0x20."""
    x = np.ones((1, 2, 2, 16), np.float16)
    x[0, 0, 0, 0] = np.inf
    x[0, 1, 1, 0] = np.nan
    w = np.full((1, 1, 16, 16), 0.5, np.float16)
    b = np.full(16, -1.0, np.float16)
    chain = [_step("BiasAdd", -1, 2), _step("Relu", -1)]
    ctx = OpContext(dtype="float16", overflow_mode="saturation")
    ep = fused_ops._epilogue(ctx, (x, w, b), chain)
    assert ep is not None
    (y,) = OPS["_FusedConv2D"](x, w, b, ctx=ctx, strides=[1, 1, 1, 1], padding="VALID", chain=chain)
    assert ctx.status == 0x400 | 0x20
    assert float(y[0, 0, 0, 0]) == 65504.0 and float(y[0, 1, 1, 0]) == 0.0 and float(y[0, 0, 1, 0]) == 7.0


def test_the_kernel_keeps_plain_float32_operations():
    """No fused multiply-add in the compiled epilogue (a*b+c rounds twice, as numpy's ufuncs do), and its
    steps vectorised: the assembly of a fresh compilation (a cached one cannot be inspected)."""
    import numba

    from ascend_emu.kernels.cube import epilogue as ke

    a = np.float32(1 + 2 ** -12)
    acc = np.full(32, a, np.float32)
    prog = np.array([[ke.MUL, ke.RUN, 0, ke.TILE, 0], [ke.ADD, ke.RUN, 0, ke.TILE, 1]], dtype=np.int64)
    tiles = np.stack([np.full(32, a, np.float32), np.full(32, -(a * a), np.float32)])
    out32 = np.empty(32, np.float32)
    fresh = numba.njit(parallel=True, error_model="numpy")(ke.epilogue.py_func)
    args = (acc, False, 2, 16, 1, prog, tiles, (np.zeros(1, np.float32),), (np.zeros(1, np.uint16),),
            np.zeros(1, np.int64), np.zeros(1, np.uint16), out32, ke.OUT_F32, 0, False, 0x20)
    assert fresh(*args) == 0 and (out32 == 0).all() and not np.signbit(out32).any()
    asm = "\n".join(fresh.inspect_asm().values()).lower()
    assert "mulps" in asm or "fmul" in asm   # the kernel's own code is there
    assert "vfmadd" not in asm and "vfmsub" not in asm and "vfnm" not in asm and "fmadd" not in asm


@pytest.mark.parametrize("kind", ["normal", "hostile", "big", "tiny"])
def test_plain_transposed_convolution_fixpipe(kind, monkeypatch):
    """A convolution without a chain whose product is C^T: the Fixpipe reads it in place (an empty
    program, status 0x100 on overflow as finish_to_16's) instead of a transposed copy."""
    from ascend_emu.numerics.cube import conv2d

    count = _Count(monkeypatch)
    x = _values(kind, (2, 7, 7, 16))
    w = _values("normal", (3, 3, 16, 40), 10.0 if kind == "big" else 0.3)   # big: the rounding overflows
    for out in ("float16", "bfloat16", "float32"):
        for ov in ("inf_nan", "saturation"):
            for sub in ("keep", "flush"):
                kw = dict(padding="SAME", out_dtype=out, overflow_mode=ov, subnormals=sub,
                          bias=np.linspace(-2, 2, 40))
                got, st = conv2d(x.astype(np.float16), w.astype(np.float16), **kw)
                with monkeypatch.context() as m:
                    m.setattr(Epilogue, "apply", lambda *a, **k: None)
                    want, wst = conv2d(x.astype(np.float16), w.astype(np.float16), **kw)
                assert got.dtype == want.dtype and got.shape == want.shape
                np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{kind} {kw}")
                assert st == wst, (kind, kw, hex(st), hex(wst))
    assert count.applied >= (2 if kind == "hostile" else 6)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("flush", [0, 1])
def test_im2col_widens_every_16_bit_pattern_as_widen_operands(bf16, flush):
    """A 1x1 convolution's im2col reads the 16-bit operands' bits and widens them itself: the same float32
    bits (every pattern: NaN payloads, Inf, -0, subnormals kept or flushed) as widening first."""
    from ascend_emu.kernels import cube as k
    from ascend_emu.numerics.conv import _k_offsets

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(2, 32, 64, 16)
    wide = np.empty(bits.shape, np.uint32)
    k.widen_operands(bits.reshape(-1), wide.reshape(-1), bf16, bool(flush))
    wide = wide.view(np.float32)
    koff = _k_offsets(1, 1, 16, 64, 1, 1, "hwc")
    for sh in (1, 2):
        OH, OW = 32 // sh, 64 // sh
        R = 2 * OH * OW
        a = np.full((R, 16), np.nan, np.float32)
        b = np.full((R, 16), np.nan, np.float32)
        k.im2col(wide, koff, sh, sh, OH, OW, 0, a)
        k.im2col(bits, koff, sh, sh, OH, OW, 0, b, bf16, flush)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
        pa = k.empty_slabs(k.slab_shape(1, R, 16))
        pb = k.empty_slabs(k.slab_shape(1, R, 16))
        pa[...] = 0     # the slabs' columns past the 2x2 block edge are never written
        pb[...] = 0
        k.im2col_packed(wide, koff, sh, sh, OH, OW, 0, R, pa)
        k.im2col_packed(bits, koff, sh, sh, OH, OW, 0, R, pb, bf16, flush)
        np.testing.assert_array_equal(pa.view(np.uint32), pb.view(np.uint32))


# The epilogue's own rounding of every finite float32 pattern (fp16 and bf16, both overflow modes, with the
# status of each slice): in the cast sweep (tests/numerics/test_cast.py::test_f32_to_16_every_pattern), against
# the oracle the cast kernel meets there.


def test_read_only_operands_mixed_with_writable_ones(monkeypatch):
    """Two full-shape operands of different writeability (a frozen constant and an activation) take the one
    pass with the step path's bits (Numba once failed to type the tuple of such operands)."""
    x = _values("normal", (2, 9, 9, 16)).astype(np.float16)
    w = _values("normal", (3, 3, 16, 32), 0.2).astype(np.float16)
    out_shape = (2, 9, 9, 32)
    count = _Count(monkeypatch)
    for dt in (np.float16, np.float32):          # the 16-bit and the float32 operand tuples
        full = _values("normal", out_shape).astype(dt)
        frozen = _values("normal", out_shape).astype(dt)
        frozen.flags.writeable = False
        chain = [_step("AddV2", -1, 2), _step("Mul", -1, 3), _step("Relu", -1)]
        kw = dict(chain=chain, strides=(1, 1, 1, 1), padding="SAME")
        _compare("_FusedConv2D", (x, w, full, frozen), kw, dict(dtype="float16"), monkeypatch)
    assert count.applied >= 2


def test_kept_plans_take_each_calls_own_operand_values(monkeypatch):
    """The epilogue's plan is kept per shapes (``Epilogue._PLANS``: a training step's layers meet the same shapes
    every step with new biases): later calls of the same shapes reuse it and still read their own values."""
    monkeypatch.setattr(Epilogue, "_PLANS", {})
    count = _Count(monkeypatch)
    chain, specs = CHAINS["bn_relu6"]
    for _ in range(3):
        xs = [_values("normal", (40, 32)).astype(np.float16), _values("normal", (32, 20), 0.3).astype(np.float16)]
        xs += [_operand(s, (40, 20), "normal", np.float16) for s in specs]
        _compare("_FusedMatMul", xs, dict(chain=chain), dict(dtype="float16"), monkeypatch)
    assert count.applied == 3 and len(Epilogue._PLANS) == 1

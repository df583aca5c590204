"""SoftmaxGradFusionPass on a training step: where it fires, its numerics against an oracle, the switch.

The oracle is written from NUMERICS.md section 6's description: inputs widened to float32, the
product, a sequential float32 sum over the last axis, the difference and the product in float32, one
rounding to the op's compute dtype.
"""
from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import ascend_emu as ae  # noqa: E402
from ascend_emu.analysis.dump import load_dump  # noqa: E402
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)


def attention_classifier():
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    inp = keras.Input((8, 16))
    h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(inp, inp)
    out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h))
    m = keras.Model(inp, out, name="attention_classifier")
    m.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m, (rng.normal(size=(16, 8, 16)).astype(np.float32), rng.integers(0, 3, 16))


def softmax_grad_oracle(y, dy, dtype):
    y = np.asarray(y, np.float32)
    dy = np.asarray(dy, np.float32)
    p = y * dy
    s = p[..., 0].copy()
    for k in range(1, p.shape[-1]):
        s = s + p[..., k]           # float32, left to right
    r = (dy - s[..., None]) * y
    return r.astype(dtype)


@pytest.mark.parametrize("mode", ["allow_mix_precision", "force_fp16"])
def test_softmax_grad_fuses_and_follows_its_model(tmp_path, mode):
    model, data = attention_classifier()
    res = ae.Device(mode).train(model, data, batch_size=8, steps=2, dump_dir=str(tmp_path), dump_steps=[1],
                                progress=False)
    assert len(res.steps) == 2
    d = load_dump(str(tmp_path / "step-1"))
    fused = [op for op in d.ops if op["tf_type"] == "_SoftmaxGrad"]
    assert len(fused) == 1
    op = fused[0]
    assert op["phase"] == "backward" and op["fusion"]["rule"] == "SoftmaxGradFusionPass"
    assert len(op["fusion"]["replaces"]) == 4
    # black list: float32 under allow_mix_precision; force_fp16 makes it fp16 (float32 steps inside)
    assert op["compute_dtype"] == ("float32" if mode == "allow_mix_precision" else "float16")
    ins = [d.tensor(ref.rsplit(":", 1)[0], int(ref.rsplit(":", 1)[1])) for ref in op["inputs"]]
    got = d.tensor(op["name"], 0)
    want = softmax_grad_oracle(ins[0], ins[1], got.dtype)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_switching_softmax_grad_off_keeps_the_four_ops(tmp_path):
    model, data = attention_classifier()
    switch = {"Switch": {"GraphFusion": {"SoftmaxGradFusionPass": "off"}}}
    ae.Device("allow_mix_precision", fusion_switch=switch).train(model, data, batch_size=8, steps=1,
                                                                 dump_dir=str(tmp_path), dump_steps=[0],
                                                                 progress=False)
    d = load_dump(str(tmp_path / "step-0"))
    assert not [op for op in d.ops if op["tf_type"] == "_SoftmaxGrad"]
    assert not any(e["rule"] == "SoftmaxGradFusionPass" for e in d.fused_away)
    sums = [op for op in d.ops if op["tf_type"] == "Sum" and op["phase"] == "backward"
            and op["name"].endswith("/Sum") and "attention" in op["name"]]
    assert sums


def test_float32_fused_softmax_grad_matches_tensorflow():
    model, data = attention_classifier()
    res = ae.Device(**fp32(op_model="exact")).train(model, data, batch_size=8, steps=4,
                                                                      reference=True, progress=False)
    rel = np.abs(res.losses - res.reference_losses) / np.abs(res.reference_losses)
    assert rel.max() < 1e-5


@pytest.mark.parametrize("ctx_kw", [dict(dtype="float32"), dict(dtype="float32", overflow_mode="saturation"),
                                    dict(dtype="float32", subnormals="flush"), dict(dtype="float32", ftz=True),
                                    dict(dtype="float16")], ids=["inf_nan", "saturation", "flush", "ftz", "fp16"])
def test_update_chain_op_is_its_ops_one_by_one(ctx_kw):
    """``_UpdateChain`` (npu/update_chain.py's node for an optimizer's update ops) against the registry's ops run
    one by one, values and status: Adam's steps on data with float32 subnormals, values whose squares and
    products overflow, Inf and NaN, a zero under a division; one pass only where it gives the same."""
    from ascend_emu.ops import OPS, OpContext

    rng = np.random.default_rng(7)
    shape = (3, 700)
    g, m, v, w = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    v = np.abs(v)
    g[0, :5] = [3e20, -3e38, np.inf, np.nan, 1e-40]
    v[1, :2] = [0.0, 1e-45]
    singles = [np.array(x, np.float32) for x in (0.1, 0.001, 1e-3, 0.0)]   # 1 - b1, 1 - b2, alpha, eps = 0
    steps = (("sub", 0, 1), ("mul", 8, 4), ("add", 1, 9), ("square", 0, -1), ("sub", 11, 2), ("mul", 12, 5),
             ("add", 2, 13), ("mul", 10, 6), ("sqrt", 14, -1), ("add", 16, 7), ("realdiv", 15, 17), ("sub", 3, 18),
             ("neg", 19, -1))
    outputs = (20, 10, 14, 19, 1)
    tf_type = {"add": "AddV2", "sub": "Sub", "mul": "Mul", "realdiv": "RealDiv", "neg": "Neg", "square": "Square",
               "sqrt": "Sqrt"}
    from ascend_emu.numerics.chain import chain_f32

    finite = [np.nan_to_num(g, posinf=1.0, neginf=1.0, nan=1.0).clip(-1e3, 1e3), m, v + 1, w]
    for data in ([g, m, v, w], finite):
        with np.errstate(over="ignore"):
            xs = [np.asarray(d, np.float16 if ctx_kw["dtype"] == "float16" else np.float32) for d in data]
        one_pass = chain_f32(list(xs) + singles, steps, outputs) is not None
        assert one_pass == (data is finite and ctx_kw["dtype"] == "float32")   # (so both paths are seen)
        ctx = OpContext(**ctx_kw)
        got = OPS["_UpdateChain"](*xs, ctx=ctx, steps=steps, outputs=outputs, consts=tuple(singles))
        vals, status = list(xs) + [s.astype(xs[0].dtype) for s in singles], 0
        for name, a, b in steps:
            c = OpContext(**ctx_kw)
            vals.append(OPS[tf_type[name]](*((vals[a],) if b < 0 else (vals[a], vals[b])), ctx=c)[0])
            status |= c.status
        assert ctx.status == status, ctx_kw
        for x, y in zip(got, (vals[o] for o in outputs)):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


@pytest.mark.parametrize("overflow_mode", ["inf_nan", "saturation"])
def test_bn_dx_chain_op_is_the_one_pass(overflow_mode):
    """``"_BnDxChain"`` (npu/bn_chain.py's node for batch norm's fp16 input gradient) as the registry runs it (its four
    ops one by one in the context's fp16) against the replay's one pass (numerics.chain.bn_dx_f16, the kernel
    kernels/chain16.py) on finite data with fp16-exact operands: the same bits, no status; and the op's status where
    the one pass declines (a product past 65504)."""
    from ascend_emu.numerics.chain import bn_dx_f16
    from ascend_emu.ops import OPS, OpContext

    rng = np.random.default_rng(20)
    g = (rng.standard_normal((4, 8, 8, 16)) * 3).astype(np.float16)
    x = (rng.standard_normal((4, 8, 8, 16)) * 2).astype(np.float16)
    s, m, b, t = (rng.standard_normal(16).astype(np.float16).astype(np.float32) for _ in range(4))
    n, k = np.float32(256.0), np.float32(-2.0)
    ctx = OpContext(dtype="float16", overflow_mode=overflow_mode)
    ops = OPS["_BnDxChain"](g, s.astype(np.float16), x, m.astype(np.float16), b.astype(np.float16),
                            n.astype(np.float16), k.astype(np.float16), t.astype(np.float16), ctx=ctx)[0]
    one = bn_dx_f16(g, s, x, m, b, n, k, t)
    assert one is not None and ctx.status == 0
    assert ops.dtype == np.float16 and np.array_equal(ops.view(np.uint16), one.view(np.uint16))
    g[0, 0, 0, :2] = [60000.0, -60000.0]
    s[:2] = 4.0
    ctx = OpContext(dtype="float16", overflow_mode=overflow_mode)
    OPS["_BnDxChain"](g, s.astype(np.float16), x, m.astype(np.float16), b.astype(np.float16), n.astype(np.float16),
                      k.astype(np.float16), t.astype(np.float16), ctx=ctx)
    assert bn_dx_f16(g, s, x, m, b, n, k, t) is None and ctx.status != 0

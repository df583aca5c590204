"""Fusion: switches, pattern matching, and the numerics of every fused op against an oracle of its formula.

Oracles (float64, written independently of ascend_emu.ops.fused_ops): a fused cube op is the exact
product of its (cast) operands plus the float32 bias, its elementwise chain applied in numpy float32,
rounded once; LayerNorm and Gelu are their float64 formulas rounded once; an AutomaticUbFusion chain
is numpy float32 steps rounded once. "Unfused" oracles round after every op, and the fused results
match the fused oracle, not the unfused one, exactly where NUMERICS.md section 6 says.
"""
import json
import math
import warnings

import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.npu.fusion import GRAPH, RULES, UB, FusionConfig, apply_fusion
from ascend_emu.graph import tensor_name
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)

ALL_RULES = ["SpaceToBatchConv2dBatchToSpacePass", "BiasaddConvFusionPass", "ConvBatchnormFusionPass",
             "MatMulBiasAddFusionPass", "MatMulReshapeBiasAddFusionPass", "LayerNormFusionPass", "GeluFusionPass",
             "SoftmaxGradFusionPass", "TbeEltwiseFusionPass", "AutomaticUbFusion"]


# --------------------------------------------------------------------------- switches

def test_registry_order_and_texts():
    assert list(RULES) == ALL_RULES
    kinds = [RULES[r].kind for r in RULES]
    assert kinds == sorted(kinds, key=lambda k: (k != GRAPH))  # graph passes first, then UB
    for r in RULES.values():
        assert r.pattern and r.numerics and r.kind in (GRAPH, UB)


def test_switch_default_all_on_and_fusion_off():
    on = FusionConfig.load(None)
    assert all(on.enabled(r) for r in RULES)
    off = FusionConfig.load("off")
    assert not any(off.enabled(r) for r in RULES)


def test_switch_all_plus_per_pass_overrides():
    cfg = FusionConfig.load({"Switch": {"GraphFusion": {"ALL": "off", "GeluFusionPass": "on"},
                                        "UBFusion": {"TbeEltwiseFusionPass": "off"}}})
    assert cfg.enabled("GeluFusionPass")
    assert not cfg.enabled("ConvBatchnormFusionPass") and not cfg.enabled("LayerNormFusionPass")
    assert not cfg.enabled("TbeEltwiseFusionPass")
    assert cfg.enabled("AutomaticUbFusion")          # UB's ALL defaults to on
    cfg = FusionConfig.load({"Switch": {"UBFusion": {"ALL": "off"}}})
    assert all(cfg.enabled(r) == (RULES[r].kind == GRAPH) for r in RULES)


def test_switch_file_json_and_line_format(tmp_path):
    p = tmp_path / "fusion_switch.cfg"
    p.write_text(json.dumps({"Switch": {"GraphFusion": {"ConvBatchnormFusionPass": "off"}, "UBFusion": {}}}))
    cfg = FusionConfig.load(str(p))
    assert not cfg.enabled("ConvBatchnormFusionPass") and cfg.enabled("GeluFusionPass")
    # ATC / AOE line format
    p.write_text("# comment\nConvBatchnormFusionPass:off\nAutomaticUbFusion : off\n")
    cfg = FusionConfig.load(p)
    assert not cfg.enabled("ConvBatchnormFusionPass") and not cfg.enabled("AutomaticUbFusion")
    assert cfg.enabled("TbeEltwiseFusionPass")
    p.write_text("ALL:off\nGeluFusionPass:on\n")
    cfg = FusionConfig.load(p)
    assert [r for r in RULES if cfg.enabled(r)] == ["GeluFusionPass"]


def test_switch_unknown_pass_warns_with_closest_names():
    with pytest.warns(UserWarning, match="ConvBatchnormFusionPass"):
        cfg = FusionConfig.load({"Switch": {"GraphFusion": {"ConvBatchNormFusionPas": "off"}}})
    assert all(cfg.enabled(r) for r in RULES)
    with pytest.warns(UserWarning, match="unknown fusion pass 'Zzz'"):
        FusionConfig.load({"Switch": {"GraphFusion": {"Zzz": "off"}}})
    # a real CANN pass the emulator does not model: accepted silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FusionConfig.load({"Switch": {"GraphFusion": {"SoftmaxGradFusionPass": "off"}}})
    # listed under the wrong section: warned, applied to its own
    with pytest.warns(UserWarning, match="is a UBFusion pass"):
        cfg = FusionConfig.load({"Switch": {"GraphFusion": {"AutomaticUbFusion": "off"}}})
    assert not cfg.enabled("AutomaticUbFusion")


@pytest.mark.parametrize("content, match", [
    ("{not json", "neither valid JSON"),
    ("", "neither valid JSON"),
    ('{"GraphFusion": {"ALL": "off"}}', "expected"),
    ('{"Switch": {"GraphFusion": {"ALL": "no"}}}', "use \"on\" or \"off\""),
    ('{"Switch": {"Fusion": {"ALL": "off"}}}', "unknown section 'Fusion'"),
    ('{"Switch": {"GraphFusion": ["ALL"]}}', "must map pass names"),
    ('[1, 2]', "expected"),
    ("ConvBatchnormFusionPass=off\n", "neither valid JSON"),
])
def test_switch_malformed_files_are_clear_errors(tmp_path, content, match):
    p = tmp_path / "bad.cfg"
    p.write_text(content)
    with pytest.raises(AscendEmuError, match=match) as e:
        FusionConfig.load(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_switch_missing_file(tmp_path):
    with pytest.raises(AscendEmuError, match="not found"):
        FusionConfig.load(tmp_path / "nope.cfg")


def test_device_takes_the_switch():
    from ascend_emu.npu.device import Device

    d = Device(fusion_switch="off")
    assert not any(d.fusion.enabled(r) for r in RULES)
    assert d.config()["fusion_switch"]["enabled"]["GeluFusionPass"] is False


# --------------------------------------------------------------------------- small graphs

def _tf():
    from ascend_emu.frontend.tf.loader import import_tf
    return import_tf()


def graph_of(fn, *shapes):
    """Frozen Graph of a tf.function over float32 inputs of ``shapes``."""
    tf = _tf()
    from ascend_emu.frontend.tf.loader import load_graph
    f = tf.function(fn, input_signature=[tf.TensorSpec(s, tf.float32) for s in shapes])
    return load_graph(f)


def fused(graph, switch=None):
    return apply_fusion(graph, FusionConfig.load(switch))


def by_op(f, op):
    return [n for n in f.nodes if n.op == op]


RNG = np.random.default_rng(7)
W = RNG.normal(0, 0.3, (3, 3, 4, 6)).astype(np.float32)
DW = RNG.normal(0, 0.3, (3, 3, 4, 2)).astype(np.float32)
GAMMA = RNG.uniform(0.5, 1.5, 6).astype(np.float32)
BETA = RNG.normal(0, 0.1, 6).astype(np.float32)
MEAN = RNG.normal(0, 0.1, 6).astype(np.float32)
VAR = RNG.uniform(0.5, 2.0, 6).astype(np.float32)
BIAS = RNG.normal(0, 0.5, 6).astype(np.float32)


def conv_fbn(x):
    tf = _tf()
    y = tf.nn.conv2d(x, W, 1, "SAME")
    y, _, _ = tf.compat.v1.nn.fused_batch_norm(y, GAMMA, BETA, mean=MEAN, variance=VAR, epsilon=1e-3,
                                               is_training=False)
    return tf.nn.relu(y)


def conv_bias_keras_bn(x):
    tf = _tf()
    y = tf.nn.bias_add(tf.nn.conv2d(x, W, 1, "SAME"), BIAS)
    return tf.nn.relu6(tf.nn.batch_normalization(y, MEAN, VAR, BETA, GAMMA, 1e-3))


def test_conv_fused_batch_norm_v3_is_folded():
    g = graph_of(conv_fbn, (1, 8, 8, 4))
    assert "FusedBatchNormV3" in {n.op for n in g.nodes}
    f = fused(g, {"Switch": {"UBFusion": {"ALL": "off"}}})
    assert f.counts == {"ConvBatchnormFusionPass": 1}
    (conv,) = by_op(f, "_FusedConv2D")
    bn = next(n for n in g.nodes if n.op == "FusedBatchNormV3")
    assert conv.name == bn.name
    assert conv.meta["fusion"]["replaces"] == ["Conv2D", bn.name]
    assert conv.meta["ascend_type"] == "Conv2D"
    assert f.fused_away == [{"name": "Conv2D", "tf_type": "Conv2D", "rule": "ConvBatchnormFusionPass",
                             "into": bn.name}]
    # the folded filter is a new float32 Const: w * gamma / sqrt(var + eps), in float32
    filt = next(n for n in f.nodes if n.name == tensor_name(conv.inputs[1])[:-2])
    scale = GAMMA / np.sqrt(VAR + np.float32(1e-3))
    np.testing.assert_array_equal(filt.attrs["value"], (W * scale).astype(np.float32))
    np.testing.assert_array_equal(conv.attrs["bias"], (BETA - MEAN * scale).astype(np.float32))
    # with UB fusion on, the Relu joins the fused conv
    f = fused(g)
    assert f.counts == {"ConvBatchnormFusionPass": 1, "TbeEltwiseFusionPass": 1}
    (conv,) = by_op(f, "_FusedConv2D")
    assert [s["op"] for s in conv.attrs["chain"]] == ["Relu"]
    assert conv.meta["fusion"]["rules"] == ["ConvBatchnormFusionPass", "TbeEltwiseFusionPass"]
    assert {e["into"] for e in f.fused_away} == {conv.name} and len(f.fused_away) == 2


def test_conv_bias_then_keras_style_bn():
    g = graph_of(conv_bias_keras_bn, (1, 8, 8, 4))
    f = fused(g)
    assert f.counts == {"BiasaddConvFusionPass": 1, "ConvBatchnormFusionPass": 1, "TbeEltwiseFusionPass": 1}
    (conv,) = by_op(f, "_FusedConv2D")
    assert [s["op"] for s in conv.attrs["chain"]] == ["Relu6"]
    # everything but Const nodes of the original graph is gone except the input
    left = {n.op for n in f.nodes} - {"Const", "Placeholder", "Identity"}
    assert left == {"_FusedConv2D"}
    # the BN's constant chain (Rsqrt(var + eps) * gamma, beta - mean * scale) folded on the host in float32
    scale = (np.float32(1) / np.sqrt(VAR + np.float32(1e-3))).astype(np.float32) * GAMMA
    np.testing.assert_allclose(conv.attrs["bias"], BIAS * scale + (BETA - MEAN * scale), rtol=1e-6, atol=1e-7)
    # BiasaddConv off: the BN no longer follows the conv directly and is not folded (as in CANN)
    f = fused(g, {"Switch": {"GraphFusion": {"BiasaddConvFusionPass": "off"}, "UBFusion": {"ALL": "off"}}})
    assert f.counts == {}


def test_depthwise_conv_bn_folds_per_output_channel():
    tf = _tf()

    def fn(x):
        y = tf.nn.depthwise_conv2d(x, DW, [1, 1, 1, 1], "SAME")
        g, b, m, v = (np.resize(a, 8) for a in (GAMMA, BETA, MEAN, VAR))
        return tf.nn.batch_normalization(y, m, v, b, g, 1e-3)

    g = graph_of(fn, (1, 8, 8, 4))
    f = fused(g)
    assert f.counts == {"ConvBatchnormFusionPass": 1}
    (conv,) = by_op(f, "_FusedConv2D")
    assert conv.attrs["base"] == "DepthwiseConv2dNative" and conv.meta["ascend_type"] == "DepthwiseConv2D"
    filt = next(n for n in f.nodes if n.name + ":0" == tensor_name(conv.inputs[1]))
    scale = np.resize(GAMMA, 8) / np.sqrt(np.resize(VAR, 8) + np.float32(1e-3))
    np.testing.assert_allclose(filt.attrs["value"], DW * scale.reshape(4, 2), rtol=2e-7)


def test_no_match_when_an_intermediate_is_used_elsewhere_or_params_not_constant():
    tf = _tf()

    def shared(x):
        y = tf.nn.conv2d(x, W, 1, "SAME")
        z = tf.nn.batch_normalization(y, MEAN, VAR, BETA, GAMMA, 1e-3)
        return z, tf.reduce_sum(y)            # the conv output is read outside the BN

    f = fused(graph_of(shared, (1, 8, 8, 4)), "off")
    assert f.counts == {}
    f = fused(graph_of(shared, (1, 8, 8, 4)), {"Switch": {"UBFusion": {"ALL": "off"}}})
    assert "ConvBatchnormFusionPass" not in f.counts

    def varying(x, s):
        y = tf.nn.conv2d(x, W, 1, "SAME")
        return y * s[0, 0, 0] + BETA          # the scale is an input, not a constant

    f = fused(graph_of(varying, (1, 8, 8, 4), (1, 1, 1, 6)), {"Switch": {"UBFusion": {"ALL": "off"}}})
    assert f.counts == {}

    def out_inside(x):
        y = tf.nn.conv2d(x, W, 1, "SAME")
        return tf.nn.relu(y), y               # a model output inside the chain

    f = fused(graph_of(out_inside, (1, 8, 8, 4)))
    assert f.counts == {}


def test_matmul_bias_add_variants():
    tf = _tf()
    w = RNG.normal(0, 0.3, (5, 7)).astype(np.float32)
    b = RNG.normal(0, 1, 7).astype(np.float32)

    def fn(x, y):
        p = tf.nn.bias_add(tf.matmul(x, w), b)                    # MatMul + BiasAdd
        q = tf.matmul(x, w, transpose_b=False) + b.reshape(1, 7)  # MatMul + AddV2 of a (1, N) constant
        r = tf.linalg.matmul(y, w) + b                            # BatchMatMulV2 + AddV2
        s = tf.einsum("bij,jk->bik", y, w) + b                    # Einsum + AddV2
        t = tf.matmul(x, w) + tf.reduce_sum(x)                    # not a constant: a UB chain instead
        return p, q, r, s, t

    g = graph_of(fn, (3, 5), (2, 3, 5))
    f = fused(g)
    assert f.counts == {"MatMulBiasAddFusionPass": 4, "TbeEltwiseFusionPass": 1}
    kinds = sorted((n.op, n.attrs["base"], bool(n.attrs.get("chain"))) for n in f.nodes if n.op.startswith("_Fused"))
    assert kinds == [("_FusedBatchMatMul", "BatchMatMulV2", False), ("_FusedBatchMatMul", "Einsum", False),
                     ("_FusedMatMul", "MatMul", False), ("_FusedMatMul", "MatMul", False),
                     ("_FusedMatMul", "MatMul", True)]
    for n in f.nodes:
        if n.op.startswith("_Fused") and not n.attrs.get("chain"):
            np.testing.assert_array_equal(n.attrs["bias"], b)
            assert n.meta["ascend_type"] in ("MatMulV2", "BatchMatMulV2")


def test_matmul_reshape_bias_add_only_where_cann_fuses_it():
    """MatMulReshapeBiasAddFusionPass: the three ops become one _FusedMatMul named after the add, its output the
    add's shape; a Reshape read elsewhere, one changing the last dimension, a bias not constant are left alone,
    and the pass switches off by name."""
    tf = _tf()
    w = RNG.normal(0, 0.3, (16, 24)).astype(np.float32)
    b = RNG.normal(0, 1, 24).astype(np.float32)

    def fn(y):
        return tf.nn.bias_add(tf.tensordot(y, w, axes=1), b)

    g = graph_of(fn, (2, 5, 16))
    f = fused(g)
    assert f.counts == {"MatMulReshapeBiasAddFusionPass": 1}
    (node,) = by_op(f, "_FusedMatMul")
    assert node.name.endswith("BiasAdd") and node.attrs["reshape"] == 2 and not node.attrs.get("chain")
    assert node.meta["ascend_type"] == "MatMulV2" and len(node.inputs) == 3
    np.testing.assert_array_equal(node.attrs["bias"], b)
    assert {e["tf_type"] for e in f.fused_away} == {"MatMul", "Reshape"}
    assert fused(g, {"Switch": {"GraphFusion": {"MatMulReshapeBiasAddFusionPass": "off"}}}).counts == {}

    def shared(y):   # the Reshape's output read elsewhere too
        r = tf.tensordot(y, w, axes=1)
        return tf.nn.bias_add(r, b), r * np.float32(2)

    def last_dim(x):   # the Reshape's last dimension is 1: the add broadcasts, it does not add per column
        return tf.reshape(tf.matmul(x, w), (8, 24, 1)) + b

    def varying(y, v):   # the bias is an input
        return tf.nn.bias_add(tf.tensordot(y, w, axes=1), v[0])

    def product_read(x):   # the MatMul's output read elsewhere too
        r = tf.matmul(x, w)
        return tf.reshape(r, (2, 4, 24)) + b, r

    def wide_bias(x):   # a bias of more dimensions than one (CANN's Add takes a 1-D one): it may broadcast wider
        return tf.reshape(tf.matmul(x, w), (2, 4, 24)) + b.reshape(1, 1, 1, 24), \
            tf.reshape(tf.matmul(x, w * np.float32(2)), (2, 4, 24)) + b.reshape(1, 24)

    for fn, shapes in ((shared, [(2, 5, 16)]), (last_dim, [(8, 16)]), (varying, [(2, 5, 16), (1, 24)]),
                       (product_read, [(8, 16)]), (wide_bias, [(8, 16)])):
        assert "MatMulReshapeBiasAddFusionPass" not in fused(graph_of(fn, *shapes)).counts, fn.__name__


@pytest.mark.parametrize("reshaped", [False, True])
def test_bias_chain_sharing_the_weights_producer_keeps_it(reshaped):
    """A bias computed from the weights through a node the product reads too (a Mul of the weights, Sum): the
    fused op still reads that node, so it stays in the graph (it was taken with the bias chain) and the replay
    matches TensorFlow in float32."""
    from ascend_emu.npu.device import Device
    from ascend_emu.frontend.tf.reference import reference

    tf = _tf()
    w = RNG.normal(0, 0.3, (16, 24)).astype(np.float32)

    def fn(x):
        wi = tf.constant(w) * np.float32(2)   # a node of the constant chain, not a Const
        bias = tf.reduce_sum(wi, axis=0)
        p = tf.matmul(tf.reshape(x, (-1, 16)), wi)
        return tf.nn.bias_add(tf.reshape(p, (2, 4, 24)) if reshaped else p, bias)

    g = graph_of(fn, (8, 16))
    rule = "MatMulReshapeBiasAddFusionPass" if reshaped else "MatMulBiasAddFusionPass"
    f = fused(g)
    assert f.counts == {rule: 1}
    kept = {n.name for n in f.nodes}
    (node,) = by_op(f, "_FusedMatMul")
    assert all(tensor_name(r).split(":")[0] in kept for r in node.inputs)
    dev = Device(**fp32(op_model="exact"))
    rep = dev.replay(g, seed=3, progress=False)
    ref = reference(g, rep.inputs, progress=False)
    assert check_float32_against_tf(rep, ref, dev) == 1


def test_matmul_reshape_bias_add_last_dim_checked_at_run_time():
    """A Reshape whose shape is computed and not inferred (an ONNX model's) is checked when it runs: a last
    dimension other than the product's columns is a clear error naming the pass to switch off."""
    from ascend_emu.graph.core import Graph, InputSpec, Node
    from ascend_emu.npu.device import Device

    w = RNG.normal(0, 0.3, (16, 24)).astype(np.float32)
    b = RNG.normal(0, 1, 24).astype(np.float32)
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [8, 16]}),
             Node("s", "Placeholder", [], {"dtype": "int32", "shape": [3]}),
             Node("w", "Const", [], {"value": w, "dtype": "float32"}),
             Node("b", "Const", [], {"value": b, "dtype": "float32"}),
             Node("mm", "MatMul", ["x", "w"], {"T": "float32"}),
             Node("r", "Reshape", ["mm", "s"], {"T": "float32"}),
             Node("add", "AddV2", ["r", "b"], {"T": "float32"})]
    g = Graph(nodes=nodes, inputs=[InputSpec("x", "float32", [8, 16]), InputSpec("s", "int32", [3])],
              outputs=["add:0"])
    x = RNG.normal(0, 1, (8, 16)).astype(np.float32)
    dev = Device("force_fp16")
    rep = dev.replay(g, {"x": x, "s": np.array([2, 4, 24], np.int32)}, progress=False)
    assert rep.summary["fusion_counts"] == {"MatMulReshapeBiasAddFusionPass": 1}
    assert rep.outputs["add:0"].shape == (2, 4, 24)
    for shape in ([2, -1, 24], [2, 4, -1]):   # a -1 resolved as the Reshape resolves it
        rep = dev.replay(g, {"x": x, "s": np.array(shape, np.int32)}, progress=False)
        assert rep.outputs["add:0"].shape == (2, 4, 24), shape
    with pytest.raises(AscendEmuError, match="MatMulReshapeBiasAddFusionPass off"):
        dev.replay(g, {"x": x, "s": np.array([8, 24, 1], np.int32)}, progress=False)
    # a chain with the fused Reshape (no rule makes one) is refused before anything is computed
    from ascend_emu.ops import OPS
    from ascend_emu.ops.registry import OpContext

    relu = [{"op": "Relu", "args": [-1], "attrs": {}, "name": "relu"}]
    with pytest.raises(AscendEmuError, match="both a fused Reshape and an elementwise chain"):
        OPS["_FusedMatMul"].fn(x, w, np.array([2, 4, 24], np.int32), ctx=OpContext(dtype="float16"), bias=b,
                               chain=relu, reshape=2)


def test_layer_norm_patterns():
    tf = _tf()
    import keras

    keras.utils.set_random_seed(0)
    variants = [({}, 3), ({"center": False}, 2), ({"scale": False}, 2), ({"scale": False, "center": False}, 1)]
    for kwargs, inputs in variants:
        inp = keras.Input((6, 16))
        layer = keras.layers.LayerNormalization(epsilon=1e-4, **kwargs)
        m = keras.Model(inp, layer(inp))
        from ascend_emu.frontend.tf.loader import load_graph
        g = load_graph(m)
        f = fused(g)
        assert f.counts == {"LayerNormFusionPass": 1}, kwargs
        (ln,) = by_op(f, "_LayerNorm")
        assert len(ln.inputs) == inputs and ln.attrs["epsilon"] == pytest.approx(1e-4, rel=1e-6)
        assert ln.attrs["axis"] == [-1] and ln.meta["ascend_type"] == "LayerNorm"
        assert {n.op for n in f.nodes} <= {"Placeholder", "Const", "Reshape", "_LayerNorm", "Identity"}

    def tf_moments(x):   # the tf.nn.moments + batch_normalization form
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return tf.nn.batch_normalization(x, mean, var, BETA[:1], GAMMA[:1], 1e-5)

    f = fused(graph_of(tf_moments, (2, 6, 16)))
    assert f.counts == {"LayerNormFusionPass": 1}


def gelu_erfc(x):
    return _tf().nn.gelu(x, approximate=False)


def gelu_tanh(x):
    return _tf().nn.gelu(x, approximate=True)


def gelu_erf(x):
    tf = _tf()
    return 0.5 * x * (1.0 + tf.math.erf(x / np.float32(math.sqrt(2.0))))


def gelu_tanh_mul(x):   # x^3 as x * x * x, constants folded differently
    tf = _tf()
    return x * 0.5 * (1.0 + tf.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * (x * x * x))))


@pytest.mark.parametrize("fn, approx", [(gelu_erfc, "none"), (gelu_tanh, "tanh"), (gelu_erf, "none"),
                                        (gelu_tanh_mul, "tanh")])
def test_gelu_patterns(fn, approx):
    g = graph_of(fn, (4, 8))
    f = fused(g)
    assert f.counts == {"GeluFusionPass": 1}
    (gl,) = by_op(f, "_Gelu")
    assert gl.attrs["approximate"] == approx and gl.inputs == ["x:0"]
    assert {n.op for n in f.nodes} <= {"Placeholder", "Const", "_Gelu", "Identity"}


def test_fused_tanh_gelu_keeps_its_tail_for_negative_inputs():
    """0.5 x (1 + tanh u) cancels to 0 for x << 0; the fused op keeps the tiny true value, as the vector unit does."""
    from ascend_emu.ops import OpContext, run_op

    x = np.array([-8.0, -6.0, -4.0], np.float32)
    (y,) = run_op("_Gelu", x, ctx=OpContext(dtype="float32"), approximate="tanh")
    u = math.sqrt(2 / math.pi) * (x.astype(np.float64) + 0.044715 * x.astype(np.float64) ** 3)
    tail = x * np.exp(2 * u) * (1 - np.exp(2 * u))  # x * sigmoid(2u) for 2u << 0, to O(e^(4u))
    assert np.all(y < 0) and np.allclose(y, tail, rtol=1e-6)


def test_sourced_gelu_is_the_tanh_form_in_float32_too():
    """After GeluFusionPass an exact (erf) gelu runs CANN's tanh-form kernel: in float32 mode the replay
    differs from TF by the approximation (|gelu_tanh - gelu_erf| < 5e-4), not by float32 rounding."""
    from ascend_emu.frontend.tf.reference import reference
    from ascend_emu.npu.device import Device

    g = graph_of(gelu_erfc, (64, 64))
    x = {"x": np.linspace(-6, 6, 64 * 64, dtype=np.float32).reshape(64, 64)}
    ref = reference(g, x, progress=False)
    for model in ("tbe_v100", "tbe_v220"):     # the Ascend910's kernels and the Ascend910B's
        rep = Device(**fp32(op_model=model)).replay(g, x, progress=False)
        d = np.abs(rep.outputs[g.outputs[0]].astype(np.float64) - ref.outputs[g.outputs[0]].astype(np.float64))
        assert 1e-4 < d.max() < 5e-4, (model, d.max())
    exact = Device(**fp32(op_model="exact")).replay(g, x, progress=False)
    assert np.abs(exact.outputs[g.outputs[0]] - ref.outputs[g.outputs[0]]).max() <= 1e-6


def test_gelu_wrong_constant_is_not_gelu():
    tf = _tf()

    def fn(x):
        return 0.5 * x * (1.0 + tf.math.erf(x / np.float32(1.5)))

    f = fused(graph_of(fn, (4, 8)), {"Switch": {"UBFusion": {"ALL": "off"}}})
    assert f.counts == {}


def test_automatic_ub_chain_and_limit():
    tf = _tf()

    def fn(x, y):
        z = x
        for i in range(30):   # 60 elementwise ops in one single-reader chain
            z = tf.nn.relu(z * np.float32(1.01) + y)
        return z, tf.exp(x) * y

    g = graph_of(fn, (4, 8), (4, 8))
    f = fused(g)
    chains = by_op(f, "_EltwiseChain")
    assert f.counts == {"AutomaticUbFusion": 5}
    lens = sorted(len(c.attrs["chain"]) for c in chains)
    assert lens == [2, 6, 28, 28, 28]     # 90 ops cut into pieces of at most 28, and exp(x) * y
    from ascend_emu.npu.precision import ascend_type
    assert all(c.meta["ascend_type"] == ascend_type(c.attrs["chain"][0]["op"]) for c in chains)


# --------------------------------------------------------------------------- oracles

def _pads(padding, size, k, s, explicit=None):
    if padding == "SAME":
        out = -(-size // s)
        total = max((out - 1) * s + k - size, 0)
        return total // 2, total - total // 2
    if padding == "VALID":
        return 0, 0
    return explicit


def conv_f64(x, w, attrs, depthwise):
    """Exact-ish (float64) NHWC convolution / depthwise convolution."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    st = attrs.get("strides", [1, 1, 1, 1])
    dl = attrs.get("dilations", [1, 1, 1, 1])
    sh, sw, dh, dw = st[1], st[2], dl[1], dl[2]
    kh, kw = w.shape[:2]
    ekh, ekw = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    e = list(attrs.get("explicit_paddings") or [0] * 8)
    ph = _pads(attrs["padding"], x.shape[1], ekh, sh, (e[2], e[3]))
    pw = _pads(attrs["padding"], x.shape[2], ekw, sw, (e[4], e[5]))
    xp = np.pad(x, ((0, 0), ph, pw, (0, 0)))
    oh, ow = (xp.shape[1] - ekh) // sh + 1, (xp.shape[2] - ekw) // sw + 1
    out = 0.0
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw, :]
            if depthwise:
                out = out + (patch[..., :, None] * w[i, j]).reshape(patch.shape[:3] + (-1,))
            else:
                out = out + patch @ w[i, j]
    return out


def matmul_f64(node, a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    at = node.attrs
    if node.attrs["base"] == "MatMul":
        return (a.T if at.get("transpose_a") else a) @ (b.T if at.get("transpose_b") else b)
    if node.attrs["base"] == "Einsum":
        return np.einsum(at["equation"].replace("...", "Z"), a, b) if "..." not in at["equation"] \
            else np.einsum(at["equation"], a, b)
    return (np.swapaxes(a, -1, -2) if at.get("adj_x") else a) @ (np.swapaxes(b, -1, -2) if at.get("adj_y") else b)


F32_STEPS = {
    "Relu": lambda x: np.maximum(x, np.float32(0)),
    "Relu6": lambda x: np.minimum(np.maximum(x, np.float32(0)), np.float32(6)),
    "Add": np.add, "AddV2": np.add, "BiasAdd": np.add, "Sub": np.subtract, "Mul": np.multiply,
    "RealDiv": np.divide, "Maximum": np.maximum, "Minimum": np.minimum, "Neg": np.negative,
    "Exp": lambda x: np.exp(x.astype(np.float64)).astype(np.float32),
    "Tanh": lambda x: np.tanh(x.astype(np.float64)).astype(np.float32),
}
#: chain steps whose result commutes with rounding: fusing them does not change a bit
TRANSPARENT = {"Relu", "Relu6", "Neg"}


def chain_f32(chain, value, inputs, op_dtype, model="exact"):
    import naive

    for step in chain:
        args = [value if a == -1 else np.asarray(inputs[a]).astype(op_dtype).astype(np.float32) for a in step["args"]]
        if step["op"] == "Tanh" and model != "exact":   # the sourced kernel, float32 data
            value = naive.steps32("tanh_ascendc" if model == "ascendc" else "tanh_tbe", *args)[0]
        else:
            value = F32_STEPS[step["op"]](*args).astype(np.float32)
    return value


def gelu_oracle(x, approximate):
    x = np.asarray(x, np.float64)
    if approximate == "tanh":  # NUMERICS section 2's form of 0.5 x (1 + tanh u), without cancellation
        u = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
        with np.errstate(over="ignore"):
            return x / (1 + np.exp(-2 * u))
    return np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.reshape(-1)]).reshape(x.shape)


def ln_oracle(x, params, attrs):
    x = np.asarray(x, np.float64)
    ax = tuple(a % x.ndim for a in attrs["axis"])
    mu = np.mean(x, axis=ax, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=ax, keepdims=True)
    y = (x - mu) * (1.0 / np.sqrt(var + attrs["epsilon"]))
    params = [np.asarray(p, np.float64) for p in params]
    if attrs["has_gamma"]:
        y = y * params.pop(0)
    if attrs["has_beta"]:
        y = y + params.pop(0)
    return y


def fused_oracle(node, inputs, op_dtype, out_dtype, model="exact"):
    """The fused op's formula: exact inside (float32 for UB chains), one rounding to ``out_dtype``; under a
    sourced ``model``, LayerNorm, Gelu and Tanh steps are CANN's kernels step by step (tests/naive.py)."""
    cast = [np.asarray(a).astype(op_dtype) if np.asarray(a).dtype.kind == "f" else a for a in inputs]
    op = node.op
    if op in ("_FusedConv2D", "_FusedMatMul", "_FusedBatchMatMul"):
        if op == "_FusedConv2D":
            acc = conv_f64(cast[0], cast[1], node.attrs, node.attrs["base"] == "DepthwiseConv2dNative")
        else:
            acc = matmul_f64(node, cast[0], cast[1])
        if node.attrs.get("bias") is not None:
            acc = acc + np.asarray(node.attrs["bias"], np.float64)
        if node.attrs.get("reshape") is not None:   # MatMulReshapeBiasAddFusionPass: the Reshape after the bias
            acc = acc.reshape([int(d) for d in np.asarray(inputs[node.attrs["reshape"]]).reshape(-1)])
        if node.attrs.get("chain"):
            # the chain's other operands meet the accumulator in the cube's output dtype
            acc = chain_f32(node.attrs["chain"], acc.astype(np.float32), inputs, out_dtype, model)
        return acc.astype(out_dtype)
    if op == "_LayerNorm" and model != "exact":
        import naive

        at = node.attrs
        params = list(cast[1:])
        gamma = params.pop(0) if at["has_gamma"] else None
        beta = params.pop(0) if at["has_beta"] else None
        axes = tuple(a % np.ndim(cast[0]) for a in at["axis"])
        return naive.layer_norm_steps(cast[0], gamma, beta, at["epsilon"], axes, model).astype(out_dtype)
    if op == "_LayerNorm":
        return ln_oracle(cast[0], cast[1:], node.attrs).astype(out_dtype)
    if op == "_Gelu" and model != "exact":
        import naive

        kernel = {"tbe_v100": "gelu_v100", "tbe_v220": "gelu_v220", "ascendc": "gelu_ascendc"}[model]
        return naive.steps32(kernel, np.asarray(cast[0]).astype(np.float32))[0].astype(out_dtype)
    if op == "_Gelu":
        return gelu_oracle(cast[0], node.attrs["approximate"]).astype(out_dtype)
    if op == "_EltwiseChain":
        return chain_f32(node.attrs["chain"], None, inputs, op_dtype, model).astype(out_dtype)
    raise AssertionError(op)


def ulps(a, b):
    """Distance in units in the last place between same-dtype float arrays (nan vs nan: 0)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    bits = {2: (np.uint16, 0x8000), 4: (np.uint32, 0x80000000)}[a.itemsize]

    def ordered(x):
        u = x.view(bits[0]).astype(np.int64)
        mag = u & (bits[1] - 1)
        return np.where(u & bits[1], -mag, mag)
    d = np.abs(ordered(a) - ordered(b))
    both_nan = np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
    return np.where(both_nan, 0, d)


#: the cube accumulates in float32 (blocked sums), the oracle exactly: after the one rounding the
#: results agree but for values near a rounding boundary, by at most one unit
CUBE_ULPS, CUBE_EXACT = 1, 0.97


def check_fused_against_oracle(rep, dev, unfused=None):
    """Every fused op of replay ``rep`` against its oracle; returns {rule: number checked}.

    With ``unfused`` (a replay of the same inputs with fusion off): a fused op whose chain only
    holds rounding-transparent steps gives the same bits as the unfused ops; the others are
    checked to differ from them somewhere when their formula says they should.
    """
    f = apply_fusion(rep.graph, dev.fusion)
    checked: dict = {}
    for node in f.nodes:
        if not node.op.startswith("_"):
            continue
        rec = rep.record(node.name)
        op_dtype = rec.precision["dtype"]
        got = rep.tensor(node.name)
        assert got.dtype == np.dtype(rec.compute_dtype), node.name
        want = fused_oracle(node, [rep.tensor(r) for r in node.inputs], op_dtype, got.dtype, dev.op_model)
        d = ulps(got, want)
        if node.op.startswith("_Fused") and got.dtype == np.float32:
            # fp32 output (force_fp32): the block order shows at fp32 resolution, as in any fp32 GEMM
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()), err_msg=node.name)
        elif node.op.startswith("_Fused"):
            assert d.max() <= CUBE_ULPS and (d == 0).mean() >= CUBE_EXACT, (node.name, d.max(), (d == 0).mean())
        else:
            assert d.max() == 0, (node.name, d.max(), (d != 0).sum())
        for rule in node.meta["fusion"]["rules"]:
            checked[rule] = checked.get(rule, 0) + 1
        if unfused is not None:
            off = unfused.tensor(node.name)
            steps = {s["op"] for s in node.attrs.get("chain", [])}
            rules = set(node.meta["fusion"]["rules"])
            if rules == {"TbeEltwiseFusionPass"} and steps <= TRANSPARENT:
                np.testing.assert_array_equal(got, off, err_msg=node.name)
            elif node.op == "_EltwiseChain" and got.dtype == np.float32:
                # float32 in, float32 inside: the chain is the unfused ops, bit for bit
                np.testing.assert_array_equal(got, off, err_msg=node.name)
            elif got.dtype == np.float32:
                pass
            elif rules & {"ConvBatchnormFusionPass", "LayerNormFusionPass", "GeluFusionPass"} \
                    or steps & {"Add", "AddV2", "BiasAdd", "Sub"} or node.attrs.get("bias") is not None:
                assert (ulps(got, off.astype(got.dtype)) > 0).any(), f"{node.name}: fusion changed nothing"
    return checked


def check_float32_against_tf(rep, ref, dev, cos_min=0.99999, rel=2e-5):
    """In float32 mode every fused op's output matches TensorFlow's op of the same name to float32 rounding."""
    f = apply_fusion(rep.graph, dev.fusion)
    n = 0
    for node in f.nodes:
        if not node.op.startswith("_"):
            continue
        got = rep.tensor(node.name).astype(np.float64).reshape(-1)
        want = ref.tensor(node.name).astype(np.float64).reshape(-1)
        assert rep.tensor(node.name).dtype == np.float32
        cos = float(np.dot(got, want) / (np.linalg.norm(got) * np.linalg.norm(want) or 1.0))
        scale = max(float(np.abs(want).max()), 1e-30)
        assert cos >= cos_min and float(np.abs(got - want).max()) <= rel * scale, \
            (node.name, cos, float(np.abs(got - want).max()) / scale)
        n += 1
    return n


# --------------------------------------------------------------------------- numerics on small graphs

def small_cases():
    tf = _tf()
    w = RNG.normal(0, 0.3, (16, 24)).astype(np.float32)
    b = RNG.normal(0, 1, 24).astype(np.float32)
    g16 = RNG.uniform(0.5, 1.5, 24).astype(np.float32)
    b16 = RNG.normal(0, 0.1, 24).astype(np.float32)

    def mlp(x):
        h = tf.nn.bias_add(tf.matmul(x, w), b)
        mean, var = tf.nn.moments(h, axes=[-1], keepdims=True)
        h = tf.nn.batch_normalization(h, mean, var, b16, g16, 1e-5)
        h = tf.nn.gelu(h, approximate=True) + tf.nn.gelu(h * np.float32(0.5), approximate=False)
        return tf.nn.relu(tf.einsum("bi,ij->bj", h, w.T[:, :16].copy()) * np.float32(3.0) - x)

    def chain(x, y):
        return tf.tanh(tf.exp(x * np.float32(0.7)) - y) * np.float32(1.3) + y

    wq = RNG.normal(0, 0.3, (16, 4, 6)).astype(np.float32)
    bq = RNG.normal(0, 1, 6).astype(np.float32)

    def matmuls(x, y):
        p = tf.nn.bias_add(tf.matmul(x, w, transpose_b=False), b)              # MatMul + BiasAdd
        r = tf.nn.relu(tf.linalg.matmul(y, w) + b)                             # BatchMatMulV2 + Add + Relu
        s = tf.einsum("btd,dnh->bnth", y, wq) + bq                             # Einsum + Add over the last label
        t = tf.nn.depthwise_conv2d(tf.reshape(y, (-1, 4, 4, 16)), np.resize(w, (3, 3, 16, 2)), [1, 1, 1, 1],
                                   "VALID") + np.resize(b, 32)                 # DepthwiseConv2dNative + Add
        u = tf.nn.relu6(-tf.matmul(x, w))                                     # MatMul + Neg + Relu6: no bit changes
        return p, r, s, t, u

    def tensordot(y):
        p = tf.nn.bias_add(tf.tensordot(y, w, axes=1), b)       # MatMul -> Reshape (shape computed) -> BiasAdd
        q = tf.reshape(tf.matmul(tf.reshape(y, (-1, 16)), w), (2, 16, 24)) + b   # a constant shape, AddV2
        return p, q

    return {"conv_fbn": (conv_fbn, [(2, 8, 8, 4)]), "conv_bias_bn": (conv_bias_keras_bn, [(2, 8, 8, 4)]),
            "mlp": (mlp, [(8, 16)]), "chain": (chain, [(8, 16), (8, 16)]),
            "matmuls": (matmuls, [(8, 16), (2, 16, 16)]), "tensordot": (tensordot, [(2, 16, 16)])}


SMALL_COUNTS = {
    "conv_fbn": {"ConvBatchnormFusionPass": 1, "TbeEltwiseFusionPass": 1},
    "conv_bias_bn": {"BiasaddConvFusionPass": 1, "ConvBatchnormFusionPass": 1, "TbeEltwiseFusionPass": 1},
    "mlp": {"MatMulBiasAddFusionPass": 1, "LayerNormFusionPass": 1, "GeluFusionPass": 2, "TbeEltwiseFusionPass": 1},
    "chain": {"AutomaticUbFusion": 1},
    "matmuls": {"BiasaddConvFusionPass": 1, "MatMulBiasAddFusionPass": 3, "TbeEltwiseFusionPass": 2},
    "tensordot": {"MatMulReshapeBiasAddFusionPass": 2},
}
CASES = list(SMALL_COUNTS)


@pytest.mark.parametrize("op_model", ["exact", "tbe_v220"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", ["force_fp16", "allow_mix_precision", "allow_fp32_to_fp16", "force_fp32"])
def test_small_fused_ops_match_oracle(case, mode, op_model):
    from ascend_emu.npu.device import Device

    fn, shapes = small_cases()[case]
    g = graph_of(fn, *shapes)
    dev = Device(mode, soc="Ascend910B", op_model=op_model)
    on = dev.replay(g, seed=3, progress=False)
    off = Device(mode, soc="Ascend910B", fusion_switch="off", op_model=op_model).replay(g, seed=3, progress=False)
    assert on.summary["fusion_counts"] == SMALL_COUNTS[case]
    checked = check_fused_against_oracle(on, dev, off)
    assert set(checked) == set(on.summary["fusion_counts"])


@pytest.mark.parametrize("case", CASES)
def test_small_fused_ops_float32_match_tensorflow(case):
    from ascend_emu.npu.device import Device
    from ascend_emu.frontend.tf.reference import reference

    fn, shapes = small_cases()[case]
    g = graph_of(fn, *shapes)
    # the exact model: CANN's Gelu is the tanh form whatever the graph computed (see the test below)
    dev = Device(**fp32(op_model="exact"))
    rep = dev.replay(g, seed=3, progress=False)
    ref = reference(g, rep.inputs, progress=False)
    assert check_float32_against_tf(rep, ref, dev) == sum(1 for n in apply_fusion(g, dev.fusion).nodes
                                                          if n.op.startswith("_"))


def test_fused_precision_decisions_under_mixed_precision():
    """Cube ops are white (fp16); LayerNorm and Gelu are gray: they follow their producer."""
    from ascend_emu.npu.device import Device

    tf = _tf()
    w = RNG.normal(0, 0.3, (16, 16)).astype(np.float32)

    def fn(x):
        a = tf.nn.gelu(x, approximate=False)                # gray, fed by a graph input: keeps float32
        h = tf.matmul(a, w)
        mean, var = tf.nn.moments(h, axes=[-1], keepdims=True)
        return tf.nn.batch_normalization(h, mean, var, None, None, 1e-5)

    g = graph_of(fn, (4, 16))
    rep = Device("allow_mix_precision").replay(g, seed=0, progress=False)
    f = apply_fusion(g, FusionConfig.load(None))
    kinds = {n.op: rep.record(n.name) for n in f.nodes if n.op.startswith("_")}
    assert set(kinds) == {"_Gelu", "_LayerNorm"}
    assert kinds["_Gelu"].compute_dtype == "float32" and kinds["_Gelu"].precision["list"] == "gray"
    assert kinds["_LayerNorm"].compute_dtype == "float16" and kinds["_LayerNorm"].precision["list"] == "gray"
    assert kinds["_LayerNorm"].ascend_type == "LayerNorm"
    mm = [r for r in rep.records if r.tf_type == "MatMul"]
    assert mm and all(r.compute_dtype == "float16" and r.precision["list"] == "white" for r in mm)


def test_dump_records_fusion_and_fused_away(tmp_path):
    from ascend_emu.npu.device import Device
    from ascend_emu.analysis.dump import load_dump

    g = graph_of(conv_bias_keras_bn, (1, 8, 8, 4))
    rep = Device("force_fp16").replay(g, dump_dir=tmp_path / "d", seed=0, progress=False)
    d = load_dump(tmp_path / "d")
    f = apply_fusion(g, FusionConfig.load(None))
    (conv,) = by_op(f, "_FusedConv2D")
    op = d.op(conv.name)
    assert op["fusion"]["rule"] == "TbeEltwiseFusionPass"
    assert "_fusion" not in op["attrs"] and op["fusion"]["rules"] == ["BiasaddConvFusionPass", "ConvBatchnormFusionPass",
                                               "TbeEltwiseFusionPass"]
    assert op["tf_type"] == "_FusedConv2D" and op["ascend_type"] == "Conv2D" and op["engine"] == "AICORE"
    originals = {n.name for n in g.nodes}
    assert set(op["fusion"]["replaces"]) <= originals and conv.name in op["fusion"]["replaces"]
    # every original op is either in the dump or listed as fused into an op that is
    away = {e["name"]: e for e in d.fused_away}
    for n in g.nodes:
        assert (n.name in d) != (n.name in away), n.name
    assert all(e["into"] in d for e in d.fused_away)
    assert set(away) | {conv.name} >= set(op["fusion"]["replaces"])
    assert rep.summary["fusion_counts"] == d.summary["fusion_counts"] == f.counts


# --------------------------------------------------------------------------- real models

MODEL_NAMES = ("resnet50", "mobilenet_v2", "transformer_encoder")


@pytest.fixture(scope="module")
def model_graph():
    """name -> (keras model, Graph), each built and loaded once per module (32x32 images)."""
    from ascend_emu.frontend.tf import models
    from ascend_emu.frontend.tf.loader import load_graph

    builders = {"resnet50": lambda: models.resnet50((32, 32, 3)),
                "mobilenet_v2": lambda: models.mobilenet_v2((32, 32, 3)),
                "transformer_encoder": lambda: models.transformer_encoder()}
    cache: dict = {}

    def get(name):
        if name not in cache:
            m = builders[name]()
            cache[name] = (m, load_graph(m))
        return cache[name]
    return get


def _history(obj, out):
    if isinstance(obj, dict):
        if "keras_history" in obj.get("config", {}):
            out.append(obj["config"]["keras_history"][0])
        else:
            for v in obj.values():
                _history(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _history(v, out)
    return out


def keras_expected(model) -> dict:
    """Where each pattern is, counted on the Keras layer graph (independently of the rewriter).

    - ConvBatchnorm: a BatchNormalization whose input is a Conv2D / DepthwiseConv2D layer.
    - BiasaddConv: a conv layer with use_bias (its BiasAdd then follows the conv op directly).
    - MatMulBiasAdd: a Dense layer with use_bias on a 2-D input (MatMul -> BiasAdd).
    - TbeEltwise: an elementwise layer (ReLU / Activation relu / Add) reading a conv+BN that only it reads;
      an Add whose two inputs both qualify is one chain (on the earlier conv).
    - LayerNorm / Gelu: LayerNormalization layers, layers with activation gelu.
    """
    layers = model.get_config()["layers"]
    cls = {ly["name"]: ly["class_name"] for ly in layers}
    conf = {ly["name"]: ly["config"] for ly in layers}
    parents = {ly["name"]: _history(ly["inbound_nodes"], []) for ly in layers}
    children: dict = {}
    for n, ps in parents.items():
        for p in ps:
            children.setdefault(p, []).append(n)
    conv = {n for n in cls if cls[n] in ("Conv2D", "DepthwiseConv2D")}
    bn_conv = {n for n in cls if cls[n] == "BatchNormalization" and len(parents[n]) == 1 and parents[n][0] in conv}
    eltwise = {n for n in cls if cls[n] == "Add" or (cls[n] == "ReLU") or
               (cls[n] == "Activation" and conf[n]["activation"] == "relu")}
    exp = {"ConvBatchnormFusionPass": len(bn_conv),
           "BiasaddConvFusionPass": sum(1 for n in conv if conf[n]["use_bias"]),
           "MatMulBiasAddFusionPass": sum(1 for n in cls if cls[n] == "Dense" and conf[n]["use_bias"]),
           "TbeEltwiseFusionPass": sum(1 for n in eltwise
                                       if any(p in bn_conv and len(children[p]) == 1 for p in parents[n])),
           "LayerNormFusionPass": sum(1 for n in cls if cls[n] == "LayerNormalization"),
           "GeluFusionPass": sum(1 for n in cls if conf[n].get("activation") == "gelu"),
           "AutomaticUbFusion": 0}
    return {k: v for k, v in exp.items() if v}


# The Transformer block (ascend_emu.models.transformer_encoder) is one MultiHeadAttention layer, whose
# projections are not Keras layers of their own, so its expectations are read off its structure:
# - MatMulBiasAdd 1: the attention output projection (BatchMatMulV2 -> BiasAdd); the Q/K/V projections
#   (BatchMatMulV2 -> Reshape -> Add of a [heads, key_dim] constant) match neither bias pass;
# - MatMulReshapeBiasAdd 2: the two Dense layers on a 3-D input (Tensordot: MatMul -> Reshape -> BiasAdd);
# - TbeEltwise 2: the scores Einsum -> Mul(1/sqrt(key_dim)), and the fused output projection -> residual Add
#   (not ffn2's fused product -> residual Add: the chain does not reach across the Reshape);
# - LayerNorm 2, Gelu 1 (the Keras layers); no AutomaticUb (no two elementwise ops in a row are left).
TRANSFORMER_EXPECTED = {"MatMulBiasAddFusionPass": 1, "MatMulReshapeBiasAddFusionPass": 2, "LayerNormFusionPass": 2,
                        "GeluFusionPass": 1, "TbeEltwiseFusionPass": 2}
TRANSFORMER_WHERE = {  # rule -> for each fused op, the original ops (name suffixes) it replaces
    "MatMulBiasAddFusionPass": [{"attention_output_1/MatMul", "attention_output_1/BiasAdd"}],
    "MatMulReshapeBiasAddFusionPass": [{"ffn1_1/Tensordot/MatMul", "ffn1_1/Tensordot", "ffn1_1/BiasAdd"},
                                       {"ffn2_1/Tensordot/MatMul", "ffn2_1/Tensordot", "ffn2_1/BiasAdd"}],
    "TbeEltwiseFusionPass": [{"attention_1/einsum/Einsum", "attention_1/Mul"},
                             {"attention_output_1/MatMul", "attention_output_1/BiasAdd", "residual1_1/Add"}],
    "GeluFusionPass": [{"ffn1_1/Gelu/mul", "ffn1_1/Gelu/Neg", "ffn1_1/Gelu/mul_1", "ffn1_1/Gelu/Erfc",
                        "ffn1_1/Gelu/mul_2"}],
    "LayerNormFusionPass": [{"norm1_1/moments/mean", "norm1_1/Rsqrt", "norm1_1/add_2"},
                            {"norm2_1/moments/mean", "norm2_1/Rsqrt", "norm2_1/add_2"}],
}


def _rules_of(node):
    return node.meta["fusion"]["rules"]


@pytest.mark.models
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_rules_fire_where_their_pattern_is(model_graph, name):
    m, g = model_graph(name)
    f = apply_fusion(g, FusionConfig.load(None))
    expected = TRANSFORMER_EXPECTED if name == "transformer_encoder" else keras_expected(m)
    assert f.counts == expected
    # every fused op replaced original ops, the swallowed ones are listed once, nothing is lost
    originals = {n.name for n in g.nodes}
    away = [e["name"] for e in f.fused_away]
    assert len(away) == len(set(away)) and set(away) <= originals
    kept = {n.name for n in f.nodes}
    assert kept | set(away) >= originals and not (kept & set(away))
    replaced = [r for n in f.nodes if n.op.startswith("_") for r in n.meta["fusion"]["replaces"]]
    assert len(replaced) == len(set(replaced)) and set(replaced) == set(away) | {n.name for n in f.nodes
                                                                                  if n.op.startswith("_")}
    if name == "transformer_encoder":
        for rule, where in TRANSFORMER_WHERE.items():
            reps = [n.meta["fusion"]["replaces"] for n in f.nodes if n.op.startswith("_") and rule in _rules_of(n)]
            assert len(reps) == len(where), rule
            for suffixes in where:
                assert any(all(any(r.endswith("/" + sfx) for r in rs) for sfx in suffixes) for rs in reps), rule
        for ln in by_op(f, "_LayerNorm"):
            assert all("norm" in r for r in ln.meta["fusion"]["replaces"])


@pytest.mark.models
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_incremental_index_equals_a_full_reindex_after_every_fusion(model_graph, monkeypatch, name):
    """Rewriter.fuse updates its indexes in place; after each fusion they equal a rebuild from scratch."""
    from ascend_emu.npu.fusion.rules import Rewriter

    fuse = Rewriter.fuse
    checked = []

    def snapshot(rw):  # the indexes, by name: positions, nodes, readers of every tensor in order
        return ([n.name for n in rw._nodes], dict(rw._pos), sorted(rw._by_name),
                {t: [(r.name, s) for r, s in e] for t, e in rw._readers.items()})

    def checking_fuse(self, *args, **kwargs):
        new = fuse(self, *args, **kwargs)
        incremental = snapshot(self)
        self._reindex()
        assert incremental == snapshot(self)
        checked.append(new.name)
        return new

    monkeypatch.setattr(Rewriter, "fuse", checking_fuse)
    _, g = model_graph(name)
    f = apply_fusion(g, FusionConfig.load(None))
    assert len(checked) == sum(f.counts.values()) > 0


@pytest.mark.models
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_switching_a_rule_off_removes_it_from_the_dump(model_graph, tmp_path, name):
    from ascend_emu.npu.device import Device
    from ascend_emu.analysis.dump import load_dump

    _, g = model_graph(name)
    fired = list(apply_fusion(g, FusionConfig.load(None)).counts)
    for rule in fired + ["ALL"]:
        kind = RULES[rule].kind if rule != "ALL" else GRAPH
        switch = "off" if rule == "ALL" else {"Switch": {kind: {rule: "off"}}}
        out = tmp_path / rule
        Device(**fp32(fusion_switch=switch)).replay(g, dump_dir=out, seed=0, progress=False,
                                                                      stats_only=True)
        d = load_dump(out)
        rules_in_dump = {r for op in d.ops if op.get("fusion") for r in op["fusion"]["rules"]}
        rules_in_dump |= {op["fusion"]["rule"] for op in d.ops if op.get("fusion")}
        rules_in_dump |= {e["rule"] for e in d.fused_away}
        if rule == "ALL":
            assert not rules_in_dump and not d.fused_away and d.summary["fusion_counts"] == {}
            assert {op["name"] for op in d.ops} >= {n.name for n in g.nodes}
        else:
            assert rule not in rules_in_dump and rule not in d.summary["fusion_counts"]
            # the other rules still fire (those that depend on it aside: ConvBatchnorm needs BiasaddConv
            # in ResNet50, where the conv's bias sits between conv and batch norm)
            others = set(fired) - {rule} - ({"ConvBatchnormFusionPass"} if rule == "BiasaddConvFusionPass" else set())
            assert others <= set(d.summary["fusion_counts"]), (rule, d.summary["fusion_counts"])


@pytest.mark.models
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_float32_mode_fused_ops_match_tensorflow(model_graph, name):
    from ascend_emu.npu.device import Device
    from ascend_emu.frontend.tf.reference import reference

    _, g = model_graph(name)
    dev = Device(**fp32(op_model="exact"))
    rep = dev.replay(g, seed=1, progress=False)
    ref = reference(g, rep.inputs, progress=False)
    n = check_float32_against_tf(rep, ref, dev)
    assert n == sum(1 for node in apply_fusion(g, dev.fusion).nodes if node.op.startswith("_"))
    # and the model's output
    for t in g.outputs:
        a, b = rep.outputs[t].astype(np.float64).ravel(), ref.outputs[t].astype(np.float64).ravel()
        assert np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b) >= 0.99999


@pytest.mark.models
@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("op_model", ["exact", "tbe_v220", "tbe_v100"])
def test_fp16_fused_ops_match_their_formula(model_graph, name, op_model):
    from ascend_emu.npu.device import Device

    _, g = model_graph(name)
    dev = Device("force_fp16", soc="Ascend910B", op_model=op_model)
    on = dev.replay(g, seed=1, progress=False)
    off = Device("force_fp16", soc="Ascend910B", fusion_switch="off", op_model=op_model).replay(g, seed=1,
                                                                                                progress=False)
    checked = check_fused_against_oracle(on, dev, off)
    assert set(checked) == set(on.summary["fusion_counts"])


def test_ub_chain_table_agrees_with_the_registry():
    """Every op type a UB chain may hold is a registered op that runs one of the vector unit's elementwise ops
    and takes the attributes the chain step records (fused_ops runs chain steps through the registry)."""
    from ascend_emu.npu.fusion.rules import ELTWISE
    from ascend_emu.ops import OPS, VECTOR

    for t, attrs in ELTWISE.items():
        assert t in OPS and OPS[t].kind == VECTOR and OPS[t].eltwise, t
        assert set(attrs) <= OPS[t].params, (t, attrs)

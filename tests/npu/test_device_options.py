"""Device options reach the kernels, and output paths fail cleanly."""
import numpy as np
import pytest

from ascend_emu import Device, compare, overflow_report, reference, write_report
from ascend_emu.cli import main
from ascend_emu.errors import AscendEmuError
from ascend_emu.graph import Graph, InputSpec, Node
from fp32mode import FP32, FP32_ARGS, fp32  # noqa: F401  (the tests' fp32 mode)


def graph(*nodes, shape=(64,), outputs=None):
    x = Node("x", "Placeholder", [], {"dtype": "float32", "shape": list(shape)})
    nodes = [x, *nodes]
    return Graph(nodes, [InputSpec("x", "float32", list(shape))], outputs or [f"{nodes[-1].name}:0"], name="g")


def test_impl_mode_reaches_the_vector_unit():
    # every finite fp16 value: the two transcendental models differ on a handful of them
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    x = x[np.isfinite(x)].astype(np.float32)
    g = graph(Node("e", "Exp", ["x"], {"T": "float32"}), Node("s", "Sigmoid", ["x"], {"T": "float32"}),
              shape=x.shape, outputs=["e:0", "s:0"])
    from ascend_emu import vector

    res = {}
    for mode in ("high_precision", "high_performance"):
        # the exact model: there the two transcendental models show on fp16 outputs
        res[mode] = Device("force_fp16", soc="Ascend910B", impl_mode=mode, fusion_switch="off",
                           op_model="exact").replay(g, {"x": x}, progress=False)
        for op, name in (("exp", "e"), ("sigmoid", "s")):
            want, _ = vector(op, x.astype(np.float16), dtype="float16", impl_mode=mode, op_model="exact")
            np.testing.assert_array_equal(res[mode].tensor(name).view(np.uint16), want.view(np.uint16))
    assert any(not np.array_equal(res["high_precision"].tensor(n).view(np.uint16),
                                  res["high_performance"].tensor(n).view(np.uint16)) for n in ("e", "s"))


def test_op_model_reaches_the_vector_unit():
    """The SoC picks its TBE kernels; op_model overrides; the dump config records it."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    x = x[np.isfinite(x)].astype(np.float32)
    g = graph(Node("t", "Tanh", ["x"], {"T": "float32"}), Node("s", "Sigmoid", ["x"], {"T": "float32"}),
              shape=x.shape, outputs=["t:0", "s:0"])
    from ascend_emu import vector

    assert Device().op_model == "tbe_v100" and Device(soc="Ascend910B").op_model == "tbe_v220"
    seen = {}
    for model in ("tbe_v220", "ascendc", "exact"):
        dev = Device("force_fp16", soc="Ascend910B", op_model=model if model != "tbe_v220" else None)
        assert dev.config()["op_model"] == model
        res = dev.replay(g, {"x": x}, progress=False)
        for op, name in (("tanh", "t"), ("sigmoid", "s")):
            want, _ = vector(op, x.astype(np.float16), dtype="float16", op_model=model)
            np.testing.assert_array_equal(res.tensor(name).view(np.uint16), want.view(np.uint16))
            seen[model, name] = res.tensor(name).view(np.uint16)
    for name in ("t", "s"):   # the three kernel families give different fp16 results
        assert not np.array_equal(seen["tbe_v220", name], seen["exact", name])
        assert not np.array_equal(seen["tbe_v220", name], seen["ascendc", name])
    with pytest.raises(AscendEmuError, match="unknown op_model 'cann'; choose one of: tbe_v100, tbe_v220, ascendc"):
        Device(op_model="cann")


def test_fp16_reduce_accumulator_option():
    ax = Node("ax", "Const", [], {"dtype": "int32", "value": np.array([0], np.int32)})
    g = graph(ax, Node("s", "Sum", ["x", "ax"], {"T": "float32", "keep_dims": False}), shape=(4096,))
    ones = np.ones(4096, np.float32)
    f32 = Device("force_fp16").replay(g, {"x": ones}, progress=False).tensor("s")
    f16 = Device("force_fp16", reduce_accumulate="float16").replay(g, {"x": ones}, progress=False).tensor("s")
    assert float(f32) == 4096 and float(f16) == 2048          # 2048 + 1 rounds back to 2048 in fp16
    # float32 and bf16 reductions ignore the fp16-accumulator option instead of failing
    Device(**fp32(reduce_accumulate="float16")).replay(g, {"x": ones}, progress=False)
    Device("allow_mix_precision_bf16", soc="Ascend910B", reduce_accumulate="float16").replay(g, {"x": ones},
                                                                                             progress=False)


def _mm_chain():
    w = Node("w", "Const", [], {"dtype": "float32", "value": np.eye(8, dtype=np.float32) * 3})
    return graph(w, Node("mm", "MatMul", ["x", "w"], {"T": "float32"}),
                 Node("r", "Relu", ["mm"], {"T": "float32"}), Node("t", "Tanh", ["r"], {"T": "float32"}),
                 shape=(4, 8))


def test_fusion_follows_the_devices_mixlist():
    g = _mm_chain()
    plain = Device("allow_mix_precision").replay(g, progress=False)
    assert plain.summary["fusion_counts"] == {"TbeEltwiseFusionPass": 1}
    assert plain.record("t").fusion["replaces"] == ["mm", "r", "t"]
    black = Device("allow_mix_precision", modify_mixlist={"black-list": {"to-add": ["Tanh"]}}).replay(g, progress=False)
    # a black-listed op runs in float32, so it cannot join the fp16 chain
    assert black.record("t").compute_dtype == "float32" and black.record("t").fusion is None
    assert black.record("r").fusion["replaces"] == ["mm", "r"]


def test_tf_cast_overflow_gets_a_float32_verdict(tmp_path):
    c = Node("c", "Const", [], {"dtype": "float32", "value": np.float32(1e6)})
    g = graph(c, Node("m", "Mul", ["x", "c"], {"T": "float32"}),
              Node("h", "Cast", ["m"], {"SrcT": "float32", "DstT": "float16", "Truncate": False}), shape=(4,))
    res = Device(**FP32).replay(g, {"x": np.ones(4, np.float32)}, tmp_path / "d", progress=False)
    rec = res.record("h")
    assert rec.compute_dtype == "float16" and rec.status & 0x100
    assert rec.fp32_check["overflow"] is True
    assert overflow_report(tmp_path / "d").first["verdict"]["verdict"] == "normal"


def test_int_to_fp16_cast_sets_conversion_status():
    g = Graph([Node("x", "Placeholder", [], {"dtype": "int32", "shape": [2]}),
               Node("h", "Cast", ["x"], {"SrcT": "int32", "DstT": "float16", "Truncate": False})],
              [InputSpec("x", "int32", [2])], ["h:0"])
    res = Device("force_fp16", soc="Ascend910B").replay(g, {"x": np.array([3, 70000], np.int32)}, progress=False)
    assert np.isinf(res.tensor("h")[1]) and res.record("h").status & 0x100


def test_result_paths_that_are_directories_or_missing(tmp_path, capsys):
    from ascend_emu.frontend.tf.models import planted_overflow_model

    g = planted_overflow_model()
    ref = reference(g, None, tmp_path / "bench", progress=False)
    Device().replay(g, ref.inputs, tmp_path / "npu", progress=False)
    (tmp_path / "adir").mkdir()
    cmp = compare(tmp_path / "npu", tmp_path / "bench")
    with pytest.raises(AscendEmuError, match="is a directory"):
        cmp.to_csv(tmp_path / "adir")
    with pytest.raises(AscendEmuError, match="does not exist"):
        cmp.to_csv(tmp_path / "nodir" / "c.csv")
    with pytest.raises(AscendEmuError, match="is a directory"):
        write_report(tmp_path / "npu", tmp_path / "bench", tmp_path / "adir")
    for args in (["overflow", str(tmp_path / "npu"), "--json", str(tmp_path / "adir")],
                 ["overflow", str(tmp_path / "npu"), "--json", str(tmp_path / "nodir" / "o.json")],
                 ["replay", str(tmp_path / "m.pb"), "--modify-mixlist", str(tmp_path / "adir")]):
        assert main(["-q", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ascend-emu: error:")
    assert sorted(p.name for p in (tmp_path / "adir").iterdir()) == []
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    cmp.to_csv(tmp_path / "c.csv")
    assert (tmp_path / "c.csv").stat().st_mode & 0o044   # readable by others, as an ordinary file


def test_einsum_the_cube_does_not_lower_runs_on_the_ai_cpu():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec((2, 4, 5), tf.float32)])
    def f(x):
        return tf.einsum("...ij,...jk->...ik", tf.ones((1, 3, 4)), x)

    # broadcast batch dimensions are not lowered to the cube: they run on the AI CPU, matching TF
    res = Device(**FP32).replay(f, progress=False)
    rec = [r for r in res.records if r.tf_type == "Einsum"][0]
    assert rec.engine == "AICPU"
    x = next(iter(res.inputs.values()))
    np.testing.assert_allclose(res.tensor(rec.name), np.einsum("...ij,...jk->...ik", np.ones((1, 3, 4)), x),
                               rtol=1e-5)


def test_conv_k_order_reaches_the_cube_and_the_cli(tmp_path):
    """--cube-conv-k-order reaches the replayed Conv2D (float32 cube path) and the dump's config."""
    from ascend_emu import CubeModel, conv2d
    from ascend_emu.analysis.dump import load_dump
    from ascend_emu.frontend.tf.models import _keras

    keras = _keras(7)
    inp = keras.Input((6, 6, 20), batch_size=2, name="x")
    model = keras.Model(inp, keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv")(inp))
    model.save(tmp_path / "m.keras")
    x = np.random.default_rng(7).standard_normal((2, 6, 6, 20)).astype(np.float32)
    w = model.get_layer("conv").get_weights()[0]
    np.save(tmp_path / "x.npy", x)
    outs = {}
    for order in ("hwc", "c1hwc0"):
        d = tmp_path / order
        assert main(["-q", "replay", str(tmp_path / "m.keras"), "--input", f"x={tmp_path / 'x.npy'}",
                     *FP32_ARGS, "--cube-conv-k-order", order, "--dump", str(d)]) == 0
        dump = load_dump(d)
        assert dump.manifest["config"]["cube_model"]["conv_k_order"] == order
        conv = next(op["name"] for op in dump.ops if op["tf_type"] == "Conv2D")
        outs[order] = dump.tensor(conv)
        want, _ = conv2d(x, w, padding="SAME", model=CubeModel(conv_k_order=order), operand_dtype="float32",
                         out_dtype="float32")
        np.testing.assert_array_equal(outs[order].view(np.uint32), want.view(np.uint32))
    # float32 outputs show the other order of additions (fp16 outputs usually round it away)
    assert np.any(outs["hwc"].view(np.uint32) != outs["c1hwc0"].view(np.uint32))

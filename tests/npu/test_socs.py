"""The SoC table, precision_mode_v2 and HF32 (issue 29): every SoC's row, what a SoC refuses, the v2 names as
the v1 modes, and float32 cube operands rounded to HF32 against an oracle written from the format's
definition (naive_cube.hf32) and the cube model's oracle (naive_cube.conv2d / matmul)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import naive_cube
from ascend_emu import AscendEmuError, Device, load_dump
from ascend_emu.cli import main
from ascend_emu.graph import Graph, InputSpec, Node
from ascend_emu.numerics.policy import SOCS, soc

FIVE = ("Ascend910", "Ascend910B", "Ascend910_93", "Ascend310P3", "Ascend950")


@pytest.fixture(scope="module")
def demo_model():
    from ascend_emu.frontend.tf import models

    return models.demo_model()


@pytest.fixture(scope="module")
def demo_path(demo_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "demo.keras"
    demo_model.save(path)
    return str(path)


def run_cli(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_table_holds_five_socs_and_their_aliases(capsys):
    assert tuple(SOCS) == FIVE
    assert soc("Ascend310P").name == "Ascend310P3"
    assert soc("Ascend950PR").name == soc("Ascend950DT").name == "Ascend950"
    code, out, _ = run_cli(["socs"], capsys)
    assert code == 0 and all(name in out for name in FIVE) and "Ascend310P" in out
    code, out, _ = run_cli(["socs", "--json"], capsys)
    rows = {r["soc"]: r for r in json.loads(out)}
    assert rows["Ascend910"]["overflow_modes"] == ["saturation"] and not rows["Ascend910"]["vector_bf16"]
    assert rows["Ascend310P3"]["ai_cores"] == 8 and rows["Ascend310P3"]["vector_cores"] == 7
    assert rows["Ascend310P3"]["overflow_default"] == "saturation" and "float32" not in rows["Ascend310P3"]["cube_dtypes"]
    assert rows["Ascend910B"]["allow_hf32_default"] == "conv" and rows["Ascend910B"]["overflow_default"] == "inf_nan"
    assert rows["Ascend910_93"]["train_precision_default"] == "must_keep_origin_dtype"
    assert rows["Ascend910"]["train_precision_default"] == "allow_fp32_to_fp16"
    assert {"ai_cores", "vector_cores"} <= set(rows["Ascend950"]["assumed"]) and rows["Ascend950"]["op_model"] == "ascendc"
    assert "hifloat8" in rows["Ascend950"]["cube_dtypes"]


@pytest.mark.parametrize("argv,what", [
    (["--soc", "Ascend310P3", "--precision-mode", "allow_mix_precision_bf16"], "Ascend310P3 lacks"),
    (["--soc", "Ascend910", "--precision-mode-v2", "mixed_bfloat16"], "Ascend910 lacks"),
    (["--soc", "Ascend310P", "--precision-mode", "allow_fp32_to_bf16"], "Ascend310P3 lacks"),
    (["--precision-mode", "force_fp16", "--precision-mode-v2", "fp16"], "both given"),
    (["--soc", "Ascend910B", "--precision-mode-v2", "cube_hif8"], "HiFloat8"),
    (["--soc", "Ascend310P3", "--precision-mode-v2", "mixed_hif8"], "Ascend310P3: its cube has no HiFloat8"),
    (["--soc", "Ascend910", "--allow-hf32", "conv"], "Ascend910 has no HF32"),
    (["--soc", "Ascend910B", "--allow-hf32", "gemm"], "unknown op family 'gemm'"),
])
def test_what_a_soc_cannot_do_exits_2_with_one_line(argv, what, capsys, tmp_path):
    code, _, err = run_cli(["replay", "no-such-model.keras", *argv, "--dump", str(tmp_path / "d")], capsys)
    assert code == 2 and what in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def _tensors(path):
    d = load_dump(path)
    return d, {(op["name"], o["index"]): open(os.path.join(path, o["file"]), "rb").read()
               for op in d.ops for o in op["outputs"] if o.get("file")}


@pytest.mark.parametrize("v1,v2,chip", [("force_fp16", "fp16", "Ascend910"),
                                        ("must_keep_origin_dtype", "origin", "Ascend910B"),
                                        ("allow_mix_precision", "mixed_float16", "Ascend310P3"),
                                        ("allow_mix_precision_bf16", "mixed_bfloat16", "Ascend910_93")])
def test_v2_names_give_the_v1_modes_bytes(v1, v2, chip, tmp_path, demo_model):
    a, b = tmp_path / "v1", tmp_path / "v2"
    Device(v1, soc=chip).replay(demo_model, dump_dir=a, progress=False)
    Device(precision_mode_v2=v2, soc=chip).replay(demo_model, dump_dir=b, progress=False)
    da, ta = _tensors(a)
    db, tb = _tensors(b)
    assert ta and ta == tb
    assert [op for op in da.ops] == [op for op in db.ops]
    ca, cb = da.manifest["config"], db.manifest["config"]
    assert ca["precision_mode_option"] == "precision_mode" and ca["precision_mode_v2"] is None
    assert cb["precision_mode_option"] == "precision_mode_v2" and cb["precision_mode_v2"] == v2
    strip = ("precision_mode_option", "precision_mode_v2")
    assert {k: v for k, v in ca.items() if k not in strip} == {k: v for k, v in cb.items() if k not in strip}


@pytest.mark.parametrize("chip,overflow,mode", [("Ascend310P3", "saturation", "force_fp16"),
                                                ("Ascend910_93", "inf_nan", "force_fp16")])
def test_replay_records_the_socs_defaults(chip, overflow, mode, tmp_path, capsys, demo_path):
    code, out, err = run_cli(["-q", "replay", demo_path, "--soc", chip, "--dump", str(tmp_path / "d")], capsys)
    assert code == 0, err
    cfg = load_dump(tmp_path / "d").manifest["config"]
    assert (cfg["soc"], cfg["overflow_mode"], cfg["precision_mode"], cfg["precision_mode_option"]) == \
        (chip, overflow, mode, "default")


def test_training_default_follows_the_cube(tmp_path):
    from ascend_emu import emulate

    assert emulate(soc="Ascend910_93").device.precision.mode == "must_keep_origin_dtype"
    assert emulate(soc="Ascend310P").device.precision.mode == "allow_fp32_to_fp16"
    assert emulate(soc="Ascend910B", precision_mode_v2="mixed_float16").device.precision.mode == \
        "allow_mix_precision_fp16"
    with pytest.raises(AscendEmuError, match="both given"):
        emulate("allow_mix_precision", precision_mode_v2="origin")


# -- float32 cube ops: HF32 on the 910B, the AI CPU on SoCs without a float32 cube ---------------------------

def _graph():
    """x (2, 6, 6, 20) * w (3, 3, 20, 5) by Conv2D, and a (7, 40) @ b (40, 3) by MatMul, all placeholders."""
    spec = {"x": (2, 6, 6, 20), "w": (3, 3, 20, 5), "a": (7, 40), "b": (40, 3)}
    ph = [Node(n, "Placeholder", [], {"dtype": "float32", "shape": list(s)}) for n, s in spec.items()]
    conv = Node("conv", "Conv2D", ["x", "w"], {"T": "float32", "strides": [1, 1, 1, 1], "padding": "SAME",
                                             "dilations": [1, 1, 1, 1], "data_format": "NHWC"})
    mm = Node("mm", "MatMul", ["a", "b"], {"T": "float32", "transpose_a": False, "transpose_b": False})
    g = Graph(ph + [conv, mm], [InputSpec(n, "float32", list(s)) for n, s in spec.items()], ["conv:0", "mm:0"],
              name="hf32")
    rng = np.random.default_rng(29)
    # values with bits below HF32's precision, so every rounding shows
    feeds = {n: (rng.standard_normal(s) * (1 + rng.random(s) * 2 ** -12)).astype(np.float32)
             for n, s in spec.items()}
    return g, feeds


#: the 910B's HF32 tie rule per operand: the convolution's nearest even, the matmul's ties away
_RULE = {"x": "rint", "w": "rint", "a": "round", "b": "round"}


def _oracles(feeds, hf32_conv: bool, hf32_mm: bool):
    def r(n):
        return naive_cube.hf32(feeds[n], 11, _RULE[n])
    x, w = (r("x"), r("w")) if hf32_conv else (feeds["x"], feeds["w"])
    a, b = (r("a"), r("b")) if hf32_mm else (feeds["a"], feeds["b"])
    conv, _ = naive_cube.conv2d(x, w, (1, 1), "SAME", (1, 1), operand_dtype="float32", out_dtype="float32")
    mm, _ = naive_cube.matmul(a, b, operand_dtype="float32", out_dtype="float32")
    return conv, mm


@pytest.mark.parametrize("allow,conv_hf32,mm_hf32", [(None, True, False), ("none", False, False),
                                                     ("conv,matmul", True, True), ("matmul", False, True)])
def test_hf32_on_the_910b_in_origin(allow, conv_hf32, mm_hf32, tmp_path):
    g, feeds = _graph()
    dev = Device(precision_mode_v2="origin", soc="Ascend910B", allow_hf32=allow)
    res = dev.replay(g, feeds, dump_dir=tmp_path / "d", progress=False)
    conv, mm = _oracles(feeds, conv_hf32, mm_hf32)
    np.testing.assert_array_equal(res.tensor("conv").view(np.uint32), conv.view(np.uint32))
    np.testing.assert_array_equal(res.tensor("mm").view(np.uint32), mm.view(np.uint32))
    # HF32 and float32 differ on these operands, so the check above tells the two apart
    other_conv, other_mm = _oracles(feeds, not conv_hf32, not mm_hf32)
    assert not np.array_equal(conv, other_conv) and not np.array_equal(mm, other_mm)
    # the rounded operands are in the dump, as inserted casts of dtype hfloat32
    casts = {op["name"]: op for op in load_dump(tmp_path / "d").ops if op["name"].endswith("_to_hf32")}
    want = {f"{n}/ascend_cast_0_to_hf32" for n, on in (("x", conv_hf32), ("w", conv_hf32), ("a", mm_hf32),
                                                         ("b", mm_hf32)) if on}
    assert set(casts) == want
    for name in casts:
        assert casts[name]["compute_dtype"] == "hfloat32" and "HF32" in casts[name]["precision"]["reason"]
        n = name.split("/")[0]
        np.testing.assert_array_equal(res.tensor(name), naive_cube.hf32(feeds[n], 11, _RULE[n]))
    assert dev.config()["allow_hf32"] == (allow if allow not in (None,) else "conv")


def test_hf32_rounding_overrides_every_family():
    g, feeds = _graph()
    # ties (half an HF32 ulp above a grid value), where rint and round part
    for n in ("x", "a"):
        feeds[n].reshape(-1)[:64] = 1 + (2 * np.arange(64) + 1) * 2.0 ** -12
    runs = {r: Device("must_keep_origin_dtype", soc="Ascend910B", allow_hf32="conv,matmul", hf32_rounding=r)
            .replay(g, feeds, progress=False) for r in (None, "rint", "trunc", "round")}
    outs = {r: (res.tensor("conv"), res.tensor("mm")) for r, res in runs.items()}
    assert not np.array_equal(outs["rint"][0], outs["trunc"][0])
    assert not np.array_equal(outs["rint"][0], outs["round"][0])
    # without the override each family keeps its own rule: the conv's rint, the matmul's round
    for i, rule in ((0, "rint"), (1, "round")):
        assert np.array_equal(outs[None][i], outs[rule][i])
    assert not np.array_equal(outs[None][1], outs["rint"][1])
    for r in ("rint", "trunc", "round"):
        np.testing.assert_array_equal(runs[r].tensor("a/ascend_cast_0_to_hf32"), naive_cube.hf32(feeds["a"], 11, r))


@pytest.mark.parametrize("chip", ["Ascend910", "Ascend310P3"])
def test_float32_cube_ops_without_a_float32_cube_go_to_the_aicpu(chip, demo_model):
    """must_keep_origin_dtype keeps float32; these cubes have none: GE places the op on the AI CPU (the
    reason recorded), never on an emulated float32 cube; with the fallback off it is an error."""
    res = Device("must_keep_origin_dtype", soc=chip).replay(demo_model, progress=False)
    cube = [r for r in res.records if r.tf_type in ("Conv2D", "MatMul", "_FusedConv2D", "_FusedMatMul")]
    # the fused cube ops of the demo model are left unfused: GE does not fuse an op it sends to the AI CPU
    assert len(cube) == 4 and all(r.engine == "AICPU" and not r.tf_type.startswith("_Fused") for r in cube)
    assert all("has no float32" in r.precision["reason"] for r in cube)
    assert all(r.engine == "AICORE" for r in res.records if r.tf_type in ("Relu", "Softmax", "_LayerNorm"))
    g, feeds = _graph()
    with pytest.raises(AscendEmuError, match=f"{chip}'s cube has no float32"):
        Device("must_keep_origin_dtype", soc=chip, aicpu_fallback=False).replay(g, feeds, progress=False)
    # dropped to fp16, the same cube runs on the AI Core
    res = Device("allow_fp32_to_fp16", soc=chip).replay(g, feeds, progress=False)
    assert res.record("conv").engine == "AICORE" and res.record("conv").compute_dtype == "float16"


def test_a_bf16_cube_op_on_a_cube_without_bf16_is_not_emulated():
    """A bf16 model (Keras mixed_bfloat16) under must_keep_origin_dtype on the Ascend910: its cube has no bf16,
    so the op does not run on an emulated bf16 cube; with the fallback off that is one line."""
    import ml_dtypes

    spec = {"a": (7, 40), "b": (40, 3)}
    ph = [Node(n, "Placeholder", [], {"dtype": "bfloat16", "shape": list(s)}) for n, s in spec.items()]
    g = Graph(ph + [Node("mm", "MatMul", ["a", "b"], {"T": "bfloat16", "transpose_a": False, "transpose_b": False})],
              [InputSpec(n, "bfloat16", list(s)) for n, s in spec.items()], ["mm:0"], name="bf16")
    feeds = {n: np.ones(s, dtype=ml_dtypes.bfloat16) for n, s in spec.items()}
    dev = Device("must_keep_origin_dtype", aicpu_fallback=False)
    assert dev.cube_elsewhere(g.nodes[-1])
    with pytest.raises(AscendEmuError, match="Ascend910's cube has no bfloat16"):
        dev.replay(g, feeds, progress=False)
    ok = Device("must_keep_origin_dtype", soc="Ascend910B").replay(g, feeds, progress=False)
    assert ok.record("mm").engine == "AICORE" and ok.record("mm").compute_dtype == "bfloat16"


def test_hf32_roundings_are_drawn_as_casts_in_the_report(tmp_path, demo_model):
    """The report's op graph draws the HF32 roundings as inserted Casts feeding their convolution."""
    from ascend_emu import reference
    from ascend_emu.analysis.compare import compare
    from ascend_emu.analysis.graph_view import graph_section
    from graph_markup import parse

    ref = reference(demo_model, None, tmp_path / "bench", progress=False)
    Device(precision_mode_v2="origin", soc="Ascend910B").replay(demo_model, ref.inputs, tmp_path / "npu",
                                                                progress=False)
    html = graph_section(compare(tmp_path / "npu", tmp_path / "bench"))
    assert 'data-cast-from="image/ascend_cast_0_to_hf32"' in html
    assert "data-cast-to=" in html and parse(html).nodes

"""Overflow report on synthetic dumps: status bits, the first overflowing op, the verdict, the register."""
import json

import numpy as np
import pytest

from ascend_emu.analysis.dump import DumpWriter
from ascend_emu.analysis.overflow import FORMAT_MAX, overflow_report
from cast_chain import cast_into_chain


def write(path, ops, *, mode="saturation", summary=None, **kw):
    with DumpWriter(path, kind="npu", config={"overflow_mode": mode}, model={"name": "m", "fingerprint": "f"},
                    inputs_sha256="0", **kw) as w:
        for name, tf_type, engine, inputs, outs, status, extra in ops:
            w.add_op(name, tf_type, tf_type + "V2" if tf_type == "MatMul" else tf_type, engine, "float16", inputs,
                     outs, status, **extra)
        w.finish(summary or {})
    return path


def planted(mode):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float16)
    mm = (rng.standard_normal((4, 8)) * 1000).astype(np.float16)
    if mode == "saturation":
        mm[0, :3] = 65504.0
        mm[1, 0] = -65504.0
    else:
        mm[0, :3] = np.inf
        mm[1, 0] = -np.inf
    relu = np.maximum(mm, 0)
    add = relu + x
    return [
        ("x", "Placeholder", "AICORE", [], [x], 0, {}),
        ("mm", "MatMul", "AICORE", ["x:0", "w:0"], [mm], 0x20,
         {"fp32_check": {"overflow": mode == "inf_nan", "max_abs": 131008.0 if mode == "saturation" else 3.5e38}}),
        ("relu", "Relu", "AICORE", ["mm:0"], [relu], 0x20, {}),
        ("add", "AddV2", "AICORE", ["relu:0", "x:0"], [add], 0, {}),
    ]


def test_saturation_abnormal(tmp_path):
    rep = overflow_report(write(tmp_path / "d", planted("saturation"), summary={"float_status": 0x20}))
    assert [e["name"] for e in rep.ops] == ["mm", "relu"]
    assert rep.ops[0]["status_names"][0].startswith("0x20")
    f = rep.first
    assert f["name"] == "mm" and f["index"] == 1
    v = f["verdict"]
    assert v["verdict"] == "abnormal" and v["format"] == "float16" and v["format_max"] == 65504.0
    assert v["largest_dumped"] == 65504.0 and v["fp32_max_abs"] == 131008.0
    assert v["range_ratio"] == pytest.approx(131008.0 / 65504.0)
    assert rep.register == 0x20 and rep.register_source == "summary"
    assert rep.counts["saturated"] == 4 + 3 and rep.counts["inf"] == 0  # mm: 4, relu: the 3 positive ones
    text = rep.format_text()
    assert "[MatMul][1] mm" in text
    assert " - [AI Core][Status:32] [0x20 floating-point compute overflow" in text
    assert " - Input[0] x:0 shape [4, 8] dtype float16 max" in text
    assert " - Input[1] w:0: not dumped" in text
    assert " - Output[0] mm:0 shape [4, 8] dtype float16 max 65504 min -65504" in text
    assert "verdict: abnormal" in text and "saturated" in text
    j = rep.to_json()
    json.dumps(j, allow_nan=False)
    assert j["first"]["name"] == "mm" and j["register"]["hex"] == "0x20"


def test_inf_nan_normal(tmp_path):
    rep = overflow_report(write(tmp_path / "d", planted("inf_nan"), mode="inf_nan"))
    assert rep.first["name"] == "mm" and rep.first["verdict"]["verdict"] == "normal"
    assert rep.first["verdict"]["largest_dumped"] == float("inf")
    # no summary: the register is the OR of every op's bits
    assert rep.register == 0x20 and rep.register_source != "summary"
    assert rep.counts["saturated"] == 0 and rep.counts["inf"] == 4 + 3 + 3  # mm: 4 inf; relu and add: the 3 +inf
    assert rep.first["outputs"][0]["inf"] == 4
    assert "inf_nan mode" in "\n".join(rep.notes)
    json.dumps(rep.to_json(), allow_nan=False)


def test_first_needs_finite_clean_inputs(tmp_path):
    x = np.array([1.0, np.nan], np.float16)
    ops = [("x", "Placeholder", "AICORE", [], [x], 0, {}),
           ("y", "Mul", "AICORE", ["x:0"], [x * 2], 0x20, {}),
           ("z", "Cast", "AICORE", [], [np.array([np.inf], np.float16)], 0x100,
            {"fp32_check": {"overflow": False, "max_abs": 70000.0}})]
    rep = overflow_report(write(tmp_path / "d", ops))
    # x already holds a nan (no status: a placeholder) so it is the first non-finite op, not y
    assert rep.first["name"] == "x" and rep.first["verdict"]["verdict"] == "unknown"
    assert [e["name"] for e in rep.ops] == ["y", "z"]
    assert rep.register == 0x120


def test_aicpu_nonfinite_without_status_and_clean_dump(tmp_path):
    ops = [("a", "Placeholder", "AICORE", [], [np.ones(3, np.float32)], 0, {}),
           ("b", "Erfinv", "AICPU", ["a:0"], [np.array([np.inf, 1, 2], np.float32)], 0, {}),
           ("c", "Relu", "AICORE", ["b:0"], [np.array([np.inf, 1, 2], np.float32)], 0x20, {})]
    rep = overflow_report(write(tmp_path / "d", ops, stats_only=True))
    assert rep.first["name"] == "b" and "[AI CPU][Status:0]" in rep.format_text()
    assert [e["name"] for e in rep.ops] == ["c"]
    assert any("statistics only" in n for n in rep.notes)
    clean = overflow_report(write(tmp_path / "e", ops[:1]))
    assert clean.first is None and clean.ops == [] and clean.register == 0
    assert "first overflowing op: none" in clean.format_text() and "(no overflow)" in clean.format_text()


def test_format_table():
    assert FORMAT_MAX["float16"] == 65504.0 and FORMAT_MAX["bfloat16"] == pytest.approx(3.3895313892515355e38)


def test_an_inserted_cast_blames_the_fused_consumer_it_was_made_for(tmp_path):
    rep = overflow_report(cast_into_chain(tmp_path))
    first = rep.first
    assert first["name"] == "x/ascend_cast_0_to_fp16" and first["verdict"]["verdict"] == "abnormal"
    # the Cast is the replay's own op: the op type needing it is the RealDiv fused into the chain "t"
    assert first["blame"]["types"] == ["RealDiv"] and first["blame"]["consumers"] == ["t"]
    expl = first["verdict"]["explanation"]
    assert "black-list RealDiv" in expl and "_EltwiseChain, fused from RealDiv" in expl
    assert "black-list it" not in expl
    assert rep.suggestion() == {"black-list": {"to-add": ["RealDiv"]}}
    assert rep.to_json()["ops_info"] == rep.suggestion()
    assert "black-list RealDiv" in rep.format_text()


def test_a_fused_op_that_overflows_names_the_types_it_replaced(tmp_path):
    with DumpWriter(tmp_path / "d", kind="npu", config={"overflow_mode": "saturation"},
                    model={"name": "m", "fingerprint": "f"}, inputs_sha256="0") as w:
        w.add_op("x", "Placeholder", "Data", "HOST", "float16", [], [np.ones(4, np.float16)], 0)
        w.add_fused("m", "Mul", "AutomaticUbFusion", "t")
        w.add_op("t", "_EltwiseChain", "Mul", "AICORE", "float16", ["x:0"], [np.full(4, 65504, np.float16)], 0x8,
                 fusion={"rule": "AutomaticUbFusion", "replaces": ["m", "t"], "tf_type": "Exp"},
                 fp32_check={"overflow": False, "max_abs": 1e5})
        w.finish({})
    rep = overflow_report(tmp_path / "d")
    assert rep.first["blame"]["types"] == ["Mul", "Exp"]
    assert rep.suggestion() == {"black-list": {"to-add": ["Mul", "Exp"]}}


def test_cli_overflow_writes_the_suggested_mixlist(tmp_path, capsys):
    from ascend_emu.cli import main

    d = cast_into_chain(tmp_path)
    assert main(["overflow", str(d), "--ops-info", str(tmp_path / "ops_info.json")]) == 0
    assert "black-list RealDiv" in capsys.readouterr().out
    assert json.loads((tmp_path / "ops_info.json").read_text()) == {"black-list": {"to-add": ["RealDiv"]}}
    # nothing abnormal: nothing written, and said so
    clean = write(tmp_path / "clean", [("x", "Placeholder", "HOST", [], [np.ones(4, np.float16)], 0, {})])
    assert main(["overflow", str(clean), "--ops-info", str(tmp_path / "none.json")]) == 0
    assert "not written" in capsys.readouterr().out and not (tmp_path / "none.json").exists()


def test_a_convolution_fused_through_the_onnx_transpose_blames_no_transpose(tmp_path):
    """An ONNX convolution whose UB chain went through the loader's Transpose to NCHW (TbeEltwiseFusionPass,
    ``transpose``) replaced that Transpose too; ATC's graph has none, so it is no type to black-list."""
    with DumpWriter(tmp_path / "d", kind="npu", config={"overflow_mode": "saturation"},
                    model={"name": "m", "fingerprint": "f"}, inputs_sha256="0") as w:
        w.add_op("x", "Placeholder", "Data", "HOST", "float16", [], [np.ones((1, 2, 2, 1), np.float16)], 0)
        for name, tf_type in (("c/Conv2D", "Conv2D"), ("c/BiasAdd", "BiasAdd"), ("c", "Transpose")):
            w.add_fused(name, tf_type, "TbeEltwiseFusionPass", "r")
        w.add_op("r", "_FusedConv2D", "Conv2D", "AICORE", "float16", ["x:0", "w:0", "perm:0"],
                 [np.full((1, 1, 2, 2), 65504, np.float16)], 0x8,
                 attrs={"transpose": 2, "chain": [{"op": "Relu", "args": [-1], "attrs": {}, "name": "r"}]},
                 fusion={"rule": "TbeEltwiseFusionPass", "replaces": ["c/Conv2D", "c/BiasAdd", "c", "r"],
                         "tf_type": "Relu"},
                 fp32_check={"overflow": False, "max_abs": 1e5})
        w.finish({})
    rep = overflow_report(tmp_path / "d")
    assert rep.first["blame"]["types"] == ["Conv2D", "BiasAdd", "Relu"]
    assert rep.suggestion() == {"black-list": {"to-add": ["Conv2D", "BiasAdd", "Relu"]}}


"""Issue 45 item 9: fit (and sensitivity --dump) run in the configuration the dump's manifest records for every
option the user did not give (the SoC, the precision mode, HF32, --keep-dtype, ...), say so in one line, and
refuse in one line only options the user gave that differ from the dump's. A tiny ONNX model; seconds.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ascend_emu.cli.main import main
from ascend_emu.errors import AscendEmuError
from ascend_emu.npu.device import Device


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A MatMul + Relu model and its dump made with --soc Ascend910B --precision-mode force_fp32 --keep-dtype."""
    tmp = tmp_path_factory.mktemp("adopt")
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="/fc/MatMul"),
             helper.make_node("Relu", ["m"], ["y"], name="/Relu")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp / "m.onnx"
    onnx.save(m, str(path))
    keep = tmp / "keep.txt"
    keep.write_text("/Relu\n")
    x = rng.standard_normal((4, 8)).astype(np.float32)
    np.save(tmp / "x.npy", x)
    Device(soc="Ascend910B", precision_mode="force_fp32", keep_dtype=keep).replay(path, {"x": x}, str(tmp / "npu"),
                                                                                 progress=False)
    return tmp, path


def test_fit_api_takes_the_dumps_configuration(made):
    from ascend_emu.tools.fit import fit

    tmp, path = made
    res = fit(str(tmp / "npu"), path, progress=False, params=["impl_mode"])
    assert res.identical == 1.0 and res.tensors > 0
    # a Device given whole is the user's choice: another configuration is refused, as before
    with pytest.raises(AscendEmuError, match="was made with canonical_mode=cube_fp16in_fp32out"):
        fit(str(tmp / "npu"), path, device=Device(), progress=False, params=["impl_mode"])


def test_fit_cli_says_it_adopts_and_refuses_only_given_conflicts(made, capsys):
    tmp, path = made
    dump, x = str(tmp / "npu"), f"x={tmp / 'x.npy'}"
    assert main(["fit", dump, str(path), "--input", x, "--param", "impl_mode", "--scheduler", "none"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "its manifest" in ln)
    assert "soc=Ascend910B" in line and "precision_mode=force_fp32" in line and "keep_dtype=/Relu" in line, line
    assert "100.0%" in out or "contradicted" not in out
    # an option given that agrees with the dump is not "adopted"; the rest still is
    assert main(["fit", dump, str(path), "--input", x, "--param", "impl_mode", "--soc", "Ascend910B",
                 "--scheduler", "none"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "its manifest" in ln)
    assert "soc=" not in line and "precision_mode=force_fp32" in line, line
    # an option given that differs from the dump's: one line, exit 2
    assert main(["fit", dump, str(path), "--input", x, "--soc", "Ascend310P3", "--scheduler", "none"]) == 2
    err = capsys.readouterr().err
    assert "was made with soc=Ascend910B" in err and "Ascend310P3" in err and len(err.strip().splitlines()) == 1, err
    assert main(["fit", dump, str(path), "--input", x, "--precision-mode", "force_fp16", "--scheduler", "none"]) == 2
    assert "canonical_mode=cube_fp16in_fp32out" in capsys.readouterr().err


def test_sensitivity_dump_takes_the_dumps_configuration(made, capsys):
    tmp, path = made
    assert main(["sensitivity", str(path), "--input", f"x={tmp / 'x.npy'}", "--dump", str(tmp / "npu"),
                 "--param", "impl_mode", "--scheduler", "none", "-q"]) == 0
    assert main(["sensitivity", str(path), "--input", f"x={tmp / 'x.npy'}", "--dump", str(tmp / "npu"),
                 "--param", "impl_mode", "--scheduler", "none"]) == 0
    assert "soc=Ascend910B" in next(ln for ln in capsys.readouterr().out.splitlines() if "its manifest" in ln)
    assert main(["sensitivity", str(path), "--input", f"x={tmp / 'x.npy'}", "--dump", str(tmp / "npu"),
                 "--allow-hf32", "matmul", "--scheduler", "none"]) == 2
    assert "allow_hf32" in capsys.readouterr().err

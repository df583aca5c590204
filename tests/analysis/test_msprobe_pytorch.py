"""msprobe's PyTorch dump layout (``export_msprobe(..., framework="pytorch")``, ``export-msprobe --framework pytorch``).

The layout is msprobe 26.2's PyTorch dump (facts 13.6; NUMERICS.md section 7, "msprobe dumps"): the fixture dumps
below carry a torch run's op names (``Aten.addmm.0.forward``, ``.backward``) as ascend-emu dumps of a torch run do.
The real ``msprobe compare`` of such an export is in tests/analysis/test_msprobe_compare.py.
"""
import contextlib
import io
import json
import os

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ascend_emu.analysis.msprobe import (API_KEY, NAME_PATTERN, SIDECAR, export_msprobe, import_msprobe,  # noqa: E402
                                         pytorch_keys)
from ascend_emu.cli import main  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402
from test_msprobe import assert_same_dump, write  # noqa: E402


def torch_run_ops(seed=0):
    """One training step's ops as a torch run names them: forward, backward (phase), a graph-style name in the
    backward phase, a name that collides with a kept key once mapped, bf16 and fp16 outputs, two outputs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 8)).astype(np.float16)
    h = rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)
    g = rng.standard_normal((4, 8)).astype(np.float32)
    stack = ["File train.py, line 12, in forward, \n return self.fc(x)"]
    return [
        ("Aten.addmm.0.forward", "MatMul", [], [x], {"attrs": {"requires_grad": True, "stack": stack}}),
        ("Aten.relu.0.forward", "Relu", ["Aten.addmm.0.forward:0"], [h], {"attrs": {"requires_grad": [True]}}),
        ("Aten.relu.0.backward", "ReluGrad", ["Aten.relu.0.forward:0"], [g], {"phase": "backward"}),
        ("Aten.addmm.0.backward", "MatMul", ["Aten.relu.0.backward:0"], [g[:, :4], g[:, 4:]],
         {"phase": "backward"}),
        ("model/dense/MatMul_grad", "MatMul", ["Aten.addmm.0.backward:1"], [g], {"phase": "backward"}),
        ("Functional.aten_relu_0_forward", "Identity", [], [x]),     # a graph name: not a key
        ("aten.relu.0.FORWARD", "Identity", [], [x]),                # not msprobe's spelling: mapped
    ]


def test_pytorch_layout(tmp_path):
    src = write(tmp_path / "d", "npu", torch_run_ops())
    root = export_msprobe(src, tmp_path / "ms", framework="pytorch")
    dj = json.load(open(os.path.join(root, "dump.json")))
    assert (dj["task"], dj["level"], dj["framework"]) == ("tensor", "L1", "pytorch")
    keys = list(dj["data"])
    assert keys[:4] == ["Aten.addmm.0.forward", "Aten.relu.0.forward", "Aten.relu.0.backward",
                        "Aten.addmm.0.backward"]      # a torch run's keys kept as they are
    assert keys[4] == "Functional.model.dense.MatMul_grad.0.backward"   # its phase gives the direction
    assert keys[5] == "Functional.Functional.aten_relu_0_forward.0.forward"
    assert keys[6] == "Functional.aten.relu.0.FORWARD.0.forward"
    assert len({k.lower() for k in keys}) == len(keys) and all(NAME_PATTERN.match(k) for k in keys)
    for key, ent in dj["data"].items():
        backward = key.endswith(".backward")
        assert set(ent) == ({"input", "output"} if backward else {"input_args", "input_kwargs", "output"})
        for role, leaves in (("output", ent["output"]), ("input", ent["input" if backward else "input_args"])):
            for i, leaf in enumerate(leaves):
                assert set(leaf) == {"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad",
                                     "data_name"}
                assert leaf["data_name"] == f"{key}.{role}.{i}.pt"
                t = torch.load(os.path.join(root, "dump_tensor_data", leaf["data_name"]), weights_only=True)
                assert str(t.dtype) == leaf["dtype"] and list(t.shape) == leaf["shape"]
    ops = {op[0]: op for op in torch_run_ops()}
    fwd = dj["data"]["Aten.relu.0.forward"]
    # the bf16 output is a torch.bfloat16 tensor holding exactly the dumped values
    t = torch.load(os.path.join(root, "dump_tensor_data", fwd["output"][0]["data_name"]), weights_only=True)
    assert t.dtype == torch.bfloat16
    assert t.view(torch.int16).numpy().tobytes() == ops["Aten.relu.0.forward"][3][0].view(np.int16).tobytes()
    assert fwd["output"][0]["requires_grad"] is True and fwd["input_args"][0]["requires_grad"] is True
    assert fwd["input_args"][0]["dtype"] == "torch.float16" and fwd["input_kwargs"] == {}
    bwd = dj["data"]["Aten.addmm.0.backward"]
    assert [leaf["shape"] for leaf in bwd["output"]] == [[4, 4], [4, 4]] and bwd["input"][0]["shape"] == [4, 8]
    assert bwd["output"][0]["requires_grad"] is False
    assert dj["data"]["Functional.model.dense.MatMul_grad.0.backward"]["input"][0]["data_name"] == \
        "Functional.model.dense.MatMul_grad.0.backward.input.0.pt"
    # the input's file is the producer's (linked), so msprobe compares the same values
    assert os.path.samefile(os.path.join(root, "dump_tensor_data", bwd["input"][0]["data_name"]),
                            os.path.join(root, "dump_tensor_data", "Aten.relu.0.backward.output.0.pt"))
    st = json.load(open(os.path.join(root, "stack.json")))
    assert st["0"] == [["Aten.addmm.0.forward"], ops["Aten.addmm.0.forward"][4]["attrs"]["stack"]]
    assert st["1"][0] == ["Aten.relu.0.forward"] and "ascend-emu op Aten.relu.0.forward" in st["1"][1][0]
    assert json.load(open(os.path.join(root, "construct.json"))) == {}   # msprobe's L1 has no module tree


def test_pytorch_keys_unique_against_kept_keys():
    ops = [{"name": "Functional.a.0.forward"}, {"name": "a"}, {"name": "Functional.A.0.forward"},
           {"name": "x/y", "phase": "backward"}]
    k = pytorch_keys(ops)
    assert k == {"Functional.a.0.forward": "Functional.a.0.forward", "a": "Functional.a_2.0.forward",
                 "Functional.A.0.forward": "Functional.Functional.A.0.forward.0.forward",
                 "x/y": "Functional.x.y.0.backward"}
    assert API_KEY.match("Aten.native_layer_norm.3.backward") and not API_KEY.match("Aten.mm.forward")


@pytest.mark.parametrize("mode", ["tensor", "stats_only"])
def test_pytorch_round_trip_is_identical(tmp_path, mode):
    src = write(tmp_path / "d", "npu", torch_run_ops(), stats_only=(mode == "stats_only"))
    root = export_msprobe(src, tmp_path / "ms", framework="pytorch")
    dj = json.load(open(os.path.join(root, "dump.json")))
    assert dj["task"] == ("statistics" if mode == "stats_only" else "tensor")
    if mode == "stats_only":
        assert not os.path.exists(os.path.join(root, "dump_tensor_data")) and dj["dump_data_dir"] is None
        assert all("data_name" not in leaf for e in dj["data"].values() for v in e.values()
                   for leaf in (v if isinstance(v, list) else []))
    assert_same_dump(src, import_msprobe(tmp_path / "ms", tmp_path / "back"))


def test_statistics_export_needs_no_torch(tmp_path, monkeypatch):
    import ascend_emu.analysis.msprobe.export as ex

    def no_torch(why):
        raise AscendEmuError(f"{why} needs PyTorch")

    monkeypatch.setattr(ex, "_import_torch", no_torch)
    src = write(tmp_path / "s", "npu", torch_run_ops(), stats_only=True)
    export_msprobe(src, tmp_path / "ms", framework="pytorch")
    src = write(tmp_path / "t", "npu", torch_run_ops())
    with pytest.raises(AscendEmuError, match="exporting .pt tensor files needs PyTorch"):
        export_msprobe(src, tmp_path / "ms2", framework="pytorch")
    assert not os.path.exists(tmp_path / "ms2")


def test_pytorch_export_refusals_and_cli(tmp_path):
    src = write(tmp_path / "d", "npu", torch_run_ops())
    with pytest.raises(AscendEmuError, match="unknown framework 'mindspore'; choose one of: graph, pytorch"):
        export_msprobe(src, tmp_path / "ms", framework="mindspore")
    with pytest.raises(AscendEmuError, match="PyTorch dumps hold .pt tensor files, not .npy"):
        export_msprobe(src, tmp_path / "ms", framework="pytorch", tensor_format="npy")
    assert not os.path.exists(tmp_path / "ms")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["export-msprobe", str(src), str(tmp_path / "ms"), "--framework", "pytorch",
                     "--tensor-format", "npy"]) == 2
    assert err.getvalue().startswith("ascend-emu: error: ") and err.getvalue().count("\n") == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["export-msprobe", str(src), str(tmp_path / "ms"), "--framework", "pytorch", "--step", "2"]) == 0
    root = tmp_path / "ms" / "step2" / "rank0"
    assert "Aten.relu.0.backward" in json.load(open(root / "dump.json"))["data"]
    assert json.load(open(root / SIDECAR))["framework"] == "pytorch"
    # the graph layout is still the default: .npy files, every op a Functional key
    assert main(["export-msprobe", str(src), str(tmp_path / "g")]) == 0
    dj = json.load(open(tmp_path / "g" / "step0" / "rank0" / "dump.json"))
    assert "Functional.Aten.relu.0.backward.0.forward" in dj["data"]
    assert dj["data"]["Functional.Aten.relu.0.forward.0.forward"]["output"][0]["data_name"].endswith(".npy")

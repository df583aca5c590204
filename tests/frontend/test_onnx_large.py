"""Issue 45 F4: a valid ONNX model over protobuf's 2 GiB limit (its weights in external data) is not called
"malformed": it is refused in one line that names the limit and what to do, before 2 GiB are read; under the
limit the same layout loads. No 2 GiB is written: the large data file is sparse.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from ascend_emu.cli.main import main
from ascend_emu.errors import AscendEmuError
from ascend_emu.frontend.onnx import loader


def _external_model(tmp_path, n: int, write: bool):
    """Add(x, w) with w (n float32) kept in ``w.bin`` beside the model; ``write`` False: a sparse file of n * 4
    bytes (zeros, no disk space) instead of the data."""
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[n])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", str(4 * n))):
        w.external_data.add(key=k, value=v)
    with open(tmp_path / "w.bin", "wb") as f:
        if write:
            f.write(np.arange(n, dtype=np.float32).tobytes())
        else:
            f.truncate(4 * n)
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="/Add")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "big.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_model_over_2_gib_is_refused_with_the_limit_not_called_malformed(tmp_path, capsys):
    path = _external_model(tmp_path, 550_000_000, write=False)      # 2.05 GiB of (sparse) weights
    with pytest.raises(AscendEmuError) as e:
        loader.load_onnx(path)
    msg = str(e.value)
    assert "malformed" not in msg and "2.05 GiB" in msg and "2 GiB" in msg and "smaller export" in msg, msg
    assert "\n" not in msg
    assert main(["replay", str(path), "--dump", str(tmp_path / "dump")]) == 2
    err = capsys.readouterr().err
    assert "2 GiB" in err and "Traceback" not in err


def test_the_limit_counts_inlined_external_data(tmp_path, monkeypatch):
    """The same layout loads under the limit, and is refused over it (the limit lowered, so that the test writes
    a few KiB): in memory (onnx.load reads the external data) as from the path."""
    import onnx

    path = _external_model(tmp_path, 4096, write=True)
    g = loader.load_onnx(path)
    assert "/Add" in {n.name for n in g.nodes}
    monkeypatch.setattr(loader, "PROTO_LIMIT", 16000)
    for model in (path, onnx.load(str(path))):
        with pytest.raises(AscendEmuError, match="limits to 2 GiB"):
            loader.load_onnx(model)

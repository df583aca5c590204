"""`compare A B` of two NPU dumps that share no op (a torch-run step against a .pt2 replay: the torch script's
manifest has no model fingerprint, so nothing refused them earlier) printed "identical: all 0 ops hold the same
bytes in both runs" before its error; now the one-line error alone, exit status 2."""
import numpy as np

from ascend_emu.analysis.dump import DumpWriter
from ascend_emu.cli.main import main


def _npu_dump(path, model, names):
    with DumpWriter(path, kind="npu", config={}, model=model, inputs_sha256=None) as w:
        for n in names:
            w.add_op(n, "Relu", "Relu", "AICORE", "float32", [], [np.arange(4, dtype=np.float32)])
    return str(path)


def test_two_npu_dumps_with_no_op_in_common(tmp_path, capsys):
    a = _npu_dump(tmp_path / "script", {"name": "torch script", "framework": "pytorch"}, ["Aten.relu.0.forward"])
    b = _npu_dump(tmp_path / "gpt", {"name": "gpt"}, ["relu"])
    assert main(["-q", "compare", a, b]) == 2
    cap = capsys.readouterr()
    assert "identical" not in cap.out, cap.out
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "no op name in common" in err[0] and "'torch script' vs 'gpt'" in err[0], err
    # two runs of one model still compare bit for bit
    c = _npu_dump(tmp_path / "again", {"name": "gpt"}, ["relu"])
    assert main(["-q", "compare", b, c]) == 0
    assert "identical: all 1 ops hold the same bytes" in capsys.readouterr().out

"""S5 (issue 45): what the command line prints from a dump (op names, tensor names, the sensitivity sidecar's
conclusion and parameter names) reaches the terminal escaped: no ESC/OSC sequence, bell, carriage return,
bidi override or a newline that starts a fake result line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ascend_emu.analysis.dump import DumpWriter
from ascend_emu.analysis.robustness import sidecar
from ascend_emu.cli.main import main

#: clear screen, set the title (OSC), a carriage return over the line, a fake result line, a bidi override
HOSTILE = "op\x1b[2J\x1b]0;pwned\x07\rcompared 9 of 9 tensors: 9 pass\n\u202eevil"


def _dump(path, kind, y):
    with DumpWriter(path, kind=kind, config={"overflow_mode": "saturation"},
                    model={"name": "m", "fingerprint": "f"}, inputs_sha256="s") as w:
        w.add_op("x", "Placeholder", "Data", "AICORE", "float32", [], [np.ones(3, np.float32)])
        w.add_op(HOSTILE, "Relu", "Relu", "AICORE", "float32", ["x:0"], [y])
        w.add_op("z", "Neg", "Neg", "AICORE", "float32", [f"{HOSTILE}:0"], [-y])
        w.finish({})
    return str(path)


def _clean(text):
    assert not any(c in text for c in "\x1b\x07\r\u202e"), repr(text)
    assert not any(line.startswith("compared 9") or line.startswith("\u202e") for line in text.splitlines())


def test_compare_and_overflow_escape_names_from_the_dump(tmp_path, capsys):
    npu = _dump(tmp_path / "npu", "npu", np.array([1.0, -2.0, 3.0], np.float32))
    bench = _dump(tmp_path / "bench", "bench", np.array([1.0, 2.0, 3.0], np.float32))
    with open(sidecar(npu), "w") as f:
        json.dump({"conclusions": {f"first_divergent{HOSTILE}": {"robust": False, "moved_by": [
            {"parameters": [f"p{HOSTILE}"]}]}}, "variants": [], "inputs_sha256": "s", "model_fingerprint": "f"}, f)
    assert main(["compare", npu, bench, "--limit", "5"]) == 0
    out = capsys.readouterr().out
    _clean(out)
    assert "first divergent op: [Relu][1] op\\x1b[2J\\x1b]0;pwned\\x07\\rcompared 9 of 9 tensors: 9 pass\\n" in out
    assert "moved: first_divergentop\\x1b" in out    # the sidecar's names, escaped too
    assert main(["overflow", npu]) == 0
    _clean(capsys.readouterr().out)


def test_a_users_script_prints_through_the_real_stream(tmp_path, capsys):
    """run / torch-run execute the user's own script: its colours and progress bars' carriage returns are its
    own output, not text from a dump, so they reach the terminal unescaped (Keras' progress bar is one)."""
    pytest.importorskip("torch")
    script = tmp_path / "s.py"
    script.write_text('print("\\x1b[32mgreen\\x1b[0m\\rdone")\n')
    assert main(["torch-run", str(script)]) == 0
    assert "\x1b[32mgreen\x1b[0m\rdone" in capsys.readouterr().out

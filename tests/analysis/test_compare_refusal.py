"""compare refuses what does not belong together (issue 12): other models, other inputs, empty dumps;
inf/nan statistics and mismatch wording."""
import csv
import math

import numpy as np
import pytest

from ascend_emu.analysis.compare import compare, tensor_metrics
from ascend_emu.analysis.dump import DumpWriter
from ascend_emu.analysis.report import write_report
from ascend_emu.errors import AscendEmuError, DumpError

FP_A, FP_B = "a" * 64, "b" * 64
IN_A, IN_B = "1" * 64, "2" * 64


def dump(path, kind, *, fingerprint=FP_A, inputs=IN_A, ops=None):
    ops = [("x", [np.arange(4, dtype=np.float32)]), ("y", [np.arange(4, dtype=np.float32) * 2])] if ops is None else ops
    with DumpWriter(path, kind=kind, config={}, model={"name": f"model-{fingerprint[0]}", "fingerprint": fingerprint},
                    inputs_sha256=inputs) as w:
        for name, outs in ops:
            w.add_op(name, "Relu", "Relu", "AICORE", str(outs[0].dtype), [], outs)
    return path


def test_different_models_refused_unless_forced(tmp_path):
    npu = dump(tmp_path / "n", "npu")
    other = dump(tmp_path / "b", "bench", fingerprint=FP_B)
    with pytest.raises(AscendEmuError) as e:
        compare(npu, other)
    msg = str(e.value)
    assert "\n" not in msg and "different models" in msg and FP_A in msg and FP_B in msg and "--force" in msg
    c = compare(npu, other, force=True)
    assert c.forced and "different models" in c.summary_text().splitlines()[0]
    c.to_csv(tmp_path / "c.csv")
    rows = list(csv.DictReader(open(tmp_path / "c.csv")))
    assert rows and all(r["Err_message"].startswith("[compared with --force") for r in rows)
    html = open(write_report(npu, other, tmp_path / "r.html", force=True)).read()
    assert 'id="forced"' in html and "different models" in html
    with pytest.raises(AscendEmuError, match="different models"):
        write_report(npu, other, tmp_path / "r2.html")
    assert not (tmp_path / "r2.html").exists()


def test_different_inputs_refused_unless_forced(tmp_path):
    npu = dump(tmp_path / "n", "npu")
    other = dump(tmp_path / "b", "bench", inputs=IN_B)
    with pytest.raises(AscendEmuError) as e:
        compare(npu, other)
    assert "different inputs" in str(e.value) and IN_A in str(e.value) and IN_B in str(e.value)
    assert "different inputs" in compare(npu, other, force=True).forced_note()
    # the same model and inputs: no refusal, no note
    c = compare(npu, dump(tmp_path / "same", "bench"))
    assert not c.forced and not c.summary_text().startswith("WARNING")


def test_empty_dump_is_an_error(tmp_path):
    """An NPU dump with no op used to "pass" the comparison."""
    empty = dump(tmp_path / "e", "npu", ops=[])
    bench = dump(tmp_path / "b", "bench")
    with pytest.raises(DumpError, match="holds no ops") as e:
        compare(empty, bench)
    assert "NPU dump" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DumpError, match="bench dump .* holds no ops"):
        compare(dump(tmp_path / "n", "npu"), dump(tmp_path / "eb", "bench", ops=[]), force=True)


def test_mismatch_wording_names_the_side(tmp_path):
    """NaN only in the bench (inputs with NaN, saturation mode zeroing it on the NPU): the message must not say
    the NPU has inf/nan the bench has not (the old wording was inverted)."""
    n = np.array([1.0, 0.0, 2.0], np.float32)
    b = np.array([1.0, np.nan, 2.0], np.float32)
    m = tensor_metrics(n, b)
    assert "1 only in the bench tensor" in m["Err_message"] and "only in the NPU" not in m["Err_message"]
    m = tensor_metrics(b, n)
    assert "1 non-finite only in the NPU tensor" in m["Err_message"]
    m = tensor_metrics(np.array([np.inf]), np.array([-np.inf]))
    assert "a different inf/nan on each side" in m["Err_message"]
    npu = dump(tmp_path / "n", "npu", ops=[("x", [n])])
    bench = dump(tmp_path / "b", "bench", ops=[("x", [b])])
    text = compare(npu, bench).summary_text()
    assert "inf/nan positions differ between NPU and bench" in text and "where the bench has none" not in text


def test_nonfinite_statistics_shown_in_csv_and_report(tmp_path):
    """NPU/Bench max and min of an all-Inf (or all-NaN) tensor show inf/-inf/nan, never an empty cell."""
    ops = [("pinf", [np.full(3, np.inf, np.float32)]), ("ninf", [np.array([-np.inf, np.nan], np.float16)]),
           ("nan", [np.full(2, np.nan, np.float32)])]
    npu = dump(tmp_path / "n", "npu", ops=ops)
    bench = dump(tmp_path / "b", "bench", ops=ops)
    c = compare(npu, bench)
    c.to_csv(tmp_path / "c.csv")
    rows = {r["NPU Name"]: r for r in csv.DictReader(open(tmp_path / "c.csv"))}
    assert (rows["pinf:0"]["NPU max"], rows["pinf:0"]["NPU min"]) == ("inf", "inf")
    assert (rows["ninf:0"]["Bench max"], rows["ninf:0"]["Bench min"]) == ("-inf", "-inf")
    assert (rows["nan:0"]["NPU max"], rows["nan:0"]["Bench min"]) == ("nan", "nan")
    r = {x["NPU Name"]: x for x in c.rows}
    assert r["pinf:0"]["NPU max"] == math.inf
    html = open(write_report(npu, bench, tmp_path / "r.html")).read()
    assert "inf" in html


def step_dump(path, *, w, x=(1.0, 2.0, 3.0, 4.0), g=None, state=("w", "loss_scale"), inputs=IN_A):
    """A dump of a training step (ops with phases, the step's state inputs in the manifest): placeholders x
    (batch), w and loss_scale (state); h = x * w, g (its own numerics), out = h + g."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    g = np.arange(4, dtype=np.float32) + 1 if g is None else np.asarray(g, np.float32)
    model = {"name": "m_train_step", "fingerprint": FP_A, "state_inputs": list(state)}
    with DumpWriter(path, kind="npu", config={}, model=model, inputs_sha256=inputs) as wr:
        for name, out in (("x", x), ("w", w), ("loss_scale", np.float32(1024.0))):
            wr.add_op(name, "Placeholder", "Data", "HOST", "float32", [], [np.asarray(out)], phase="forward")
        wr.add_op("h", "Mul", "Mul", "AICORE", "float32", ["x:0", "w:0"], [x * w], phase="forward")
        wr.add_op("g", "Relu", "Relu", "AICORE", "float32", ["x:0"], [g], phase="forward")
        wr.add_op("out", "AddV2", "Add", "AICORE", "float32", ["h:0", "g:0"], [x * w + g], phase="backward")
    return path


def test_two_runs_steps_compare_by_their_state(tmp_path, capsys):
    """Issue 35: `compare a/step-29 b/step-29` was refused as "different inputs" (the state placeholders are
    inputs), the runs' message not naming --force; forced, a weight placeholder was the first divergent op.
    Two runs' steps differ by their state: compared without --force, the state said as such, never the
    first divergent op; a different batch is still refused, naming --force."""
    from ascend_emu.analysis.runs import compare_runs
    from ascend_emu.cli.main import main

    a = step_dump(tmp_path / "a", w=[1, 1, 1, 1])
    b = step_dump(tmp_path / "b", w=[1, -1, 2, 1], inputs=IN_B)           # another run's weights
    c = compare(a, b)
    assert not c.forced
    assert [r["NPU Name"] for r in c.state_differences()] == ["w:0"]
    assert c.first_divergent() is None                                     # h and out only follow from w
    assert "the steps start from different states: 1 of 2 state inputs differ" in c.summary_text()
    # a divergence of the step's own: found past the state
    b2 = step_dump(tmp_path / "b2", w=[1, -1, 2, 1], g=[5, -6, 7, 9], inputs=IN_B)
    assert compare(a, b2).first_divergent().name == "g"
    runs = compare_runs(a, b2)
    assert runs.state == ["w"] and runs.first["name"] == "h" and not runs.first["source"]
    assert runs.sources == ["g"] and "different states: 1 state inputs differ (w)" in runs.format_text()
    assert main(["compare", str(a), str(b2)]) == 0
    out = capsys.readouterr().out
    assert "different states" in out and "first divergent op: [Relu][4] g" in out
    # another batch is another step: refused by both, naming the input and --force
    other = step_dump(tmp_path / "o", w=[1, -1, 2, 1], x=[4, 3, 2, 1], inputs=IN_B)
    for fn in (compare, compare_runs):
        with pytest.raises(AscendEmuError) as e:
            fn(a, other)
        msg = str(e.value)
        assert "different inputs (x differ" in msg and "--force" in msg and "\n" not in msg
    assert main(["compare", str(a), str(other)]) == 2
    assert "--force" in capsys.readouterr().err


def test_worst_rows_table_says_when_none_is_below_the_cosine(tmp_path, capsys):
    """Issue 35: `compare --cosine 0.98 --limit 10` printed an empty table when every row was above 0.98;
    it says so and shows the lowest rows instead."""
    from ascend_emu.cli.main import main

    npu = dump(tmp_path / "n", "npu", ops=[("x", [np.arange(4, dtype=np.float32)]),
                                           ("y", [np.array([0, 2, 4, 6.1], np.float32)])])
    bench = dump(tmp_path / "b", "bench")
    assert main(["compare", str(npu), str(bench), "--cosine", "0.98", "--limit", "10"]) == 0
    out = capsys.readouterr().out
    head, table = out.split("no tensor with cosine <= 0.98; the 2 lowest:\n")[1].split("\n", 1)
    assert "Cosine" in head and table.splitlines()[1].split()[1] == "y:0"     # the lowest first
    c = compare(npu, bench)
    assert c.format_worst(0.99999, 1).startswith("Index") and "y:0" in c.format_worst(0.99999, 1)

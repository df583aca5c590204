"""Dumps of an emulated torch run in ascend-emu's format: compare, overflow and report read them unchanged."""
import os

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import ascend_emu as ae  # noqa: E402
from ascend_emu.analysis.dump import load_dump  # noqa: E402

from torch_models import cnn_batch, small_cnn  # noqa: E402


def test_cnn_dump_and_reference_compare(tmp_path):
    x, y = cnn_batch()
    m = small_cnn()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with ae.torch.emulate(dump=tmp_path / "d", dump_steps=[1], reference=True) as run:
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(m(x), y).backward()
            opt.step()
    assert sorted(run.dumps) == [1] and os.path.isdir(tmp_path / "d" / "step-1")
    d, r = load_dump(run.dumps[1]), load_dump(run.reference_dumps[1])
    names = [op["name"] for op in d.ops]
    # every call of the step but those handing out uninitialised memory (aten.empty: nothing to compare)
    from ascend_emu.npu.torch_run.run import UNINITIALISED

    assert names == [op["name"] for op in r.ops] and names == [
        rec.name for rec in run.records if rec.step == 1 and ".".join(rec.aten.split(".")[:2]) not in UNINITIALISED]
    conv = next(op for op in d.ops if op["name"] == "Aten.convolution.0.forward")
    assert conv["tf_type"] == "Conv2D" and conv["engine"] == "AICORE" and conv["phase"] == "forward"
    assert conv["precision"]["cube_math_type"] == "USE_HF32" and conv["precision"]["torch_dtypes"]["inputs"][0] == \
        "float32"
    assert conv["inputs"][0] == "Input.0:0"                     # the batch: no op of the step made it
    assert all(i.startswith(("Input.", "Aten.")) for op in d.ops for i in op["inputs"])
    assert d.op("Aten.relu.0.forward")["inputs"] == ["Aten.native_batch_norm.0.forward:0"]
    assert {op["phase"] for op in d.ops} == {"forward", "backward", "update"}
    c = ae.compare(run.dumps[1], run.reference_dumps[1])
    # HF32 convolution operands move the values a little. The first convolution's bias gradient (output 1 of its
    # convolution_backward) is zero in exact arithmetic: the batch norm after it cancels the bias, so both sides hold
    # float32 rounding noise of 1e-8 whose cosine is 0.13. It fails the metric rule, and is passed over as noise,
    # never named the first divergent op (nor is a max pool whose argmax moved: integers are exact or not)
    rows = {row["NPU Name"]: row for row in c.rows}
    noisy = rows["Aten.convolution_backward.1.backward:1"]     # the backward meets the first convolution second
    assert noisy["Result"] == "error" and noisy["Cosine"] < 0.5 and "rounding noise" in noisy["Err_message"]
    assert c.noise_ops() == ["Aten.convolution_backward.1.backward"]
    assert c.first_divergent() is None and "rounding noise" in c.summary_text()
    assert rows["Aten.convolution.0.forward:0"]["Cosine"] > 0.9999
    assert rows["Aten.addmm.0.forward:0"]["Result"] == "pass"
    html = ae.write_report(run.dumps[1], run.reference_dumps[1], tmp_path / "report.html")
    assert os.path.getsize(html) > 1000


def test_amp_overflow_dump_names_the_backward_op(tmp_path):
    x, y = cnn_batch()
    m = small_cnn()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    with ae.torch.emulate(dump=tmp_path / "d") as run:
        opt.zero_grad()
        with run.autocast():
            out = m(x)
            out.register_hook(lambda g: g * 1e4)
            loss = F.cross_entropy(out, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert run.steps[0]["skipped"]
    rep = ae.overflow_report(run.dumps[0])
    assert rep.first is not None and rep.first["name"] == run.steps[0]["first_overflow"]["name"]
    assert rep.first["name"].startswith("Aten.mul.") and rep.first["name"].endswith(".backward")


def test_dump_past_the_free_space_keeps_statistics(tmp_path, monkeypatch, capsys):
    import shutil
    from collections import namedtuple

    from ascend_emu.npu import torch_run

    usage = namedtuple("usage", "total used free")
    # 300 kB usable after the margin: the first calls' tensors fit, the rest become statistics
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 40, 0, torch_run.DUMP_MARGIN + 300_000))
    x, y = cnn_batch()
    m = small_cnn()
    with ae.torch.emulate(dump=tmp_path / "d") as run:
        F.cross_entropy(m(x), y).backward()
    d = load_dump(run.dumps[0])
    files = [o["file"] for op in d.ops for o in op["outputs"]]
    assert files[0] is not None and files[-1] is None and all(o.get("max") is not None or o["shape"] == [0]
                                                              for op in d.ops for o in op["outputs"]
                                                              if o["dtype"].startswith("float"))
    assert "statistics only" in capsys.readouterr().err


def test_missing_torch_is_one_line():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "import ascend_emu as ae\n"
            "try:\n    ae.torch.emulate\nexcept ae.AscendEmuError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "PyTorch is not installed; install the torch extra: pip install 'ascend-emu[torch]'"


def test_reference_follows_the_runs_draws_scale_and_unscale(tmp_path):
    """The float32 reference of a GradScaler + AdamW step with dropout: it takes the run's own random draws (it
    drew others: the first divergent op was a random op), unscales its gradients as the run does (they stayed
    scaled, and AdamW's addcmul_/lerp_ parted at cosine 0.93 in step 1) and shares the loss scale; uninitialised
    memory (aten.empty) is in neither dump."""
    x, y = cnn_batch()
    torch.manual_seed(0)
    m = torch.nn.Sequential(small_cnn(), torch.nn.Dropout(0.2))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    with ae.torch.emulate(dump=tmp_path / "d", dump_steps=[1], reference=True) as run:
        for _ in range(2):
            opt.zero_grad()
            with run.autocast():
                loss = F.cross_entropy(m(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            torch.empty(3).uniform_()          # a draw into uninitialised memory
    assert not run.steps[1]["skipped"]
    d = load_dump(run.dumps[1])
    names = [op["name"] for op in d.ops]
    assert not any(n.startswith("Aten.empty") for n in names)
    assert any(n.startswith(("Aten.native_dropout", "Aten.bernoulli")) for n in names)
    c = ae.compare(run.dumps[1], run.reference_dumps[1])
    rows = {row["NPU Name"]: row for row in c.rows}
    for name, row in rows.items():
        if name.startswith(("Aten.native_dropout", "Aten.bernoulli", "Aten.uniform_")):
            assert row["Cosine"] == 1.0 or row["Cosine"] == "N/A", (name, row["Cosine"])
    # the weights' updates (a bias before a BatchNorm has a gradient of rounding noise only: no cosine to hold)
    update = [r for n, r in rows.items() if n.startswith(("Aten.addcmul_", "Aten.lerp_"))
              and isinstance(r["Cosine"], float) and r["NPU Tensor Shape"].count(",") >= 1]
    assert len(update) >= 4 and min(r["Cosine"] for r in update) > 0.999, [(r["NPU Name"], r["Cosine"]) for r in update]


def test_max_pool_indices_compare_exact_or_not(tmp_path):
    """max_pool2d_with_indices' int64 indices are not measurements: compared exact or not (the elements that differ,
    counted here from the two dumps' tensors), never by a cosine; HF32 convolution operands move a few argmaxes."""
    import numpy as np

    x, _ = cnn_batch()
    m = small_cnn()
    with torch.no_grad(), ae.torch.emulate(dump=tmp_path / "d", reference=True) as run:
        m(x)
    d, r = load_dump(run.dumps[0]), load_dump(run.reference_dumps[0])
    rows = {row["NPU Name"]: row for row in ae.compare(run.dumps[0], run.reference_dumps[0]).rows}
    pools = [op["name"] for op in d.ops if op["name"].startswith("Aten.max_pool2d_with_indices")]
    assert len(pools) == 2
    verdicts = set()
    for name in pools:
        a, b = d.tensor(name, 1), r.tensor(name, 1)
        assert a.dtype == np.int64 and b.dtype == np.int64
        n, size = int((a != b).sum()), a.size
        row = rows[f"{name}:1"]
        assert all(row[c] == "N/A" for c in ("Cosine", "MaxAbsErr", "RMSE")), row
        if n:
            assert row["Result"] == "warning" and f"integers differ at {n} of {size} " in row["Err_message"], row
        else:
            assert row["Result"] == "pass" and f"exact ({size} of {size} equal" in row["Err_message"], row
        verdicts.add(row["Result"])
        assert isinstance(rows[f"{name}:0"]["Cosine"], float)      # the pooled values keep their metrics
    assert verdicts == {"pass", "warning"}    # this batch: the first pool's ties moved (3 of 8192), the second's not

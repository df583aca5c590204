"""random-errors (NUMERICS.md section 11): runs with deterministic off part at a multi-core op, which the
command names as the source; deterministic runs are byte-identical dumps (issue 13's Done-when)."""
import filecmp
import json
import os

import numpy as np
import pytest

from ascend_emu.cli import main
from ascend_emu.errors import AscendEmuError
from ascend_emu.ops.multicore import MULTICORE_OPS
from ascend_emu.tools.random_errors import random_errors
from fp32mode import FP32, FP32_ARGS, fp32  # noqa: F401  (the tests' fp32 mode)


def same_files(d1, d2) -> bool:
    """Every file of two dump directories byte for byte (manifest included)."""
    names = sorted(os.listdir(d1))
    if names != sorted(os.listdir(d2)):
        return False
    return all(filecmp.cmp(os.path.join(d1, n), os.path.join(d2, n), shallow=False) for n in names)


def check_parts_at_multicore_op(res, op_hint, reaches_output=True):
    assert not res.identical
    f = res.first
    assert f["source"] and f["tf_type"] in MULTICORE_OPS and op_hint in f["name"], f
    assert f["split"].startswith(f["tf_type"])
    assert all(s["tf_type"] in MULTICORE_OPS for s in res.sources)
    assert (res.output_spread["max_abs"] > 0) == reaches_output
    text = res.format_text()
    assert f["name"] in text and "the source" in text and "multi-core op" in text


@pytest.mark.models
def test_mobilenet_v2_replays_part_at_the_split_k_classifier(tmp_path):
    from ascend_emu.frontend.tf.models import _keras

    keras = _keras(0)
    m = keras.applications.MobileNetV2(alpha=0.35, weights=None, input_shape=(32, 32, 3), classes=100)
    dev = dict(FP32)
    # K = 1280 in 4 chunks: 12 distinct sums of 4 partials, so two runs may agree; three runs part
    # full dumps: no second run of the parting pair (the default's is covered by the small model below)
    res = random_errors(m, runs=3, out_dir=tmp_path / "off", device_options=dev, full_dumps=True)
    # with random weights the logits are ~1e-11: the softmax absorbs their last-bit differences
    check_parts_at_multicore_op(res, "predictions", reaches_output=False)
    det = random_errors(m, runs=2, out_dir=tmp_path / "on", device_options={**dev, "deterministic": True})
    assert det.identical and det.output_spread["max_abs"] == 0
    assert same_files(tmp_path / "on" / "run-0", tmp_path / "on" / "run-1")


@pytest.mark.models
def test_transformer_replays_part_at_the_ffn_matmul_and_deterministic_dumps_are_identical(tmp_path):
    from ascend_emu.frontend.tf.models import transformer_encoder

    m = transformer_encoder(ff_dim=1024)      # ffn2: K = 1024 over 3 cube cores (split-K)
    dev = dict(FP32)
    res = random_errors(m, runs=2, out_dir=tmp_path / "off", device_options=dev, full_dumps=True)
    check_parts_at_multicore_op(res, "ffn2")
    assert res.differing_ops >= 2              # it propagates to the residual add and the layer norm
    det = random_errors(m, runs=3, out_dir=tmp_path / "on", device_options={**dev, "deterministic_level": 1})
    assert det.identical and det.deterministic_level == 1
    for k in (1, 2):
        assert same_files(tmp_path / "on" / "run-0", tmp_path / "on" / f"run-{k}")


@pytest.mark.models
def test_training_with_an_embedding_parts_at_a_named_step_and_op(tmp_path):
    from ascend_emu.frontend.tf.models import embedding_classifier, embedding_data

    m, data = embedding_classifier(), embedding_data()
    kw = dict(data=data, steps=20, batch_size=16, device_options=dict(FP32))
    res = random_errors(m, runs=4, out_dir=tmp_path / "off", dump_steps=[0], report=tmp_path / "re.html", **kw)
    f = res.first
    assert (f["step"], f["phase"], f["tf_type"], f["source"]) == (0, "backward", "UnsortedSegmentSum", True)
    assert res.first_loss_step is not None and res.loss_spread["runs"] == 4 and res.loss_spread["max_abs"] >= 0
    # the curves part from the first differing step on; the final losses may meet again (since the float32 steps
    # of the cross-entropy kernel, this seed's 20th losses coincide in all four runs)
    curves = np.array([r["losses"] for r in res.runs])
    assert (curves[:, res.first_loss_step] != curves[0, res.first_loss_step]).any()
    assert not (curves[:, :res.first_loss_step] != curves[0, :res.first_loss_step]).any()
    text = res.format_text()
    assert "step 0" in text and "UnsortedSegmentSum" in text and "final loss spread over 4 runs" in text
    html = (tmp_path / "re.html").read_text()
    assert 'id="curves"' in html and "UnsortedSegmentSum" in html
    det = random_errors(m, runs=2, out_dir=tmp_path / "on", dump_steps=[0, 19],
                        **{**kw, "device_options": {**kw["device_options"], "deterministic": True}})
    assert det.identical and det.first_loss_step is None
    a, b = det.runs
    assert np.array(a["losses"]).tobytes() == np.array(b["losses"]).tobytes()
    for k in ("step-0", "step-19"):
        assert same_files(tmp_path / "on" / "run-0" / k, tmp_path / "on" / "run-1" / k)


def test_cli_random_errors_names_the_op_and_compare_says_where_runs_part(tmp_path, monkeypatch, capsys):
    from ascend_emu.frontend.tf.loader import import_tf

    tf = import_tf()
    monkeypatch.chdir(tmp_path)
    inp = tf.keras.Input((1500,), name="inp")
    m = tf.keras.Model(inp, tf.keras.layers.Dense(6, name="dense")(inp))
    m.layers[1].set_weights([np.random.default_rng(0).standard_normal((1500, 6)).astype(np.float32),
                             np.zeros(6, np.float32)])
    m.save(tmp_path / "m.keras")
    args = ["-q", "random-errors", "m.keras", *FP32_ARGS, "--runs", "3"]
    # the runs on a real Dask LocalCluster (the CLI's default with Dask installed), then serially
    assert main(args + ["--json", "re.json", "--report", "re.html", "--scheduler", "local", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "re.json").read_text())
    assert res["first"]["source"] and res["first"]["tf_type"] in ("MatMul", "_FusedMatMul"), res["first"]
    assert res["first"]["name"] in out and (tmp_path / "re.html").exists()
    seeds = res["first"]["run_seeds"]
    assert main(["compare", f"random-errors-output/run-{seeds[0]}", f"random-errors-output/run-{seeds[1]}"]) == 0
    out = capsys.readouterr().out
    assert "the runs part at op" in out and res["first"]["name"] in out and "the source" in out
    assert main(args + ["--deterministic", "1", "--out", "det", "--scheduler", "none"]) == 0
    assert "identical" in capsys.readouterr().out
    assert main(["compare", "det/run-0", "det/run-2"]) == 0
    assert capsys.readouterr().out.startswith("identical: all")


_CALLS: dict = {}


def _flaky(x):
    _CALLS[x] = _CALLS.get(x, 0) + 1
    if _CALLS[x] == 1:
        raise RuntimeError("transient")
    return 2 * x


def _broken(x):
    raise RuntimeError("broken")


def _user_error(x):
    raise AscendEmuError("bad option x")


def test_sweep_map_retries_once_then_names_the_run():
    from ascend_emu.tools.sweep import Sweep

    with Sweep("none", progress=False) as sweep:
        assert sweep.map(_flaky, [1, 2]) == [2, 4] and _CALLS == {1: 2, 2: 2}
        with pytest.raises(AscendEmuError, match=r"^run 7 failed twice: RuntimeError: broken$"):
            sweep.map(_broken, [0], names=["run 7"])
    with Sweep("none", progress=False) as sweep, pytest.raises(AscendEmuError, match="^bad option x$"):
        sweep.map(_user_error, [0])


def test_earlier_runs_are_not_replaced_unasked(tmp_path):
    """issue 35: a second detection into the same --out replaced the first one's dumps without --overwrite."""
    (tmp_path / "out" / "run-0").mkdir(parents=True)
    (tmp_path / "out" / "run-0" / "keep").write_text("an earlier run")
    (tmp_path / "m.keras").write_bytes(b"refused before it is read")
    with pytest.raises(AscendEmuError, match="already holds the dumps of earlier runs.*--overwrite"):
        random_errors(str(tmp_path / "m.keras"), runs=2, out_dir=tmp_path / "out", runner=lambda tasks: [])
    assert (tmp_path / "out" / "run-0" / "keep").read_text() == "an earlier run"
    with pytest.raises(AscendEmuError, match="more than random-error detection takes"):
        random_errors(str(tmp_path / "m.keras"), runs=10 ** 20, out_dir=tmp_path / "out2")


def test_precision_mode_v2_reaches_the_runs(tmp_path):
    """The runs took precision_mode force_fp16 beside a precision_mode_v2 and refused the pair (the README's
    `random-errors --precision-mode-v2 origin` always failed)."""
    from ascend_emu.frontend.tf.tf import import_tf

    tf = import_tf()
    inp = tf.keras.Input((64,), name="inp")
    m = tf.keras.Model(inp, tf.keras.layers.Dense(4, name="dense")(inp))
    res = random_errors(m, runs=2, out_dir=tmp_path / "o",
                        device_options={"precision_mode_v2": "origin", "soc": "Ascend910B", "deterministic": True})
    assert res.first is None


def test_seed_reaches_the_training_runs(tmp_path, monkeypatch):
    """``random-errors --data ... --seed 7 --shuffle``: every run trains with seed 7 (its shuffle), not 0."""
    import ascend_emu.tools.random_errors as re_mod

    seen = []

    def capture(task):      # (the CLI may run the command in a child process: the task goes through a file)
        seen.append(task)
        (tmp_path / "task.json").write_text(json.dumps({k: task[k] for k in ("seed", "shuffle") if k in task}))
        raise AscendEmuError("captured")

    monkeypatch.setattr(re_mod, "run_once", capture)
    monkeypatch.setattr("ascend_emu.npu.training.training_step_bytes", lambda *a, **k: 0)   # (no model to trace)
    model = tmp_path / "m.keras"
    model.write_bytes(b"")
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2), np.float32), y=np.zeros(4, np.int64))
    code = main(["random-errors", str(model), "--data", str(tmp_path / "d.npz"), "--steps", "1", "--shuffle",
                 "--seed", "7", "--out", str(tmp_path / "o"), "-q"])
    assert code == 2 and json.loads((tmp_path / "task.json").read_text()) == {"seed": 7, "shuffle": True}
    seen.clear()
    with pytest.raises(AscendEmuError, match="captured"):
        random_errors(str(model), data=str(tmp_path / "d.npz"), steps=1, seed=5, out_dir=tmp_path / "p")
    assert seen[0]["seed"] == 5


def _split_k_model(tf):
    """Dense 1500 -> 6, whose MatMul splits K over the cube cores (runs with determinism off part there), then
    two wider layers (what a full dump holds and the default does not)."""
    inp = tf.keras.Input((1500,), name="inp")
    x = tf.keras.layers.Dense(6, name="dense")(inp)
    for k in range(2):
        x = tf.keras.layers.Dense(256, activation="relu", name=f"wide{k}")(x)
    m = tf.keras.Model(inp, tf.keras.layers.Dense(2, name="out")(x))
    rng = np.random.default_rng(0)
    for layer in m.layers[1:]:
        scale = 1.0 if layer.name == "dense" else 0.0625
        layer.set_weights([rng.standard_normal(w.shape).astype(np.float32) * scale for w in layer.get_weights()])
    return m


def _tensor_ops(run_dir):
    m = json.loads((run_dir / "manifest.json").read_text())
    return m, {op["name"] for op in m["ops"] if any(o.get("file") for o in op["outputs"])}


def test_default_dumps_hold_statistics_and_the_tensors_where_runs_part(tmp_path, capsys):
    """issue 35: ``random-errors --steps 3 --runs 3`` wrote 2.9 GB unasked. By default a run dumps statistics and
    a sha256 per output (still bit for bit), a replay's final outputs, and, run again, the tensors of the op where
    the runs part and of its inputs; the estimate is told first. ``full_dumps`` keeps every tensor."""
    from ascend_emu.frontend.tf.tf import import_tf

    m = _split_k_model(import_tf())
    res = random_errors(m, runs=2, out_dir=tmp_path / "o", device_options=dict(FP32), progress=True)
    err = capsys.readouterr().err
    assert "the dumps of 2 runs (statistics and digests; --full-dumps for every tensor) will take about" in err
    f = res.first
    assert f["source"] and f["metrics"].get("Cosine") is not None, f    # its metrics read the kept tensors
    for k in (0, 1):
        man, kept = _tensor_ops(tmp_path / "o" / f"run-{k}")
        assert all(isinstance(o.get("sha256"), str) for op in man["ops"] for o in op["outputs"]
                   if o["dtype"] not in ("string", "variant"))
        op = next(o for o in man["ops"] if o["name"] == f["name"])
        want = {f["name"], *(r.rpartition(":")[0] for r in op["inputs"])}
        assert want <= kept and not any(n.startswith("wide") for n in kept), (kept, want)
    full = random_errors(m, runs=2, out_dir=tmp_path / "full", device_options=dict(FP32), full_dumps=True)
    assert (full.first["name"], full.differing_ops) == (f["name"], res.differing_ops)
    assert full.output_spread == res.output_spread
    man, kept = _tensor_ops(tmp_path / "full" / "run-0")
    assert len(kept) == len([op for op in man["ops"] if op["outputs"]])
    from ascend_emu.analysis.dump import dump_bytes

    assert dump_bytes(tmp_path / "o") * 3 < dump_bytes(tmp_path / "full")

"""The pre-tuning checklist (ascend_emu.check, ``ascend-emu check``).

One small Keras classifier (Dense -> BatchNorm -> ReLU -> Dropout -> Dense(tanh) -> Dense) and 64 samples; each
test plants one fault and asserts that exactly its row fails, with the evidence naming the fault; the clean
model passes every row it can check (item 8 needs the user's cluster: Not checked). Exploding gradients also
make the loss diverge (item 14): the same fault seen in the loss curve, asserted as such.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import ascend_emu as ae  # noqa: E402
from ascend_emu.cli.main import main  # noqa: E402
from ascend_emu.tools.check import RESULTS  # noqa: E402

STEPS, BATCH = 3, 16
BENCH = {"optimizer": "sgd", "learning_rate": 0.05, "momentum": 0.0, "batch_size": BATCH,
         "loss": "sparse_categorical_crossentropy_from_logits"}


class Noise(keras.layers.Layer):
    """Adds 1e-6 of unseeded uniform noise: a stateful random op whose every run draws anew."""

    def call(self, x):
        return x + tf.raw_ops.RandomUniform(shape=tf.shape(x), dtype=tf.float32, seed=0, seed2=0) * 1e-6


def build(fault=None, lr=0.05):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    L = keras.layers
    inp = keras.Input((8,))
    if fault == "explode":
        h = L.Dense(16, activation="relu", name="dense1")(inp)
        m = keras.Model(inp, L.Dense(4, name="out")(h), name="regressor")
        m.compile(optimizer=keras.optimizers.SGD(lr), loss="mean_squared_error")
        return m
    h = L.Dense(16, name="dense1")(inp)
    if fault == "noise":
        h = Noise(name="noise")(h)
    if fault == "overflow":
        h = L.Rescaling(6e4, name="amplify")(h)   # fine in float32 (BatchNorm follows), beyond 65504 in fp16
    h = L.BatchNormalization(name="bn")(h)
    h = L.Activation("relu", name="relu")(h)
    h = L.Dropout(0.2, name="drop")(h)
    kernel = {"zero": "zeros", "sigmoid": keras.initializers.RandomNormal(stddev=5.0)}.get(fault, "glorot_uniform")
    h = L.Dense(8, activation="sigmoid" if fault == "sigmoid" else "tanh", kernel_initializer=kernel, name="dense2")(h)
    m = keras.Model(inp, L.Dense(4, name="logits")(h), name="classifier")
    if fault == "frozen":
        m.get_layer("dense2").trainable = False
    m.compile(optimizer=keras.optimizers.SGD(lr), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def data(fault=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = rng.integers(0, 4, 64)
    if fault == "bad_data":
        x[3, 2] = np.nan
        y[5] = 7
    if fault == "explode":
        x, y = x * np.float32(4), rng.normal(size=(64, 4)).astype(np.float32)
    return {"x": x, "y": y}


def run(fault=None, *, precision_mode="allow_mix_precision", loss_scale="dynamic", benchmark_config=BENCH, lr=0.05):
    dev = ae.Device(precision_mode, soc="Ascend910")
    return ae.check(build(fault, lr), data(fault), device=dev, batch_size=BATCH, steps=STEPS, loss_scale=loss_scale,
                    benchmark_config=benchmark_config)


def failed(res) -> set:
    return {r.number for r in res.failed}


@pytest.fixture(scope="module")
def clean():
    return run()


def test_clean_model_passes_every_row_it_can_check(clean):
    assert [r.number for r in clean] == ["1", "2/3", "4", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
                                         "16", "17", "18", "19"]
    assert {r.number: r.result for r in clean if r.result != "Passed"} == {"8": "Not checked"}, clean.format_text()
    assert clean.exit_code == 0 and clean.ops_info is None
    assert "bit-identical" in clean["1"].evidence
    assert "8 of 8 matrix ops in fp16" in clean["2/3"].evidence
    assert "5 setting(s) equal" in clean["10"].evidence
    # the numeric rows carry their plots' numbers
    assert len(clean["12"].plot["norms"]) == STEPS and clean["12"].plot["layers"] == [
        "dense1", "bn", "dense2", "logits"]
    assert {a["type"] for a in clean["13"].plot["activations"]} == {"Relu", "Tanh"}
    assert len(clean["14"].plot["reference"]) == len(clean["14"].plot["npu"]) == STEPS


def test_json_rows_have_exactly_the_five_fields(clean):
    doc = json.loads(json.dumps(clean.to_json()))
    assert list(doc) == ["rows"]
    for r in doc["rows"]:
        assert list(r) == ["number", "item", "method", "result", "evidence"]
        assert r["result"] in RESULTS


def test_nondeterministic_benchmark_names_the_first_differing_op():
    res = run("noise")
    assert failed(res) == {"1"}, res.format_text()
    ev = res["1"].evidence
    assert "inference: first differing op" in ev and "RandomUniform" in ev and "training: step 0 differs" in ev
    # the emulator's own comparison leaves the random op to item 1
    assert "random op(s)" in res["17"].evidence


def test_mixed_precision_off():
    res = run(precision_mode="must_keep_origin_dtype")
    assert failed(res) == {"2/3"}, res.format_text()
    assert "0 of 8 matrix ops in fp16" in res["2/3"].evidence and "must_keep_origin_dtype" in res["2/3"].evidence
    assert res["4"].result == "Passed" and "not needed" in res["4"].evidence


def test_no_loss_scale_under_saturation():
    res = run(loss_scale="none")
    assert failed(res) == {"4"}, res.format_text()
    assert "no loss scale" in res["4"].evidence and "saturation" in res["4"].evidence


def test_isfinite_overflow_check_under_saturation_is_flagged():
    res = ae.check(build(), data(), device=ae.Device("allow_mix_precision", soc="Ascend910"), batch_size=BATCH,
                   steps=2, loss_scale="dynamic", overflow_check="isfinite", benchmark_config=BENCH)
    assert res["4"].result == "Failed" and "isfinite" in res["4"].evidence and "65504" in res["4"].evidence


def test_dataset_with_nan_and_out_of_range_labels():
    res = run("bad_data")
    assert failed(res) == {"6"}, res.format_text()
    ev = res["6"].evidence
    assert "1 sample(s) with NaN/Inf in x" in ev and "sample 3" in ev
    assert "outside the model's 4 classes" in ev and "values 7" in ev
    assert "62 clean samples" in ev


def test_frozen_layer():
    res = run("frozen")
    assert failed(res) == {"9"}, res.format_text()
    assert "frozen layer(s), not in the optimizer: dense2" in res["9"].evidence


def test_zero_initialised_dense_layer():
    res = run("zero")
    assert failed(res) == {"11"}, res.format_text()
    assert "all zero: dense2/kernel" in res["11"].evidence


def test_hyperparameter_difference_against_the_benchmark_config():
    res = run(benchmark_config=dict(BENCH, learning_rate=0.01, batch_size=32))
    assert failed(res) == {"10"}, res.format_text()
    ev = res["10"].evidence
    assert "learning_rate: 0.05 here, 0.01 in the benchmark" in ev and "batch_size: 16 here, 32" in ev


def test_exploding_gradients_with_a_large_learning_rate():
    res = run("explode", lr=1.0, benchmark_config=None)
    # the loss diverges with the gradients: item 14 is the same fault in the loss curve
    assert failed(res) == {"12", "14"}, res.format_text()
    assert "non-finite gradient" in res["12"].evidence or "exploding" in res["12"].evidence
    assert res["15"].result == "Passed"      # 1.0 is within SGD's range: the model's curvature makes it too large


def test_sigmoid_saturation():
    res = run("sigmoid")
    assert failed(res) == {"13"}, res.format_text()
    assert "dense2_1/Sigmoid (Sigmoid)" in res["13"].evidence and "pinned at 0 or 1" in res["13"].evidence


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("check")
    m = build("overflow")
    m.save(d / "port.keras")
    build().save(d / "bench.keras")     # same optimizer and loss: item 10 passes
    np.savez(d / "train.npz", **data())
    return d


def test_cli_planted_fp16_overflow_json_report_and_ops_info(files, tmp_path, capsys):
    out = tmp_path
    code = main(["check", str(files / "port.keras"), "--data", str(files / "train.npz"), "--benchmark",
                 str(files / "bench.keras"), "--steps", str(STEPS), "--batch-size", str(BATCH), "--precision-mode",
                 "allow_mix_precision", "--loss-scale", "dynamic", "--json", str(out / "c.json"), "--report",
                 str(out / "c.html"), "--ops-info", str(out / "ops_info.json"), "-q"])
    text = capsys.readouterr().out
    assert code == 1, text
    rows = {r["number"]: r for r in json.loads((out / "c.json").read_text())["rows"]}
    # the planted forward overflow skips every step: item 4 says so instead of passing
    assert {k for k, r in rows.items() if r["result"] == "Failed"} == {"4", "16"}, text
    assert f"every step skipped: {STEPS} of {STEPS}" in rows["4"]["evidence"]
    ev = rows["16"]["evidence"]
    assert "amplify" in ev and "phase forward" in ev and "verdict abnormal" in ev
    assert rows["10"]["result"] == "Passed" and "--benchmark" in rows["10"]["evidence"]
    # the first overflow is a _FusedMatMul: the op types it replaced are the ones to black-list, each named
    assert "fused from MatMul, BiasAdd, Mul, AddV2" in ev and "black-list MatMulV2, BiasAdd, Mul, AddV2" in ev
    assert json.loads((out / "ops_info.json").read_text()) == {"black-list": {"to-add": [
        "MatMulV2", "BiasAdd", "Mul", "AddV2"]}}
    html = (out / "c.html").read_text()
    for sec in ("summary", "checklist", "plots", "ops-info", "config"):
        assert f'id="{sec}"' in html
    assert html.count("<img") == 3        # gradient norms, activation histograms, loss
    assert "No fp16 overflow in forward or backward" in html and "Failed" in html
    # the suggested list is a valid modify_mixlist
    ae.Device("allow_mix_precision", modify_mixlist=str(out / "ops_info.json"))


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ae.AscendEmuError, match="steps"):
        ae.check(build(), data(), steps=0)
    with pytest.raises(ae.AscendEmuError, match="not both"):
        ae.check(build(), data(), benchmark="b.keras", benchmark_config=BENCH)
    with pytest.raises(ae.AscendEmuError, match="missing y"):
        ae.check(build(), {"x": np.ones((4, 8), np.float32)})


# --------------------------------------------------------------------------- rows on hand-made dumps (no model)

def _ctx(tmp_path, ops, *, y=None, shuffle=False):
    """A check context whose emulated step 0 is the dump of ``ops`` [(name, tf_type, ascend_type, dtype, inputs,
    outputs, list)] and whose data are 64 samples with labels ``y``."""
    from ascend_emu.analysis.dump import DumpWriter, load_dump
    from ascend_emu.tools.check.runs import _Ctx

    with DumpWriter(tmp_path / "npu", kind="npu", config={}, model={"name": "m", "fingerprint": "f"},
                    inputs_sha256="s") as w:
        for name, t, at, dt, inputs, outs, lst in ops:
            w.add_op(name, t, at, "AICORE", dt, inputs, outs, precision={"list": lst}, phase="forward")
        w.finish({})
    y = np.arange(64) % 4 if y is None else y
    c = _Ctx(None, None, None, np.zeros((64, 8), np.float32), y, np.ones(64, bool), BATCH, STEPS, None, shuffle, 0,
             ae.Device("allow_mix_precision"), "dynamic", "status", None, str(tmp_path), False)
    c.npu_dump = load_dump(tmp_path / "npu")
    return c


def test_long_fp16_reduction_fails_and_is_suggested_for_the_black_list(tmp_path):
    from ascend_emu.tools.check.precision_rows import _row_reductions

    f16 = np.ones(4096, np.float16)
    c = _ctx(tmp_path, [("x", "Placeholder", "Data", "float16", [], [f16], None),
                        ("s", "Sum", "ReduceSumD", "float16", ["x:0"], [np.float16([4096])], "gray"),
                        ("t", "Sum", "ReduceSumD", "float32", ["x:0"], [np.float32([4096])], "black")])
    row = _row_reductions(c)
    assert row.result == "Failed" and "s (ReduceSumD, float16) sums 4096 terms" in row.evidence
    assert c.ops_info["black-list"]["to-add"] == ["ReduceSumD"]


def test_matrix_ops_in_float32_fail_mixed_precision_and_a_user_black_list_is_named(tmp_path):
    from ascend_emu.tools.check.precision_rows import _row_mixed_precision

    a = np.ones((4, 8), np.float32)
    b = np.ones((8, 4), np.float32)
    c = _ctx(tmp_path, [("a", "Placeholder", "Data", "float32", [], [a], None),
                        ("b", "Placeholder", "Data", "float32", [], [b], None),
                        ("mm", "MatMul", "MatMulV2", "float32", ["a:0", "b:0"], [a @ b], "black"),
                        ("mm2", "MatMul", "MatMulV2", "float16", ["a:0", "b:0"], [(a @ b).astype(np.float16)],
                         "white")])
    row = _row_mixed_precision(c)
    # equal FLOPs: 50% in fp16 passes the share; MatMulV2 is not on the shipped black list, so its
    # black-listing came from the user's modify_mixlist: named, not a victim
    assert row.result == "Passed", row.evidence
    assert "1 of 2 matrix ops in fp16/bf16, 50.0% of 512 FLOPs" in row.evidence
    assert "black-listed by modify_mixlist" in row.evidence and "mm (MatMulV2)" in row.evidence


def test_labels_sorted_without_shuffle_fail_the_order_row(tmp_path):
    from ascend_emu.tools.check.data_rows import _row_order

    c = _ctx(tmp_path, [], y=np.repeat(np.arange(4), 16))
    row = _row_order(c)
    assert row.result == "Failed" and "3 of 3 batches hold a single label" in row.evidence
    c.shuffle = True
    assert _row_order(c).result == "Passed"


def test_truncated_data_fails_item_6_and_leaves_the_training_items_not_checked():
    res = ae.check(build(), {"x": np.ones((4, 8), np.float32), "y": np.zeros(3, np.int64)}, steps=2, batch_size=2)
    assert failed(res) == {"6"} and "x has 4 samples but y 3" in res["6"].evidence
    assert res["11"].result == res["15"].result == "Passed"       # decided from the model alone
    assert {r.number for r in res if r.result == "Not checked"} == set(
        ["1", "2/3", "4", "7", "8", "9", "10", "12", "13", "14", "16", "17", "18", "19"])
    assert res["9"].evidence == "no usable samples (item 6)" and res.exit_code == 1


def test_a_run_that_cannot_be_made_is_no_pass():
    """issue 35: check exited 0 when most items could not run (here the emulated run: an op without an AI Core
    kernel and the AI CPU fallback off); it now says why and exits 1."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    h = keras.layers.Lambda(lambda t: tf.math.cosh(t), name="cosh")(keras.layers.Dense(8, name="d")(inp))
    m = keras.Model(inp, keras.layers.Dense(4, name="logits")(h))
    m.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    res = ae.check(m, data(), device=ae.Device("allow_mix_precision", aicpu_fallback=False), steps=2, batch_size=16)
    assert not res.failed and res.errors and "Cosh" in res.errors[0]
    assert res.exit_code == 1 and "could not run: the emulated run failed" in res.format_text()
    assert res.to_json()["errors"] == res.errors


def test_dumps_the_disk_will_not_hold_are_refused_before_any_run(tmp_path, monkeypatch):
    """issue 35: check --keep-dumps wrote its dumps whatever the free space; its four dumps of step 0 are estimated
    from the traced step and refused in one line (exit 2 from the CLI) before any run, nothing written."""
    import os
    import shutil

    from ascend_emu.errors import AscendEmuError

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 40, 0, 100))
    with pytest.raises(AscendEmuError, match=r"the check's four dumps of step 0 would take about .* 100 B free; "
                                             r"nothing was written: give a smaller --batch-size"):
        ae.check(build(), data(), device=ae.Device("allow_mix_precision"), steps=2, batch_size=BATCH,
                 work_dir=tmp_path / "keep")
    assert os.listdir(tmp_path / "keep") == []


def _fake_run(dump, steps, loss_scale="dynamic"):
    """The emulated run items 4 and 16 read: the dump of step 0 and the step records."""
    from types import SimpleNamespace

    from ascend_emu.analysis.dump import load_dump
    from ascend_emu.tools.check.runs import _Ctx

    c = SimpleNamespace(npu_dump=load_dump(dump), npu_error=None, overflow_check="status", loss_scale=loss_scale,
                        device=ae.Device("force_fp16"), ops_info={"black-list": {"to-add": [], "to-remove": []}},
                        npu=SimpleNamespace(config={"loss_scale": loss_scale}, steps=steps,
                                            skipped=np.array([s["skipped"] for s in steps])))
    c.suggest = lambda action, t: _Ctx.suggest(c, action, t)
    return c


def test_item_16_blames_the_op_type_behind_an_inserted_cast_and_item_4_fails_when_every_step_is_skipped(tmp_path):
    from ascend_emu.tools.check.precision_rows import _row_loss_scale, _row_overflow
    from cast_chain import cast_into_chain

    cast_into_chain(tmp_path)
    steps = [{"step": k, "skipped": True, "float_status": 0x100, "loss_scale": 2.0 ** (15 - k),
              "first_overflow": {"name": "x/ascend_cast_0_to_fp16", "phase": "forward"}} for k in range(10)]
    c = _fake_run(tmp_path / "d", steps)
    row = _row_overflow(c)
    assert row.result == "Failed" and "black-list RealDiv" in row.evidence, row.evidence
    assert c.ops_info["black-list"]["to-add"] == ["RealDiv"]          # what --ops-info writes
    r4 = _row_loss_scale(c)
    assert r4.result == "Failed" and "every step skipped: 10 of 10" in r4.evidence, r4.evidence
    # one applied step: item 4 passes again
    steps[-1] = dict(steps[-1], skipped=False, float_status=0)
    assert _row_loss_scale(_fake_run(tmp_path / "d", steps)).result == "Passed"

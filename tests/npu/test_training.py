"""Training on the emulated NPU (Device.train, reference_train, the train command).

What is checked against what:
- the functional optimizers against Keras' own ``optimizer.apply`` (bit for bit, several steps);
- Device.train in must_keep_origin_dtype against TensorFlow float32 training of the same step graph, and
  reference_train against Keras' own ``train_on_batch`` (losses per step and final weights);
- under allow_mix_precision: a planted backward overflow (op, phase, skipped step, halved scale, training
  continues), the status register catching a saturated overflow that an isfinite check misses, fp16
  underflow of small gradients without loss scaling;
- determinism (byte-identical JSON and dumps), the CLI (JSON fields, report, step dumps that compare),
  and bad input (one line, exit status 2).
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import ascend_emu as ae  # noqa: E402
from ascend_emu.cli.main import main  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.frontend.tf.models import train_demo_data, train_demo_model  # noqa: E402
from ascend_emu.frontend.tf.training import FunctionalOptimizer  # noqa: E402
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)

STEP_FIELDS = {"step", "loss", "reference_loss", "loss_scale", "skipped", "float_status", "first_overflow"}


def small_cnn(seed=0, *, dropout=True, optimizer=None, compile=True):
    keras.backend.clear_session()  # the same layer names (and so the same graph) every time
    keras.utils.set_random_seed(seed)
    L = keras.layers
    layers = [keras.Input((8, 8, 3)), L.Conv2D(8, 3, activation="relu"), L.BatchNormalization(), L.Flatten()]
    if dropout:
        layers.append(L.Dropout(0.3))
    layers.append(L.Dense(5))
    m = keras.Sequential(layers, name="small_cnn")
    if compile:
        m.compile(optimizer=optimizer or keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def cnn_data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, 8, 8, 3)).astype(np.float32), "y": rng.integers(0, 5, n).astype(np.int64)}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)))) for k in a)


# --------------------------------------------------------------------------- optimizers

OPTIMIZER_CASES = [
    ("sgd", {"learning_rate": 0.1}),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
    ("adam", {"learning_rate": 0.01}),
    ("adam", {"learning_rate": 0.01, "amsgrad": True}),
    ("adamw", {"learning_rate": 0.01, "weight_decay": 0.05}),
    ("rmsprop", {"learning_rate": 0.01}),
    ("rmsprop", {"learning_rate": 0.01, "momentum": 0.5, "centered": True}),
]


@pytest.mark.parametrize("name,options", OPTIMIZER_CASES, ids=[f"{n}-{'-'.join(o)}" for n, o in OPTIMIZER_CASES])
def test_functional_optimizer_equals_keras_apply_bit_for_bit(name, options):
    import tensorflow as tf

    fopt = FunctionalOptimizer.build(name, **options)
    kopt = fopt.keras_optimizer()
    rng = np.random.default_rng(1)
    shapes = [(3, 4), (4,)]
    params0 = [rng.normal(size=s).astype(np.float32) for s in shapes]
    kvars = [keras.Variable(p.copy()) for p in params0]
    kopt.build(kvars)
    params = [tf.constant(p) for p in params0]
    slots = [[tf.zeros(s, tf.float32) for _ in fopt.slot_names()] for s in shapes]
    for it in range(5):
        grads = [rng.normal(size=s).astype(np.float32) for s in shapes]
        kopt.apply([tf.constant(g) for g in grads], kvars)
        params, slots = fopt.apply([tf.constant(g) for g in grads], params, slots, tf.constant(it, tf.int64))
        for p, v in zip(params, kvars):
            np.testing.assert_array_equal(np.asarray(p), np.asarray(v), err_msg=f"{name} step {it}")


# --------------------------------------------------------------------------- float32: agreement with TensorFlow

def test_float32_training_matches_tensorflow_step_by_step_and_final_weights():
    """must_keep_origin_dtype: 20 steps (BN, dropout, SGD with momentum) against the same step in TensorFlow."""
    res = ae.Device(**FP32).train(small_cnn(), cnn_data(), batch_size=16, steps=20,
                                                    reference=True, shuffle=True, seed=3, progress=False)
    assert len(res.steps) == 20 and set(res.steps[0]) >= STEP_FIELDS
    assert not res.skipped.any() and not res.float_status.any()
    rel = np.abs(res.losses - res.reference_losses) / np.abs(res.reference_losses)
    # measured: up to ~1e-6 relative (float32 summation order of the cube model vs Eigen)
    assert rel.max() < 2e-5, rel
    assert max_diff(res.weights(), res.weights(reference=True)) < 1e-4


def test_reference_train_matches_keras_train_on_batch():
    """reference_train (the traced step run by TensorFlow) against Keras' own training loop, no dropout."""
    data = cnn_data()
    opt = keras.optimizers.Adam(0.01)
    ref = ae.reference_train(small_cnn(dropout=False, optimizer=opt), data, batch_size=16, steps=8, progress=False)
    m = small_cnn(dropout=False, optimizer=keras.optimizers.Adam(0.01))
    losses = []
    for i in range(8):
        sl = slice((i % 4) * 16, (i % 4) * 16 + 16)
        losses.append(float(m.train_on_batch(data["x"][sl], data["y"][sl])))
    # train_on_batch resets its metrics: each value is that batch's loss, before the update
    np.testing.assert_allclose(ref.losses, losses, rtol=1e-4)
    keras_w = [np.asarray(v) for v in m.trainable_variables + m.non_trainable_variables]
    ours = list(ref.weights().values())
    assert len(ours) == len(keras_w) == 8   # conv, BN gamma/beta, dense; BN moving mean/variance
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(ours, keras_w)) < 1e-5


# --------------------------------------------------------------------------- fp16: overflow, loss scale, underflow

@pytest.fixture(scope="module")
def demo_run():
    return ae.Device("allow_mix_precision", soc="Ascend910").train(
        train_demo_model(), train_demo_data(), batch_size=32, steps=8, loss_scale="dynamic", reference=True,
        progress=False)


def test_planted_backward_overflow_skips_the_step_and_halves_the_scale(demo_run):
    steps = demo_run.steps
    over = [s for s in steps if s["first_overflow"]]
    assert over, "the planted overflow was not seen"
    s = over[0]
    assert s["first_overflow"]["phase"] == "backward"
    assert s["first_overflow"]["name"].startswith("gradient_tape/")
    assert s["skipped"] and s["float_status"] != 0
    k = s["step"]
    assert steps[k + 1]["loss_scale"] == s["loss_scale"] / 2
    assert len(steps) == 8 and not all(t["skipped"] for t in steps[k + 1:])
    # the curve follows the float32 reference: same first loss to fp16 precision
    assert abs(steps[0]["loss"] - steps[0]["reference_loss"]) < 1e-2
    assert demo_run.loss_scales[0] == 2.0 ** 15


def test_skipped_step_keeps_the_weights():
    """A step that overflows leaves the state as it was: a fixed scale far too large skips every step."""
    m = train_demo_model()
    before = {v.path: np.asarray(v).copy() for v in m.trainable_variables}
    res = ae.Device("allow_mix_precision").train(m, train_demo_data(64), batch_size=32, steps=2,
                                                 loss_scale="fixed:1e9", progress=False)
    assert res.skipped.all() and (res.float_status != 0).all()
    w = res.weights()
    for k, v in before.items():
        np.testing.assert_array_equal(w[f"{k}"], v)


def test_status_register_sees_a_saturated_overflow_that_isfinite_misses():
    kw = dict(batch_size=32, steps=3, loss_scale="fixed:32768", progress=False)
    status = ae.Device("allow_mix_precision", soc="Ascend910").train(train_demo_model(), train_demo_data(), **kw)
    finite = ae.Device("allow_mix_precision", soc="Ascend910").train(train_demo_model(), train_demo_data(), **kw,
                                                                     overflow_check="isfinite")
    assert status.config["device"]["overflow_mode"] == "saturation"
    hit = [s["step"] for s in status.steps if s["float_status"]]
    assert hit and all(status.steps[k]["skipped"] for k in hit)
    # saturation turns the overflow into 65504: the gradients stay finite, so an isfinite check applies the step
    assert any(finite.steps[k]["float_status"] and not finite.steps[k]["skipped"] for k in hit)


def test_fp16_underflow_without_loss_scaling_flushes_gradients_to_zero():
    """Tiny gradients: float32 keeps them, fp16 flushes them; a loss scale brings them back."""
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8)], name="tiny")
    m.layers[0].kernel.assign(np.asarray(m.layers[0].kernel) * np.float32(3e-7))
    m.compile(optimizer="sgd", loss="mean_squared_error")
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(64, 16)).astype(np.float32), "y": np.zeros((64, 8), np.float32)}
    dev = ae.Device("allow_mix_precision")
    none = dev.train(m, data, batch_size=32, steps=2, loss_scale="none", reference=True, progress=False)
    scaled = dev.train(m, data, batch_size=32, steps=2, loss_scale="fixed:65536", progress=False)
    s = none.steps[0]
    assert s["reference_grad_zeros"] == 0
    assert s["grad_zeros"] > 0.2 * s["grad_values"], s
    assert scaled.steps[0]["grad_zeros"] < s["grad_zeros"] // 4


# --------------------------------------------------------------------------- determinism

def _tree_digest(root) -> dict:
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def test_same_seed_same_bits(tmp_path):
    outs = []
    for k in range(2):
        d = tmp_path / f"run{k}"
        res = ae.Device("allow_mix_precision").train(small_cnn(), cnn_data(), batch_size=16, steps=3, shuffle=True,
                                                     seed=7, dump_dir=str(d / "dump"), dump_steps=[0, 2],
                                                     loss_scale="dynamic", progress=False)
        text = json.dumps(res.to_json(), sort_keys=True).replace(str(d), "<run>")
        outs.append((text, _tree_digest(d / "dump")))
    assert outs[0][0] == outs[1][0]
    assert outs[0][1] == outs[1][1] and len(outs[0][1]) > 4


# --------------------------------------------------------------------------- the command

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    small_cnn().save(root / "cnn.keras")
    small_cnn(compile=False).save(root / "bare.keras")
    np.savez(root / "train.npz", **cnn_data())
    rng = np.random.default_rng(0)
    np.savez(root / "wrong.npz", x=rng.normal(size=(8, 4, 4, 3)).astype(np.float32), y=np.zeros(8, np.int64))
    return root


def test_cli_train_json_report_and_step_dumps_that_compare(files, tmp_path, capsys):
    out = tmp_path
    rc = main(["-q", "train", str(files / "cnn.keras"), "--data", str(files / "train.npz"), "--steps", "4",
               "--batch-size", "16", "--precision-mode", "allow_mix_precision", "--loss-scale", "dynamic",
               "--reference", "--dump", str(out / "npu"), "--dump-steps", "0,3", "--json", str(out / "t.json"),
               "--report", str(out / "t.html")])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "steps: 4" in text and "report:" in text
    run = json.loads((out / "t.json").read_text())
    assert set(run) >= {"config", "steps"} and len(run["steps"]) == 4
    assert all(set(s) >= STEP_FIELDS for s in run["steps"])
    assert run["config"]["device"]["precision_mode"] in ("allow_mix_precision", "allow_mix_precision_fp16")
    html = (out / "t.html").read_text()
    for sec in ("summary", "curves", "overflows", "dumps", "steps", "config"):
        assert f'id="{sec}"' in html
    assert 't-step-0.html' in html and (out / "t-step-3.html").exists()
    # each step's comparison page draws the step's op graph (forward, backward and update ops)
    step_html = (out / "t-step-3.html").read_text()
    assert 'id="graph"' in step_html and step_html.count("data-op=") > 20 and '"phase":"backward"' in step_html
    # the step dump holds every phase and compares with the reference dump of the same step
    dump = ae.load_dump(str(out / "npu" / "step-3"))
    phases = {op.get("phase") for op in dump.ops}
    assert {"forward", "backward", "update"} <= phases
    ref = ae.load_dump(str(out / "npu" / "reference" / "step-3"))
    assert {op["name"]: op.get("phase") for op in ref.ops if op["name"] in {o["name"] for o in dump.ops}} == {
        op["name"]: op.get("phase") for op in dump.ops if op["name"] in {o["name"] for o in ref.ops}}
    # the tape's gradient sums carry no scope but belong to the backward pass
    sums = [op for op in dump.ops if op["tf_type"] == "AddN"]
    assert sums and all(op["phase"] == "backward" for op in sums)
    cmp = ae.compare(str(out / "npu" / "step-3"), str(out / "npu" / "reference" / "step-3"))
    assert cmp.counts()["compared"] > 20
    # both dumps name the step's state inputs (weights, slots, loss scale), not its batch (issue 35)
    assert dump.state_inputs == ref.state_inputs and "loss_scale" in dump.state_inputs
    assert "x" not in dump.state_inputs and len(dump.state_inputs) > 6 and not cmp.state_differences()
    # and the dump directory refuses to be overwritten silently
    rc = main(["-q", "train", str(files / "cnn.keras"), "--data", str(files / "train.npz"), "--steps", "4",
               "--batch-size", "16", "--dump", str(out / "npu"), "--dump-steps", "0"])
    assert rc == 2 and "--overwrite" in capsys.readouterr().err


BAD = [
    (["bare.keras"], "no loss"),
    (["cnn.keras", "--data", "{wrong}"], "shape"),
    (["cnn.keras", "--steps", "0"], "steps must be a positive integer"),
    (["cnn.keras", "--optimizer", "adagradx"], "unknown optimizer"),
    (["cnn.keras", "--loss", "nope"], "unknown loss"),
    (["cnn.keras", "--steps", "3", "--dump", "{tmp}/d", "--dump-steps", "5"], "outside the run"),
    (["cnn.keras", "--loss-scale", "fixed:abc"], "fixed:1024"),
    (["cnn.keras", "--optimizer", "sgd", "--beta-1", "0.9"], "takes no beta_1"),
    (["missing.keras"], "no such file"),
    (["cnn.keras", "--data", "{tmp}/none.npz"], "does not exist"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_cli_train_bad_input_is_one_line_exit_2(files, tmp_path, capsys, args, message):
    argv = ["-q", "train"] + [a.format(tmp=tmp_path, wrong=files / "wrong.npz") for a in args]
    argv[2] = str(files / argv[2])
    if "--data" not in argv:
        argv += ["--data", str(files / "train.npz")]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.count("\n") == 0 and err.startswith("ascend-emu: error:"), err
    assert message in err, err


def test_api_bad_arguments():
    with pytest.raises(AscendEmuError, match="batch_size"):
        ae.Device().train(small_cnn(), cnn_data(), batch_size=0, progress=False)
    with pytest.raises(AscendEmuError, match="overflow_check"):
        ae.Device().train(small_cnn(), cnn_data(), overflow_check="nan", progress=False)
    with pytest.raises(AscendEmuError, match="x and y"):
        ae.Device().train(small_cnn(), {"x": np.zeros((4, 8, 8, 3), np.float32)}, progress=False)


@pytest.mark.parametrize("name,cls", [("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy"),
                                      ("categorical_crossentropy", "CategoricalCrossentropy"),
                                      ("binary_crossentropy", "BinaryCrossentropy")])
def test_loss_names_from_logits(name, cls):
    """The documented --loss NAME_from_logits (issue 35: it raised a TypeError, keras.losses.get giving a
    function whose type was called): the loss class with from_logits, and the plain name without."""
    from ascend_emu.frontend.tf.optimizers import resolve_loss

    loss = resolve_loss(None, name + "_from_logits")
    assert type(loss) is getattr(keras.losses, cls) and loss.get_config()["from_logits"] is True
    loss = resolve_loss(None, name)
    assert type(loss) is getattr(keras.losses, cls) and loss.get_config()["from_logits"] is False
    with pytest.raises(AscendEmuError, match="takes no logits"):
        resolve_loss(None, "mean_squared_error_from_logits")


def _old_batch_order(n, batch_size, steps, shuffle, seed):
    """The list every step's indices were built into before (the oracle of the lazy order)."""
    import math

    per_epoch, rng, out = math.ceil(n / batch_size), np.random.default_rng(seed), []
    while len(out) < steps:
        order = rng.permutation(n) if shuffle else np.arange(n)
        out.extend(order[b * batch_size:(b + 1) * batch_size] for b in range(per_epoch) if len(out) < steps)
    return out[:steps]


@pytest.mark.parametrize("n,batch,steps,shuffle", [(10, 3, 11, True), (10, 3, 11, False), (8, 4, 5, True),
                                                   (7, 7, 3, True), (5, 8, 4, False)])
def test_batch_order_is_made_as_it_is_read(n, batch, steps, shuffle):
    """issue 35: --steps 10^20 built every index before the first step and took the machine's memory. The
    order is now made step by step: the same batches as the list, in any reading order, at no cost up front."""
    from ascend_emu.npu.training import batch_order

    want = _old_batch_order(n, batch, steps, shuffle, 5)
    order = batch_order(n, batch, steps, shuffle=shuffle, seed=5)
    assert len(order) == steps
    assert [b.tolist() for b in order] == [b.tolist() for b in want]
    assert [order[i].tolist() for i in (steps - 1, 0, steps // 2, -1)] == \
        [want[i].tolist() for i in (steps - 1, 0, steps // 2, -1)]
    with pytest.raises(IndexError):
        order[steps]
    huge = batch_order(n, batch, 10 ** 18, shuffle=shuffle, seed=5)
    assert len(huge) == 10 ** 18 and huge[0].tolist() == want[0].tolist()
    assert huge[10 ** 17].size > 0 if not shuffle else huge[steps - 1].tolist() == want[steps - 1].tolist()


def test_too_many_steps_is_one_line(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.ones((8, 4), np.float32), y=np.zeros(8, np.int64))
    with pytest.raises(AscendEmuError, match="more than any run can take"):
        ae.Device("allow_mix_precision").train(train_demo_model(), str(tmp_path / "d.npz"), steps=10 ** 20,
                                               progress=False)

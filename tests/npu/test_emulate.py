"""``ascend_emu.emulate``: a user's own Keras fit, tf.function loop and TF1 session loop on the emulated NPU.

Each test runs the same small script twice, plainly in TensorFlow and under the emulator, and
compares what the script itself sees (History, callbacks' learning rates, fetched losses, weights).
In ``must_keep_origin_dtype`` the emulated float32 step differs from TensorFlow's only by float32
rounding (the cube's accumulation order against oneDNN's): measured at most 2.4e-7 absolute on
losses of order 1 (the TF1 loop; 1.2e-7 for fit's History) and 9e-8 on weights (NUMERICS.md section 10).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import ascend_emu as ae  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402
from steps import gradient_tape_step  # noqa: E402  (tests/ is on the path: pyproject's pythonpath)
from fp32mode import FP32, FP32_ARGS, fp32  # noqa: F401  (the tests' fp32 mode)

pytestmark = pytest.mark.models

#: float32 noise between the emulated float32 step and TensorFlow's (see the module docstring)
FP32_TOL = 5e-7
STEP_FIELDS = {"step", "loss", "reference_loss", "loss_scale", "skipped", "float_status", "first_overflow",
               "grad_zeros", "grad_values"}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 8)).astype("float32"), rng.integers(0, 3, 64)


def _classifier(optimizer):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    m.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
    return m


def _schedule_sgd():
    return keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5), momentum=0.9)


class _LearningRates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_end(self, batch, logs=None):
        self.rates.append(float(self.model.optimizer.learning_rate))


def _fit(data, optimizer, **kw):
    x, y = data
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model = _classifier(optimizer)
    rates = _LearningRates()
    hist = model.fit(ds, epochs=2, callbacks=[rates], validation_data=ds, verbose=0, **kw)
    return model, hist.history, rates.rates


@pytest.fixture(scope="module")
def keras_fp32(data):
    """The same fit in TensorFlow and under emulate(must_keep_origin_dtype, reference=True)."""
    _, tf_hist, tf_rates = _fit(data, _schedule_sgd())
    tf_model = _classifier(_schedule_sgd())
    tf_model.fit(tf.data.Dataset.from_tensor_slices(data).batch(16), epochs=2, verbose=0)
    x, y = data
    tf_batch = tf_model.train_on_batch(x[:16], y[:16], return_dict=True)
    with ae.emulate(**fp32(reference=True)) as run:
        model, hist, rates = _fit(data, _schedule_sgd())
        pred = model.predict(x[:5], verbose=0)
        tf_pred = np.asarray(model(x[:5], training=False))        # TensorFlow's forward on the same weights
        batch = model.train_on_batch(x[:16], y[:16], return_dict=True)
    return {"tf": (tf_hist, tf_rates, tf_model, tf_batch), "emu": (hist, rates, model, (pred, tf_pred), batch), "run": run}


def test_fit_history_matches_tensorflow_in_float32(keras_fp32):
    tf_hist, tf_rates, tf_model, tf_batch = keras_fp32["tf"]
    hist, rates, model, _, batch = keras_fp32["emu"]
    assert sorted(hist) == sorted(tf_hist) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    for key in tf_hist:
        np.testing.assert_allclose(hist[key], tf_hist[key], rtol=0, atol=FP32_TOL, err_msg=key)
    # the schedule's learning rate, as a callback reads it from the optimizer after each emulated step
    assert rates == tf_rates and len(rates) == 8 and rates[0] > rates[-1]
    for a, b in zip(model.weights, tf_model.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=FP32_TOL, err_msg=a.path)
    # one more step with train_on_batch after the fit
    assert sorted(batch) == sorted(tf_batch)
    for key in tf_batch:
        np.testing.assert_allclose(batch[key], tf_batch[key], rtol=0, atol=FP32_TOL, err_msg=key)


def test_fit_run_record(keras_fp32):
    run = keras_fp32["run"]
    assert len(run.steps) == 9 and [s["step"] for s in run.steps] == list(range(9))
    for s in run.steps:
        assert STEP_FIELDS <= set(s) and not s["skipped"] and s["loss_scale"] == 1.0
        assert abs(s["loss"] - s["reference_loss"]) <= FP32_TOL
    assert run.to_json()["config"]["device"]["precision_mode"] == "must_keep_origin_dtype"


def test_predict_and_exit(keras_fp32, data):
    hist, rates, model, pred, _ = keras_fp32["emu"]
    np.testing.assert_allclose(pred[0], pred[1], rtol=0, atol=FP32_TOL)
    # outside the context the model is Keras' own again
    assert model.train_function is None and model.predict_function is None and model.test_function is None


def test_fit_mixed_precision_reads_the_float_status(data, tmp_path):
    """A Keras LossScaleOptimizer in the script: its overflow check is the emulated float status."""
    x, y = data
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0 ** 20)
    model = _classifier(opt)
    with ae.emulate("allow_mix_precision", soc="Ascend910") as run:
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, verbose=0)
    steps = run.steps
    assert len(steps) == 8 and all(STEP_FIELDS <= set(s) for s in steps)
    assert all(s["reference_loss"] is None for s in steps)       # no reference: null, not absent (issue 35)
    # 2**20 overflows fp16 in the backward pass (saturated on the 910: only the status shows it)
    assert steps[0]["skipped"] and steps[0]["float_status"] and steps[0]["first_overflow"]["phase"] == "backward"
    scales = [s["loss_scale"] for s in steps]
    assert scales[0] == 2.0 ** 20 and scales[1] == 2.0 ** 19 and not steps[-1]["skipped"]
    # the script's optimizer sees the emulated scale and counts only applied steps
    assert float(opt.dynamic_scale.numpy()) == scales[-1]
    assert int(opt.iterations.numpy()) == sum(not s["skipped"] for s in steps)
    assert run.config["functions"][steps[0]["function"]]["from"] == "script"
    path = run.write_report(tmp_path / "train.html")
    assert "loss scale" in open(path).read()


def test_skipped_steps_are_said_while_the_script_runs(data):
    """Issue 35: a fit whose every step overflowed looked healthy (Keras' loss 0.0000, nothing said until one
    read run.steps). A warning per 10 skipped steps and, at the end, the summary, each one line."""
    x, y = data
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)),
                              keras.layers.Dense(3, kernel_initializer=keras.initializers.Constant(100.0))])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    big = np.concatenate([x, x, x, x, x])[:320] * 1000.0      # fp16 MatMul outputs beyond 65504 at any scale
    with pytest.warns(ae.SkippedStepsWarning) as caught:
        with ae.emulate("allow_mix_precision", soc="Ascend910", loss_scale="dynamic") as run:
            model.fit(big, np.resize(y, 320), batch_size=16, epochs=1, verbose=0)
    assert len(run.steps) == 20 and all(s["skipped"] for s in run.steps)
    msgs = [str(w.message) for w in caught if issubclass(w.category, ae.SkippedStepsWarning)]
    first = run.steps[0]["first_overflow"]
    tail = f"first overflow: {first['name']} ({first['tf_type']}), forward, step 0"
    assert msgs == [f"emulate: 10 of 10 steps skipped, scale 2^15 -> 2^5, {tail} so far",
                    f"emulate: 20 of 20 steps skipped, scale 2^15 -> 1, {tail} so far",
                    f"emulate: 20 of 20 steps skipped, scale 2^15 -> 1, {tail}"]
    assert run.skipped_summary() == msgs[-1][len("emulate: "):]


def test_custom_gradient_tape_loop(data):
    x, y = data

    def script():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
        opt = keras.optimizers.Adam(1e-2)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        train_step = gradient_tape_step(tf, model, loss_fn, opt)

        @tf.function
        def eval_step(bx, by):
            return loss_fn(by, model(bx, training=False))

        losses = [float(train_step(bx, by)) for _ in range(2)
                  for bx, by in tf.data.Dataset.from_tensor_slices((x, y)).batch(16)]
        return losses, float(eval_step(x, y)), [v.numpy() for v in model.weights]

    tf_losses, tf_eval, tf_weights = script()
    with ae.emulate(**fp32(loss_scale="fixed:128")) as run:
        losses, ev, weights = script()
    assert len(run.steps) == 8 and [s["loss"] for s in run.steps] == losses
    assert all(s["loss_scale"] == 128.0 and not s["skipped"] for s in run.steps)
    np.testing.assert_allclose(losses, tf_losses, rtol=0, atol=FP32_TOL)
    np.testing.assert_allclose(ev, tf_eval, rtol=0, atol=FP32_TOL)      # eval_step (no gradient) ran in TF
    for a, b in zip(weights, tf_weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=FP32_TOL)


def _tf1_script(x, y, session=lambda s: s, optimizer=None, steps=6):
    g = tf.Graph()
    with g.as_default():
        xp = tf.compat.v1.placeholder(tf.float32, (None, 8), name="x")
        yp = tf.compat.v1.placeholder(tf.float32, (None, 2), name="y")
        w = tf.compat.v1.get_variable("w", (8, 2), initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
        b = tf.compat.v1.get_variable("b", (2,), initializer=tf.compat.v1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(xp, w) + b - yp))
        gs = tf.compat.v1.train.get_or_create_global_step()
        opt = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
        train = (optimizer(opt) if optimizer else opt).minimize(loss, global_step=gs)
        tf.compat.v1.summary.scalar("loss", loss)
        merged = tf.compat.v1.summary.merge_all()
        sess = session(tf.compat.v1.Session(graph=g))
        sess.run(tf.compat.v1.global_variables_initializer())
        losses, summaries = [], []
        for i in range(steps):
            sl = slice((i % 4) * 16, (i % 4) * 16 + 16)
            _, lv, sv = sess.run([train, loss, merged], feed_dict={xp: x[sl], yp: y[sl]})
            losses.append(lv)
            summaries.append(sv)
        out = sess.run([w, b, gs])
        sess.close()
        return losses, summaries, out


@pytest.fixture(scope="module")
def tf1_data(data):
    return data[0], np.random.default_rng(1).normal(size=(64, 2)).astype("float32")


def test_tf1_session_loop_under_the_wrapper_matches_tensorflow(tf1_data):
    x, y = tf1_data
    tf_losses, _, (tw, tb, tgs) = _tf1_script(x, y)
    wrapped = []
    losses, summaries, (w, b, gs) = _tf1_script(
        x, y, session=lambda s: wrapped.append(ae.tf1.wrap(s, **FP32)) or wrapped[0])
    run = wrapped[0].emulation
    assert len(run.steps) == 6 and gs == tgs == 6
    assert [s["loss"] for s in run.steps] == [float(v) for v in losses]
    np.testing.assert_allclose(losses, tf_losses, rtol=0, atol=FP32_TOL)
    np.testing.assert_allclose(w, tw, rtol=0, atol=FP32_TOL)
    np.testing.assert_allclose(b, tb, rtol=0, atol=FP32_TOL)
    assert all(isinstance(s, bytes) and s for s in summaries)      # summaries: TensorFlow's, same weights


def test_tf1_session_loop_with_a_reference(tf1_data):
    """Issue 35: with reference=True a TF1 loop inside ``with g.as_default()`` failed ("Cannot convert a
    symbolic tf.Tensor (Const_4:0) to a numpy array": the reference's inputs became constants of the
    user's graph). The reference is TensorFlow's own step of the graph, so its losses are the plain run's."""
    x, y = tf1_data
    plain = []
    tf_losses, _, _ = _tf1_script(x, y, session=lambda s: plain.append(s) or s, steps=3)
    wrapped = []
    losses, _, _ = _tf1_script(x, y, session=lambda s: wrapped.append(ae.tf1.wrap(s, **FP32, reference=True))
                               or wrapped[0], steps=3)
    run = wrapped[0].emulation
    assert [s["reference_loss"] for s in run.steps] == [float(v) for v in tf_losses]
    np.testing.assert_allclose(losses, tf_losses, rtol=0, atol=FP32_TOL)
    # nothing added to the user's graph
    assert len(wrapped[0].graph.get_operations()) == len(plain[0].graph.get_operations())


_TF1_GRAPH_MODE_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()          # as TF 1.15 scripts start
import ascend_emu as ae

rng = np.random.default_rng(0)
x, y = rng.normal(size=(32, 8)).astype("float32"), rng.normal(size=(32, 2)).astype("float32")
xp = tf.compat.v1.placeholder(tf.float32, (None, 8), name="x")
yp = tf.compat.v1.placeholder(tf.float32, (None, 2), name="y")
w = tf.compat.v1.get_variable("w", (8, 2), initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
loss = tf.reduce_mean(tf.square(tf.matmul(xp, w) - yp))
train = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss)
sess = ae.tf1.wrap(tf.compat.v1.Session(), precision_mode="allow_mix_precision", reference=True,
                   dump_dir=sys.argv[1], dump_steps=[1])
sess.run(tf.compat.v1.global_variables_initializer())
for i in range(2):
    sess.run([train, loss], feed_dict={xp: x[i * 16:i * 16 + 16], yp: y[i * 16:i * 16 + 16]})
print(json.dumps({"steps": sess.emulation.steps, "reference_dumps": sess.emulation.reference_dumps}))
"""


def test_tf1_script_with_eager_execution_disabled_and_a_reference(tmp_path):
    """Issue 35: the same with tf.compat.v1.disable_eager_execution() at the top, how TF 1.15 scripts are
    written (process-global, hence a subprocess)."""
    import json
    import subprocess
    import sys

    script = tmp_path / "tf1_train.py"
    script.write_text(_TF1_GRAPH_MODE_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "dumps")], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = out["steps"]
    assert len(steps) == 2 and all(np.isfinite(s["reference_loss"]) for s in steps)
    assert abs(steps[0]["loss"] - steps[0]["reference_loss"]) < 1e-2 * abs(steps[0]["reference_loss"])
    assert list(out["reference_dumps"]) == ["1"] and os.listdir(out["reference_dumps"]["1"])


def test_tf1_session_in_the_context_with_npu_loss_scale_optimizer(tf1_data):
    """The TF adapter's NPULossScaleOptimizer and manager: the emulated device scales and checks."""
    x, y = tf1_data
    manager = ae.tf1.ExponentialUpdateLossScaleManager(2.0 ** 40, 1000, decr_every_n_nan_or_inf=1, decr_ratio=0.5)
    run = ae.emulate("allow_mix_precision", soc="Ascend910")      # as a decorator of the script
    with pytest.warns(ae.SkippedStepsWarning, match=r"^emulate: 6 of 6 steps skipped, scale 2\^40 -> 2\^34, first "):
        losses, _, (_, _, gs) = run(_tf1_script)(x, y, optimizer=lambda o: ae.tf1.NPULossScaleOptimizer(o, manager))
    steps = run.steps
    assert len(steps) == 6 and steps[0]["loss_scale"] == 2.0 ** 40 and steps[0]["skipped"]
    assert steps[0]["float_status"] and steps[1]["loss_scale"] == 2.0 ** 39
    assert gs == sum(not s["skipped"] for s in steps)
    # issue 35: the record (and the report) said "loss scale none" while the script's optimizer scaled
    scaling = run.to_json()["config"]["loss_scale"]
    assert scaling["kind"] == "exponential" and scaling["init"] == 2.0 ** 40 and "script" in scaling["source"]


def test_wrapped_tf1_session_says_its_skipped_steps_on_close(tf1_data):
    """ae.tf1.wrap has no with block: the summary of skipped steps comes with the session's close()."""
    x, y = tf1_data
    manager = ae.tf1.ExponentialUpdateLossScaleManager(2.0 ** 40, 1000, decr_every_n_nan_or_inf=1, decr_ratio=0.5)
    with pytest.warns(ae.SkippedStepsWarning, match=r"^emulate: 3 of 3 steps skipped, scale 2\^40 -> 2\^37, "):
        _tf1_script(x, y, session=lambda s: ae.tf1.wrap(s, "allow_mix_precision", soc="Ascend910"), steps=3,
                    optimizer=lambda o: ae.tf1.NPULossScaleOptimizer(o, manager))


def test_user_errors_are_one_line(data):
    x, y = data
    # an op without an emulated kernel, the AI CPU fallback off
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3), keras.layers.Lambda(tf.math.cosh)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(AscendEmuError) as e:
        with ae.emulate(**fp32(aicpu_fallback=False)):
            model.fit(x, np.ones((64, 3), np.float32), batch_size=16, epochs=1, verbose=0)
    assert "Cosh" in str(e.value) and "\n" not in str(e.value)

    # eager-only code: a layer that needs a tensor's value in Python, which a traced step cannot give
    class Eager(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, t):
            t = self.dense(t)
            return t * 2.0 if float(tf.reduce_max(t).numpy()) > 0 else t

    keras.utils.set_random_seed(0)
    model = Eager()
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    model.fit(x, np.ones((64, 3), np.float32), batch_size=16, epochs=1, verbose=0)      # fine in TensorFlow
    with pytest.raises(AscendEmuError) as e:
        with ae.emulate(**FP32):
            model.fit(x, np.ones((64, 3), np.float32), batch_size=16, epochs=1, verbose=0)
    msg = str(e.value)
    assert "cannot trace" in msg and "numpy" in msg and "test_emulate.py" in msg and "\n" not in msg

    with pytest.raises(AscendEmuError, match="sample weights"):
        with ae.emulate(**FP32):
            _classifier("sgd").fit(x, y, sample_weight=np.ones(64), batch_size=16, verbose=0)
    with pytest.raises(AscendEmuError, match="sometimes.*fixed:N"):
        ae.emulate(loss_scale="sometimes")


def test_dump_dir_is_never_written_through_a_link(data, tmp_path):
    """Issue 35: emulate(dump_dir=LINK) wrote its step dumps through the link, as DUMP/reference as a link
    did; both are refused in one line, the link's target left empty."""
    x, y = data
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(target, tmp_path / "link")
    with pytest.raises(AscendEmuError, match="symbolic link") as e:
        ae.emulate("must_keep_origin_dtype", dump_dir=tmp_path / "link")
    assert "\n" not in str(e.value)
    (tmp_path / "d").mkdir()
    os.symlink(target, tmp_path / "d" / "reference")
    with pytest.raises(AscendEmuError, match="reference is a symbolic link"):
        with ae.emulate("must_keep_origin_dtype", dump_dir=tmp_path / "d", reference=True):
            _classifier("sgd").fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert os.listdir(target) == []


def test_a_dump_the_disk_will_not_hold_is_refused_before_it_is_written(data, tmp_path, monkeypatch):
    """issue 35: emulate(dump_dir=) wrote its step dumps whatever the free space; each dumped step (and its
    reference) is estimated from the traced step and refused in one line past the free space, nothing written."""
    import shutil

    x, y = data
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 40, 0, 100))
    with pytest.raises(AscendEmuError, match=r"the dump of step 0 and its reference would take about .* has "
                                             r"100 B free; nothing was written: dump fewer steps") as e:
        with ae.emulate(**FP32, dump_dir=tmp_path / "d", reference=True):
            _classifier("sgd").fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "d" / "step-0")


def test_a_second_thread_is_refused_and_nothing_stays_patched():
    """issue 35: emulate() in two threads left tf.GradientTape.gradient (and the other interceptions) patched for
    the rest of the process. The interceptions are process-wide: a second thread is refused in one line, and the
    classes are the originals again once the first thread's context exits."""
    import threading

    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from tensorflow.python.client.session import BaseSession
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

    before = (tf.GradientTape.gradient, Function.__call__, BaseSession.run, TensorFlowTrainer.make_train_function)
    entered, leave, errors = threading.Event(), threading.Event(), []

    def first():
        with ae.emulate("allow_mix_precision"):
            entered.set()
            leave.wait(60)

    t = threading.Thread(target=first)
    t.start()
    assert entered.wait(60)
    try:
        with ae.emulate("allow_mix_precision"):
            errors.append("entered")
    except AscendEmuError as e:
        errors.append(str(e))
    finally:
        leave.set()
        t.join(60)
    assert len(errors) == 1 and "another thread" in errors[0] and "\n" not in errors[0]
    after = (tf.GradientTape.gradient, Function.__call__, BaseSession.run, TensorFlowTrainer.make_train_function)
    assert after == before
    with ae.emulate("allow_mix_precision") as run:     # and this thread may emulate now
        assert run is not None

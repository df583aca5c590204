"""Stateful training steps on the emulated NPU: a tf.function step and a TF1 graph with a train op.

Each is converted into the stateless TrainStep (ascend_emu.frontend.tf.stateful), trained for 20 steps by
Device.train and held against TensorFlow's own training of the original step (the tf.function called
20 times, the TF1 train op run 20 times in the user's session) on the same batches.

Tolerances (measured on this project's machine, float32 accumulation-order noise: the emulated cube
and reductions sum in another order than oneDNN/Eigen):
- loss per step: relative difference <= 1.9e-7 measured (Keras Adam, TF1 GradientDescent, Momentum,
  nesterov Momentum, Adam, RMSProp, ref and resource variables); asserted <= 1e-6;
- final variables (weights, optimizer slots, counters): max |difference| <= 6e-7 of the variable's
  largest magnitude for weights and slots measured, 3.9e-6 for one small bias; asserted <= 2e-5;
- the reference step (TrainStep.function: TensorFlow running the original stateful step from the
  state) equals TensorFlow's own training bit for bit.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ascend_emu import AscendEmuError, Device, reference_train
from ascend_emu.frontend.tf.stateful import train_step_from_tf_function
from ascend_emu.frontend.tf.tf1_step import train_step_from_tf1_graph
from ascend_emu.frontend.tf.tf import import_keras, import_tf
from steps import gradient_tape_step  # tests/ is on the path (pyproject's pythonpath)
from fp32mode import FP32, FP32_ARGS, fp32  # noqa: F401  (the tests' fp32 mode)

STEPS, BATCH = 20, 16
LOSS_RTOL, WEIGHT_RTOL = 1e-6, 2e-5


def _data(seed=1, n=160, features=16, classes=4):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)).astype(np.float32), rng.integers(0, classes, n).astype(np.int32)


def _batches(x, y):
    per_epoch = len(x) // BATCH
    for i in range(STEPS):
        k = i % per_epoch
        yield x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]


def _assert_close_weights(emulated: dict, expected: dict):
    assert set(emulated) == set(expected)
    for name, want in expected.items():
        got = emulated[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        scale = max(float(np.max(np.abs(want))), 1e-6) if want.size else 1.0
        err = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
        assert err <= WEIGHT_RTOL * scale, f"{name}: max |diff| {err:.3g} > {WEIGHT_RTOL} * {scale:.3g}"


# --------------------------------------------------------------------------- tf.function steps

def _keras_step():
    """A Keras 3 MLP and its tf.function step applying a Keras Adam."""
    tf, keras = import_tf(), import_keras()
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(4)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.Adam(1e-2)
    step = gradient_tape_step(tf, model, loss_fn, opt)
    # the optimizer's variables exist once the step has been traced
    return step, model.trainable_variables, lambda: list(model.trainable_variables) + list(opt.variables)


def _plain_step():
    """The same MLP on plain tf.Variables, updated by hand (SGD: v.assign_sub(lr * g))."""
    tf = import_tf()
    rng = np.random.default_rng(3)
    shapes = [(16, 32), (32,), (32, 32), (32,), (32, 4), (4,)]
    params = [tf.Variable(rng.normal(scale=0.3, size=s).astype(np.float32) if len(s) == 2
                          else np.zeros(s, np.float32), name=f"p{i}") for i, s in enumerate(shapes)]

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, params[0]) + params[1])
            h = tf.tanh(tf.matmul(h, params[2]) + params[3])
            logits = tf.matmul(h, params[4]) + params[5]
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        for v, g in zip(params, tape.gradient(loss, params)):
            v.assign_sub(0.1 * g)
        return loss
    return step, params, lambda: params


def _key(v) -> str:
    return getattr(v, "path", None) or v.name.split(":")[0]


@pytest.mark.parametrize("update", ["keras_adam", "assign_sub"])
def test_tf_function_step_matches_tensorflow_training(update):
    x, y = _data()
    step, trainable, variables = (_keras_step if update == "keras_adam" else _plain_step)()
    ts = train_step_from_tf_function(step, x[:BATCH], y[:BATCH], trainable)
    all_vars = variables()
    assert len(ts.state) == len(all_vars)
    before = {_key(v): v.numpy().copy() for v in all_vars}

    res = Device(**FP32).train(ts, (x, y), batch_size=BATCH, steps=STEPS, reference=True,
                                                 progress=False)
    # the reference run restores the user's variables after each step
    assert all(np.array_equal(v.numpy(), before[_key(v)]) for v in all_vars)
    # a retrace gives the same graph (same fingerprint in dumps and JSON)
    assert train_step_from_tf_function(step, x[:BATCH], y[:BATCH], trainable).graph.fingerprint == \
        ts.graph.fingerprint

    tf_losses = np.array([float(step(xb, yb)) for xb, yb in _batches(x, y)])
    np.testing.assert_array_equal(res.reference_losses, tf_losses)
    np.testing.assert_allclose(res.losses, tf_losses, rtol=LOSS_RTOL, atol=0)
    assert not res.skipped.any() and (res.float_status == 0).all()

    tf_vars = {_key(v): v.numpy() for v in all_vars}
    _assert_close_weights(res.weights(), tf_vars)
    for k, v in tf_vars.items():
        np.testing.assert_array_equal(res.weights(reference=True)[k], v)

    # phases from the graph's structure; a Keras optimizer's decomposed update runs as its Apply* op,
    # a hand-written assign_sub as CANN's AssignSub
    assert set((n.meta['phase'] for n in ts.graph.nodes)) == {"forward", "backward", "update"}
    upd = [n for n in ts.graph.nodes if ts.phase(n.name) == "update" and n.op in ("Mul", "Sub", "AddV2")
           and n.output_dtypes == ["float32"]]
    if update == "keras_adam":
        assert upd and {n.meta.get("ascend_type") for n in upd} == {"ApplyAdam"}
    else:
        assert [n.meta.get("ascend_type") for n in upd if n.op == "Sub"] == ["AssignSub"] * len(trainable)
        assert all(n.meta.get("ascend_type") is None for n in upd if n.op == "Mul")


def test_tf_function_step_with_embedding_lookup():
    """tf.gather on a variable (ResourceGather, rewritten to GatherV2 on its value) and its IndexedSlices
    gradient (unscaled on its values)."""
    tf = import_tf()
    rng = np.random.default_rng(0)
    emb = tf.Variable(rng.normal(size=(50, 8)).astype(np.float32), name="emb")
    w = tf.Variable(rng.normal(scale=0.3, size=(8, 3)).astype(np.float32), name="w")

    @tf.function
    def step(ids, y):
        with tf.GradientTape() as tape:
            h = tf.reduce_mean(tf.gather(emb, ids), axis=1)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, tf.matmul(h, w)))
        g_emb, g_w = tape.gradient(loss, [emb, w])
        emb.assign_sub(0.5 * tf.convert_to_tensor(g_emb))
        w.assign_sub(0.5 * g_w)
        return loss

    ids, y = rng.integers(0, 50, (64, 5)).astype(np.int32), rng.integers(0, 3, 64).astype(np.int32)
    ts = train_step_from_tf_function(step, ids[:BATCH], y[:BATCH])
    assert "GatherV2" in {n.op for n in ts.graph.nodes}
    res = Device(**FP32).train(ts, (ids, y), batch_size=BATCH, steps=8, reference=True,
                                                 progress=False)
    tf_losses = [float(step(ids[(i % 4) * BATCH:(i % 4 + 1) * BATCH], y[(i % 4) * BATCH:(i % 4 + 1) * BATCH]))
                 for i in range(8)]
    np.testing.assert_array_equal(res.reference_losses, tf_losses)
    np.testing.assert_allclose(res.losses, tf_losses, rtol=LOSS_RTOL)
    _assert_close_weights(res.weights(), {"emb": emb.numpy(), "w": w.numpy()})


def test_tf_function_step_mixed_precision_follows_reference(tmp_path):
    x, y = _data()
    step, _, _ = _keras_step()
    ts = train_step_from_tf_function(step, x[:BATCH], y[:BATCH])
    res = Device("allow_mix_precision", soc="Ascend910").train(
        ts, (x, y), batch_size=BATCH, steps=10, loss_scale="dynamic", reference=True, progress=False,
        dump_dir=tmp_path / "npu", dump_steps=[0])
    assert np.isfinite(res.losses).all() and not res.skipped.any()
    assert not np.array_equal(res.losses, res.reference_losses)          # fp16 made a difference ...
    np.testing.assert_allclose(res.losses, res.reference_losses, rtol=3e-3)   # ... and a small one (2.5e-4 seen)
    from ascend_emu.analysis.dump import load_dump

    by_phase = {}
    for op in load_dump(tmp_path / "npu" / "step-0").ops:
        if op["engine"] != "HOST":
            by_phase.setdefault(op.get("phase"), set()).add(op["compute_dtype"])
    assert set(by_phase) == {"forward", "backward", "update"}
    assert "float16" in by_phase["forward"] and "float16" in by_phase["backward"]
    assert "float16" not in by_phase["update"]       # ApplyAdam is black-listed: the update stays float32


# --------------------------------------------------------------------------- TF1 graphs

def _tf1_graph(optimizer: str, resource: bool, out_stddev: float | None = None):
    tf = import_tf()
    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        v1.set_random_seed(5)
        x = v1.placeholder(tf.float32, (None, 16), name="x")
        y = v1.placeholder(tf.int32, (None,), name="y")
        h = x
        for i, (n, act) in enumerate(((32, tf.nn.relu), (32, tf.tanh))):
            w = v1.get_variable(f"w{i}", (h.shape[1], n), use_resource=resource)
            b = v1.get_variable(f"b{i}", (n,), initializer=v1.zeros_initializer(), use_resource=resource)
            h = act(tf.matmul(h, w) + b)
        init = None if out_stddev is None else v1.random_normal_initializer(stddev=out_stddev)
        w = v1.get_variable("wo", (32, 4), initializer=init, use_resource=resource)
        logits = tf.matmul(h, w)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        gs = v1.train.get_or_create_global_step()
        opt = {"gradient_descent": lambda: v1.train.GradientDescentOptimizer(0.1),
               "momentum": lambda: v1.train.MomentumOptimizer(0.05, 0.9)}[optimizer]()
        train = opt.minimize(loss, global_step=gs, name="train")
        init_op = v1.global_variables_initializer()
    sess = v1.Session(graph=g)
    sess.run(init_op)
    return g, sess, x, y, loss, train


@pytest.mark.parametrize("optimizer,resource", [("gradient_descent", False), ("momentum", True)])
def test_tf1_graph_matches_tensorflow_training(optimizer, resource):
    tf = import_tf()
    x, y = _data()
    g, sess, xt, yt, loss, train = _tf1_graph(optimizer, resource)
    ts = train_step_from_tf1_graph(g, x="x", y="y", loss="loss:0", train_op="train", session=sess)
    assert {k for k, _, _ in ts.state} >= {"variable/w0", "variable/wo", "variable/global_step"}
    kinds = set(ts.description["updates"])
    assert kinds == ({"ApplyGradientDescent", "AssignAddVariableOp"} if optimizer == "gradient_descent"
                     else {"ResourceApplyMomentum", "AssignAddVariableOp"})

    res = Device(**FP32).train(ts, (x, y), batch_size=BATCH, steps=STEPS, reference=True,
                                                 progress=False)
    tf_losses = np.array([sess.run([loss, train], {xt: xb, yt: yb})[0] for xb, yb in _batches(x, y)], np.float64)
    np.testing.assert_array_equal(res.reference_losses, tf_losses)
    np.testing.assert_allclose(res.losses, tf_losses, rtol=LOSS_RTOL, atol=0)

    if optimizer == "gradient_descent":      # reference_train takes a TrainStep too (fresh from its initial state)
        np.testing.assert_array_equal(reference_train(ts, (x, y), batch_size=BATCH, steps=STEPS,
                                                      progress=False).losses, tf_losses)
    tf_vars = {v.op.name: sess.run(v) for v in g.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
    assert tf_vars["global_step"] == STEPS
    _assert_close_weights(res.weights(), tf_vars)
    for k, v in tf_vars.items():
        np.testing.assert_array_equal(res.weights(reference=True)[k], v)
    # the Apply* ops run as their CANN operator in the update phase, with the gradients' unscaling
    apply = [n for n in ts.graph.nodes if n.meta.get("ascend_type", "").startswith("Apply")]
    assert apply and all(ts.phase(n.name) == "update" for n in apply if not n.name.startswith("loss_scale_unscale/"))
    assert sum(n.name.startswith("loss_scale_unscale/") for n in apply) == ts.n_grads + 1     # the Muls and 1/scale


def test_tf1_graph_mixed_precision_overflow_skips_steps():
    """A planted fp16 overflow in the backward pass (output weights ~N(0, 4^2): a weight gradient of the
    hidden layers exceeds 65504 at loss scale 2^15) is found by the float status register, named with
    phase backward; the dynamic scale halves and training goes on."""
    x, y = _data()
    g, sess, *_ = _tf1_graph("momentum", False, out_stddev=4.0)
    ts = train_step_from_tf1_graph(g, x="x", y="y", loss="loss:0", train_op="train", session=sess)
    res = Device("allow_mix_precision", soc="Ascend910").train(
        ts, (x, y), batch_size=BATCH, steps=8, loss_scale="dynamic", reference=True, progress=False)
    assert res.skipped[0] and res.loss_scales[0] == 2.0 ** 15 and res.loss_scales[1] == 2.0 ** 14
    first = res.first_overflow(0)
    assert first["phase"] == "backward" and first["name"].startswith("gradients/"), first
    assert not res.skipped[-1]
    ran = ~res.skipped
    # a skipped step keeps the weights: the emulated and reference runs then see different weights, so
    # only the loss of the first step (same weights) is comparable tightly
    np.testing.assert_allclose(res.losses[0], res.reference_losses[0], rtol=3e-3)
    assert ran.sum() >= 4 and np.isfinite(res.losses).all()

    # without the planted overflow the fp16 curve follows the float32 one
    g, sess, *_ = _tf1_graph("momentum", False)
    ts = train_step_from_tf1_graph(g, x="x", y="y", loss="loss:0", train_op="train", session=sess)
    res = Device("allow_mix_precision", soc="Ascend910").train(
        ts, (x, y), batch_size=BATCH, steps=8, loss_scale="fixed:1024", reference=True, progress=False)
    assert not res.skipped.any() and not np.array_equal(res.losses, res.reference_losses)
    np.testing.assert_allclose(res.losses, res.reference_losses, rtol=3e-3)


def test_tf1_meta_graph_and_checkpoint(tmp_path, capsys):
    tf = import_tf()
    x, y = _data()
    g, sess, xt, yt, loss, train = _tf1_graph("momentum", False)
    for xb, yb in list(_batches(x, y))[:3]:       # a checkpoint after 3 steps: non-zero momentum slots
        sess.run(train, {xt: xb, yt: yb})
    with g.as_default():
        prefix = tf.compat.v1.train.Saver().save(sess, os.fspath(tmp_path / "model.ckpt"))
    ts = train_step_from_tf1_graph(prefix + ".meta", x="x", y="y", loss="loss", train_op="train",
                                   checkpoint=prefix)
    for v in g.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        np.testing.assert_array_equal(ts.initial[f"variable/{v.op.name}"], sess.run(v))
    res = Device(**FP32).train(ts, (x, y), batch_size=BATCH, steps=3, reference=True,
                                                 progress=False)
    tf_losses = [sess.run([loss, train], {xt: xb, yt: yb})[0] for xb, yb in list(_batches(x, y))[:3]]
    np.testing.assert_array_equal(res.reference_losses, tf_losses)
    np.testing.assert_allclose(res.losses, tf_losses, rtol=LOSS_RTOL)

    again = Device(**FP32).train(ts, (x, y), batch_size=BATCH, steps=3, reference=True,
                                                   progress=False)
    assert json.dumps(again.to_json(), sort_keys=True) == json.dumps(res.to_json(), sort_keys=True)

    # the same from the command line
    from ascend_emu.cli.main import main

    np.savez(tmp_path / "d.npz", x=x, y=y.astype(np.int64))
    argv = ["-q", "train", prefix + ".meta", "--data", str(tmp_path / "d.npz"), "--steps", "3", "--batch-size",
            str(BATCH), *FP32_ARGS, "--json", str(tmp_path / "t.json")]
    assert main(argv + ["--checkpoint", prefix, "--loss-tensor", "loss:0", "--train-op", "train"]) == 0
    steps = json.loads((tmp_path / "t.json").read_text())["steps"]
    assert [s["loss"] for s in steps] == res.losses.tolist()
    capsys.readouterr()
    assert main(argv + ["--loss-tensor", "loss:0", "--train-op", "train"]) == 2
    assert "training a MetaGraph needs --checkpoint" in capsys.readouterr().err
    assert main(["-q", "train", str(tmp_path / "m.keras"), "--data", str(tmp_path / "d.npz"),
                 "--checkpoint", prefix]) == 2
    assert "apply to a TF1 MetaGraph (.meta) only" in capsys.readouterr().err


# --------------------------------------------------------------------------- the update chains, bit for bit

@pytest.mark.parametrize("op", ["ApplyGradientDescent", "ApplyMomentum", "ApplyMomentum-nesterov",
                                "ResourceApplyKerasMomentum", "ResourceApplyKerasMomentum-nesterov",
                                "ApplyAdam", "ApplyRMSProp"])
def test_update_chain_equals_apply_kernel(op):
    """The rewritten Apply* (its TensorFlow functor as tensor ops, replayed in float32) equals the emulator's
    own Apply* kernel (ascend_emu.ops.apply_ops) bit for bit, and TensorFlow's kernel (0 ulp measured here;
    2 allowed for a CPU where TensorFlow's Eigen code contracts a multiply-add)."""
    tf = import_tf()
    from ascend_emu.frontend.tf.functionalize import VariableSpec, functionalize
    from ascend_emu.frontend.tf.loader import graph_from_graph_def
    from ascend_emu.ops import apply_ops as grad_ops

    kind, _, nesterov = op.partition("-")
    rng = np.random.default_rng(7)
    shape = (64,)
    slots = {"ApplyGradientDescent": 0, "ApplyMomentum": 1, "ResourceApplyKerasMomentum": 1, "ApplyAdam": 2,
             "ApplyRMSProp": 2}[kind]
    state = [rng.normal(size=shape).astype(np.float32)]
    state += [np.abs(rng.normal(size=shape)).astype(np.float32) for _ in range(slots)]
    grad = rng.normal(size=shape).astype(np.float32)
    scalars = {"ApplyGradientDescent": [0.1], "ApplyMomentum": [0.05, 0.9], "ResourceApplyKerasMomentum": [0.05, 0.9],
               "ApplyAdam": [0.1, 0.01, 1e-3, 0.9, 0.999, 1e-7], "ApplyRMSProp": [1e-2, 0.9, 0.5, 1e-7]}[kind]
    scalars = [np.float32(s) for s in scalars]
    g = tf.Graph()
    with g.as_default():
        vars_ = [tf.compat.v1.Variable(s, name=f"s{i}", use_resource=True) for i, s in enumerate(state)]
        gt = tf.compat.v1.placeholder(tf.float32, shape, name="grad")
        c = [tf.constant(s) for s in scalars]
        h = [v.handle for v in vars_]
        kw = {"use_nesterov": True} if nesterov else {}
        if kind == "ApplyGradientDescent":
            upd = tf.raw_ops.ResourceApplyGradientDescent(var=h[0], alpha=c[0], delta=gt)
            order = [state[0], scalars[0], grad]
        elif kind in ("ApplyMomentum", "ResourceApplyKerasMomentum"):
            f = tf.raw_ops.ResourceApplyMomentum if kind == "ApplyMomentum" else tf.raw_ops.ResourceApplyKerasMomentum
            upd = f(var=h[0], accum=h[1], lr=c[0], grad=gt, momentum=c[1], **kw)
            order = [state[0], state[1], scalars[0], grad, scalars[1]]
        elif kind == "ApplyAdam":
            upd = tf.raw_ops.ResourceApplyAdam(var=h[0], m=h[1], v=h[2], beta1_power=c[0], beta2_power=c[1], lr=c[2],
                                               beta1=c[3], beta2=c[4], epsilon=c[5], grad=gt)
            order = [*state, *scalars, grad]
        else:
            upd = tf.raw_ops.ResourceApplyRMSProp(var=h[0], ms=h[1], mom=h[2], lr=c[0], rho=c[1], momentum=c[2],
                                                  epsilon=c[3], grad=gt)
            order = [*state, *scalars, grad]
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=g) as sess:
        sess.run(init)
        sess.run(upd, {gt: grad})
        tf_new = sess.run([v.value() for v in vars_])
    specs = [VariableSpec(v.handle.op.name, f"variable/s{i}", "float32", list(shape)) for i, v in enumerate(vars_)]
    fn = functionalize(g.as_graph_def(), specs, [], targets=[upd.name], extra_inputs=["grad"])
    graph = graph_from_graph_def(fn.graph_def, fn.inputs, fn.outputs, name=op)
    feeds = {"grad": grad, **{s.placeholder: st for s, st in zip(specs, state)}}
    res = Device(**FP32).replay(graph, feeds, progress=False)
    emulated = [res.outputs[t] for t in graph.outputs]

    kernel = {"ApplyGradientDescent": grad_ops.apply_gradient_descent, "ApplyMomentum": grad_ops.apply_momentum,
              "ResourceApplyKerasMomentum": grad_ops.apply_keras_momentum, "ApplyAdam": grad_ops.apply_adam,
              "ApplyRMSProp": grad_ops.apply_rms_prop}[kind]
    ctx = Device(**FP32).context("float32")
    expected = kernel(*order, ctx=ctx, **kw)
    for e, k, t in zip(emulated, expected, tf_new):
        np.testing.assert_array_equal(e, k)
        ulp = np.abs(e.view(np.int32).astype(np.int64) - t.view(np.int32).astype(np.int64))
        assert ulp.max() <= 2, ulp.max()


# --------------------------------------------------------------------------- errors

def test_unsupported_variable_ops_are_listed():
    tf = import_tf()
    x, y = _data()
    v = tf.Variable(tf.zeros((16, 4)), name="table")

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(xb, v)))
        g = tape.gradient(loss, v)
        v.scatter_add(tf.IndexedSlices(g[:2], tf.constant([0, 1])))
        return loss

    with pytest.raises(AscendEmuError, match=r"cannot convert: ResourceScatterAdd x1 \(.*\); supported variable ops"):
        train_step_from_tf_function(step, x[:4], y[:4])

    v1 = tf.compat.v1
    g = _square_loss_graph(lambda loss, w: v1.train.AdagradOptimizer(0.1).minimize(loss, name="train"))
    with pytest.raises(AscendEmuError, match=r"ApplyAdagrad x1 \(train/update_w/ApplyAdagrad\)"):
        train_step_from_tf1_graph(g, x="x", y="y", loss="loss", train_op="train")


def _square_loss_graph(make_train):
    """A TF1 graph: placeholders x (None, 16) and y, a ref variable w (16, 4), loss = mean((x @ w)^2), and the
    train op ``make_train(loss, w)`` builds (named "train")."""
    tf = import_tf()
    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        xt = v1.placeholder(tf.float32, (None, 16), name="x")
        v1.placeholder(tf.int32, (None,), name="y")
        w = v1.get_variable("w", (16, 4), use_resource=False)
        make_train(tf.reduce_mean(tf.square(tf.matmul(xt, w)), name="loss"), w)
    return g


def test_unordered_updates_and_bad_input_are_refused():
    tf = import_tf()
    v1 = tf.compat.v1

    def unordered(loss, w):
        gw, = tf.gradients(loss, [w])
        tf.group(v1.assign_sub(w, 0.1 * gw), v1.assign_add(w, 0.01 * gw), name="train")
    g = _square_loss_graph(unordered)
    with pytest.raises(AscendEmuError, match="variable 'w' is updated by .* with no order between them"):
        train_step_from_tf1_graph(g, x="x", y="y", loss="loss", train_op="train")
    with pytest.raises(AscendEmuError, match="'nope' is not in the graph"):
        train_step_from_tf1_graph(g, x="nope", y="y", loss="loss", train_op="train")
    with pytest.raises(AscendEmuError, match="no initializer in the graph's collections"):
        _no_collection(g)

    x, y = _data()
    step, _, _ = _plain_step()
    ts = train_step_from_tf_function(step, x[:BATCH], y[:BATCH])
    with pytest.raises(AscendEmuError, match=r"training data x has samples of shape \(8,\) but the step's 'x' takes"):
        Device(**FP32).train(ts, (x[:, :8], y), steps=1, progress=False)
    with pytest.raises(AscendEmuError, match="a TrainStep carries its own loss and update; drop optimizer"):
        Device(**FP32).train(ts, (x, y), optimizer="sgd", steps=1, progress=False)
    with pytest.raises(AscendEmuError, match="computes no gradient"):
        train_step_from_tf_function(lambda a, b: tf.reduce_sum(a), x[:4], y[:4])


def _no_collection(g):
    """A graph whose variable is missing from the collections: its initial value must come from elsewhere."""
    tf = import_tf()
    g.clear_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    w_update = [op.name for op in g.get_operations() if op.type == "AssignSub"][0]
    return train_step_from_tf1_graph(g, x="x", y="y", loss="loss", train_op=w_update)

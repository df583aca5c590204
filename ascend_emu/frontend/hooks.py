"""Where a user's own TensorFlow script is routed to an emulated device (the TensorFlow side of
:func:`ascend_emu.npu.emulate.emulate`).

While installed, three entry points of TensorFlow and Keras hand each training step to a *runner*
(the device side, :class:`ascend_emu.npu.emulate.Emulation`; this module never imports it):

- **Keras 3** (``fit``, ``train_on_batch``, ``evaluate``, ``test_on_batch``, ``predict``): the TF
  trainer's ``make_train_function`` / ``make_test_function`` / ``make_predict_function`` install
  functions that take the batches from Keras' iterator themselves. A training batch runs the model's
  own ``train_step`` made stateless (:func:`~ascend_emu.frontend.stateful.train_step_from_tf_function`,
  so a custom ``train_step``, the compiled loss, regularisers, metrics, the optimizer's learning-rate
  schedule and the dropout seed all come with it): every variable it touches (weights, optimizer
  slots and iteration count, metric totals, seed state) is device state, read from the Keras
  variables before the step and written back after it, so callbacks, History and the user see the
  emulated values. A Keras ``LossScaleOptimizer`` is traced as its inner optimizer; its scale and
  growth counter become the runner's loss-scale manager (the overflow check reads the emulated float
  status) and are written back into it after each step. Evaluation and prediction replay the
  model's forward pass (``stateless_call``, with the compiled loss for evaluation) on the device;
  Keras' metric objects then update from the emulated predictions and loss, in float32.
- **A ``tf.function`` training step** the user calls in their own loop: ``Function.__call__`` is
  intercepted (eager calls only, so functions called inside other functions trace as usual). A
  function called with two arguments ``(x, y)`` that calls ``tape.gradient`` is a training step and
  runs emulated (the same rewrite, its variables read before and written after); any other
  function runs in TensorFlow. Interception rather than a decorator keeps the script unchanged but
  for the ``with`` line.
- **``tf.compat.v1.Session.run``** with a train op among the fetches (an op that writes variables
  and depends on ``tf.gradients``) and a ``feed_dict`` of two placeholders:
  :func:`~ascend_emu.frontend.tf1_step.train_step_from_tf1_graph` on the session's graph, the
  variables read from the session before the step and loaded into it after. The fetched loss is the
  emulated one; every other fetch (summaries, metrics) is TensorFlow's float32 value from the same
  weights and batch, before the update. Any other ``run`` goes to TensorFlow unchanged.

The runner's interface: ``train(step, x, y, state, key=, loss_scale=None) -> record`` (updates
``state`` in place when the step is applied), ``forward(graph, feeds) -> outputs``,
``tf1_loss_scale(graph, op_name)`` (a loss-scale manager registered for a TF1 train op, or None).
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from ..errors import AscendEmuError
from .stateful import assign_variables, read_variables, train_step_from_tf_function
from .tf import first_line, import_keras, import_tf, traced_error

_local = threading.local()


@contextlib.contextmanager
def passthrough():
    """While inside: TensorFlow and Keras run unhooked (the emulator's own TF calls, nested calls)."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def _bypassed() -> bool:
    return getattr(_local, "depth", 0) > 0


def _numpy(t, what: str) -> np.ndarray:
    tf = import_tf()
    if t is None:
        raise AscendEmuError(f"emulate: {what} is missing; an emulated step takes inputs and targets")
    if isinstance(t, (dict, list, tuple)):
        raise AscendEmuError(f"emulate: {what} is a {type(t).__name__}; an emulated step takes one array of "
                             "inputs and one of targets")
    if isinstance(t, (tf.RaggedTensor, tf.SparseTensor)):
        raise AscendEmuError(f"emulate: {what} is a {type(t).__name__}; dense arrays only")
    return np.asarray(t)


# --------------------------------------------------------------------------- Keras


def _keras_lso_class():
    keras = import_keras()
    return keras.optimizers.LossScaleOptimizer


@contextlib.contextmanager
def _optimizer_as(model, opt):
    """``model.optimizer`` is ``opt`` while inside (tracing a LossScaleOptimizer's model as its inner one)."""
    old = model.__dict__.get("optimizer")
    object.__setattr__(model, "optimizer", opt)
    try:
        yield
    finally:
        object.__setattr__(model, "optimizer", old)


def _batches(iterator, n: int):
    """Up to ``n`` batches from what Keras hands its train/test function (a tf.data iterator or a generator)."""
    tf = import_tf()
    out = []
    for _ in range(max(1, int(n))):
        try:
            if hasattr(iterator, "get_next"):
                out.append(iterator.get_next())
            else:
                out.append(next(iterator))
        except (StopIteration, tf.errors.OutOfRangeError):
            break
    if not out:
        raise StopIteration
    return out


def _unpack(data):
    keras = import_keras()
    x, y, sw = keras.utils.unpack_x_y_sample_weight(tuple(data) if isinstance(data, list) else data)
    if sw is not None:
        raise AscendEmuError("emulate: sample weights (sample_weight=, class_weight=) are not emulated; "
                             "train without them")
    return x, y


class KerasSteps:
    """The emulated train/test/predict functions of Keras models (one per model and batch signature)."""

    def __init__(self, runner):
        self.runner = runner
        self._train: dict = {}
        self._forward: dict = {}
        self.models: list = []          # whose train/test/predict functions are ours (reset on exit)

    # -- training ----------------------------------------------------------------------------
    def _train_step(self, model, x, y):
        key = (id(model), x.shape[1:], x.dtype.str, y.shape[1:], y.dtype.str)
        if key not in self._train:
            opt = getattr(model, "optimizer", None)
            if opt is None:
                raise AscendEmuError(f"emulate: model {model.name!r} has no optimizer; compile it with one")
            lso = opt if isinstance(opt, _keras_lso_class()) else None
            if not opt.built:
                opt.build(model.trainable_variables)
            inner = lso.inner_optimizer if lso is not None else opt

            def keras_train_step(bx, by):
                with _optimizer_as(model, inner):
                    return model.train_step((bx, by))

            step = train_step_from_tf_function(keras_train_step, x, y, optimizer=inner,
                                               name=f"{model.name}_train_step", loss_from="tape")
            self._train[key] = (step, lso)
        return self._train[key]

    def train(self, model, iterator):
        logs = None
        with passthrough():
            for data in _batches(iterator, getattr(model, "steps_per_execution", 1)):
                x, y = _unpack(data)
                x, y = _numpy(x, "the model's input"), _numpy(y, "the target y")
                step, lso = self._train_step(model, x, y)
                spec = None
                if lso is not None:
                    spec = {"spec": f"exponential:init={float(lso.dynamic_scale.numpy())!r},"
                                    f"incr_every={int(lso.dynamic_growth_steps)},decr_every=1,incr_ratio=2,"
                                    "decr_ratio=0.5",
                            "good_steps": int(lso.step_counter.numpy())}
                state = read_variables(step)
                key = ("keras", id(model), step.graph.name, x.shape[1:], y.shape[1:])
                self.runner.train(step, x, y, state, key=key, loss_scale=spec)
                assign_variables(step, state)
                if lso is not None:
                    scale, good = self.runner.manager_state(key)
                    lso.dynamic_scale.assign(scale)
                    lso.step_counter.assign(good)
            logs = model.get_metrics_result()
        return logs

    # -- forward (evaluate, predict) --------------------------------------------------------------
    def _forward_graph(self, model, x, y):
        tf = import_tf()
        key = (id(model), x.shape[1:], x.dtype.str, None if y is None else (y.shape[1:], y.dtype.str))
        if key in self._forward:
            return self._forward[key]
        from .loader import load_graph

        tv, ntv = list(model.trainable_variables), list(model.non_trainable_variables)
        sig = [tf.TensorSpec((None, *x.shape[1:]), tf.as_dtype(x.dtype), name="x")]
        if y is not None:
            sig.append(tf.TensorSpec((None, *y.shape[1:]), tf.as_dtype(y.dtype), name="y"))
        names = [f"v{i}" for i in range(len(tv) + len(ntv))]
        sig += [tf.TensorSpec(v.shape, v.dtype, name=n) for v, n in zip(tv + ntv, names)]
        nt, structure = len(tv), []

        def forward(*args):
            bx = args[0]
            st = args[2:] if y is not None else args[1:]
            pred, _, losses = model.stateless_call(list(st[:nt]), list(st[nt:]), bx, training=False,
                                                   return_losses=True)
            structure[:] = [pred]
            flat = tf.nest.flatten(pred)
            if y is None:
                return flat
            compiled = getattr(model, "_compile_loss", None)
            if compiled is None:
                raise AscendEmuError(f"emulate: model {model.name!r} has no compiled loss to evaluate")
            loss = compiled(args[1], pred)
            for extra in losses:
                loss = loss + extra
            return flat + [loss]

        try:
            cf = tf.function(forward, input_signature=sig, autograph=False).get_concrete_function()
        except AscendEmuError:
            raise
        except Exception as e:
            raise AscendEmuError(f"emulate: cannot trace model {model.name!r}'s forward pass: {first_line(e)}") from None
        graph = load_graph(cf)
        graph.name = f"{model.name}_{'test' if y is not None else 'predict'}_step"
        by_key = {s.key or s.name: s.name for s in graph.inputs}
        feeds_of = [by_key.get(n, n) for n in ["x"] + (["y"] if y is not None else []) + names]
        self._forward[key] = (graph, feeds_of, structure[0], tv + ntv)
        return self._forward[key]

    def _run_forward(self, model, x, y):
        tf = import_tf()
        graph, names, structure, variables = self._forward_graph(model, x, y)
        values = [x] + ([y] if y is not None else []) + [np.asarray(v.numpy()) for v in variables]
        outs = self.runner.forward(graph, dict(zip(names, values)))
        n = len(tf.nest.flatten(structure))
        pred = tf.nest.pack_sequence_as(structure, [tf.constant(o) for o in outs[:n]])
        return pred, (outs[n] if y is not None else None)

    def test(self, model, iterator):
        tf = import_tf()
        logs = None
        with passthrough():
            for data in _batches(iterator, getattr(model, "steps_per_execution", 1)):
                x, y = _unpack(data)
                x, y = _numpy(x, "the model's input"), _numpy(y, "the target y")
                pred, loss = self._run_forward(model, x, y)
                model._loss_tracker.update_state(tf.constant(loss, tf.float32), sample_weight=x.shape[0])
                logs = model.compute_metrics(x, y, pred, sample_weight=None)
        return logs

    def predict(self, model, data):
        tf = import_tf()
        outs = []
        with passthrough():
            for batch in (data if isinstance(data, list) else [data]):
                x, _ = _unpack(batch)
                pred, _ = self._run_forward(model, _numpy(x, "the model's input"), None)
                outs.append(pred)
        if len(outs) == 1:
            return outs[0]
        return tf.nest.map_structure(lambda *ts: tf.concat(ts, axis=0), *outs)


# --------------------------------------------------------------------------- tf.function


class FunctionSteps:
    """``tf.function`` training steps called eagerly in the user's loop."""

    def __init__(self, runner):
        self.runner = runner
        self._steps: dict = {}

    def _is_training_step(self, fn, x, y) -> bool:
        """Whether ``fn(x, y)`` calls ``tape.gradient`` (a fresh trace of its Python function)."""
        tf = import_tf()
        calls = []
        cls = tf.GradientTape
        original = cls.gradient

        def gradient(tape, *args, **kwargs):
            calls.append(1)
            return original(tape, *args, **kwargs)

        cls.gradient = gradient
        try:
            out = tf.function(fn.python_function).get_concrete_function(x, y).structured_outputs
        except Exception as e:
            raise AscendEmuError(f"emulate: cannot trace tf.function {fn.__name__!r}: "
                                 f"{traced_error(e) or first_line(e)}") from None
        finally:
            cls.gradient = original
        if calls and not (isinstance(out, tf.Tensor) and out.shape.rank == 0):
            raise AscendEmuError(f"emulate: tf.function {fn.__name__!r} is a training step that returns "
                                 f"{type(out).__name__}; an emulated step returns its loss alone (a scalar)")
        return bool(calls)

    def call(self, fn, args, kwargs, original):
        tf = import_tf()
        if kwargs or len(args) != 2 or not all(isinstance(a, (tf.Tensor, np.ndarray)) for a in args):
            return original(fn, *args, **kwargs)
        with passthrough():
            x, y = (np.asarray(a) for a in args)
            key = (id(fn), x.shape[1:], x.dtype.str, y.shape[1:], y.dtype.str)
            if key not in self._steps:
                self._steps[key] = (train_step_from_tf_function(fn, x, y)
                                    if self._is_training_step(fn, x, y) else None)
            step = self._steps[key]
            if step is None:
                return original(fn, *args, **kwargs)
            state = read_variables(step)
            rec = self.runner.train(step, x, y, state, key=("function",) + key)
            assign_variables(step, state)
            return tf.constant(rec["loss"], tf.float32)


# --------------------------------------------------------------------------- TF1 sessions


_WRITE_PREFIXES = ("Apply", "ResourceApply", "Assign", "ResourceScatter", "ScatterAdd", "ScatterSub",
                   "ScatterUpdate", "SparseApply", "ResourceSparseApply")


def _ancestors(op) -> list:
    seen, stack, out = set(), [op], []
    while stack:
        o = stack.pop()
        if o.name in seen:
            continue
        seen.add(o.name)
        out.append(o)
        stack.extend(t.op for t in o.inputs)
        stack.extend(o.control_inputs)
    return out


def _loss_of_gradients(graph, ops):
    """The tensor ``tf.gradients`` differentiates, from its seed (``gradients/grad_ys_0``, a Fill of ones):
    the seed feeds the gradient of the loss's op, named ``gradients/<loss op>_grad/...``."""
    import re

    seed = re.compile(r"(^|/)gradients(_\d+)?/grad_ys_\d+$")
    for o in ops:
        if o.type != "Fill" or not seed.search(o.name):
            continue
        for c in o.outputs[0].consumers():
            m = re.match(r"^(?:.*/)?gradients(?:_\d+)?/(.+?)_grad/", c.name)
            if m is None:
                continue
            try:
                op = graph.get_operation_by_name(m.group(1))
            except KeyError:
                continue
            for t in op.outputs:
                if t.dtype.is_floating and t.shape.rank == 0:
                    return t
    return None


def _flatten(fetches) -> list:
    tf = import_tf()
    return tf.nest.flatten(fetches, expand_composites=False)


class SessionSteps:
    """``Session.run`` calls that run a TF1 train op."""

    def __init__(self, runner):
        self.runner = runner
        self._train_ops: dict = {}      # (graph id, op name) -> (loss tensor or None)
        self._steps: dict = {}

    def _train_op(self, graph, op):
        """The loss tensor of train op ``op`` (the tensor its ``tf.gradients`` differentiates), or None when
        ``op`` is no training step."""
        key = (id(graph), op.name)
        if key not in self._train_ops:
            loss = None
            anc = _ancestors(op)
            if any(o.type.startswith(_WRITE_PREFIXES) for o in anc):
                loss = _loss_of_gradients(graph, anc)
            self._train_ops[key] = loss
        return self._train_ops[key]

    def run(self, sess, fetches, feed_dict, options, run_metadata, original):
        tf = import_tf()
        graph = sess.graph
        flat = _flatten(fetches)
        try:
            elems = [graph.as_graph_element(f) for f in flat]
        except Exception:
            return original(sess, fetches, feed_dict, options, run_metadata)
        train = [(i, e) for i, e in enumerate(elems) if isinstance(e, tf.Operation) and self._train_op(graph, e)
                 is not None]
        if not train:
            return original(sess, fetches, feed_dict, options, run_metadata)
        if len(train) > 1:
            raise AscendEmuError(f"emulate: Session.run fetches {len(train)} train ops "
                                 f"({', '.join(e.name for _, e in train)}); one step runs one")
        ti, op = train[0]
        loss = self._train_op(graph, op)
        feeds = list((feed_dict or {}).items())
        phs = [graph.as_graph_element(k) if not isinstance(k, tf.Tensor) else k for k, _ in feeds]
        if len(phs) != 2 or any(p.op.type != "Placeholder" for p in phs):
            raise AscendEmuError(f"emulate: Session.run of train op {op.name!r} feeds "
                                 f"{', '.join(p.name for p in phs) or 'nothing'}; an emulated TF1 step is fed "
                                 "exactly two placeholders (inputs and targets)")
        from .tf1_step import load_session_variables, read_session_variables, train_step_from_tf1_graph

        with passthrough():
            key = (id(graph), op.name, phs[0].name, phs[1].name)
            x, y = (np.asarray(v) for _, v in feeds)
            if key not in self._steps:
                self._steps[key] = train_step_from_tf1_graph(graph, x=phs[0], y=phs[1], loss=loss, train_op=op,
                                                             session=sess)
            step = self._steps[key]
            others = [i for i, e in enumerate(elems) if i != ti and e is not loss]
            values = original(sess, [flat[i] for i in others], feed_dict, options, run_metadata) if others else []
            state = read_session_variables(step, sess)
            rec = self.runner.train(step, x, y, state, key=("tf1",) + key,
                                    loss_scale=self.runner.tf1_loss_scale(graph, op.name))
            load_session_variables(step, sess, state)
        out = [None] * len(flat)
        for i, v in zip(others, values):
            out[i] = v
        for i, e in enumerate(elems):
            if e is loss:
                out[i] = loss.dtype.as_numpy_dtype(rec["loss"])
        return tf.nest.pack_sequence_as(fetches, out)


class SessionWrapper:
    """A ``tf.compat.v1.Session`` whose ``run`` trains on the emulated device (``ascend_emu.tf1.wrap``)."""

    def __init__(self, session, steps: SessionSteps):
        self._session = session
        self._steps = steps

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        tf = import_tf()
        original = _original_session_run() or tf.compat.v1.Session.run
        return self._steps.run(self._session, fetches, feed_dict, options, run_metadata, original)

    def __getattr__(self, name):
        return getattr(self._session, name)

    def __enter__(self):
        self._session.__enter__()
        return self

    def __exit__(self, *exc):
        return self._session.__exit__(*exc)


# --------------------------------------------------------------------------- installing


_installed: list = []     # stack of (Hooks) installed; the innermost handles the calls


def _original_session_run():
    return _installed[0]._originals.get("session_run") if _installed else None


class Hooks:
    """The three interceptions, installed while an emulation context is active (nesting: innermost wins)."""

    def __init__(self, runner):
        self.keras = KerasSteps(runner)
        self.functions = FunctionSteps(runner)
        self.sessions = SessionSteps(runner)
        self._originals: dict = {}

    def install(self) -> None:
        tf = import_tf()
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
        from tensorflow.python.client.session import BaseSession
        from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

        if _installed:
            # an inner context: the patches are in place; route to this one's runner until it exits
            self._originals = _installed[0]._originals
            _installed.append(self)
            return
        o = self._originals
        o["make_train_function"] = TensorFlowTrainer.make_train_function
        o["make_test_function"] = TensorFlowTrainer.make_test_function
        o["make_predict_function"] = TensorFlowTrainer.make_predict_function
        o["function_call"] = Function.__call__
        o["session_run"] = BaseSession.run

        def current() -> "Hooks":
            return _installed[-1]

        def mine(model):
            if not any(m is model for m in current().keras.models):
                current().keras.models.append(model)

        def make_train_function(model, force=False):
            mine(model)
            model.train_function = lambda iterator: current().keras.train(model, iterator)
            return model.train_function

        def make_test_function(model, force=False):
            mine(model)
            model.test_function = lambda iterator: current().keras.test(model, iterator)
            return model.test_function

        def make_predict_function(model, force=False):
            mine(model)
            model.predict_function = lambda data: current().keras.predict(model, data)
            return model.predict_function

        def function_call(fn, *args, **kwargs):
            if _bypassed() or not tf.executing_eagerly():
                return o["function_call"](fn, *args, **kwargs)
            return current().functions.call(fn, args, kwargs, o["function_call"])

        def session_run(sess, fetches, feed_dict=None, options=None, run_metadata=None):
            if _bypassed():
                return o["session_run"](sess, fetches, feed_dict, options, run_metadata)
            return current().sessions.run(sess, fetches, feed_dict, options, run_metadata, o["session_run"])

        TensorFlowTrainer.make_train_function = make_train_function
        TensorFlowTrainer.make_test_function = make_test_function
        TensorFlowTrainer.make_predict_function = make_predict_function
        Function.__call__ = function_call
        BaseSession.run = session_run
        _installed.append(self)

    def uninstall(self) -> None:
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
        from tensorflow.python.client.session import BaseSession
        from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

        _installed.remove(self)
        if _installed:
            return
        o = self._originals
        TensorFlowTrainer.make_train_function = o["make_train_function"]
        TensorFlowTrainer.make_test_function = o["make_test_function"]
        TensorFlowTrainer.make_predict_function = o["make_predict_function"]
        Function.__call__ = o["function_call"]
        BaseSession.run = o["session_run"]


def reset_keras_functions(models) -> None:
    """Forget the emulated train/test/predict functions of ``models`` (Keras rebuilds its own on next use)."""
    for m in models:
        for name in ("train_function", "test_function", "predict_function"):
            if getattr(m, name, None) is not None:
                setattr(m, name, None)


def keras_loss_scale_optimizer(inner_optimizer, dynamic: bool = True, initial_scale=None,
                               dynamic_growth_steps=None):
    """The TF2 adapter's ``npu.train.optimizer.NpuLossScaleOptimizer``, as Keras' LossScaleOptimizer
    (which it subclasses): initial scale 2**15 and growth every 2000 finite steps unless given. Under
    :func:`~ascend_emu.npu.emulate.emulate` its overflow check reads the emulated float status."""
    if not dynamic:
        raise AscendEmuError("NpuLossScaleOptimizer(dynamic=False) is not emulated; under emulate use "
                             "loss_scale='fixed:N' and the plain optimizer")
    keras = import_keras()
    kwargs = {}
    if initial_scale is not None:
        kwargs["initial_scale"] = float(initial_scale)
    if dynamic_growth_steps is not None:
        kwargs["dynamic_growth_steps"] = int(dynamic_growth_steps)
    return keras.optimizers.LossScaleOptimizer(inner_optimizer, **kwargs)
NpuLossScaleOptimizer = keras_loss_scale_optimizer

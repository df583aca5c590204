"""Where a user's own TensorFlow script is routed to an emulated device (the TensorFlow side of
:func:`ascend_emu.npu.emulate.emulate`).

While installed, three entry points of TensorFlow and Keras hand each training step to a *runner*
(the device side, :class:`ascend_emu.npu.emulate.Emulation`; this module never imports it; the Keras
part is in :mod:`.keras_hooks`, what all three share in :mod:`.intercept`):

- **Keras 3** (``fit``, ``train_on_batch``, ``evaluate``, ``test_on_batch``, ``predict``): the TF
  trainer's ``make_train_function`` / ``make_test_function`` / ``make_predict_function`` install
  functions that take the batches from Keras' iterator themselves. A training batch runs the model's
  own ``train_step`` made stateless (:func:`~ascend_emu.frontend.tf.stateful.train_step_from_tf_function`,
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
  :func:`~ascend_emu.frontend.tf.tf1_step.train_step_from_tf1_graph` on the session's graph, the
  variables read from the session before the step and loaded into it after. The fetched loss is the
  emulated one; every other fetch (summaries, metrics) is TensorFlow's float32 value from the same
  weights and batch, before the update. Any other ``run`` goes to TensorFlow unchanged.

The runner's interface: ``train(step, x, y, state, key=, loss_scale=None) -> record`` (updates
``state`` in place when the step is applied), ``forward(graph, feeds) -> outputs``,
``tf1_loss_scale(graph, op_name)`` (a loss-scale manager registered for a TF1 train op, or None), ``end()``
(a wrapped session is closed: the run's end).
"""
from __future__ import annotations

import sys
import threading

import numpy as np

from ...errors import AscendEmuError
from .intercept import _bypassed, passthrough  # noqa: F401  (passthrough: part of this module's API)
from .keras_hooks import (KerasSteps, NpuLossScaleOptimizer, keras_loss_scale_optimizer,  # noqa: F401
                          reset_keras_functions)
from .stateful import assign_variables, read_variables, train_step_from_tf_function
from .tf import first_line, import_tf, traced_error

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
        with _PROBE:        # one probe at a time: each restores exactly what it replaced
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
            before = dict(state)
            rec = self.runner.train(step, x, y, state, key=("function",) + key)
            assign_variables(step, state, before)
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

    def close(self):
        self._session.close()
        self._steps.runner.end()

    def __getattr__(self, name):
        return getattr(self._session, name)

    def __enter__(self):
        self._session.__enter__()
        return self

    def __exit__(self, *exc):
        out = self._session.__exit__(*exc)
        if exc[0] is None:
            self._steps.runner.end()
        return out


# --------------------------------------------------------------------------- installing


_installed: list = []     # stack of (Hooks) installed; the innermost handles the calls
#: the interceptions patch classes for the whole process, so they belong to one thread at a time
_INSTALL = threading.Lock()
_PROBE = threading.Lock()


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

        with _INSTALL:
            if _installed and _installed[0]._thread != threading.get_ident():
                raise AscendEmuError("emulate(...) is already active in another thread; its interceptions of Keras, "
                                     "tf.function and Session.run are process-wide, so run one thread's emulation "
                                     "at a time (or one process per emulation)")
            self._thread = threading.get_ident()
            if _installed:
                # an inner context: the patches are in place; route to this one's runner until it exits
                self._originals = _installed[0]._originals
                _installed.append(self)
                return
            self._patch(tf, TensorFlowTrainer, BaseSession, Function)

    def _patch(self, tf, TensorFlowTrainer, BaseSession, Function) -> None:
        o = self._originals
        o["make_train_function"] = TensorFlowTrainer.make_train_function
        o["make_test_function"] = TensorFlowTrainer.make_test_function
        o["make_predict_function"] = TensorFlowTrainer.make_predict_function
        o["function_call"] = Function.__call__
        o["session_run"] = BaseSession.run
        o["reset_metrics"] = TensorFlowTrainer.reset_metrics
        o["own_reset_metrics"] = "reset_metrics" in TensorFlowTrainer.__dict__

        def current() -> "Hooks":
            return _installed[-1]

        def mine(model):
            if not any(m is model for m in current().keras.models):
                current().keras.models.append(model)

        def make_train_function(model, force=False):
            mine(model)
            model.train_function = fn = lambda iterator: current().keras.train(model, iterator)
            fn.ascend_emu_train = True      # (reset_metrics defers only in front of this function)
            return model.train_function

        def make_test_function(model, force=False):
            mine(model)
            model.test_function = lambda iterator: current().keras.test(model, iterator)
            return model.test_function

        def make_predict_function(model, force=False):
            mine(model)
            model.predict_function = lambda data: current().keras.predict(model, data)
            return model.predict_function

        train_on_batch = getattr(TensorFlowTrainer.train_on_batch, "__code__", None)

        def reset_metrics(model):
            # (train_on_batch resets the metrics before every call: one traced call instead of an assign each; the
            # call train_on_batch makes right before its train function, ours, runs in that function's first read)
            if _bypassed() or not any(m is model for m in current().keras.models):
                return o["reset_metrics"](model)
            # (deferred only when the train function train_on_batch calls next is ours: a class's own
            # make_train_function leaves it to run the reset it would never consume)
            if (train_on_batch is not None and sys._getframe(1).f_code is train_on_batch
                    and getattr(getattr(model, "train_function", None), "ascend_emu_train", False)):
                return current().keras.defer_reset(model, o["reset_metrics"])
            return current().keras.reset_metrics(model, o["reset_metrics"])

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
        TensorFlowTrainer.reset_metrics = reset_metrics
        Function.__call__ = function_call
        BaseSession.run = session_run
        _installed.append(self)

    def uninstall(self) -> None:
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
        from tensorflow.python.client.session import BaseSession
        from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

        with _INSTALL:
            _installed.remove(self)
            if _installed:
                return
            o = self._originals
            TensorFlowTrainer.make_train_function = o["make_train_function"]
            TensorFlowTrainer.make_test_function = o["make_test_function"]
            TensorFlowTrainer.make_predict_function = o["make_predict_function"]
            if o["own_reset_metrics"]:
                TensorFlowTrainer.reset_metrics = o["reset_metrics"]
            else:       # Keras' Trainer's, inherited
                del TensorFlowTrainer.reset_metrics
            Function.__call__ = o["function_call"]
            BaseSession.run = o["session_run"]

"""The Keras 3 side of :mod:`ascend_emu.frontend.tf.hooks`: ``fit``, ``train_on_batch``, ``evaluate``,
``test_on_batch`` and ``predict`` routed to the runner (see the hooks' docstring for what is taken and how),
and the TF2 adapter's ``NpuLossScaleOptimizer`` name for Keras' LossScaleOptimizer."""
from __future__ import annotations

import contextlib

import numpy as np

from ...errors import AscendEmuError
from .intercept import _numpy, passthrough
from .stateful import NOT_RUN, assign_variables, fast_call, read_variables, train_step_from_tf_function
from .tf import first_line, import_keras, import_tf


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


def _arrays(model, iterator):
    """(x, y) of each batch Keras' iterator gives for one call of a train/test function, as arrays."""
    for data in _batches(iterator, getattr(model, "steps_per_execution", 1)):
        x, y = _unpack(data)
        yield _numpy(x, "the model's input"), _numpy(y, "the target y")


class KerasSteps:
    """The emulated train/test/predict functions of Keras models (one per model and batch signature)."""

    def __init__(self, runner):
        self.runner = runner
        self._train: dict = {}
        self._forward: dict = {}
        self._metrics: dict = {}
        self._resets: dict = {}
        self._pinned: dict = {}         # _compiled's ids -> the objects
        self._pending: dict = {}        # id(model) -> [not run yet, Keras' reset_metrics]: a reset train_on_batch deferred
        self.models: list = []          # whose train/test/predict functions are ours (reset on exit)

    # -- training ----------------------------------------------------------------------------
    def _compiled(self, model) -> tuple:
        """The ids of what ``compile`` made (the optimizer, the compiled loss and metrics): part of a traced function's key, so a recompile traces anew (a step
        traced before updated the old metrics: "Cannot get result() since the metric has not yet been built"). The
        objects are kept (``_pinned``) while a function keyed by their ids is: a dead one's id cannot come back."""
        made = tuple(getattr(model, a, None) for a in ("optimizer", "_compile_loss", "_compile_metrics"))
        ids = tuple(map(id, made))
        self._pinned.setdefault(ids, made)
        return ids

    def _train_key(self, model, x, y) -> tuple:
        return (id(model), x.shape[1:], x.dtype.str, y.shape[1:], y.dtype.str, self._compiled(model))

    @staticmethod
    def _build(model, x, y) -> None:
        """Keras' own build of what is unbuilt (the layers of a model made without an Input, its compiled loss and
        metrics, its optimizer) from a batch's shapes, as ``fit`` does before tracing (``train_on_batch`` leaves it to
        the trace, which the emulator's step tracing is not: an optimizer built on an unbuilt model's no variables
        refused them: "Unknown variable")."""
        build = getattr(model, "_symbolic_build", None)
        if build is not None:
            build(data_batch=(x, y, None))

    def _train_step(self, model, x, y):
        key = self._train_key(model, x, y)
        if key not in self._train:
            opt = getattr(model, "optimizer", None)
            if opt is None:
                raise AscendEmuError(f"emulate: model {model.name!r} has no optimizer; compile it with one")
            self._build(model, x, y)
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
        # the metrics' reset train_on_batch asked for just before (``defer_reset``): traced in front of the first
        # read of the variables, one call for both; run on its own before a step is traced, and if nothing read
        pending = self._pending.pop(id(model), None)
        try:
            logs = self._train_batches(model, iterator, pending)
            pending = None
        finally:
            if pending is not None and pending[0]:
                self.reset_metrics(model, pending[1])
        return logs

    def _train_batches(self, model, iterator, pending):
        logs = then = None
        with passthrough():
            for x, y in _arrays(model, iterator):
                if pending is not None and pending[0] and self._train_key(model, x, y) not in self._train:
                    pending[0] = False      # (a step traced now: the reset runs first, as Keras runs it)
                    self.reset_metrics(model, pending[1])
                step, lso = self._train_step(model, x, y)
                spec = None
                if lso is not None:
                    spec = {"spec": f"exponential:init={float(lso.dynamic_scale.numpy())!r},"
                                    f"incr_every={int(lso.dynamic_growth_steps)},decr_every=1,incr_ratio=2,"
                                    "decr_ratio=0.5",
                            "good_steps": int(lso.step_counter.numpy())}
                first = self._reset_fn(model, pending[1]) if pending is not None and pending[0] else None
                state = read_variables(step, first)
                if first is not None:
                    pending[0] = False      # (run: a read that fails leaves it to ``train``'s own, a reset again)
                before = dict(state)
                key = ("keras", id(model), step.graph.name, x.shape[1:], y.shape[1:])
                self.runner.train(step, x, y, state, key=key, loss_scale=spec)
                # one batch a call (train_on_batch, fit's default): the logs traced into the variables' write
                then = self._logs_fn(model) if lso is None and getattr(model, "steps_per_execution", 1) == 1 else None
                logs = assign_variables(step, state, before, then=then)
                if lso is not None:
                    scale, good = self.runner.manager_state(key)
                    lso.dynamic_scale.assign(scale)
                    lso.step_counter.assign(good)
            if then is None or logs is NOT_RUN:
                logs = self._metrics_result(model)
        return logs

    def _logs_fn(self, model):
        """``model.get_metrics_result`` as one function object per model and set of metrics (the key of the write
        it is traced into, :func:`~ascend_emu.frontend.tf.stateful.assign_variables`)."""
        key = ("logs", id(model), tuple(map(id, model.metrics)))
        fn = self._metrics.get(key)
        if fn is None:
            fn = self._metrics[key] = lambda: model.get_metrics_result()
        return fn

    def _metrics_result(self, model):
        """``model.get_metrics_result()`` (the logs Keras hands its callbacks) in one call: traced once per model
        and set of metrics, as Keras' own train step traces it (each metric's result eagerly is a few dispatches
        of TensorFlow ops); eagerly where it cannot be traced."""
        key = (id(model), tuple(map(id, model.metrics)))
        fn = self._metrics.get(key)
        if fn is None:
            tf = import_tf()
            try:
                fn = fast_call(tf.function(model.get_metrics_result, autograph=False).get_concrete_function())
            except Exception:   # a get_metrics_result of the script's own that only runs eagerly
                fn = model.get_metrics_result
            self._metrics[key] = fn
        return fn()

    def defer_reset(self, model, reset) -> None:
        """Keras' ``reset_metrics`` (``reset``) of ``model`` called by ``train_on_batch`` right before its train
        function (ours: :meth:`train`): run by that function in front of its first read of the variables, in the
        same traced call (a call less a step); now where it would run eagerly anyway."""
        if not _keras_resets(model):
            return reset(model)
        old = self._pending.pop(id(model), None)
        if old is not None and old[0]:
            self.reset_metrics(model, old[1])     # (never consumed: run as it would have been)
        self._pending[id(model)] = [True, reset]

    def _reset_fn(self, model, reset):
        """``reset(model)`` as one function object per model and set of metric variables (the key of the read it
        is traced into, :func:`~ascend_emu.frontend.tf.stateful.read_variables`)."""
        key = ("reset", id(model), tuple(map(id, model.metrics_variables)))
        fn = self._resets.get(key)
        if fn is None:
            fn = self._resets[key] = lambda: reset(model)
        return fn

    def reset_metrics(self, model, reset):
        """Keras' ``reset_metrics`` (``reset``) of ``model`` in one call: traced once per model and set of metric
        variables (each metric's eager reset is an assign of zeros per variable, ~0.6 ms a ``train_on_batch`` for
        a loss tracker and two metrics); eagerly when a metric resets itself otherwise than Keras' own
        ``reset_state`` (a trace would run its Python once)."""
        if not _keras_resets(model):
            return reset(model)
        key = (id(model), tuple(map(id, model.metrics_variables)))
        fn = self._resets.get(key)
        if fn is None:
            tf = import_tf()
            cf = tf.function(lambda: reset(model), autograph=False).get_concrete_function()
            fn = self._resets[key] = fast_call(cf)
        fn()

    # -- forward (evaluate, predict) --------------------------------------------------------------
    def _forward_graph(self, model, x, y):
        tf = import_tf()
        key = (id(model), x.shape[1:], x.dtype.str, None if y is None else (y.shape[1:], y.dtype.str),
               self._compiled(model))
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
            for x, y in _arrays(model, iterator):
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


def _keras_resets(model) -> bool:
    """Whether every metric of ``model`` (and of its compiled-metrics containers) resets with Keras' own
    ``reset_state``: assigns to its variables and nothing else, which a trace keeps."""
    todo, seen = list(model.metrics), set()
    while todo:
        m = todo.pop()
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        if not getattr(type(m).reset_state, "__module__", "").startswith("keras."):
            return False
        for inner in ("_flat_metrics", "_flat_weighted_metrics", "metrics"):
            more = getattr(m, inner, None)
            if isinstance(more, (list, tuple)):
                todo.extend(more)
    return True


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

"""Stateful training steps as the stateless :class:`~ascend_emu.frontend.tf.training.TrainStep`.

Two kinds of user code train by mutating variables rather than returning new values:

- a ``tf.function`` (or plain Python function) ``step(x, y)`` that computes a loss under a
  ``tf.GradientTape`` and updates ``tf.Variable``\\ s (``optimizer.apply_gradients`` of a Keras 3
  optimizer, ``v.assign_sub(lr * g)``, ...): :func:`train_step_from_tf_function`;
- a ``tf.compat.v1`` graph with variables (``VariableV2`` or resource), a loss tensor and a train op
  (``tf.compat.v1.train.GradientDescentOptimizer(...).minimize(loss)``, ``MomentumOptimizer``, ...),
  Python-built or imported from a MetaGraph: :func:`~ascend_emu.frontend.tf.tf1_step.train_step_from_tf1_graph`
  (:mod:`ascend_emu.frontend.tf.tf1_step`, on the helpers here).

Both become the contract the training loop replays (:mod:`ascend_emu.npu.training`)::

    (x, y, loss_scale, iteration, state...) -> (loss, gradients..., new state...)

by one rewrite of the step's GraphDef (:func:`~ascend_emu.frontend.tf.functionalize.functionalize`): every variable becomes a state
placeholder holding its value at the start of the step; a read (``ReadVariableOp``, the ``Identity``
that reads a TF1 ref variable, any op consuming a ref as a value, ``ResourceGather`` as ``GatherV2``)
becomes the variable's value at that point; a write (``Assign``/``AssignVariableOp``, ``AssignAdd``/``AssignSub`` and their resource
forms, the ``Apply*``/``ResourceApply*`` optimizer ops) becomes ordinary tensor ops computing the new
value; the variable's last value is a new-state output. "At that point" is decided by the graph's own
ordering: a read sees the last write of the variable that is an ancestor of it (through data or
control edges), else the value at the start of the step. A ``tf.function`` orders every op on one
variable by automatic control dependencies; a TF1 optimizer gates its gradients
(``gate_gradients=GATE_OP``) so the forward and backward reads run before the updates that depend
on them. Two writes of one variable with no order between them are refused.

An ``Apply*`` op becomes the float32 chain of its TensorFlow update functor
(``tensorflow/core/kernels/training_ops.cc``), op for op the formula of
:mod:`ascend_emu.ops.grad_ops`' Apply* kernels, each op tagged with the CANN operator it runs as
(``node.meta["ascend_type"]``, e.g. ApplyMomentum, black-listed), so the precision lists treat the
chain as the one Apply* operator, as the Keras path does.

Loss scaling follows the Ascend TF adapter's NPULossScaleOptimizer: the gradient seed (d loss / d
loss) is the loss scale instead of 1 and the gradients are multiplied by ``1 / loss_scale`` before
the update. For a ``tf.function`` the step is traced with ``tf.GradientTape.gradient`` wrapped to do
exactly that (and to record the gradients as outputs); for a TF1 graph the seed ``grad_ys`` op of
``tf.gradients`` is multiplied by the scale and every tensor leaving the gradients' name scope is
multiplied by the inverse.

The phase of each op is structural (``node.meta["phase"]``, :meth:`TrainStep.phase`): ancestors of
the loss are ``forward``, the other ancestors of the gradients ``backward``, the rest ``update``. As in
the Keras path, the unscaling of the gradients (``loss_scale_unscale/``) runs with the optimizer's
Apply* operator (float32; NUMERICS.md section 10) when the update is one.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ...errors import AscendEmuError
from ...graph.core import split_tensor_name, tensor_name
from .functionalize import Functional, VariableSpec, functionalize
from .tf import first_line, import_keras, import_tf, traced_error
from .training import UNSCALE_PREFIX, TrainStep

#: Keras 3 optimizers (class name) -> the CANN Apply* operator their decomposed update runs as, as in the
#: Keras path (:mod:`ascend_emu.npu.training`); SGD with momentum -> ApplyMomentum
KERAS_UPDATE_TYPES = {"SGD": "ApplyGradientDescent", "Adam": "ApplyAdam", "AdamW": "ApplyAdam",
                      "RMSprop": "ApplyRMSProp"}

# --------------------------------------------------------------------------- shared: the TrainStep

def _annotate(graph, n_grads: int, ascend: dict, update_type: str | None = None) -> dict:
    """Phase of every node (ancestors of the loss: forward; other ancestors of the gradients: backward;
    the rest: update) in ``node.meta["phase"]``, and the CANN op type of the rewritten writes; with
    ``update_type``, also of every other op of the update phase computing floats (a Keras
    optimizer's decomposed update runs as that one Apply* operator). The gradients' unscaling runs as
    the Apply* operator that reads it (``update_type``, or the Apply* op its consumers run as)."""
    producer = {n.name: n for n in graph.nodes}

    def ancestors(tensors) -> set:
        out, stack = set(), [split_tensor_name(t)[0] for t in tensors]
        while stack:
            n = stack.pop()
            if n in out:
                continue
            out.add(n)
            stack.extend(split_tensor_name(r)[0] for r in producer[n].inputs)
        return out

    forward = ancestors(graph.outputs[:1])
    backward = ancestors(graph.outputs[1:1 + n_grads]) - forward
    phases = {}
    for node in graph.nodes:
        phases[node.name] = node.meta["phase"] = (
            "forward" if node.name in forward else "backward" if node.name in backward else "update")
        computes = node.op not in ("Placeholder", "Const") and any(
            str(d).startswith(("float", "bfloat")) for d in node.output_dtypes or ())
        if update_type and phases[node.name] == "update" and computes:
            node.meta["ascend_type"] = update_type
        elif node.name in ascend:
            node.meta["ascend_type"] = ascend[node.name]
    consumers = graph.consumers()
    for node in reversed(graph.nodes):      # consumers first: the Muls, then the 1/scale they read
        if not node.name.startswith(UNSCALE_PREFIX) or node.op in ("Placeholder", "Const"):
            continue
        apply = update_type or next((c.meta["ascend_type"] for t in node.outputs() for c in consumers.get(t, ())
                                     if c.meta.get("ascend_type", "").startswith("Apply")), None)
        if apply:
            node.meta["ascend_type"] = apply
    return phases


def _make_step(func, fn_out: Functional, *, name, x, y, scale, iteration, variables, initial, n_grads,
               description, update_type=None) -> TrainStep:
    from .loader import graph_from_graph_def

    graph = graph_from_graph_def(fn_out.graph_def, fn_out.inputs, fn_out.outputs, name=name)
    _annotate(graph, n_grads, fn_out.ascend_types, update_type)
    state = [(v.key, v.placeholder, v.dtype) for v in variables]
    return TrainStep(func, graph, x, y, scale, iteration, state, [], None, loss_name=graph.outputs[0],
                     gradients=n_grads, initial=initial, description=description)


def _free(names: set, want: str) -> str:
    k, name = 0, want
    while name in names:
        k += 1
        name = f"{want}_{k}"
    return name


# --------------------------------------------------------------------------- tf.function steps

@contextlib.contextmanager
def _scaled_gradients(scale, record: list, targets: list | None = None):
    """While tracing: ``tf.GradientTape.gradient`` seeds the backward pass with ``scale`` (d(loss*scale)/d
    loss), multiplies the gradients by ``1 / scale`` (name scope ``loss_scale_unscale``, as the Keras
    path and NPULossScaleOptimizer do) and appends them to ``record`` (and its target to ``targets``).
    Restored on exit."""
    tf = import_tf()
    cls = tf.GradientTape
    original = cls.gradient

    def gradient(tape, target, sources, output_gradients=None, **kwargs):
        if targets is not None:
            targets.append(target)
        with tf.name_scope("loss_scale_seed"):
            if output_gradients is None:
                seeds = tf.nest.map_structure(lambda t: tf.fill(tf.shape(t), tf.cast(scale, t.dtype)), target)
            else:
                seeds = tf.nest.map_structure(lambda s, t: s * tf.cast(scale, t.dtype), output_gradients, target)
        grads = original(tape, target, sources, output_gradients=seeds, **kwargs)
        with tf.name_scope("loss_scale_unscale"):
            inv = 1.0 / scale

            def unscale(g):
                if g is None:
                    return None
                if isinstance(g, tf.IndexedSlices):
                    g = tf.IndexedSlices(g.values * tf.cast(inv, g.dtype), g.indices, g.dense_shape)
                    record.append(g.values)
                    return g
                g = g * tf.cast(inv, g.dtype)
                record.append(g)
                return g
            return tf.nest.map_structure(unscale, grads)

    cls.gradient = gradient
    try:
        yield
    finally:
        cls.gradient = original


def _loss_of(out, fname: str):
    tf = import_tf()
    if isinstance(out, dict):
        out = out.get("loss")
    elif isinstance(out, (list, tuple)) and out:
        out = out[0]
    if not isinstance(out, tf.Tensor) or out.shape.rank != 0 or not out.dtype.is_floating:
        raise AscendEmuError(f"training step {fname!r} must return its loss: a scalar float tensor (or a tuple / "
                             "dict with it first / under 'loss')")
    return out


def _handle_spec(handle) -> tuple[str, list]:
    """dtype and shape a resource handle holds (from its handle data)."""
    tf = import_tf()
    data = getattr(handle, "_handle_data", None)
    if data is None or not data.shape_and_type:
        raise AscendEmuError("a captured resource of the step is not a variable (no dtype/shape); pass its "
                             "variables explicitly")
    st = data.shape_and_type[0]
    dims = None if st.shape.unknown_rank else [d.size for d in st.shape.dim]
    return np.dtype(tf.as_dtype(st.dtype).as_numpy_dtype).name, dims


def _keras_optimizer(py, optimizer):
    """The Keras optimizer whose update the step runs: ``optimizer``, else the one Keras optimizer the
    function's code refers to (a global or closure variable), else None."""
    import inspect

    keras = import_keras()
    if optimizer is not None:
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise AscendEmuError(f"optimizer= must be a Keras optimizer, not {type(optimizer).__name__}")
        return optimizer
    try:
        refs = inspect.getclosurevars(py)
    except (TypeError, ValueError):
        return None
    found = {id(o): o for o in list(refs.nonlocals.values()) + list(refs.globals.values())
             if isinstance(o, keras.optimizers.Optimizer)}
    return next(iter(found.values())) if len(found) == 1 else None


def _tape_loss(targets: list, fname: str):
    if len(targets) != 1:
        raise AscendEmuError(f"training step {fname!r} calls tape.gradient {len(targets)} times; one call on the "
                             "loss is what an emulated step takes")
    return _loss_of(targets[0], fname)


def train_step_from_tf_function(fn, x_example, y_example, variables=None, *, optimizer=None,
                                name: str | None = None, loss_from: str = "return") -> TrainStep:
    """A training step written as a ``tf.function`` on ``tf.Variable``\\ s, as a :class:`TrainStep`.

    Parameters
    ----------
    fn : tf.function or Python function ``step(x, y)`` that computes the loss under a
        ``tf.GradientTape``, updates variables (``optimizer.apply_gradients`` of a Keras 3 optimizer,
        ``v.assign_sub(lr * g)``, TF's ``ResourceApply*`` ops, ...) and returns the loss (a scalar, or a
        tuple/dict with it first / under ``"loss"``). It is retraced (its Python function) with the
        gradient tape loss-scaled, so it must call ``tape.gradient`` itself.
    x_example, y_example : arrays shaped like a batch of x and y (the batch dimension stays free).
    variables : optional list of the variables (tf or Keras) the step uses, for their names; every variable
        the step touches is found from the traced function's captures anyway (an optimizer's slots, its
        iteration count and learning rate included).
    optimizer : the Keras optimizer the step applies (default: the one Keras optimizer the function refers
        to as a global or closure variable, if there is exactly one). A Keras 3 optimizer's update is
        decomposed into elementwise ops; they run as its CANN Apply* operator (SGD: ApplyGradientDescent or
        ApplyMomentum, Adam/AdamW: ApplyAdam, RMSprop: ApplyRMSProp), black-listed, so in float32 under
        the mixed modes, as in the Keras path. Without one, a hand-written update runs as its own ops.
    name : the step's name in dumps (default: the function's name).
    loss_from : ``"return"`` (the loss is what the function returns) or ``"tape"`` (the target of its
        ``tape.gradient`` call, for a step that returns something else, such as Keras' ``train_step``,
        whose logs hold the running mean of the loss).

    Returns
    -------
    TrainStep
        Its ``initial`` state is the variables' values now (after any variable the first trace creates,
        such as a Keras optimizer's slots, exists); the variables themselves are never changed: the
        reference run (``function``) restores them after each step.
    """
    tf = import_tf()
    if isinstance(fn, tf.types.experimental.ConcreteFunction):
        raise AscendEmuError("pass the tf.function itself (or its Python function), not a ConcreteFunction: the "
                             "step is retraced with loss scaling")
    py = getattr(fn, "python_function", fn)
    if not callable(py):
        raise AscendEmuError("train_step_from_tf_function needs a tf.function or a Python function, not "
                             f"{type(fn).__name__}")
    fname = name or getattr(py, "__name__", None) or "train_step"
    if loss_from not in ("return", "tape"):
        raise AscendEmuError(f"loss_from must be 'return' or 'tape', not {loss_from!r}")
    opt = _keras_optimizer(py, optimizer)
    update_type = None
    if opt is not None:
        kind = type(opt).__name__
        update_type = KERAS_UPDATE_TYPES.get(kind)
        if kind == "SGD" and float(getattr(opt, "momentum", 0.0) or 0.0) != 0.0:
            update_type = "ApplyMomentum"
    x_example, y_example = np.asarray(x_example), np.asarray(y_example)
    if x_example.ndim == 0 or y_example.ndim == 0:
        raise AscendEmuError("x_example and y_example must be batches (a leading batch dimension)")
    specs = [tf.TensorSpec((None, *x_example.shape[1:]), tf.as_dtype(x_example.dtype), name="x"),
             tf.TensorSpec((None, *y_example.shape[1:]), tf.as_dtype(y_example.dtype), name="y"),
             tf.TensorSpec((), tf.float32, name="loss_scale"),
             tf.TensorSpec((), tf.int64, name="iteration")]
    grads: list = []

    def traced(x, y, loss_scale, iteration):
        del grads[:]       # a tf.function that creates variables traces twice
        targets: list = []
        with _scaled_gradients(loss_scale, grads, targets):
            out = py(x, y)
        loss = _tape_loss(targets, fname) if loss_from == "tape" else _loss_of(out, fname)
        return [loss] + list(grads)

    try:
        cf = tf.function(traced, input_signature=specs).get_concrete_function()
    except AscendEmuError:
        raise
    except Exception as e:
        user = traced_error(e)
        if user is not None:
            raise AscendEmuError(f"cannot trace training step {fname!r}: {user}; eager-only code (.numpy(), Python "
                                 "decisions on tensor values) cannot run as a traced step") from None
        raise AscendEmuError(f"cannot trace training step {fname!r}: {first_line(e)} "
                             "(does it take (x, y) shaped like x_example and y_example?)") from None
    n_grads = len(cf.outputs) - 1
    if n_grads == 0:
        raise AscendEmuError(f"training step {fname!r} computes no gradient (no tf.GradientTape.gradient call)")

    # the variables: every captured resource handle; names from the variables given or the function's own
    known = {}
    for v in list(variables or ()) + list(cf.graph.variables):
        try:
            handle = v.handle
        except Exception:
            continue
        known.setdefault(id(handle), (getattr(v, "path", None) or v.name.split(":")[0], v))
    specs_, captures, handles, initial, used = [], {}, [], {}, set()
    for external, internal in cf.graph.captures:
        ph = internal.op.name
        if internal.dtype == tf.resource:
            vname, var = known.get(id(external), (None, None))
            if var is not None:
                dtype, shape = np.dtype(var.dtype.as_numpy_dtype if hasattr(var.dtype, "as_numpy_dtype")
                                        else var.dtype).name, list(var.shape)
            else:
                dtype, shape = _handle_spec(external)
                vname = ph.replace("/ReadVariableOp/resource", "").replace("/resource", "")
            vname = _free(used, vname)
            used.add(vname)
            value = tf.raw_ops.ReadVariableOp(resource=external, dtype=tf.as_dtype(dtype)).numpy()
            spec = VariableSpec(ph, f"variable/{vname}", dtype, list(value.shape), vname)
            specs_.append(spec)
            handles.append((external, tf.as_dtype(dtype)))
            initial[spec.key] = np.array(value, copy=True)
        else:
            try:
                captures[ph] = external.numpy()
            except Exception:
                raise AscendEmuError(f"training step {fname!r} captures a symbolic tensor ({external.name}); "
                                     "pass it as an argument or a variable") from None
    if not specs_:
        raise AscendEmuError(f"training step {fname!r} uses no variable; nothing to train")

    gd = cf.graph.as_graph_def()
    fetches = [tensor_name(t.name) for t in cf.outputs]
    inputs = [t.op.name for t in cf.inputs[:4]]
    fn_out = functionalize(gd, specs_, fetches, targets=[op.name for op in cf.graph.control_outputs],
                           captures=captures, extra_inputs=inputs, name=f"training step {fname!r}")

    def reference(x, y, loss_scale, iteration, *state):
        """TensorFlow's own step on the variables, from ``state``; the variables are restored after."""
        saved = [tf.raw_ops.ReadVariableOp(resource=h, dtype=dt) for h, dt in handles]
        for (h, _), s in zip(handles, state):
            tf.raw_ops.AssignVariableOp(resource=h, value=s)
        rec: list = []
        targets: list = []
        with _scaled_gradients(loss_scale, rec, targets):
            out = py(x, y)
        loss = _tape_loss(targets, fname) if loss_from == "tape" else _loss_of(out, fname)
        new = [tf.raw_ops.ReadVariableOp(resource=h, dtype=dt) for h, dt in handles]
        with tf.control_dependencies(new + [loss] + rec):
            for (h, _), s in zip(handles, saved):
                tf.raw_ops.AssignVariableOp(resource=h, value=s)
        return [loss] + rec + new

    state_specs = [tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for v in specs_]
    ref = tf.function(reference, input_signature=specs + state_specs)
    step = _make_step(ref, fn_out, name=fname, x=inputs[0], y=inputs[1], scale=inputs[2], iteration=inputs[3],
                      variables=specs_, initial=initial, n_grads=n_grads, update_type=update_type,
                      description={"kind": "tf_function", "function": fname, "updates": fn_out.writes,
                                   **({"optimizer": type(opt).__name__, "update_type": update_type}
                                      if opt is not None else {})})
    step.handles = {spec.key: h for spec, h in zip(specs_, handles)}
    return step


def fast_call(cf):
    """``cf()`` (a ConcreteFunction taking tensors only) called the way TensorFlow's own ``_call_flat`` calls it when no
    gradient tape watches: its atomic function on the arguments and the captures, without the Python of binding the
    arguments to the signature and checking for tapes (~60-80 us a call). The emulator's own hand-over functions
    (variable reads and writes, metric results and resets) are never differentiated. ``cf`` itself where TensorFlow
    lacks that path or a capture is made anew per call. Executing eagerly, the call goes straight to the C function
    the atomic function's own path ends in (:func:`_direct_call`)."""
    try:
        fn = cf._inference_function
        call = fn.call_preflattened
        caps = list(cf._captured_inputs)
    except AttributeError:
        return cf
    if any(callable(c) for c in caps):
        return cf
    caps = list(cf.captured_inputs)
    direct = _direct_call(fn, caps)

    def run(*args):
        if direct is not None:
            out = direct(args)
            if out is not _NOT_DIRECT:
                return out
        return call(list(args) + caps)
    return run


_NOT_DIRECT = object()


def _direct_call(fn, caps):
    """``direct(args)``: atomic function ``fn`` run on ``args`` and the captures ``caps`` by ``TFE_Py_Execute``, as
    ``call_flat`` -> ``context.call_function`` -> ``execute.quick_execute`` run it when executing eagerly with no
    cancellation manager (the function call options read at each call, as there), its outputs packed as
    ``call_preflattened`` packs them; :data:`_NOT_DIRECT` where that path does not apply (then the caller takes
    TensorFlow's). The Python layers in between (the error interpolation, the control-dependency and tape
    scopes, which do nothing eagerly for a function nobody differentiates) cost a hand-over call ~150-200 us with
    the caches cold after a replay (benchmarks/RESULTS.md, session 25). None where TensorFlow lacks a part of it or an
    output carries handle data (a resource or variant: call_flat sets it on the outputs)."""
    try:
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import cancellation, core

        ctx = fn._bound_context
        name = fn.name.decode() if isinstance(fn.name, bytes) else str(fn.name)
        types = fn.function_type.flat_outputs
        pack = fn.function_type.pack_output
        execute = pywrap_tfe.TFE_Py_Execute
        status_error = core._NotOkStatusException
        to_exception = core._status_to_exception
        current_cancellation = cancellation.context
        if any(t.dtype._handle_data for t in types):
            return None
    except AttributeError:
        return None
    nout = len(types)

    def direct(args):
        if not ctx.executing_eagerly() or current_cancellation() is not None:
            return _NOT_DIRECT
        opts = ctx.function_call_options.as_attrs()
        attrs = ("executor_type", opts["executor_type"], "config_proto", opts["config_proto"])
        ctx.ensure_initialized()
        try:
            outs = execute(ctx._handle, ctx.device_name, name, list(args) + caps, attrs, nout)
        except status_error as e:
            raise to_exception(e) from None
        return pack(outs or None)
    return direct


def _reader(step: TrainStep, first=None):
    """The step's variables read in one call (a traced function of ReadVariableOps, made once per step and ``first``):
    the eager reads cost a dispatch each. ``first``: a function of no arguments traced in front of the reads (its
    writes come first: automatic control dependencies), e.g. Keras' reset of the metrics; None where it cannot be
    traced."""
    readers = step.__dict__.setdefault("_readers", {})
    reader = readers.get(first, False)
    if reader is False:
        tf = import_tf()
        handles = list(step.handles.values())

        def read_all():
            if first is not None:
                first()
            return [tf.raw_ops.ReadVariableOp(resource=h, dtype=dt) for h, dt in handles]
        try:
            reader = fast_call(tf.function(read_all, autograph=False).get_concrete_function())
        except Exception:
            if first is None:
                raise
            reader = None       # ``first`` only runs eagerly
        readers[first] = reader
    return reader


def read_variables(step: TrainStep, first=None) -> dict:
    """State key -> the current value of each variable of a :func:`train_step_from_tf_function` step.

    The values are read-only views of the tensors the reads returned (no copy): TensorFlow never changes a
    tensor it has handed out (a later write of the variable gets a buffer of its own while the read is alive).
    ``first``: a function of no arguments run before the reads, in the same traced call where it can be traced."""
    if step.handles is None:
        raise AscendEmuError("this TrainStep has no variables to read (build it with train_step_from_tf_function)")
    reader = _reader(step, first) if first is not None else None
    if reader is None:
        if first is not None:
            first()
        reader = _reader(step)
    return {k: _view(t) for k, t in zip(step.handles, reader())}


def _view(t) -> np.ndarray:
    try:
        return np.asarray(memoryview(t))
    except (TypeError, ValueError):     # a dtype the buffer protocol does not carry (bfloat16): a copy
        return np.asarray(t.numpy())


def _assigner():
    """``assign(handle, array)``: one eager ``AssignVariableOp`` through TensorFlow's C fast path (the op by name, no
    ``tf.raw_ops`` wrapper: 27 against 35-40 us an assign); ``tf.raw_ops`` where that path is missing."""
    tf = import_tf()
    try:
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import context

        execute = pywrap_tfe.TFE_Py_FastPathExecute
        ctx = context.context()
    except (ImportError, AttributeError):
        return lambda h, v: tf.raw_ops.AssignVariableOp(resource=h, value=v)

    def assign(h, v):
        execute(ctx, "AssignVariableOp", None, h, v, "validate_shape", False)
    return assign


#: a variable of this many bytes or more is written on its own (its aligned array becomes the variable's buffer
#: without a copy); smaller ones together in one call (their copies cost less than a dispatch each)
ALONE_BYTES = 1 << 16
#: the dtypes the packed write carries (a 1-D array per dtype, split in the traced writer: exact)
_PACKED = ("float32", "float16", "float64", "int32", "int64")


def _packed_writer(step: TrainStep, keys: tuple, then=None):
    """``write(*packed)``: the variables ``keys`` written in one traced call from one 1-D array per dtype (their
    values raveled and concatenated in ``keys``' order), then ``then()`` traced into the same call (its reads of
    the variables come after the writes: automatic control dependencies) and returned; made once per step, set of
    keys and ``then`` (None: the call cannot be traced, see :func:`assign_variables`)."""
    writers = step.__dict__.setdefault("_writers", {})
    wkey = (keys, then)
    if wkey in writers:
        return writers[wkey]
    tf = import_tf()
    groups: dict = {}
    for k in keys:
        h, dt = step.handles[k]
        groups.setdefault(dt.name, []).append(k)
    order = tuple(groups)
    shapes = {k: step._shapes[k] for k in keys}

    def write(*packed):
        for name, flat in zip(order, packed):
            ks = groups[name]
            parts = tf.split(flat, [int(np.prod(shapes[k], dtype=np.int64)) for k in ks]) if len(ks) > 1 else [flat]
            for k, part in zip(ks, parts):
                tf.raw_ops.AssignVariableOp(resource=step.handles[k][0], value=tf.reshape(part, shapes[k]))
        return then() if then is not None else None
    specs = [tf.TensorSpec((sum(int(np.prod(shapes[k], dtype=np.int64)) for k in groups[n]),), tf.as_dtype(n))
             for n in order]
    try:
        cf = tf.function(write, autograph=False).get_concrete_function(*specs)
    except Exception:
        if then is None:
            raise
        writers[wkey] = None       # ``then`` only runs eagerly
        return None
    w = writers[wkey] = (order, groups, fast_call(cf))
    return w


def assign_variables(step: TrainStep, state: dict, before: dict | None = None, then=None):
    """Write ``state`` (state key -> value) into the variables of a :func:`train_step_from_tf_function` step;
    with ``before`` (the state as read), only the values that are not the very arrays read (a training step
    hands back the array it was given for a variable it leaves alone, and nothing for a skipped step).

    TensorFlow has no op writing several variables, and one inside a traced function copies its input, so a large
    variable (``ALONE_BYTES`` or more) is one eager ``AssignVariableOp``: its 64-byte-aligned array (the device's
    large outputs are, ``kernels/alloc.py``) becomes the variable's buffer without a copy. The small ones go in one
    traced call, their values packed into one array per dtype (a dispatch costs more than copying them).

    ``then``: a function of no arguments (Keras' ``get_metrics_result``) traced after the writes into the same call
    when there is one to make (small variables were written), its result returned; else :data:`NOT_RUN` is returned
    and the caller runs it."""
    tf = import_tf()
    assign = step.__dict__.get("_assign")
    if assign is None:
        assign = step.__dict__["_assign"] = _assigner()
    shapes = step.__dict__.get("_shapes")
    if shapes is None:
        shapes = step.__dict__["_shapes"] = {k: tuple(s.shape) for k, s in read_variables(step).items()}
    small = []
    for k, (h, dt) in step.handles.items():
        v = state[k]
        if before is not None and v is before.get(k):
            continue
        if v.dtype != dt.as_numpy_dtype:
            v = tf.constant(v, dtype=dt)
        elif v.nbytes < ALONE_BYTES and dt.name in _PACKED and tuple(v.shape) == shapes[k]:
            small.append(k)
            continue
        assign(h, v)
    if len(small) > 1 or (then is not None and small):
        made = _packed_writer(step, tuple(small), then)
        if made is not None:
            return _write_packed(made, state)
        if len(small) > 1:
            _write_packed(_packed_writer(step, tuple(small)), state)
            small = []
    for k in small:
        assign(step.handles[k][0], state[k])
    return NOT_RUN if then is not None else None


#: what :func:`assign_variables` returns when its ``then`` did not run
NOT_RUN = object()


def _write_packed(made, state: dict):
    """Call a :func:`_packed_writer` on ``state``'s values, one 1-D array per dtype."""
    tf = import_tf()
    order, groups, write = made
    return write(*[tf.constant(np.concatenate([np.ravel(state[k]) for k in groups[n]]) if len(groups[n]) > 1
                               else np.ravel(state[groups[n][0]])) for n in order])

"""A Keras model's training step as one plain graph: forward, backward, loss scaling, optimizer update.

The step is traced as a ``tf.function`` whose every piece of state is an input and every
new value an output, so the emulated device replays it like any inference graph and keeps
the state itself (:mod:`ascend_emu.npu.training`)::

    (x, y, loss_scale, iteration, trainable..., non_trainable..., slots...)
        -> (loss, grads..., new trainable..., new non_trainable..., new slots...)

- forward: ``model.stateless_call(trainable, non_trainable, x, training=True)`` (BatchNorm's
  moving statistics and the dropout seed state come back as new non-trainable values);
- backward: ``tf.GradientTape`` on ``loss * loss_scale`` (ops named ``gradient_tape/...``), then
  the gradients are multiplied by ``1 / loss_scale`` as the Ascend TF adapter's
  NPULossScaleOptimizer does (name scope ``loss_scale_unscale``);
- update: the optimizer's update written as tensor ops (name scope ``update``). Keras 3 refuses
  ``stateless_apply`` on the TensorFlow backend, so :class:`FunctionalOptimizer` writes the same
  update formulas as ``keras.optimizers.{SGD, Adam, AdamW, RMSprop}.update_step``, op for op;
  ``tests/frontend/test_training.py`` holds it against Keras' own ``apply`` bit for bit.

The reference run (TensorFlow float32) calls the same traced function, so both sides run the
same graph and their dumps line up op by op.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import AscendEmuError
from ...graph.core import split_tensor_name
from .optimizers import (APPLY_OPS, LOSSES, OPTIMIZERS, FunctionalOptimizer, resolve_loss,  # noqa: F401
                         resolve_optimizer)
from .tf import first_line, import_keras, import_tf

#: name scopes of the traced step, for telling the phases apart
BACKWARD_PREFIXES = ("gradient_tape/", "loss_scale_unscale/")
UPDATE_PREFIX = "update/"
#: the scope of the gradients' unscaling (grad * 1/loss_scale), part of the backward phase
UNSCALE_PREFIX = "loss_scale_unscale/"


def phase_of(op_name: str) -> str:
    """``forward``, ``backward`` or ``update``: where op ``op_name`` of a traced step belongs."""
    if op_name.startswith(UPDATE_PREFIX):
        return "update"
    if op_name.startswith(BACKWARD_PREFIXES):
        return "backward"
    return "forward"


# --------------------------------------------------------------------------- the traced step

@dataclass
class TrainStep:
    """A traced training step and how its inputs and outputs map to the training state.

    ``state`` names every state tensor in input order (``trainable/<path>``,
    ``non_trainable/<path>``, ``slot/<slot>/<path>`` for a Keras model; ``variable/<name>`` for a
    stateful step) with its placeholder; the step's outputs are ``[loss, grads (n_grads of
    them), new state (same order as state)]``.

    Each node's phase is in its ``meta["phase"]`` (:func:`assign_phases` for a Keras model's step,
    from the graph's structure for a stateful step, :mod:`ascend_emu.frontend.tf.stateful`, which also
    carries its state at the start of training in ``initial``).
    """

    function: object                  # the tf ConcreteFunction (or a callable with the same arguments)
    graph: object                     # ascend_emu.graph.Graph of it
    x_name: str
    y_name: str
    scale_name: str
    iteration_name: str
    state: list = field(default_factory=list)        # [(state key, placeholder name, dtype)]
    trainable: list = field(default_factory=list)    # state keys of the trainable variables
    optimizer: FunctionalOptimizer | None = None
    loss_name: str = ""
    #: stateful steps: the number of gradient outputs (else one per trainable variable)
    gradients: int | None = None
    #: stateful steps: state key -> value at the start of training
    initial: dict | None = None
    #: what the step is, for the run's config (kind, loss, updates)
    description: dict = field(default_factory=dict)
    #: the variables behind the state, state key -> (resource handle, dtype) for a tf.function step, the
    #: VariableSpec for a TF1 graph's (to read and write the user's variables, frontend/hooks.py)
    handles: dict | None = None

    @property
    def n_grads(self) -> int:
        return self.gradients if self.gradients is not None else len(self.trainable)

    def fit_data(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``x`` and ``y`` checked against the step's placeholders, cast to their dtypes within a kind."""
        specs = {s.name: s for s in self.graph.inputs}
        out = []
        for role, arr, ph in (("x", x, self.x_name), ("y", y, self.y_name)):
            spec = specs[ph]
            if spec.shape is not None and (len(spec.shape) != arr.ndim or any(
                    d is not None and d != n for d, n in zip(spec.shape[1:], arr.shape[1:]))):
                want = tuple("?" if d is None else d for d in spec.shape)
                raise AscendEmuError(f"training data {role} has samples of shape {tuple(arr.shape[1:])} but the "
                                     f"step's {ph!r} takes {want} (batch first)")
            want_dt = np.dtype(spec.dtype)
            if arr.dtype != want_dt:
                if arr.dtype.kind in "iub" and want_dt.kind in "iu" or arr.dtype.kind == want_dt.kind == "f":
                    arr = arr.astype(want_dt)
                else:
                    raise AscendEmuError(f"training data {role} has dtype {arr.dtype} but the step's {ph!r} "
                                         f"takes {want_dt}")
            out.append(arr)
        return out[0], out[1]

    def phase(self, op_name: str) -> str:
        """The phase of op ``op_name``: its node's ``meta["phase"]`` (see :func:`assign_phases`), else by
        name (ops inside a loop body, ``<loop>/body/<k>/...``, take their name scope's phase)."""
        phases = self._phases
        if phases is None:
            phases = self._phases = {n.name: n.meta["phase"] for n in self.graph.nodes if "phase" in n.meta}
        p = phases.get(op_name)
        if p is None:
            # a Cast the device inserts before an op (``<op>/ascend_cast_...``) runs in that op's phase; a fused op
            # has the name of the op it ends. Kept for the next replay (asked for every record of every step)
            p = phases[op_name] = phases.get(op_name.split("/ascend_cast_")[0]) or phase_of(op_name)
        return p

    _phases: dict | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        # the run's state among the step's inputs (its dumps say which, so two runs' steps compare as such)
        self.graph.state_inputs = [ph for _, ph, _ in self.state] + [self.scale_name]


def assign_phases(graph) -> dict:
    """Set ``meta["phase"]`` on every node of a traced step and return the counts per phase.

    ``update``: in the optimizer's name scope. ``backward``: in the gradient tape's or the unscale's
    scope, or fed by a backward op (the tape's gradient sums, ``AddN`` at the top level, carry no
    scope). ``forward``: the rest, which by construction depends on no backward op.
    """
    counts = {"forward": 0, "backward": 0, "update": 0}
    phase = {}
    for node in graph.nodes:                 # topological order
        p = phase_of(node.name)
        if p == "forward" and any(phase.get(split_tensor_name(r)[0]) == "backward" for r in node.inputs):
            p = "backward"
        phase[node.name] = p
        node.meta["phase"] = p
        counts[p] += 1
    return counts


def _safe(path: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_" else "_" for ch in path)


def trace_train_step(model, loss_fn, fopt: FunctionalOptimizer, x_example: np.ndarray,
                     y_example: np.ndarray) -> TrainStep:
    """Trace one training step of Keras ``model`` for batches shaped like the examples (batch dim free)."""
    tf = import_tf()
    from .loader import load_graph

    tv = list(model.trainable_variables)
    ntv = list(model.non_trainable_variables)
    if not tv:
        raise AscendEmuError(f"model {model.name!r} has no trainable variables; nothing to train")
    slot_names = fopt.slot_names()
    sig = [tf.TensorSpec((None, *x_example.shape[1:]), tf.as_dtype(x_example.dtype), name="x"),
           tf.TensorSpec((None, *y_example.shape[1:]), tf.as_dtype(y_example.dtype), name="y"),
           tf.TensorSpec((), tf.float32, name="loss_scale"),
           tf.TensorSpec((), tf.int64, name="iteration")]
    state = []
    for kind, vars_ in (("trainable", tv), ("non_trainable", ntv)):
        for i, v in enumerate(vars_):
            name = f"{kind[0]}{i}_{_safe(v.path)}"
            sig.append(tf.TensorSpec(v.shape, v.dtype, name=name))
            state.append((f"{kind}/{v.path}", name, np.dtype(v.dtype).name))
    for s in slot_names:
        for i, v in enumerate(tv):
            name = f"s_{s}_{i}_{_safe(v.path)}"
            sig.append(tf.TensorSpec(v.shape, v.dtype, name=name))
            state.append((f"slot/{s}/{v.path}", name, np.dtype(v.dtype).name))
    nt, nn = len(tv), len(ntv)

    def step(x, y, scale, iteration, *st):
        t = list(st[:nt])
        n = list(st[nt:nt + nn])
        flat_slots = list(st[nt + nn:])
        slots = [[flat_slots[k * nt + i] for k in range(len(slot_names))] for i in range(nt)]
        with tf.GradientTape() as tape:
            tape.watch(t)
            pred, n2 = model.stateless_call(t, n, x, training=True)
            loss = loss_fn(y, pred)
            scaled = loss * scale
        grads = tape.gradient(scaled, t)
        with tf.name_scope("loss_scale_unscale"):
            inv = 1.0 / scale
            grads = [g * inv for g in grads]
        with tf.name_scope("update"):
            t2, s2 = fopt.apply(grads, t, slots, iteration)
        flat_s2 = [s2[i][k] for k in range(len(slot_names)) for i in range(nt)]
        return [loss] + list(grads) + list(t2) + list(n2) + flat_s2

    try:
        fn = tf.function(step, input_signature=sig, autograph=False)
        cf = fn.get_concrete_function()
    except AscendEmuError:
        raise
    except Exception as e:
        raise AscendEmuError(f"cannot trace a training step of model {model.name!r}: {first_line(e)} "
                             "(do x and y in --data fit the model's input and loss?)") from None
    missing = [v.path for v, g in zip(tv, cf.structured_outputs[1:1 + nt]) if g is None]
    if missing:
        raise AscendEmuError(f"no gradient reaches variable(s) {', '.join(missing[:5])}; "
                             "they are not connected to the loss")
    graph = load_graph(cf)
    graph.name = f"{model.name}_train_step"
    assign_phases(graph)
    for node in graph.nodes:
        # the update and the loss-scale unscale run as the optimizer's Apply* operator (black list: float32);
        # the unscale's dtype is an assumption (NUMERICS.md section 10)
        if node.meta["phase"] == "update" or node.name.startswith(UNSCALE_PREFIX):
            node.meta["ascend_type"] = fopt.apply_type
    by_key = {s.key or s.name: s.name for s in graph.inputs}

    def ph(name):
        return by_key.get(name, name)

    step_info = TrainStep(cf, graph, ph("x"), ph("y"), ph("loss_scale"), ph("iteration"),
                          [(k, ph(n), dt) for k, n, dt in state],
                          [k for k, _, _ in state if k.startswith("trainable/")], fopt,
                          loss_name=graph.outputs[0])
    return step_info


def initial_state(model, fopt: FunctionalOptimizer | None) -> dict:
    """State key -> float32 array: the model's variables and zero optimizer slots (Keras' initial values);
    for a stateful :class:`TrainStep`, a copy of its ``initial`` state."""
    if isinstance(model, TrainStep):
        return {k: np.array(v, copy=True) for k, v in model.initial.items()}
    state = {}
    for v in model.trainable_variables:
        state[f"trainable/{v.path}"] = np.array(v.numpy(), copy=True)
    for v in model.non_trainable_variables:
        state[f"non_trainable/{v.path}"] = np.array(v.numpy(), copy=True)
    for s in fopt.slot_names():
        for v in model.trainable_variables:
            state[f"slot/{s}/{v.path}"] = np.zeros(v.shape, np.dtype(v.dtype))
    return state


def reinitialised_state(model, fopt: FunctionalOptimizer | None, seed: int) -> dict:
    """The initial state of ``model`` as a fresh copy initialised under Keras' global ``seed`` would
    have it (``keras.models.clone_model``: same layers and variable paths, new initial values; an
    initializer with a fixed seed of its own gives the same values again, as it would on every rank)."""
    if isinstance(model, TrainStep):
        raise AscendEmuError("rank_init by seed needs a Keras model; for a TrainStep give the rank's state as "
                             "a dict (state key -> array)")
    keras = import_keras()
    keras.utils.set_random_seed(int(seed))
    try:
        clone = keras.models.clone_model(model)
    except Exception as e:
        raise AscendEmuError(f"cannot re-initialise model {model.name!r} for rank_init: {first_line(e)}") from None
    want = initial_state(model, fopt)
    # the clone's variables come in the model's order; their paths may differ (a loaded model's carry no
    # model-name prefix, a clone's do), so they are matched by position and shape
    got = list(initial_state(clone, fopt).values())
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want.values())):
        raise AscendEmuError(f"model {model.name!r} cloned for rank_init has other variables than the model; "
                             "give the rank's state as a dict instead")
    return dict(zip(want, got))


def run_reference_step(step: TrainStep, feeds: dict) -> list[np.ndarray]:
    """TensorFlow's own float32 execution of the traced step (the ConcreteFunction, no fetches; a TF1 graph's
    step runs its own Session and is given the arrays, so nothing is added to a default graph of the
    caller's: a TF1 script runs inside ``with graph.as_default()`` or with eager execution disabled)."""
    tf = import_tf()
    names = [s.name for s in step.graph.inputs]
    fn_types = (tf.types.experimental.ConcreteFunction, tf.types.experimental.PolymorphicFunction)
    args = [tf.constant(feeds[n]) if isinstance(step.function, fn_types) else feeds[n] for n in names]
    try:
        outs = step.function(*args)
    except Exception as e:
        raise AscendEmuError(f"TensorFlow failed to run the training step: {first_line(e)}") from None
    return [np.asarray(o) for o in outs]

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

from ..errors import AscendEmuError
from ..graph.core import split_tensor_name
from .tf import first_line, import_keras, import_tf

#: optimizers and the Keras config keys each understands
OPTIMIZERS = {
    "sgd": ("SGD", ("learning_rate", "momentum", "nesterov")),
    "adam": ("Adam", ("learning_rate", "beta_1", "beta_2", "epsilon", "amsgrad")),
    "adamw": ("AdamW", ("learning_rate", "beta_1", "beta_2", "epsilon", "amsgrad", "weight_decay")),
    "rmsprop": ("RMSprop", ("learning_rate", "rho", "momentum", "epsilon", "centered")),
}
#: loss names the CLI accepts (any Keras loss identifier works through keras.losses.get)
LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy",
          "mean_squared_error", "mean_absolute_error")
#: the CANN operator each optimizer's update runs as (its precision list decides the update's dtype)
APPLY_OPS = {"sgd": "ApplyGradientDescent", "sgd_momentum": "ApplyMomentum", "adam": "ApplyAdam",
             "adamw": "ApplyAdam", "rmsprop": "ApplyRMSProp"}
#: Keras optimizer options this emulation does not model; a model compiled with them is refused
_UNSUPPORTED = ("clipnorm", "clipvalue", "global_clipnorm", "use_ema", "gradient_accumulation_steps",
                "loss_scale_factor")

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


# --------------------------------------------------------------------------- loss and optimizer

def resolve_loss(model, loss=None):
    """The Keras loss object: ``loss`` (a name or a loss) or the compiled model's."""
    keras = import_keras()
    spec = loss if loss is not None else getattr(model, "loss", None)
    if spec is None:
        raise AscendEmuError("the model has no loss: compile it with one or pass --loss NAME "
                             f"(e.g. {', '.join(LOSSES)})")
    if isinstance(spec, (list, tuple, dict)):
        raise AscendEmuError("models with several losses are not supported yet; pass one --loss")
    if isinstance(spec, str) and spec.endswith("_from_logits"):
        base = spec[:-len("_from_logits")]
        try:
            cls = type(keras.losses.get(base))
        except (ValueError, TypeError):
            raise AscendEmuError(f"unknown loss {spec!r}; use a Keras loss name such as {', '.join(LOSSES)}") from None
        return cls(from_logits=True)
    try:
        obj = keras.losses.get(spec)
    except (ValueError, TypeError):
        raise AscendEmuError(f"unknown loss {spec!r}; use a Keras loss name such as {', '.join(LOSSES)} "
                             "(append _from_logits for logits)") from None
    if obj is None:
        raise AscendEmuError(f"unknown loss {spec!r}; use a Keras loss name such as {', '.join(LOSSES)}")
    if not isinstance(obj, keras.losses.Loss):
        # a loss function (what a name such as "mean_squared_error" gives): per-sample values, averaged
        # over the batch as Keras' compile does
        cls = getattr(keras.losses, "".join(w.capitalize() for w in getattr(obj, "__name__", "").split("_")), None)
        if isinstance(cls, type) and issubclass(cls, keras.losses.Loss):
            obj = cls()
        else:
            from keras.src.losses.losses import LossFunctionWrapper

            obj = LossFunctionWrapper(obj, name=getattr(obj, "__name__", None))
    return obj


@dataclass
class FunctionalOptimizer:
    """One of Keras 3's optimizers as a pure function of (gradients, params, slots, iteration).

    ``kind`` is ``sgd``, ``adam``, ``adamw`` or ``rmsprop``; ``config`` holds its hyperparameters
    with Keras' defaults; ``schedule`` is a Keras LearningRateSchedule (or None).
    """

    kind: str
    config: dict
    schedule: object = None

    @classmethod
    def from_keras(cls, opt) -> "FunctionalOptimizer":
        keras = import_keras()
        name = type(opt).__name__.lower()
        if name not in OPTIMIZERS:
            raise AscendEmuError(f"optimizer {type(opt).__name__} is not supported; use one of: "
                                 + ", ".join(v[0] for v in OPTIMIZERS.values()))
        cfg = opt.get_config()
        bad = [k for k in _UNSUPPORTED if cfg.get(k) not in (None, False, 0)]
        if bad:
            raise AscendEmuError(f"optimizer option(s) {', '.join(bad)} are not emulated; compile without them")
        keys = OPTIMIZERS[name][1]
        conf = {k: cfg[k] for k in keys if k in cfg}
        schedule = None
        lr = opt._learning_rate
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            schedule = lr
            conf["learning_rate"] = None
        else:
            conf["learning_rate"] = float(np.asarray(opt.learning_rate))
        if name == "adamw" and cfg.get("exclude_from_weight_decay"):
            raise AscendEmuError("AdamW's exclude_from_weight_decay is not emulated; compile without it")
        return cls(name, conf, schedule)

    @classmethod
    def build(cls, name: str, **options) -> "FunctionalOptimizer":
        """By name (``sgd``, ``adam``, ``adamw``, ``rmsprop``) with Keras' defaults for what is not given."""
        keras = import_keras()
        key = str(name).lower()
        if key not in OPTIMIZERS:
            raise AscendEmuError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")
        keras_cls = getattr(keras.optimizers, OPTIMIZERS[key][0])
        allowed = OPTIMIZERS[key][1]
        given = {k: v for k, v in options.items() if v is not None}
        wrong = [k for k in given if k not in allowed]
        if wrong:
            raise AscendEmuError(f"optimizer {key} takes no {', '.join(wrong)}; its options: {', '.join(allowed)}")
        try:
            return cls.from_keras(keras_cls(**given))
        except (TypeError, ValueError) as e:
            raise AscendEmuError(f"optimizer {key}: {first_line(e)}") from None

    def keras_optimizer(self):
        """A fresh Keras optimizer of this configuration (for the reference and for comparison)."""
        keras = import_keras()
        conf = dict(self.config)
        if self.schedule is not None:
            conf["learning_rate"] = self.schedule
        return getattr(keras.optimizers, OPTIMIZERS[self.kind][0])(**conf)

    @property
    def apply_type(self) -> str:
        """The CANN ``Apply*`` operator this update runs as on the NPU."""
        if self.kind == "sgd":
            return APPLY_OPS["sgd_momentum" if self.config.get("momentum", 0.0) else "sgd"]
        return APPLY_OPS[self.kind]

    def slot_names(self) -> list[str]:
        c = self.config
        if self.kind == "sgd":
            return ["momentum"] if c.get("momentum", 0.0) != 0 else []
        if self.kind in ("adam", "adamw"):
            return ["momentum", "velocity"] + (["velocity_hat"] if c.get("amsgrad") else [])
        # rmsprop
        return (["velocity"] + (["momentum"] if c.get("momentum", 0.0) > 0 else [])
                + (["average_gradient"] if c.get("centered") else []))

    def to_dict(self) -> dict:
        out = {"name": OPTIMIZERS[self.kind][0], **{k: v for k, v in self.config.items() if v is not None}}
        if self.schedule is not None:
            out["learning_rate"] = {"schedule": type(self.schedule).__name__,
                                    **{k: v for k, v in self.schedule.get_config().items()
                                       if isinstance(v, (int, float, str, bool))}}
        return out

    # -- the update, as tensor ops (same op sequence as keras.optimizers.*.update_step) ----------
    def apply(self, grads, params, slots, iteration):
        """New (params, slots) after one step; ``slots[i]`` lists param i's slots in ``slot_names`` order."""
        tf = import_tf()
        c = self.config
        if self.schedule is not None:
            lr_all = self.schedule(iteration)
        else:
            lr_all = tf.constant(c["learning_rate"], tf.float32)
        new_params, new_slots = [], []
        for g, p, s in zip(grads, params, slots):
            lr = tf.cast(lr_all, p.dtype)
            g = tf.cast(g, p.dtype)
            if self.kind == "adamw" and c.get("weight_decay"):
                # Keras applies the decoupled weight decay before the update step
                wd = tf.cast(c["weight_decay"], p.dtype)
                p = p - p * wd * lr
            if self.kind == "sgd":
                p, s = self._sgd(g, p, s, lr)
            elif self.kind in ("adam", "adamw"):
                p, s = self._adam(g, p, s, lr, iteration)
            else:
                p, s = self._rmsprop(g, p, s, lr)
            new_params.append(p)
            new_slots.append(s)
        return new_params, new_slots

    def _sgd(self, g, p, s, lr):
        tf = import_tf()
        mom = self.config.get("momentum", 0.0)
        if mom == 0:
            return p - g * lr, []
        (m,) = s
        momentum = tf.cast(mom, p.dtype)
        m = m * momentum - g * lr
        if self.config.get("nesterov"):
            p = p + (m * momentum - g * lr)
        else:
            p = p + m
        return p, [m]

    def _adam(self, g, p, s, lr, iteration):
        tf = import_tf()
        c = self.config
        local_step = tf.cast(iteration + 1, p.dtype)
        beta_1_power = tf.pow(tf.cast(c["beta_1"], p.dtype), local_step)
        beta_2_power = tf.pow(tf.cast(c["beta_2"], p.dtype), local_step)
        m, v = s[0], s[1]
        alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        m = m + (g - m) * (1 - c["beta_1"])
        v = v + (tf.square(g) - v) * (1 - c["beta_2"])
        out = [m, v]
        if c.get("amsgrad"):
            v_hat = tf.maximum(s[2], v)
            out.append(v_hat)
            v = v_hat
        p = p - (m * alpha) / (tf.sqrt(v) + c["epsilon"])
        return p, out

    def _rmsprop(self, g, p, s, lr):
        tf = import_tf()
        c = self.config
        rho = c["rho"]
        names = self.slot_names()
        slot = dict(zip(names, s))
        vel = slot["velocity"] * rho + tf.square(g) * (1 - rho)
        out = {"velocity": vel}
        if c.get("centered"):
            avg = slot["average_gradient"] * rho + g * (1 - rho)
            out["average_gradient"] = avg
            denominator = vel - tf.square(avg) + c["epsilon"]
        else:
            denominator = vel + c["epsilon"]
        increment = (lr * g) / tf.sqrt(denominator)
        if c.get("momentum", 0.0) > 0:
            mom = slot["momentum"] * c["momentum"] + increment
            out["momentum"] = mom
            p = p - mom
        else:
            p = p - increment
        return p, [out[n] for n in names]


def resolve_optimizer(model, optimizer=None, **options) -> FunctionalOptimizer:
    """``optimizer`` (a name, with ``options`` such as learning_rate) or the compiled model's."""
    if optimizer is None:
        opt = getattr(model, "optimizer", None)
        if opt is None:
            raise AscendEmuError("the model has no optimizer: compile it with one or pass --optimizer NAME "
                                 f"({', '.join(OPTIMIZERS)})")
        fopt = FunctionalOptimizer.from_keras(opt)
        given = {k: v for k, v in options.items() if v is not None}
        if given:
            conf = {**fopt.config, **given}
            return FunctionalOptimizer.build(fopt.kind, **{k: v for k, v in conf.items() if v is not None})
        return fopt
    if isinstance(optimizer, FunctionalOptimizer):
        return optimizer
    if isinstance(optimizer, str):
        return FunctionalOptimizer.build(optimizer, **options)
    return FunctionalOptimizer.from_keras(optimizer)


# --------------------------------------------------------------------------- the traced step

@dataclass
class TrainStep:
    """A traced training step and how its inputs and outputs map to the training state.

    ``state`` names every state tensor in input order (``trainable/<path>``,
    ``non_trainable/<path>``, ``slot/<slot>/<path>`` for a Keras model; ``variable/<name>`` for a
    stateful step) with its placeholder; the step's outputs are ``[loss, grads (n_grads of
    them), new state (same order as state)]``.

    Each node's phase is in its ``meta["phase"]`` (:func:`assign_phases` for a Keras model's step,
    from the graph's structure for a stateful step, :mod:`ascend_emu.frontend.stateful`, which also
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
        if self._phases is None:
            self._phases = {n.name: n.meta["phase"] for n in self.graph.nodes if "phase" in n.meta}
        # a Cast the device inserts before an op (``<op>/ascend_cast_...``) runs in that op's phase
        return self._phases.get(op_name) or self._phases.get(op_name.split("/ascend_cast_")[0]) \
            or phase_of(op_name)

    _phases: dict | None = field(default=None, repr=False, compare=False)


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
    """TensorFlow's own float32 execution of the traced step (the ConcreteFunction, no fetches)."""
    tf = import_tf()
    names = [s.name for s in step.graph.inputs]
    args = [tf.constant(feeds[n]) for n in names]
    try:
        outs = step.function(*args)
    except Exception as e:
        raise AscendEmuError(f"TensorFlow failed to run the training step: {first_line(e)}") from None
    return [np.asarray(o) for o in outs]

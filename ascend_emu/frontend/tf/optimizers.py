"""The loss and the optimizer of a training step: Keras losses by name, and :class:`FunctionalOptimizer`,
Keras 3's SGD, Adam, AdamW and RMSprop ``update_step`` written as tensor ops (the traced step of
:mod:`ascend_emu.frontend.tf.training` calls it; ``tests/frontend/test_training.py`` holds it against Keras'
own ``apply`` bit for bit)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import AscendEmuError
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


def resolve_loss(model, loss=None):
    """The Keras loss object: ``loss`` (a name or a loss) or the compiled model's."""
    keras = import_keras()
    spec = loss if loss is not None else getattr(model, "loss", None)
    if spec is None:
        raise AscendEmuError("the model has no loss: compile it with one or pass --loss NAME "
                             f"(e.g. {', '.join(LOSSES)})")
    if isinstance(spec, (list, tuple, dict)):
        raise AscendEmuError("models with several losses are not supported yet; pass one --loss")
    logits = isinstance(spec, str) and spec.endswith("_from_logits")
    name = spec[:-len("_from_logits")] if logits else spec
    try:
        obj = keras.losses.get(name)
    except (ValueError, TypeError):
        obj = None
    if obj is None:
        raise AscendEmuError(f"unknown loss {spec!r}; use a Keras loss name such as {', '.join(LOSSES)} "
                             "(append _from_logits for logits)")
    if isinstance(obj, keras.losses.Loss):
        cls = type(obj)
    else:
        # a loss function (what a name such as "mean_squared_error" gives): per-sample values, averaged
        # over the batch as Keras' compile does
        cls = getattr(keras.losses, "".join(w.capitalize() for w in getattr(obj, "__name__", "").split("_")), None)
        if not (isinstance(cls, type) and issubclass(cls, keras.losses.Loss)):
            cls = None
    if logits:
        try:
            return cls(from_logits=True)
        except TypeError:   # cls is None, or a loss without a from_logits argument
            raise AscendEmuError(f"loss {name!r} takes no logits, so {spec!r} does not exist; drop _from_logits or "
                                 "use a cross-entropy loss") from None
    if isinstance(obj, keras.losses.Loss):
        return obj
    if cls is not None:
        return cls()
    from keras.src.losses.losses import LossFunctionWrapper

    return LossFunctionWrapper(obj, name=getattr(obj, "__name__", None))


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

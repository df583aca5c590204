"""Training on the emulated NPU: whole steps (forward, backward, loss scaling, optimizer update).

Each step replays the traced step graph (:mod:`ascend_emu.frontend.tf.training`) on the device with
the current state as inputs: every op on the emulated units with the precision lists deciding its
dtype, the fusion passes, the overflow model. The device keeps the state (float32 master weights,
BatchNorm statistics, optimizer slots) between steps in its own dtype.

Loss scaling follows the Ascend TF adapter's NPULossScaleOptimizer (ASCEND-FACTS.md sections 5
and 10): the loss is multiplied by the scale, the gradients by its inverse, and the overflow
decision reads the **float status register** after the backward pass (the forward and backward
ops' status bits), so under saturation mode an overflow that saturates to 65504 still skips the
step; ``overflow_check="isfinite"`` instead checks the gradients for Inf/NaN, as Keras'
LossScaleOptimizer does, to show what it misses under saturation. A skipped step keeps the old
state and the manager lowers the scale.

The optimizer's update ops run as CANN's ``Apply*`` operators, which the default lists put on the
black list: they compute in float32 whatever the precision mode (NUMERICS.md section 10).
"""
from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import AscendEmuError
from ..fileio import check_output_dir
from ..frontend.inputs import check_seed, load_npz
from .loss_scale import ExponentialUpdateLossScaleManager, FixedLossScaleManager
from .train_result import TrainResult  # noqa: F401  (part of this module's API)
from .bn_chain import bn_dx_graph
from .eltwise_reduce import eltwise_reduce_graph
from .update_chain import update_chain_graph

#: Keras' LossScaleOptimizer defaults (ASCEND-FACTS section 10): 2**15, x2 after 2000 finite steps, /2 on overflow
KERAS_DYNAMIC = {"init": 2.0 ** 15, "incr_every": 2000, "decr_every": 1, "incr_ratio": 2.0, "decr_ratio": 0.5}
#: the TF adapter's ExponentialUpdateLossScaleManager defaults for what ``exponential:`` leaves out
EXPONENTIAL_DEFAULTS = {"init": 2.0 ** 15, "incr_every": 1000, "decr_every": 2, "incr_ratio": 2.0, "decr_ratio": 0.8}
OVERFLOW_CHECKS = ("status", "isfinite")
#: what a training's ``dump_options`` may set (:meth:`Device.replay`'s keywords)
DUMP_OPTIONS = ("stats_only", "select", "digest")


def loss_scale_manager(spec):
    """A loss-scale manager from ``none``, ``fixed:N``, ``dynamic`` or ``exponential:k=v,...`` (or a manager)."""
    if spec is None or spec == "none":
        return None
    if isinstance(spec, (FixedLossScaleManager, ExponentialUpdateLossScaleManager)):
        return spec
    if not isinstance(spec, str):
        raise AscendEmuError(f"loss_scale must be none, fixed:N, dynamic or exponential:..., not {spec!r}")
    kind, _, rest = spec.partition(":")
    if kind == "fixed":
        try:
            scale = float(rest)
        except ValueError:
            raise AscendEmuError(f"--loss-scale {spec!r}: write fixed:1024") from None
        return FixedLossScaleManager(scale)
    if kind == "dynamic" and not rest:
        k = KERAS_DYNAMIC
    elif kind == "exponential":
        k = dict(EXPONENTIAL_DEFAULTS)
        for item in filter(None, rest.split(",")):
            key, eq, val = item.partition("=")
            if not eq or key.strip() not in k:
                raise AscendEmuError(f"--loss-scale {spec!r}: unknown setting {item!r}; settings: {', '.join(k)}")
            try:
                k[key.strip()] = float(val)
            except ValueError:
                raise AscendEmuError(f"--loss-scale {spec!r}: {key.strip()} must be a number") from None
            if not math.isfinite(k[key.strip()]):
                raise AscendEmuError(f"--loss-scale {spec!r}: {key.strip()} must be a finite number")
    else:
        raise AscendEmuError(f"--loss-scale {spec!r}: choose none, fixed:N, dynamic or "
                             "exponential:init=..,incr_every=..,decr_every=..,incr_ratio=..,decr_ratio=..")
    for key in ("incr_every", "decr_every"):
        if k[key] != int(k[key]):
            raise AscendEmuError(f"--loss-scale {spec!r}: {key} must be a whole number")
    return ExponentialUpdateLossScaleManager(k["init"], int(k["incr_every"]), int(k["decr_every"]),
                                             k["incr_ratio"], k["decr_ratio"])


def _manager_dict(m) -> dict | str:
    if m is None:
        return "none"
    if isinstance(m, FixedLossScaleManager):
        return {"kind": "fixed", "loss_scale": m.loss_scale}
    return {"kind": "exponential", "init": m.init_loss_scale, "incr_every": m.incr_every_n_steps,
            "decr_every": m.decr_every_n_nan_or_inf, "incr_ratio": m.incr_ratio, "decr_ratio": m.decr_ratio}


# --------------------------------------------------------------------------- data

def load_data(data) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) from an ``.npz`` path with arrays ``x`` and ``y``, a dict, or a pair of arrays."""
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        data = load_npz(path, f"--data {path}")
    if isinstance(data, dict):
        missing = [k for k in ("x", "y") if k not in data]
        if missing:
            raise AscendEmuError(f"training data needs arrays x and y; missing {', '.join(missing)} "
                                 f"(has: {', '.join(sorted(data)) or 'nothing'})")
        x, y = data["x"], data["y"]
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        x, y = data
    else:
        raise AscendEmuError("training data must be an .npz path, a dict with x and y, or a pair (x, y)")
    x, y = np.asarray(x), np.asarray(y)
    for name, a in (("x", x), ("y", y)):
        if a.dtype.kind not in "fiub":
            raise AscendEmuError(f"training data {name} has dtype {a.dtype}; numbers only")
        if a.ndim == 0 or len(a) == 0:
            raise AscendEmuError(f"training data {name} is empty")
    if len(x) != len(y):
        raise AscendEmuError(f"training data has {len(x)} samples in x but {len(y)} in y")
    if x.dtype.kind == "f" and x.dtype != np.float32:
        x = x.astype(np.float32)
    if y.dtype.kind == "f" and y.dtype != np.float32:
        y = y.astype(np.float32)
    return x, y


#: the most steps a run accepts (a Python sequence's length must fit a signed 64-bit integer)
MAX_STEPS = 2 ** 62


class BatchOrder(Sequence):
    """Sample indices of each step's batch, made as they are read: in order (or a seeded permutation per epoch),
    partial last batches kept. Only the epoch being read is held, so the number of steps costs no memory (a run
    of 10^20 steps starts at once and stops when interrupted); reading an earlier epoch again replays the
    permutations from the seed (the same batches every time)."""

    def __init__(self, n: int, batch_size: int, steps: int, *, shuffle: bool, seed: int):
        self.n, self.batch_size, self.steps, self.shuffle, self.seed = int(n), int(batch_size), int(steps), shuffle, seed
        self.per_epoch = math.ceil(self.n / self.batch_size)
        self._epoch, self._order, self._rng = -1, None, None

    def __len__(self) -> int:
        return self.steps

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:      # every epoch in file order
            if self._order is None:
                self._order = np.arange(self.n)
            return self._order
        if epoch < self._epoch or self._rng is None:
            self._rng, self._epoch = np.random.default_rng(self.seed), -1
        while self._epoch < epoch:
            self._order = self._rng.permutation(self.n)
            self._epoch += 1
        return self._order

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.steps))]
        if i < 0:
            i += self.steps
        if not 0 <= i < self.steps:
            raise IndexError(f"step {i} of {self.steps}")
        epoch, b = divmod(i, self.per_epoch)
        return self._epoch_order(epoch)[b * self.batch_size:(b + 1) * self.batch_size]


def batch_order(n: int, batch_size: int, steps: int, *, shuffle: bool, seed: int) -> BatchOrder:
    """Sample indices of each step's batch (:class:`BatchOrder`: made as they are read)."""
    return BatchOrder(n, batch_size, steps, shuffle=shuffle, seed=seed)


# --------------------------------------------------------------------------- the loop

def _load_model(model):
    from ..frontend.tf.tf import first_line, import_keras

    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise AscendEmuError(f"model {path}: no such file; give a .keras file")
        if not path.endswith(".keras"):
            raise AscendEmuError(f"model {path}: training needs a Keras model (.keras file)")
        from ..frontend.tf.sources import check_keras_archive

        check_keras_archive(path)
        keras = import_keras()
        try:
            with warnings.catch_warnings():
                # Keras warns that the saved optimizer's variables do not match a fresh one; training builds
                # its own optimizer state from the compile config, so that is expected
                warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
                return keras.saving.load_model(path, safe_mode=True)
        except Exception as e:
            raise AscendEmuError(f"model {path}: cannot load it ({first_line(e)})") from None
    if not hasattr(model, "stateless_call"):
        raise AscendEmuError("training needs a Keras 3 model (or a .keras file)")
    return model


@dataclass
class _Run:
    """What both the emulated run and the reference run need: the traced step, the data, the batches."""

    model: object
    step_graph: object
    fopt: object
    x: np.ndarray
    y: np.ndarray
    order: BatchOrder
    steps: int
    dump_steps: list
    manager: object
    config: dict


def _prepare(model, data, *, loss, optimizer, learning_rate, optimizer_options, batch_size, steps, epochs,
             loss_scale, shuffle, seed, dump_dir, dump_steps, overwrite, dump_roots=()) -> _Run:
    """Check every argument (before anything runs), load the model and data, trace the step."""
    from ..frontend.tf import training as T

    if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
        raise AscendEmuError(f"batch_size must be a positive integer, got {batch_size!r}")
    check_seed(seed)
    if isinstance(learning_rate, (int, float, np.floating)) and not (math.isfinite(learning_rate)
                                                                     and learning_rate >= 0):
        raise AscendEmuError(f"learning_rate must be a finite number >= 0, got {learning_rate!r}")
    x, y = load_data(data)
    per_epoch = math.ceil(len(x) / batch_size)
    if steps is None and epochs is None:
        steps = per_epoch
    elif steps is None:
        if not isinstance(epochs, (int, np.integer)) or isinstance(epochs, bool) or epochs < 1:
            raise AscendEmuError(f"epochs must be a positive integer, got {epochs!r}")
        steps = per_epoch * int(epochs)
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 1:
        raise AscendEmuError(f"steps must be a positive integer, got {steps!r}")
    steps = int(steps)
    if steps > MAX_STEPS:    # the batches are made as they are read (BatchOrder): only len() bounds them
        raise AscendEmuError(f"{steps} steps are more than any run can take (at most {MAX_STEPS}); give fewer "
                             "--steps or --epochs")
    try:
        dump_steps = sorted(set(int(s) for s in (dump_steps or ())))
    except (TypeError, ValueError):
        raise AscendEmuError(f"dump steps must be step numbers, got {dump_steps!r}") from None
    bad = [s for s in dump_steps if not 0 <= s < steps]
    if bad:
        raise AscendEmuError(f"dump step(s) {', '.join(map(str, bad))} are outside the run (steps 0..{steps - 1})")
    if dump_steps and dump_dir is None:
        raise AscendEmuError("dump_steps needs dump_dir (--dump DIR)")
    if dump_dir is not None and not dump_steps:
        dump_steps = [0, steps - 1] if steps > 1 else [0]
    for root in (dump_dir, *dump_roots) if dump_dir is not None else ():
        # never through a link: the --dump directory, its reference/ part and each step-N (the writer
        # sees only step-N, so a linked DUMP or DUMP/reference would be followed by its makedirs)
        check_output_dir(root, "--dump", root=dump_dir)
        for s in dump_steps:
            check_output_dir(os.path.join(os.fspath(root), f"step-{s}"), "--dump", root=root)
    if dump_dir is not None and not overwrite:
        for root in (dump_dir, *dump_roots):
            for s in dump_steps:
                d = os.path.join(os.fspath(root), f"step-{s}")
                if os.path.lexists(d):
                    raise AscendEmuError(f"dump {d} already exists; pass --overwrite (overwrite=True) to replace "
                                         "it or choose another --dump directory")
    manager = loss_scale_manager(loss_scale)

    if isinstance(model, T.TrainStep):
        return _prepare_step(model, x, y, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
                             optimizer_options=optimizer_options, batch_size=batch_size, steps=steps,
                             shuffle=shuffle, seed=seed, dump_steps=dump_steps, manager=manager)
    model = _load_model(model)
    loss_fn = T.resolve_loss(model, loss)
    fopt = T.resolve_optimizer(model, optimizer, learning_rate=learning_rate, **(optimizer_options or {}))
    in_shape = tuple(model.inputs[0].shape[1:]) if getattr(model, "inputs", None) else None
    if in_shape is not None and (len(in_shape) != x.ndim - 1 or any(
            d is not None and d != s for d, s in zip(in_shape, x.shape[1:]))):
        raise AscendEmuError(f"training data x has samples of shape {tuple(x.shape[1:])} but the model takes "
                             f"{tuple(in_shape)}")
    step_graph = T.trace_train_step(model, loss_fn, fopt, x[:1], y[:1])
    order = batch_order(len(x), batch_size, steps, shuffle=shuffle, seed=seed)
    config = {"loss": getattr(loss_fn, "name", type(loss_fn).__name__),
              "optimizer": fopt.to_dict(), "batch_size": int(batch_size), "steps": steps,
              "loss_scale": _manager_dict(manager), "shuffle": bool(shuffle),
              "seed": int(seed), "samples": int(len(x)), "model": {"name": model.name,
                                                                     "fingerprint": step_graph.graph.fingerprint}}
    return _Run(model, step_graph, fopt, x, y, order, steps, dump_steps, manager, config)


def _prepare_step(step, x, y, *, loss, optimizer, learning_rate, optimizer_options, batch_size, steps, shuffle,
                  seed, dump_steps, manager) -> _Run:
    """A ready :class:`~ascend_emu.frontend.tf.training.TrainStep` (a stateful step converted by
    :mod:`ascend_emu.frontend.tf.stateful`): it carries its loss, update and initial state."""
    given = [k for k, v in (("loss", loss), ("optimizer", optimizer), ("learning_rate", learning_rate),
                            ("optimizer_options", optimizer_options)) if v]
    if given:
        raise AscendEmuError(f"a TrainStep carries its own loss and update; drop {', '.join(given)}")
    if step.initial is None:
        raise AscendEmuError("this TrainStep has no initial state; build it with train_step_from_tf_function or "
                             "train_step_from_tf1_graph")
    x, y = step.fit_data(x, y)
    order = batch_order(len(x), batch_size, steps, shuffle=shuffle, seed=seed)
    desc = step.description
    config = {"loss": desc.get("loss", desc.get("function", "")), "optimizer": {"updates": desc.get("updates", {})},
              "step": desc.get("kind", ""), "batch_size": int(batch_size), "steps": steps,
              "loss_scale": _manager_dict(manager), "shuffle": bool(shuffle), "seed": int(seed),
              "samples": int(len(x)), "model": {"name": step.graph.name, "fingerprint": step.graph.fingerprint}}
    return _Run(step, step, None, x, y, order, steps, dump_steps, manager, config)


def _progress(enabled: bool, steps: int, desc: str):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=steps, desc=desc, unit="step", leave=False, dynamic_ncols=True, disable=None)


def _tick(bar, rec: dict) -> None:
    """One step on the progress bar, with its loss and loss scale."""
    if bar is not None:
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.4g}", scale=f"{rec['loss_scale']:.3g}", refresh=False)


def _store(state: dict, keys, values) -> None:
    """Write a step's new state back, each value in its state's own dtype (float32 master weights)."""
    for key, v in zip(keys, values):
        state[key] = np.asarray(v, dtype=state[key].dtype)


def _zeros(arrays) -> int:
    return int(sum(int(np.count_nonzero(np.asarray(g) == 0)) for g in arrays))


def train(device, model, data, *, loss=None, optimizer=None, learning_rate=None, optimizer_options=None,
          batch_size: int = 32, steps: int | None = None, epochs: int | None = None, loss_scale=None,
          shuffle: bool = False, seed: int = 0, dump_dir=None, dump_steps=None, reference: bool = False,
          reference_dump_dir=None, overflow_check: str = "status", overwrite: bool = False,
          progress: bool = True, dump_options: dict | None = None) -> TrainResult:
    """Train ``model`` on ``device``; see :meth:`ascend_emu.npu.device.Device.train`."""
    from ..frontend.tf import training as T

    if overflow_check not in OVERFLOW_CHECKS:
        raise AscendEmuError(f"unknown overflow_check {overflow_check!r}; choose one of: {', '.join(OVERFLOW_CHECKS)}")
    rroot = None
    if reference and dump_dir is not None:
        rroot = reference_dump_dir if reference_dump_dir is not None else os.path.join(os.fspath(dump_dir), "reference")
    run = _prepare(model, data, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
                   optimizer_options=optimizer_options, batch_size=batch_size, steps=steps, epochs=epochs,
                   loss_scale=loss_scale, shuffle=shuffle, seed=seed, dump_dir=dump_dir, dump_steps=dump_steps,
                   overwrite=overwrite, dump_roots=(rroot,) if rroot is not None else ())
    step_graph, manager = run.step_graph, run.manager
    dump_options = dict(dump_options or {})
    bad = set(dump_options) - set(DUMP_OPTIONS)
    if bad:
        raise AscendEmuError(f"unknown dump option(s) {', '.join(sorted(bad))}; choose from: {', '.join(DUMP_OPTIONS)}")
    if dump_dir is not None:
        copies = len(run.dump_steps) * (2 if rroot is not None else 1)
        _disk_check(step_dump_bytes(step_graph, int(batch_size), stats_only=bool(dump_options.get("stats_only")))
                    * copies, dump_dir,
                    f"the dump of {len(run.dump_steps)} step(s)" + (" and their reference" if rroot else ""))
    state = T.initial_state(run.model, run.fopt)
    ref_state = {k: v.copy() for k, v in state.items()} if reference else None
    config = {"device": device.config(), **run.config, "overflow_check": overflow_check,
              "reference": bool(reference)}
    result = TrainResult(config, [], state, ref_state)
    bar = _progress(progress, run.steps, "train")
    try:
        for i, idx in enumerate(run.order):
            ddir = os.path.join(os.fspath(dump_dir), f"step-{i}") if i in run.dump_steps else None
            # the float32 reference dump of the very same step: the emulated step's inputs and weights, so the
            # two dumps compare op by op
            dump_feeds = step_feeds(step_graph, run.x[idx], run.y[idx], i, manager.get_loss_scale()
                                    if manager is not None else 1.0, dict(state)) if reference and ddir else None
            rec = run_step(device, step_graph, run.x[idx], run.y[idx], i, state, manager=manager,
                           overflow_check=overflow_check, dump_dir=ddir, overwrite=overwrite,
                           dump_options=dump_options)
            if ddir is not None:
                result.dumps[i] = ddir
            if reference:
                rdir = os.path.join(os.fspath(rroot), f"step-{i}") if ddir is not None else None
                rec.update(reference_step(step_graph, run.x[idx], run.y[idx], i, ref_state, dump_dir=rdir,
                                          dump_feeds=dump_feeds, overwrite=overwrite))
                if rdir is not None:
                    result.reference_dumps[i] = rdir
            result.steps.append(rec)
            _tick(bar, rec)
    finally:
        if bar is not None:
            bar.close()
    return result


def step_feeds(step_graph, x, y, i: int, scale: float, state: dict) -> dict:
    """The inputs of one replay of ``step_graph``: the batch, the loss scale, the iteration, the state."""
    feeds = {step_graph.x_name: x, step_graph.y_name: y, step_graph.scale_name: np.float32(scale),
             step_graph.iteration_name: np.int64(i)}
    for key, ph, _ in step_graph.state:
        feeds[ph] = state[key]
    return feeds


def run_step(device, step_graph, x, y, i: int, state: dict, *, manager=None, overflow_check: str = "status",
             dump_dir=None, overwrite: bool = False, dump_options: dict | None = None) -> dict:
    """One training step of ``step_graph`` on ``device`` from ``state``, which it updates in place.

    The step replays with the manager's loss scale; the overflow decision reads the float status of the
    forward and backward ops (``overflow_check="status"``, as NPULossScaleOptimizer) or the gradients'
    Inf/NaN (``"isfinite"``); the manager records it, and only an applied step writes its new state
    (each value in its state's own dtype). Returns the step's record, the fields of ``train --json``
    (``step`` is ``i``).
    """
    scale = manager.get_loss_scale() if manager is not None else 1.0
    feeds = step_feeds(step_graph, x, y, i, scale, state)
    # without a dump, the optimizer's update chains run as one node each (the same bits and status)
    # (and batch norm's fp16 input gradients as one node each: npu/bn_chain.py; an fp16 elementwise node read only
    # by a reduction, with that reduction: npu/eltwise_reduce.py)
    graph = (step_graph.graph if dump_dir is not None
             else eltwise_reduce_graph(device, bn_dx_graph(device, update_chain_graph(device, step_graph.graph))))
    res = device.replay(graph, feeds, dump_dir, overwrite=overwrite, progress=False,
                        keep_tensors=False, phases=step_graph.phase, launch=i, disk_check=False,
                        **(dump_options or {}))
    ng = step_graph.n_grads
    outs = [res.outputs[t] for t in graph.outputs]
    grads = outs[1:1 + ng]
    bits, first = step_status(res.records, step_graph.phase)
    applied = step_applied(manager, overflow_check, bits, grads)
    if applied:
        _store(state, [k for k, _, _ in step_graph.state], outs[1 + ng:1 + ng + len(step_graph.state)])
    return step_record(i, float(np.asarray(outs[0], np.float64)), scale, applied, bits, first, grads)


def step_status(records, phase, **where) -> tuple[int, dict | None]:
    """The float status a step's overflow decision reads: the OR of the forward and backward ops' status
    bits (the update ops run after the decision), and the first of those ops that set any, as
    ``{"name", "tf_type", "phase"}`` plus ``where`` (e.g. the rank)."""
    bits, first = 0, None
    for r in records:
        if r.status and phase(r.name) != "update":
            bits |= r.status
            if first is None:
                first = {"name": r.name, "tf_type": r.tf_type, "phase": phase(r.name), **where}
    return bits, first


def step_applied(manager, overflow_check: str, bits: int, grads) -> bool:
    """Whether the step's update is applied: overflow read from the float status (``"status"``) or from the
    gradients' Inf/NaN (``"isfinite"``); the loss-scale manager records the decision."""
    if overflow_check == "status":
        overflow = bits != 0
    else:
        overflow = not all(bool(np.isfinite(np.asarray(g, np.float64)).all()) for g in grads)
    return manager.update(not overflow) if manager is not None else True


def step_record(i: int, loss: float, scale, applied: bool, bits: int, first, grads) -> dict:
    """A step's record with the fields of ``train --json`` (``reference_loss`` null until a reference run
    of the step fills it)."""
    return {"step": i, "loss": loss, "reference_loss": None, "loss_scale": float(scale), "skipped": not applied,
            "float_status": int(bits), "first_overflow": first, "grad_zeros": _zeros(grads),
            "grad_values": int(sum(np.asarray(g).size for g in grads))}


def reference_step(step_graph, x, y, i: int, state: dict, *, dump_dir=None, dump_feeds=None,
                   overwrite: bool = False) -> dict:
    """TensorFlow float32's own run of the same step (unscaled) from ``state``, which it updates in place;
    returns ``reference_loss`` and ``reference_grad_zeros``. With ``dump_dir``, the reference dump of the
    step's graph is written there from ``dump_feeds`` (default: this run's own inputs)."""
    from ..frontend.tf import training as T
    from ..frontend.tf.reference import reference as tf_reference

    feeds = step_feeds(step_graph, x, y, i, 1.0, state)
    ng = step_graph.n_grads
    rout = T.run_reference_step(step_graph, feeds)
    _store(state, [k for k, _, _ in step_graph.state], rout[1 + ng:1 + ng + len(step_graph.state)])
    if dump_dir is not None:
        tf_reference(step_graph.graph, dump_feeds if dump_feeds is not None else feeds, dump_dir,
                     overwrite=overwrite, progress=False)
    return {"reference_loss": float(np.asarray(rout[0], np.float64)), "reference_grad_zeros": _zeros(rout[1:1 + ng])}


def step_dump_bytes(step_graph, batch_size: int, *, stats_only: bool = False) -> int:
    """About how many bytes the dump of one step takes (:func:`~ascend_emu.analysis.dump.graph_dump_bytes` of
    the traced step at ``batch_size``; a small CNN's step dumps about half of it)."""
    from ..analysis.dump import graph_dump_bytes

    return graph_dump_bytes(step_graph.graph.nodes, batch_size, stats_only=stats_only)


def _disk_check(nbytes: int, target, what: str, fix: str = "dump fewer steps (--dump-steps) or free space") -> None:
    """Refuse (one line, nothing written) a dump the disk will not hold; announce one over about 1 GB."""
    import sys

    from ..analysis.dump import check_disk_space

    line = check_disk_space(nbytes, target, what, fix=fix)
    if line:
        print(f"ascend-emu: {line}", file=sys.stderr, flush=True)


def training_step_bytes(model, data, *, loss=None, optimizer=None, learning_rate=None, optimizer_options=None,
                        batch_size: int = 32, steps: int | None = None, epochs: int | None = None, loss_scale=None,
                        shuffle: bool = False, seed: int = 0, stats_only: bool = False) -> int:
    """About how many bytes the dump of one step of this training (as :func:`train` with these arguments)
    takes (:func:`step_dump_bytes`), from the traced step, before anything runs."""
    run = _prepare(model, data, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
                   optimizer_options=optimizer_options, batch_size=batch_size, steps=steps, epochs=epochs,
                   loss_scale=loss_scale, shuffle=shuffle, seed=seed, dump_dir=None, dump_steps=None, overwrite=False)
    return step_dump_bytes(run.step_graph, int(batch_size), stats_only=stats_only)


def first_step(model, data, *, loss=None, optimizer=None, learning_rate=None, optimizer_options=None,
               batch_size: int = 32, steps: int | None = None, epochs: int | None = None, loss_scale=None,
               shuffle: bool = False, seed: int = 0):
    """The traced step and step 0's feeds (its batch, the initial weights and optimizer state, the initial
    loss scale) of the training :meth:`Device.train` runs with the same arguments: what an op-by-op
    comparison of step 0 replays (the emulated device) and runs in float32 (the reference)."""
    from ..frontend.tf import training as T

    run = _prepare(model, data, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
                   optimizer_options=optimizer_options, batch_size=batch_size, steps=steps, epochs=epochs,
                   loss_scale=loss_scale, shuffle=shuffle, seed=seed, dump_dir=None, dump_steps=None, overwrite=False)
    state = T.initial_state(run.model, run.fopt)
    idx = run.order[0]
    scale = run.manager.get_loss_scale() if run.manager is not None else 1.0
    return run.step_graph, step_feeds(run.step_graph, run.x[idx], run.y[idx], 0, scale, state)


def reference_train(model, data, *, loss=None, optimizer=None, learning_rate=None, optimizer_options=None,
                    batch_size: int = 32, steps: int | None = None, epochs: int | None = None, loss_scale=None,
                    shuffle: bool = False, seed: int = 0, dump_dir=None, dump_steps=None, overwrite: bool = False,
                    progress: bool = True, on_step=None) -> TrainResult:
    """The same training in TensorFlow float32 on the CPU: the traced step run as TensorFlow runs it.

    Same arguments and result as :meth:`Device.train` (``losses`` are TensorFlow's; ``float_status`` is 0
    and nothing is skipped, since float32 on the CPU has no status register; ``loss_scale`` is accepted
    and recorded, but a float32 step runs unscaled, as Keras does without a LossScaleOptimizer). Dumps
    (``dump_dir/step-N``) are reference dumps of the listed steps, each from this run's own weights.
    ``on_step(i, step, feeds, outputs)``, if given, sees every step: the traced
    :class:`~ascend_emu.frontend.tf.training.TrainStep`, the step's feeds (placeholder -> array) and its outputs
    ``[loss, gradients..., new state...]`` (what ``ascend-emu check`` reads gradient norms from).
    """
    from ..frontend.tf import training as T
    from ..frontend.tf.reference import reference as tf_reference

    run = _prepare(model, data, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
                   optimizer_options=optimizer_options, batch_size=batch_size, steps=steps, epochs=epochs,
                   loss_scale=loss_scale, shuffle=shuffle, seed=seed, dump_dir=dump_dir, dump_steps=dump_steps,
                   overwrite=overwrite)
    sg = run.step_graph
    state = T.initial_state(run.model, run.fopt)
    result = TrainResult({"device": "tensorflow-float32-cpu", **run.config}, [], state)
    ng = sg.n_grads
    keys = [k for k, _, _ in sg.state]
    bar = _progress(progress, run.steps, "reference train")
    try:
        for i, idx in enumerate(run.order):
            feeds = step_feeds(sg, run.x[idx], run.y[idx], i, 1.0, state)
            if i in run.dump_steps:
                ddir = os.path.join(os.fspath(dump_dir), f"step-{i}")
                tf_reference(sg.graph, feeds, ddir, overwrite=overwrite, progress=False)
                result.dumps[i] = ddir
            outs = T.run_reference_step(sg, feeds)
            if on_step is not None:
                on_step(i, sg, feeds, outs)
            _store(state, keys, outs[1 + ng:])
            result.steps.append({"step": i, "loss": float(np.asarray(outs[0], np.float64)), "loss_scale": 1.0,
                                 "skipped": False, "float_status": 0, "first_overflow": None,
                                 "grad_zeros": _zeros(outs[1:1 + ng]),
                                 "grad_values": int(sum(np.asarray(g).size for g in outs[1:1 + ng]))})
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return result

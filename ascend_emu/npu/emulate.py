"""The user's own training script on the emulated NPU: ``with ascend_emu.emulate(...) as run:``.

Inside the context, Keras 3 ``fit`` / ``train_on_batch`` / ``evaluate`` / ``predict``, a ``tf.function``
training step called in the user's loop, and ``tf.compat.v1.Session.run`` of a train op run each
step on an emulated :class:`~ascend_emu.npu.device.Device` (the interceptions are in
:mod:`ascend_emu.frontend.tf.hooks`; which calls are taken and why is said there). Each training step
is the engine of ``ascend-emu train`` (:func:`ascend_emu.npu.training.run_step`): the step's graph
replayed with the variables as state, the loss scaling and the NPU's overflow check, so the run
record (``run.steps``) has the fields of ``train --json``.

The step's numbers go back into the user's variables after every step, so what the script sees
(History, callbacks, ``model.weights``, ``sess.run(w)``) is the emulated run. The state is read from
the variables before every step, so whatever the script or a callback writes between steps (a new
learning rate, restored weights) is what the next step starts from.
"""
from __future__ import annotations

import functools
import math
import os
import warnings

import numpy as np

from ..errors import AscendEmuError
from ..fileio import check_output_dir
from ..numerics.allreduce import default_algorithm, resolve_algorithm
from .data_parallel import check_options, data_parallel_step, split_step
from .device import Device
from .loss_scale import ExponentialUpdateLossScaleManager, FixedLossScaleManager
from .precision import TRAIN_PRECISION_DEFAULT
from .training import OVERFLOW_CHECKS, TrainResult, _disk_check, _manager_dict, loss_scale_manager, reference_step, \
    run_step, step_dump_bytes, step_feeds

#: TF1 train ops whose script wraps its optimizer in NPULossScaleOptimizer: (graph id, op name) -> manager
_TF1_MANAGERS: dict = {}


def register_tf1_loss_scale(graph, op_name: str, manager) -> None:
    """Record that train op ``op_name`` of ``graph`` is loss-scaled by ``manager`` (NPULossScaleOptimizer)."""
    _TF1_MANAGERS[(id(graph), op_name)] = manager


class _EveryStep:
    """``dump_steps="all"``: every step number is in it."""

    def __contains__(self, step) -> bool:
        return True

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "'all'"


_EVERY_STEP = _EveryStep()


class SkippedStepsWarning(UserWarning):
    """Training steps of an emulated script were skipped (an overflow): Keras' running loss leaves them out
    (0.0000 when all are), so :class:`Emulation` says it while the script runs and at its end."""


def _scale_text(scale: float) -> str:
    e = math.log2(scale) if scale > 0 else 0.5
    return f"2^{int(e)}" if e == int(e) and e >= 1 else f"{scale:g}"


class Emulation:
    """An emulated NPU for a user's own script, and the record of the steps it trained.

    Use :func:`emulate` to make one. ``steps`` holds one dict per training step with the fields of
    ``train --json`` (``step``, ``loss``, ``loss_scale``, ``skipped``, ``float_status``,
    ``first_overflow``, ``grad_zeros``, ``grad_values``; ``reference_loss`` and
    ``reference_grad_zeros`` with ``reference=True``) and ``function``, the name of the step's graph.

    Skipped (overflowing) steps are said as they happen: a :class:`SkippedStepsWarning` each time
    ``skipped_warning_every`` more steps have been skipped, and one at the end of the run (the context's
    exit, a wrapped TF1 session's ``close``) when any was: "k of n steps skipped, scale 2^15 -> 1, first
    overflow: op (type), phase, step s".
    """

    #: a SkippedStepsWarning each time this many more training steps have been skipped
    skipped_warning_every = 10

    def __init__(self, precision_mode=None, *, loss_scale=None, dump_dir=None, dump_steps=None,
                 reference: bool = False, overflow_check: str = "status", overwrite: bool = False,
                 ranks: int = 1, allreduce=None, allreduce_dtype=None, **device_options):
        soc = device_options.get("soc", "Ascend910")
        if precision_mode is None and device_options.get("precision_mode_v2") is None:
            precision_mode = TRAIN_PRECISION_DEFAULT.get(soc, "must_keep_origin_dtype")
        try:
            self.device = Device(precision_mode, **device_options)
        except TypeError as e:
            raise AscendEmuError(f"emulate: {e}") from None
        if overflow_check not in OVERFLOW_CHECKS:
            raise AscendEmuError(f"unknown overflow_check {overflow_check!r}; choose one of: "
                                 f"{', '.join(OVERFLOW_CHECKS)}")
        loss_scale_manager(loss_scale)          # check the spelling now, before the script runs
        self.loss_scale = loss_scale
        self.overflow_check = overflow_check
        self.reference = bool(reference)
        self.overwrite = bool(overwrite)
        self.dump_dir = None if dump_dir is None else os.fspath(dump_dir)
        try:
            # "all": every step (the TF adapter's dump with no dump_step)
            self.dump_steps = _EVERY_STEP if dump_steps == "all" else sorted(set(int(s) for s in (dump_steps or ())))
        except (TypeError, ValueError):
            raise AscendEmuError(f"dump steps must be step numbers, got {dump_steps!r}") from None
        if self.dump_steps is not _EVERY_STEP and any(s < 0 for s in self.dump_steps):
            raise AscendEmuError(f"dump steps must be >= 0, got {dump_steps!r}")
        if self.dump_steps and self.dump_dir is None:
            raise AscendEmuError("dump_steps needs dump_dir")
        if self.dump_dir is not None and not self.dump_steps:
            self.dump_steps = [0]
        if self.dump_dir is not None:
            check_output_dir(self.dump_dir, "dump_dir")   # before the script runs; each step's again below
        self.ranks, _ = check_options(ranks, allreduce, allreduce_dtype, None, False, self.dump_dir)
        self.allreduce = resolve_algorithm(allreduce) if allreduce is not None else default_algorithm(self.device.soc)
        self.allreduce_dtype = allreduce_dtype or "float32"
        self.steps: list = []
        self.dumps: dict = {}
        self.reference_dumps: dict = {}
        self._per_step: dict = {}       # step key -> {"manager", "ref_state", "name"}
        self._hooks = None
        self._models: list = []
        self._last_key = None
        self._ended_at = 0              # the number of steps when end() last said its summary

    # -- the runner the hooks call ------------------------------------------------------------
    def _entry(self, key, step, state, loss_scale) -> dict:
        entry = self._per_step.get(key)
        if entry is None:
            if loss_scale is not None:           # the script's own loss scaling
                if isinstance(loss_scale, dict):
                    manager = loss_scale_manager(loss_scale["spec"])
                    manager.good_steps = int(loss_scale.get("good_steps", 0))
                else:
                    manager = loss_scale_manager(loss_scale)
                source = "script"
            else:
                manager = loss_scale_manager(self.loss_scale)
                source = "emulate" if manager is not None else None
            entry = {"manager": manager, "source": source, "name": step.graph.name,
                     "ref_state": {k: np.array(v, copy=True) for k, v in state.items()} if self.reference else None}
            self._per_step[key] = entry
        return entry

    def train(self, step, x, y, state: dict, *, key, loss_scale=None) -> dict:
        """Run one training step of ``step`` (a TrainStep) on the batch from ``state`` (updated in place when
        the step is applied); returns its record, appended to ``steps``."""
        entry = self._entry(key, step, state, loss_scale)
        manager = entry["manager"]
        x, y = step.fit_data(np.asarray(x), np.asarray(y))
        i = len(self.steps)
        ddir = rdir = dump_feeds = None
        if self.dump_dir is not None and i in self.dump_steps:
            # this step's dump (and its reference's), estimated from the traced step: refused past the free space
            _disk_check(step_dump_bytes(step, len(x)) * (2 if self.reference else 1), self.dump_dir,
                        f"the dump of step {i}" + (" and its reference" if self.reference else ""),
                        fix="dump fewer steps (dump_steps) or free space")
            ddir = check_output_dir(os.path.join(self.dump_dir, f"step-{i}"), "dump_dir", root=self.dump_dir)
            if self.reference:
                rdir = check_output_dir(os.path.join(self.dump_dir, "reference", f"step-{i}"), "dump_dir",
                                        root=self.dump_dir)
                dump_feeds = step_feeds(step, x, y, i, manager.get_loss_scale() if manager is not None else 1.0,
                                        dict(state))
        if self.ranks > 1:
            rec = self._train_ranks(step, x, y, i, state, entry, manager)
        else:
            rec = run_step(self.device, step, x, y, i, state, manager=manager, overflow_check=self.overflow_check,
                           dump_dir=ddir, overwrite=self.overwrite)
        if ddir is not None:
            self.dumps[i] = ddir
        if self.reference:
            rec.update(reference_step(step, x, y, i, entry["ref_state"], dump_dir=rdir, dump_feeds=dump_feeds,
                                      overwrite=self.overwrite))
            if rdir is not None:
                self.reference_dumps[i] = rdir
        rec["function"] = entry["name"]
        self.steps.append(rec)
        self._last_key = key
        if rec["skipped"] and self.skipped_steps() % self.skipped_warning_every == 0:
            self._warn_skipped(" so far")
        return rec

    def _train_ranks(self, step, x, y, i: int, state: dict, entry: dict, manager) -> dict:
        """One step over ``ranks`` emulated ranks (:func:`~ascend_emu.npu.data_parallel.data_parallel_step`): rank 0
        starts from the script's variables, the others from their own state (a copy of rank 0's at the first
        step); rank 0's new state goes back to the script."""
        if len(x) % self.ranks:
            raise AscendEmuError(f"emulate: a batch of {len(x)} samples does not split evenly over {self.ranks} "
                                 "ranks; make the batch size a multiple of the ranks (drop_remainder=True)")
        if "split" not in entry:
            entry["split"] = split_step(step)
            entry["states"] = [None] + [{k: np.array(v, copy=True) for k, v in state.items()}
                                        for _ in range(self.ranks - 1)]
        states = entry["states"]
        states[0] = {k: np.array(v, copy=True) for k, v in state.items()}
        rec = data_parallel_step(self.device, entry["split"], states, x, y, i, manager=manager,
                                 overflow_check=self.overflow_check, algorithm=self.allreduce,
                                 dtype=self.allreduce_dtype)
        state.update(states[0])
        return rec

    def skipped_steps(self) -> int:
        return sum(1 for s in self.steps if s["skipped"])

    def skipped_summary(self) -> str | None:
        """One line on the skipped steps ("k of n steps skipped, scale A -> B, first overflow: op (type), phase,
        step s"; B is the scale the next step would use), or None when no step was skipped."""
        k = self.skipped_steps()
        if not k:
            return None
        manager = self._per_step[self._last_key]["manager"] if self._last_key in self._per_step else None
        now = manager.get_loss_scale() if manager is not None else self.steps[-1]["loss_scale"]
        line = (f"{k} of {len(self.steps)} steps skipped, scale {_scale_text(self.steps[0]['loss_scale'])} -> "
                f"{_scale_text(now)}, first overflow: ")
        first = next((s for s in self.steps if s["skipped"] and s["first_overflow"]), None)
        if first is None:
            return line + "not recorded"
        f = first["first_overflow"]
        return line + f"{f['name']} ({f['tf_type']}), {f['phase']}, step {first['step']}"

    def _warn_skipped(self, when: str = "", stacklevel: int = 3) -> None:
        warnings.warn(f"emulate: {self.skipped_summary()}{when}", SkippedStepsWarning, stacklevel=stacklevel)

    def end(self) -> None:
        """The end of the script's training: a SkippedStepsWarning with the summary when steps were skipped
        (once for the same steps)."""
        if self.skipped_steps() and len(self.steps) != self._ended_at:
            self._ended_at = len(self.steps)
            self._warn_skipped(stacklevel=4)        # the script's line: its with statement or sess.close()

    def manager_state(self, key) -> tuple[float, int] | None:
        """(loss scale, finite steps since its last change) of a step's manager, for writing it back into the
        script's LossScaleOptimizer; None without loss scaling."""
        m = self._per_step[key]["manager"]
        if m is None:
            return None
        if isinstance(m, FixedLossScaleManager):
            return m.get_loss_scale(), 0
        return m.get_loss_scale(), m.good_steps

    def forward(self, graph, feeds: dict) -> list:
        """Replay a forward graph (evaluation, prediction) on the device; its outputs in order."""
        res = self.device.replay(graph, feeds, progress=False, keep_tensors=False)
        return [res.outputs[t] for t in graph.outputs]

    def tf1_loss_scale(self, graph, op_name: str):
        return _TF1_MANAGERS.get((id(graph), op_name))

    # -- the record ----------------------------------------------------------------------------
    @property
    def config(self) -> dict:
        managers = {e["name"]: {"loss_scale": _manager_dict(e["manager"]), "from": e["source"]}
                    for e in self._per_step.values()}
        scaling = _manager_dict(loss_scale_manager(self.loss_scale))
        script = [e["manager"] for e in self._per_step.values() if e["source"] == "script"]
        if scaling == "none" and script:
            # the script's own scaling (an NPULossScaleOptimizer, a Keras LossScaleOptimizer) is the run's
            scaling = dict(_manager_dict(script[0]), source="the script's loss-scale optimizer")
        out = {"device": self.device.config(), "steps": len(self.steps), "overflow_check": self.overflow_check,
               "reference": self.reference, "loss_scale": scaling,
               "functions": managers, "model": {"name": ", ".join(sorted(managers)) or "script"}}
        if self.ranks > 1:
            out["data_parallel"] = {"ranks": self.ranks, "allreduce": self.allreduce,
                                    "allreduce_dtype": self.allreduce_dtype,
                                    "hccl_deterministic": self.device.deterministic_level > 0}
        return out

    def to_json(self) -> dict:
        """``{"config", "steps", "dumps", "reference_dumps"}``, as ``train --json`` writes."""
        return {"config": self.config, "steps": self.steps,
                "dumps": {str(k): v for k, v in self.dumps.items()},
                "reference_dumps": {str(k): v for k, v in self.reference_dumps.items()}}

    def result(self) -> TrainResult:
        """The record as a :class:`~ascend_emu.npu.training.TrainResult` (``losses``, ``loss_scales``, ...)."""
        return TrainResult(self.config, self.steps, {}, None, dict(self.dumps), dict(self.reference_dumps))

    def write_report(self, path, **kwargs) -> str:
        """The HTML training report of the steps so far (:func:`ascend_emu.analysis.train_report.write_train_report`)."""
        from ..analysis.train_report import write_train_report

        return write_train_report(self.to_json(), path, **kwargs)

    # -- context manager and decorator ---------------------------------------------------------
    def __enter__(self) -> "Emulation":
        from ..frontend.tf.hooks import Hooks

        if self._hooks is not None:
            raise AscendEmuError("this emulate(...) context is already active; nest a new emulate(...) instead")
        hooks = Hooks(self)
        hooks.install()         # may refuse (another thread's emulation): then nothing is active
        self._hooks = hooks
        return self

    def __exit__(self, *exc) -> None:
        from ..frontend.tf.keras_hooks import reset_keras_functions

        hooks, self._hooks = self._hooks, None
        hooks.uninstall()
        reset_keras_functions(hooks.keras.models)
        if exc[0] is None:
            self.end()

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        wrapper.emulation = self
        return wrapper


def emulate(precision_mode=None, *, loss_scale=None, dump_dir=None, dump_steps=None, reference: bool = False,
            overflow_check: str = "status", overwrite: bool = False, ranks: int = 1, allreduce=None,
            allreduce_dtype=None, **device_options) -> Emulation:
    """Run the training in a user's own script on the emulated NPU: a context manager and a decorator.

    Parameters
    ----------
    precision_mode : CANN precision mode (default: the TF adapter's training default for ``soc``,
        must_keep_origin_dtype where its cube has float32 (Ascend910B, Ascend910_93, Ascend950), else
        allow_fp32_to_fp16); or ``precision_mode_v2=`` (``origin``, ``mixed_float16``, ...) instead, not both.
    loss_scale : None, ``"fixed:N"``, ``"dynamic"``, ``"exponential:..."`` or a manager: loss scaling for
        steps whose script has none (a Keras LossScaleOptimizer or an NPULossScaleOptimizer in the
        script brings its own, which takes precedence).
    dump_dir, dump_steps : a dump of each listed step (global step numbers, default [0]; ``"all"``: every step) in
        ``dump_dir/step-N``; with ``reference``, TensorFlow's of the same inputs in ``dump_dir/reference/step-N``.
        Each is estimated from the traced step first: told on stderr over about 1 GB, refused (one line, nothing
        written) past the free space.
    reference : also run each step in TensorFlow float32 from its own copy of the weights (starting from
        the same values, on the same batches) and record ``reference_loss``.
    overflow_check : ``"status"`` (the float status register, as the NPU) or ``"isfinite"``.
    ranks, allreduce, allreduce_dtype : each step over ``ranks`` emulated data-parallel ranks (the batch in
        contiguous shards, the gradients all-reduced by ``allreduce``, HCCL's algorithm for the SoC by default,
        in ``allreduce_dtype``: NUMERICS.md section 12); no dumps with ranks > 1.
    **device_options : :class:`~ascend_emu.npu.device.Device`'s (soc, precision_mode_v2, allow_hf32,
        overflow_mode, modify_mixlist, ...).

    Returns
    -------
    Emulation
        ``with emulate(...) as run:`` ... ``run.steps``, ``run.write_report(path)``, ``run.result()``.
    """
    return Emulation(precision_mode, loss_scale=loss_scale, dump_dir=dump_dir, dump_steps=dump_steps,
                     reference=reference, overflow_check=overflow_check, overwrite=overwrite, ranks=ranks,
                     allreduce=allreduce, allreduce_dtype=allreduce_dtype, **device_options)


__all__ = ["emulate", "Emulation", "SkippedStepsWarning", "register_tf1_loss_scale",
           "ExponentialUpdateLossScaleManager", "FixedLossScaleManager"]

"""The pre-tuning checklist, automated: every item a program can decide, before any numerics work.

Seed 000 opens accuracy tuning with a numbered checklist (Passed / Failed / Not checked) that rules out
errors in the benchmark model and in the port; seed 003 lists the training problems worth checking
first (data, hyperparameters, model structure, loss curve). :func:`check` runs them on a Keras model and
its training data, plus the checks only an emulator can run (fp16 overflow, fp16 error against float32,
gradient underflow, long fp16 reductions), and returns one :class:`CheckRow` per item.

What runs (all on the samples that pass the dataset check, so one bad sample does not hide the rest):

- the float32 reference (TensorFlow on the CPU) twice, inference on the first batch and ``steps``
  training steps, compared bit for bit (item 1); the first run's gradients per layer, losses, weights and
  step-0 activations feed the model-structure and training items;
- the emulated NPU training for ``steps`` steps on the user's device (precision mode, lists, SoC, loss
  scale, overflow check) beside the float32 reference of the same steps, step 0 dumped by both: the
  precision items read the two dumps.

The rows live by what they read: :mod:`.data_rows` (data and benchmark), :mod:`.precision_rows` (the
emulated run's dumps), :mod:`.training_rows` (the float32 reference); :mod:`.runs` makes the runs and the
context they share; :mod:`.common` holds the row and result types and the tables. Every threshold is in
:data:`THRESHOLDS`; README "Pre-tuning checklist" says what each row decides.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from ...errors import AscendEmuError
from .common import (FAILED, LR_RANGES, NOT_CHECKED, PASSED, RESULTS, THRESHOLDS, CheckResult,  # noqa: F401
                     CheckRow)
from .runs import _Ctx, _read_data, _reference_run
from .data_rows import _row_constant, _row_dataset, _row_order, _run_inference_twice
from .precision_rows import (_row_divergence, _row_loss_scale, _row_mixed_precision, _row_overflow,
                             _row_reductions, _row_underflow)
from .training_rows import (_benchmark_settings, _loss_name, _row_distributed, _row_gradients, _row_hyper,
                            _row_init, _row_loss, _row_lr, _row_saturation, _row_training)


# --------------------------------------------------------------------------- the job

ORDER = ["1", "2/3", "4", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16", "17", "18", "19"]


def check_benchmark_config(cfg: dict) -> None:
    """Item 10 compares the keys both sides state: a misspelt key or a value of the wrong type would make it
    pass by saying nothing, so each key must be one a run states, with a value of its type."""
    import difflib

    from ...frontend.tf.optimizers import OPTIMIZERS

    settings = {k for _, keys in OPTIMIZERS.values() for k in keys}
    numbers = settings - {"nesterov", "amsgrad", "centered"}
    known = {"optimizer", "loss", "batch_size", "epochs"} | settings
    opt = cfg.get("optimizer")
    items = dict(cfg)
    if isinstance(opt, dict):
        items.pop("optimizer")
        items.update({k: v for k, v in opt.items() if k != "name"})
        opt = opt.get("name")
    for key, value in items.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            raise AscendEmuError(f"benchmark config: unknown key {key!r}" + (f" (did you mean {close[0]}?)" if close
                                                                               else "")
                                 + f"; keys: {', '.join(sorted(known))}")
        if key in ("batch_size", "epochs"):
            ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        elif key == "learning_rate":
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) or isinstance(value, dict)
        elif key in numbers:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif key in ("loss", "optimizer"):
            ok = isinstance(value, str)
        else:
            ok = isinstance(value, bool)
        if not ok:
            raise AscendEmuError(f"benchmark config: {key} has the value {value!r}, which is not a "
                                 + {"batch_size": "positive integer", "epochs": "positive integer",
                                    "loss": "loss name", "optimizer": "optimizer name"}.get(
                                        key, "number" if key in numbers else "true/false"))
    if opt is not None and str(opt).lower() not in OPTIMIZERS:
        raise AscendEmuError(f"benchmark config: unknown optimizer {opt!r}; choose one of: {', '.join(OPTIMIZERS)}")


def check(model, data, *, device=None, benchmark=None, benchmark_config=None, loss=None, optimizer=None,
          learning_rate=None, batch_size: int = 32, steps: int = 20, epochs: int | None = None, loss_scale="none",
          overflow_check: str = "status", shuffle: bool = False, seed: int = 0, work_dir=None,
          progress: bool = False) -> CheckResult:
    """Run the pre-tuning checklist on a Keras model and its training data.

    Parameters
    ----------
    model : Keras 3 model (compiled, or with ``loss`` and ``optimizer``) or a ``.keras`` path.
    data : ``.npz`` path with arrays ``x`` and ``y``, a dict with them, or a pair ``(x, y)``.
    device : :class:`ascend_emu.npu.device.Device` the port runs on (default: ``Device("allow_fp32_to_fp16")``,
        the TF adapter's training default on the Ascend910).
    benchmark, benchmark_config : the benchmark's ``.keras`` model (its compiled optimizer and loss), or a
        dict / JSON path with any of ``optimizer`` (a name or ``{"name", ...settings}``), ``learning_rate``,
        ``loss``, ``batch_size``, ``epochs`` and optimizer settings; item 10 compares every key both state.
    loss, optimizer, learning_rate : as :meth:`Device.train`.
    batch_size, steps, epochs, shuffle, seed : the training run checked (``epochs`` is the planned number,
        only compared with the benchmark).
    loss_scale, overflow_check : the port's loss scaling, as :meth:`Device.train`.
    work_dir : keep the dumps the check writes here (default: a temporary directory, removed). Their size (step
        0 up to four times) is estimated first and refused in one line past the free space.

    Returns
    -------
    CheckResult
        The rows in checklist order (``result.rows``; each ``number``, ``item``, ``method``, ``result``,
        ``evidence``), ``ops_info`` (a suggested CANN ``modify_mixlist`` when a row failed for precision
        reasons) and ``exit_code``.
    """
    from ...fileio import make_output_dir, read_json
    from ...frontend.tf import training as T
    from ...frontend.inputs import check_seed
    from ...npu.device import Device
    from ...npu.training import _load_model, loss_scale_manager

    device = device if device is not None else Device("allow_fp32_to_fp16")
    if not isinstance(device, Device):
        raise AscendEmuError("device must be an ascend_emu.Device")
    for name, v in (("batch_size", batch_size), ("steps", steps)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise AscendEmuError(f"{name} must be a positive integer, got {v!r}")
    check_seed(seed)
    if epochs is not None and (not isinstance(epochs, (int, np.integer)) or isinstance(epochs, bool) or epochs < 1):
        raise AscendEmuError(f"epochs must be a positive integer, got {epochs!r}")
    if overflow_check not in ("status", "isfinite"):
        raise AscendEmuError(f"unknown overflow_check {overflow_check!r}; choose status or isfinite")
    if benchmark is not None and benchmark_config is not None:
        raise AscendEmuError("give --benchmark or --benchmark-config, not both")
    if isinstance(benchmark_config, (str, os.PathLike)):
        benchmark_config = read_json(benchmark_config, "benchmark config",
                                     hint='give a JSON object such as {"optimizer": "sgd", "learning_rate": 0.01}')
    if benchmark_config is not None and not isinstance(benchmark_config, dict):
        raise AscendEmuError("the benchmark config must be a JSON object (optimizer, learning_rate, loss, "
                             "batch_size, epochs, ...)")
    if benchmark_config is not None:
        check_benchmark_config(benchmark_config)
    if isinstance(benchmark, (str, os.PathLike)) and not os.path.exists(os.fspath(benchmark)):
        raise AscendEmuError(f"--benchmark {os.fspath(benchmark)}: no such file; give the benchmark's .keras model")
    loss_scale_manager(loss_scale)   # a bad spec is bad input, before anything runs
    if work_dir is not None:
        make_output_dir(work_dir, "--keep-dumps")   # never through a link; a bad directory fails at once
    x, y = _read_data(data)
    model = _load_model(model)
    loss_fn = T.resolve_loss(model, loss)
    fopt = T.resolve_optimizer(model, optimizer, learning_rate=learning_rate)
    in_shape = tuple(model.inputs[0].shape[1:]) if getattr(model, "inputs", None) else None
    if in_shape is not None and len(x) and (len(in_shape) != x.ndim - 1 or any(
            d is not None and d != s for d, s in zip(in_shape, x.shape[1:]))):
        raise AscendEmuError(f"training data x has samples of shape {tuple(x.shape[1:])} but the model takes "
                             f"{in_shape}")
    bench = None
    if benchmark is not None or benchmark_config is not None:
        try:
            bench = _benchmark_settings(benchmark, benchmark_config)
        except AscendEmuError as e:
            raise AscendEmuError(f"{'--benchmark' if benchmark is not None else '--benchmark-config'}: {e}") from None

    with tempfile.TemporaryDirectory(prefix="ascend-emu-check-") as tmp:
        work = os.fspath(work_dir) if work_dir is not None else tmp
        c = _Ctx(model, loss_fn, fopt, x, y, None, int(batch_size), int(steps), epochs, bool(shuffle), int(seed),
                 device, loss_scale, overflow_check, bench, work, progress)
        rows = {"6": _row_dataset(c)}
        if c.valid is not None:
            _run(c)
        else:
            c.ref_error = c.npu_error = "no usable samples (item 6)"
        rows["1"] = _row_constant(c)
        for fn in (_row_mixed_precision, _row_loss_scale, _row_order, _row_training, _row_hyper, _row_init,
                   _row_gradients, _row_saturation, _row_loss, _row_lr, _row_overflow, _row_divergence,
                   _row_underflow, _row_reductions):
            r = fn(c)
            rows[r.number] = r
        rows["8"] = _row_distributed()
        ops_info = {"black-list": {k: v for k, v in c.ops_info["black-list"].items() if v}}
        config = {"device": device.config(), "batch_size": c.batch_size, "steps": c.steps,
                  "loss_scale": str(loss_scale), "overflow_check": overflow_check, "shuffle": c.shuffle, "seed": c.seed,
                  "model": getattr(model, "name", ""), "samples": int(len(x)),
                  "samples_used": int(c.valid.sum()) if c.valid is not None else 0}
        # the runs that failed (no usable samples is item 6's own failure)
        errors = [] if c.valid is None else (
            [f"the reference run failed: {e}" for e in (c.inf_error or c.ref_error,) if e]
            + [e for e in (c.npu_error,) if e])
        return CheckResult([rows[k] for k in ORDER], ops_info if ops_info["black-list"] else None, config, errors)


def _run(c: _Ctx) -> None:
    """The reference runs (twice), the inference runs (twice) and the emulated run, on the clean samples.

    The training step is traced once and the three training runs replay that one graph (a step that cannot
    be traced is bad input); each run starts from the model's weights and fresh optimizer slots.
    """
    from ...analysis.dump import load_dump
    from ...frontend.tf import training as T
    from ...npu.training import _disk_check, step_dump_bytes

    xv, yv = c.xv, c.yv
    step = T.trace_train_step(c.model, c.loss_fn, c.fopt, xv[:1], yv[:1])
    step.initial = T.initial_state(c.model, c.fopt)
    step.description = {"kind": "keras", "loss": _loss_name(c.loss_fn)}
    kw = dict(batch_size=c.batch_size, steps=c.steps, shuffle=c.shuffle, seed=c.seed, progress=c.progress)
    # step 0 is dumped up to four times (two reference runs, the emulated run and its reference): refused before
    # any run when the file system of the work directory (--keep-dumps, or the temporary one) will not hold it
    _disk_check(step_dump_bytes(step, c.batch_size) * 4, c.work, "the check's four dumps of step 0",
                fix="give a smaller --batch-size, --keep-dumps on a larger file system, or free space")
    try:
        c.ref_a = _reference_run(step, xv, yv, dump_dir=os.path.join(c.work, "reference-a"), detail=True, **kw)
        c.ref_b = _reference_run(step, xv, yv, dump_dir=None, detail=False, **kw)
        if c.ref_a.digests[:1] != c.ref_b.digests[:1]:
            # step 0 differs: one more run, dumped, names the first op that differs from the first run's dump
            c.ref_c = _reference_run(step, xv, yv, dump_dir=os.path.join(c.work, "reference-c"), detail=False,
                                     **dict(kw, steps=1))
    except AscendEmuError as e:
        c.ref_a = c.ref_b = None
        c.ref_error = str(e)
    _run_inference_twice(c)
    try:
        c.npu = c.device.train(step, (xv, yv), loss_scale=c.loss_scale, overflow_check=c.overflow_check,
                               dump_dir=os.path.join(c.work, "npu"), dump_steps=[0], reference=True,
                               overwrite=True, **kw)
        c.npu_dump = load_dump(c.npu.dumps[0])
        c.bench_dump = load_dump(c.npu.reference_dumps[0])
    except AscendEmuError as e:
        c.npu = None
        c.npu_error = f"the emulated run failed: {e}"

"""The emulated torch_npu run (:class:`TorchRun`): the options, the device, the records, the steps and the dumps."""
from __future__ import annotations

import os
import time

from ...frontend import torch as _front  # noqa: F401  (first: without torch, the one-line error of the extra)
import torch  # noqa: E402
from torch.utils._mode_utils import no_dispatch  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402

from ...errors import AscendEmuError
from ...fileio import check_output_dir
from ...frontend.torch import aten as _aten
from ...frontend.torch import aten_conv  # noqa: F401  (registers the convolution lowerings into aten.ATEN)
from ...frontend.torch import aten_fused  # noqa: F401  (registers the attention and fused kernels' lowerings)
from ...frontend.torch import aten_grad  # noqa: F401  (registers the backward kernels' lowerings into aten.ATEN)
from ...frontend.torch.autocast import AutocastMode
from ...frontend.torch.convert import to_numpy
from ...frontend.torch.intercept import DispatchMode
from ...frontend.torch.options import DEFAULT_SOURCE, NpuOptions, activate
from ...numerics.assumptions import ASSUMED, TORCH
from ...numerics.policy import SOCS, soc_name
from ...numerics.status import FloatStatus
from ...ops import OpContext
from ...ops.ascend_types import ascend_type
from ...ops.multicore import MULTICORE_OPS
from ..device import Device
from .amp import AMP_UNSCALE, AMP_UPDATE, amp_unscale, amp_update
from .launch import (DTYPE_NAMES, LOWERINGS, MISSING, STATUS_NONFINITE, AtenRecord, Exact, Launcher, composite,
                     flat, map_out, out_dtypes, tensors, tmap)
from .launch import primary, same_values

#: bytes a dump leaves free on its file system: past them the rest of the step is dumped as statistics
DUMP_MARGIN = 1 << 30
#: the torch path's assumed parameters (numerics/assumptions.py, family torch): Device options the run reads
TORCH_ASSUMED = tuple(a.name for a in ASSUMED if a.family == TORCH)


class TorchRun:
    """One emulated torch_npu run: the options, the device, the records and the dumps of the script's steps.

    Use :func:`emulate` to make one. ``records`` holds one :class:`AtenRecord` per aten call; ``steps`` one
    dict per step (an optimizer step, or a GradScaler iteration: its ``skipped`` flag, ``loss_scale``, the first
    overflowing call); ``float_status`` the float status register; ``options`` the torch_npu switches.
    """

    def __init__(self, soc: str = "Ascend910B", precision_mode: str | None = None, *, aicpu_fallback: bool = True,
                 dump=None, dump_steps=None, stats_only: bool = False, reference: bool = False,
                 overwrite: bool = False, allow_hf32_matmul=None, allow_hf32_conv=None, cube_math_type=None,
                 compatible_impl=None, deterministic=None, keep_records: bool = True, progress: bool = False,
                 **device_options):
        self.options = NpuOptions(soc=soc_name(soc))
        given = {"precision_mode": precision_mode, "allow_hf32_matmul": allow_hf32_matmul,
                 "allow_hf32_conv": allow_hf32_conv, "cube_math_type": cube_math_type,
                 "compatible_impl": compatible_impl, "deterministic": deterministic}
        for k, v in given.items():
            if v is not None:
                self.options.set(k, v, "emulate(...)")
        self.options.sources["soc"] = "emulate(...)" if soc != "Ascend910B" else DEFAULT_SOURCE
        self.chip = SOCS[self.options.soc]
        self.aicpu_fallback = bool(aicpu_fallback)
        bad = set(device_options) - {"overflow_mode", "subnormals", "impl_mode", "op_model", "cube_model",
                                     "run_seed", "multicore", "hf32_rounding", "reduce_accumulate", "hf32_bits",
                                     "hf32_conv_rounding", "hf32_matmul_rounding", *TORCH_ASSUMED}
        if bad:
            raise AscendEmuError(f"emulate: unknown option(s) {', '.join(sorted(bad))}")
        self._device_options = device_options
        self._devices: dict = {}
        self._contexts: dict = {}
        self.dump_dir = None if dump is None else os.fspath(dump)
        try:
            self.dump_steps = sorted({int(s) for s in (dump_steps if dump_steps is not None else [0])})
        except (TypeError, ValueError):
            raise AscendEmuError(f"dump_steps must be step numbers, got {dump_steps!r}") from None
        if self.dump_dir is not None:
            check_output_dir(self.dump_dir, "dump")
        self.stats_only = bool(stats_only)
        self.reference = bool(reference)
        self.overwrite = bool(overwrite)
        self.keep_records = bool(keep_records)
        self.progress = bool(progress)
        self._bar = None
        self.records: list[AtenRecord] = []
        self.steps: list[dict] = []
        self.float_status = FloatStatus()
        self.step = 0
        self.dumps: dict = {}
        self.reference_dumps: dict = {}
        self._counts: dict = {}
        self._stash: dict = {}
        self._names = WeakIdKeyDictionary()      # tensor -> the dump name of the op output it is
        self._inputs_seen = 0
        self._shadow = WeakIdKeyDictionary()     # tensor -> its float32 reference twin (reference=True)
        self._writers = None
        self._budget = None
        self._dump_bytes = 0
        self._budget_said = False
        self._step_info: dict = {}
        self._modes = None
        self._t0 = None
        self._cleared_at_scale = None            # the step whose first GradScaler.scale cleared the register
        self.device     # the device options checked now: a bad value is one line at emulate(...), not mid-script

    # -- the device ------------------------------------------------------------------------------------------
    @property
    def device(self) -> Device:
        """The emulated device for the current options: torch_npu's determinism snapshot picks it."""
        level = self.options.effective_deterministic_level
        dev = self._devices.get(level)
        if dev is None:
            dev = self._devices[level] = Device("must_keep_origin_dtype", soc=self.options.soc,
                                                aicpu_fallback=self.aicpu_fallback,
                                                deterministic=level > 0, deterministic_level=level or None,
                                                allow_hf32="none" if not self.chip.supports_hf32 else None,
                                                **self._device_options)
        return dev

    def context(self, dtype: str, cube_out, name: str, tf_type: str):
        """The OpContext of one registry op: a copy of the device's for (dtype, cube_out), or, for an op that splits
        over cores with determinism off, its own launch (``Device.context``)."""
        dev = self.device
        if dev.numerics.deterministic_level == 0 and tf_type in MULTICORE_OPS:
            return dev.context(dtype, cube_out, op=name, tf_type=tf_type, launch=self.step)
        key = (id(dev), dtype, cube_out)
        proto = self._contexts.get(key)
        if proto is None:
            proto = self._contexts[key] = dev.context(dtype, cube_out)
        ctx = object.__new__(OpContext)
        ctx.__dict__.update(proto.__dict__)
        return ctx

    def clear_float_status(self) -> None:
        """npu_clear_float_status: what torch_npu's GradScaler.scale does first in an iteration on a SoC in
        saturation mode."""
        self.float_status.clear()

    def grad_scaler_scale(self, scaler) -> None:
        """GradScaler.scale was called: torch_npu's scaler clears the float status register at its first call of
        an iteration on a saturation SoC ([PT] grad_scaler.py; ASCEND-FACTS 13.2); upstream's does so only under
        ``float_status_clear="scale"`` (an assumption: NUMERICS.md section 16)."""
        if not scaler.is_enabled() or self.device.overflow_mode != "saturation" or self._cleared_at_scale == self.step:
            return
        if getattr(scaler, "_clears_float_status_at_scale", False) or \
                self.device.numerics.float_status_clear == "scale":
            self._cleared_at_scale = self.step
            self.float_status.clear()

    def autocast(self, dtype=torch.float16, enabled: bool = True):
        """``torch.autocast("npu", dtype)`` of this run: a ``with`` block of torch_npu's autocast."""
        return self.options.overridden("run.autocast", autocast_enabled=bool(enabled), autocast_dtype=dtype)

    # -- one aten call ------------------------------------------------------------------------------------------
    def __call__(self, func, args, kwargs, phase: str):
        packet = str(func.overloadpacket)
        short = packet.split(".", 1)[1] if "." in packet else packet
        prefix = "Aten" if packet.startswith("aten.") else "NPU"     # msprobe's prefixes (13.6)
        if packet == AMP_UNSCALE:
            return amp_unscale(self, func, args, kwargs, phase)
        if packet == AMP_UPDATE:
            return amp_update(self, func, args, kwargs, phase)
        if not packet.startswith(("aten.", "ascend_emu.")):
            return func(*args, **kwargs)
        low = LOWERINGS.get(func, MISSING)
        if low is MISSING:
            low = LOWERINGS[func] = _aten.lookup(func) or composite(func)
        if low is None and packet in _aten.HOST:
            return self._host_call(func, args, kwargs, phase, short)
        n = self._counts.get(short, 0)
        self._counts[short] = n + 1
        name = f"{prefix}.{short}.{n}.{'backward' if phase == 'backward' else 'forward'}"
        k = Launcher(self, name)
        # the reference twins of the inputs as they are before the call (an in-place op changes them)
        k.twins = self._twins((args, kwargs)) if self._writers is not None and self._writers[1] is not None \
            else None
        engine, reason = "AICORE", ""
        out = None
        try:
            if low is None:
                raise _aten.Host if packet in _aten.HOST else _aten.Fallback("no emulated kernel")
            out = low(k, *args, **kwargs)
        except _aten.Host:
            engine, out = "HOST", self._host(func, args, kwargs)
        except Exact:
            out = self._host(func, args, kwargs)
        except _aten.Fallback as e:
            if not self.aicpu_fallback:
                raise AscendEmuError(f"aten op {func} has no emulated AI Core kernel ({e}); drop "
                                     "aicpu_fallback=False to run it on the AI CPU in float32") from None
            engine, reason = "AICPU", f"AI CPU in float32: {e}"
            out, st = self._aicpu(func, args, kwargs)
            k.status |= st
            k.types = [packet]
        if engine == "AICORE" and not k.types:
            k.types = [packet]
        if k.notes:
            reason = "; ".join([reason] + k.notes if reason else k.notes)
        self._record(k, func, phase, engine, reason, args, out)
        return out

    def _host_call(self, func, args, kwargs, phase, short):
        """A data-movement op: torch runs it; recorded (and dumped) as the host's."""
        n = self._counts.get(short, 0)
        self._counts[short] = n + 1
        k = Launcher(self, f"Aten.{short}.{n}.{'backward' if phase == 'backward' else 'forward'}")
        if self._writers is not None and self._writers[1] is not None:
            k.twins = self._twins((args, kwargs))
        out = func(*args, **kwargs)        # (the dispatch mode is off while its handler runs)
        self._record(k, func, phase, "HOST", "", args, out)
        return out
    def _host(self, func, args, kwargs):
        with no_dispatch():
            return func(*args, **kwargs)

    def _aicpu(self, func, args, kwargs):
        """The AI CPU: torch itself, 16-bit float inputs widened to float32, results rounded back to the dtype the
        op gives; mutated arguments written back."""
        halves = [a for a in tensors(args, kwargs) if a.dtype in (torch.float16, torch.bfloat16)]
        with no_dispatch():
            if not halves:
                out = func(*args, **kwargs)
            else:
                up = {id(t): t.float() for t in halves}
                wide = tmap(lambda t: up.get(id(t), t), args)
                wkw = tmap(lambda t: up.get(id(t), t), kwargs)
                out = func(*wide, **wkw)
                schema = func._schema
                for i, arg in enumerate(schema.arguments[:len(args)]):
                    if arg.alias_info is not None and arg.alias_info.is_write:
                        for orig, new in zip(flat(args[i]), flat(wide[i])):
                            if orig is not new and isinstance(orig, torch.Tensor):
                                orig.copy_(new)
                expect = out_dtypes(func, args, kwargs)
                out = map_out(out, expect, args, wide)
        st = 0
        for t in flat(out):
            if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel():
                with no_dispatch():
                    if not bool(torch.isfinite(t).all()):
                        st |= STATUS_NONFINITE
        return out, st

    # -- records, dumps, steps ----------------------------------------------------------------------------------------
    def _name(self, short: str, phase: str) -> str:
        n = self._counts.get(short, 0)
        self._counts[short] = n + 1
        return f"Aten.{short}.{n}.{'backward' if phase == 'backward' else 'forward'}"

    def _record(self, k: Launcher, func, phase, engine, reason, args, out, name=None):
        name = name or k.name
        status = int(k.status)
        if self._bar is not None:
            self._bar.update(1)
        if engine != "HOST":
            self.float_status.record(status)
        if status and "first_overflow" not in self._step_info:
            self._step_info["first_overflow"] = {"name": name, "aten": str(func), "phase": phase,
                                                 "op_types": list(k.types)}
        w = self._writers
        if not self.keep_records and w is None:
            return          # (a benchmark's run: nothing kept per call)
        ins = [t for t in flat(args) if isinstance(t, torch.Tensor)]
        outs = [t for t in flat(out) if isinstance(t, torch.Tensor)]
        # a call with no tensor output (.item(), a foreach update in place) is in its first input's dtype
        typed = outs or ins
        compute = k.compute or (DTYPE_NAMES[typed[0].dtype] if typed else "")
        rec = AtenRecord(name, str(func), phase, self.step, engine, list(k.types), compute,
                         {"inputs": [DTYPE_NAMES[t.dtype] for t in ins],
                          "outputs": [DTYPE_NAMES[t.dtype] for t in outs]}, status, reason, k.cmt)
        if self.keep_records:
            self.records.append(rec)
        if w is not None and str(func.overloadpacket) in UNINITIALISED:
            # uninitialised memory: nothing to compare, so neither dump holds it; the reference starts from the
            # same bytes (what a later in-place op writes into it is compared)
            if w[1] is not None:
                for t in outs:
                    self._shadow[t] = same_values(t)
            return
        if w is not None:
            inputs = [self._input_name(t) for t in ins]
            rec.inputs = inputs
            precision = {"list": None, "dtype": compute, "reason": reason or f"{engine}: {', '.join(k.types)}",
                         "aten": str(func), "torch_dtypes": rec.dtypes, "cube_math_type": k.cmt}
            arrays = self._dumped([to_numpy(t) for t in outs])
            main = primary(k.types) or str(func)
            fp32_check = self._fp32_check(func, args, engine) if status else None
            w[0].add_op(name, main, ascend_type(main).lstrip("_") if k.types else "",
                        engine, compute or None, [i if ":" in i else i + ":0" for i in inputs], arrays, status,
                        precision=precision, phase=phase, fp32_check=fp32_check)
            if w[1] is not None and getattr(k, "twins", None) is not None:
                ref = self._reference(func, k.twins, args, out)
                if ref is not None:
                    w[1].add_op(name, main, "", "REFERENCE", "float32",
                                [i if ":" in i else i + ":0" for i in inputs], ref, 0, phase=phase)
            for i, t in enumerate(outs):
                self._names[t] = f"{name}:{i}"

    def _input_name(self, t) -> str:
        """The dump name of tensor ``t``: the output of the call that made it in this step, or (a batch, a weight,
        a state the step starts from) ``Input.<n>:0``, numbered as the step meets them."""
        name = self._names.get(t)
        if name is None:
            name = self._names[t] = f"Input.{self._inputs_seen}:0"
            self._inputs_seen += 1
        return name

    def _fp32_check(self, func, args, engine) -> dict | None:
        """msprobe's verdict input for an overflowing call: the same call in torch float32 on its inputs widened
        (an in-place call has changed its input: none)."""
        schema = func._schema
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            return None
        try:
            with no_dispatch(), torch.no_grad():
                outs = func(*tmap(lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t, args))
        except Exception:
            return None
        finite, max_abs = True, 0.0
        for t in flat(outs):
            if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel():
                with no_dispatch():
                    fin = torch.isfinite(t)
                    finite &= bool(fin.all())
                    if bool(fin.any()):
                        max_abs = max(max_abs, float(t[fin].abs().max()))
        return {"overflow": not finite if engine != "AICPU" else True, "max_abs": max_abs}

    def _dumped(self, arrays: list) -> list:
        """The outputs as the dump stores them: the tensors while they fit the step's budget (the free space at
        the step's start less a margin), then their statistics only, said once on stderr."""
        n = sum(a.nbytes for a in arrays)
        if self.stats_only or self._budget is None or (not self._budget_said and self._dump_bytes + n <= self._budget):
            self._dump_bytes += n
            return arrays
        if not self._budget_said:
            import sys

            print(f"ascend-emu: the dump of step {self.step} outgrows the free space "
                  f"({self._budget / 1e9:.1f} GB usable): the ops from here on are dumped as statistics only",
                  file=sys.stderr)
            self._budget_said = True
        from ...analysis.dump import StatsOnly
        from ...analysis.dump.stats import tensor_stats

        out = []
        for a in arrays:
            st = tensor_stats(a) if a.dtype.kind in "fiub" or a.dtype.name == "bfloat16" else {}
            out.append(StatsOnly(a.dtype.name, tuple(a.shape), st.get("max"), st.get("min"), st.get("mean"),
                                 st.get("l2norm"), int(st.get("nan", 0)), int(st.get("inf", 0))))
        return out

    def _twins(self, args):
        """The float32 reference twins of ``args``: a tensor's twin from the reference run so far, else (an input,
        a weight at the step's start) its own value, 16-bit floats widened."""
        def twin(t):
            s = self._shadow.get(t)
            if s is None:
                with no_dispatch():
                    s = t.detach().float() if t.dtype in (torch.float16, torch.bfloat16) else t.detach().clone()
            return s
        return tmap(twin, args)

    def _reference(self, func, twins, args, out):
        """This call again in plain torch float32 on the reference twins ``(a, kwargs)`` of its inputs ``args``: the
        reference run, op by op, under the same names (autocast's casts keep float32 there)."""
        a, kwargs = twins
        if str(func.overloadpacket) == "aten._to_copy" and kwargs.get("dtype") in (torch.float16, torch.bfloat16):
            kwargs = dict(kwargs, dtype=torch.float32)
        if torch.Tag.nondeterministic_seeded in func.tags:
            # a random draw (randn, uniform_, dropout's mask): the reference takes the run's own values, widened,
            # instead of drawing others
            r = [same_values(t) for t in flat(out) if isinstance(t, torch.Tensor)]
        else:
            with no_dispatch(), torch.no_grad():
                try:
                    r = func(*a, **kwargs)
                except Exception:      # an op the float32 twins cannot take (a dtype it checks): no reference row
                    return None
        if r is None:
            return None
        outs = [t for t in flat(out) if isinstance(t, torch.Tensor)]
        refs = [t for t in flat(r) if isinstance(t, torch.Tensor)]
        if len(outs) != len(refs):
            return None
        for o, s in zip(outs, refs):
            self._shadow[o] = s
        if func._schema.arguments and func._schema.arguments[0].alias_info is not None and \
                func._schema.arguments[0].alias_info.is_write and isinstance(args[0], torch.Tensor):
            self._shadow[args[0]] = refs[0] if refs else a[0]
        return [to_numpy(t.float() if t.dtype.is_floating_point else t) for t in refs]

    def _open_step(self) -> None:
        """The dump writers of the current step, if it is one to dump."""
        if self.dump_dir is None or self.step not in self.dump_steps or self._writers is not None:
            return
        from ...analysis.dump import DumpWriter

        path = check_output_dir(os.path.join(self.dump_dir, f"step-{self.step}"), "dump", root=self.dump_dir)
        config = self.config()
        w = DumpWriter(path, kind="npu", config=config, model={"name": "torch script", "framework": "pytorch"},
                       inputs_sha256="", overwrite=self.overwrite, stats_only=self.stats_only)
        r = None
        if self.reference:
            rpath = check_output_dir(os.path.join(self.dump_dir, "reference", f"step-{self.step}"), "dump",
                                     root=self.dump_dir)
            r = DumpWriter(rpath, kind="bench", config={"reference": "torch float32"},
                           model={"name": "torch script", "framework": "pytorch"}, inputs_sha256="",
                           overwrite=self.overwrite, stats_only=self.stats_only)
            r.__enter__()
            self.reference_dumps[self.step] = rpath
        w.__enter__()
        import shutil

        free = shutil.disk_usage(path).free
        # the reference's tensors share the space; 1 GB stays free for everything else
        self._budget = max(0, (free - DUMP_MARGIN) // (2 if self.reference else 1))
        self._dump_bytes = 0
        self._budget_said = False
        self.dumps[self.step] = path
        self._writers = (w, r)
        self._shadow = WeakIdKeyDictionary()
        # names are the step's own: a weight an earlier step updated is an input of this one
        self._names = WeakIdKeyDictionary()
        self._inputs_seen = 0

    def _close_step(self, exc=None) -> None:
        w, self._writers = self._writers, None
        if w is None:
            return
        for x in w:
            if x is None:
                continue
            if exc is None:
                x.finish({"step": self.step})
                x.__exit__(None, None, None)
            else:
                x.__exit__(type(exc), exc, None)

    def end_step(self, why: str) -> None:
        """The end of a training step (an optimizer step, or GradScaler's update when the script scales)."""
        if why == "optimizer" and self._step_info.get("scaler"):
            return     # GradScaler's update ends the step (a skipped step has no optimizer step)
        info = {"step": self.step, "skipped": False, **self._step_info}
        info.setdefault("first_overflow", None)
        info["float_status"] = self.float_status.get()
        self.steps.append(info)
        self._close_step()
        if self.device.overflow_mode == "saturation" and info.get("scaler") and \
                self.device.numerics.float_status_clear == "update":
            # upstream's GradScaler marks no point of the iteration before its update: the register is cleared
            # here and the next forward counts (float_status_clear="update", an assumption: NUMERICS section 16)
            self.float_status.clear()
        self.step += 1
        self._counts = {}
        self._step_info = {}
        if self._bar is not None:
            self._bar.set_postfix(step=self.step)      # (refreshed once a step: the bar shows it as it ends)
        self._open_step()

    def config(self) -> dict:
        pol = self.device.numerics
        return {"framework": "pytorch", "torch_npu_options": self.options.as_dict(),
                "device": {**self.device.config(), **{n: getattr(pol, n) for n in TORCH_ASSUMED}},
                "aicpu_fallback": self.aicpu_fallback}

    # -- the record ------------------------------------------------------------------------------------------------
    @property
    def first_overflow(self) -> dict | None:
        """The first aten call whose kernel raised a status bit: name, aten op, phase, step."""
        for r in self.records:
            if r.status:
                return {"name": r.name, "aten": r.aten, "phase": r.phase, "step": r.step, "op_types": r.op_types}
        return None

    def summary(self) -> dict:
        per: dict = {}
        for r in self.records:
            per.setdefault(r.engine, {}).setdefault(r.compute_dtype or "-", 0)
            per[r.engine][r.compute_dtype or "-"] += 1
        return {"aten_calls": len(self.records), "per_engine_dtype": per, "steps": len(self.steps),
                "skipped_steps": sum(1 for s in self.steps if s.get("skipped")),
                "first_overflow": self.first_overflow, "float_status": self.float_status.get(),
                "options": self.options.as_dict(), "dumps": dict(self.dumps),
                "reference_dumps": dict(self.reference_dumps)}

    def format_summary(self) -> str:
        """The run in a few lines, as a command line prints it: calls per engine and dtype, steps and skipped steps,
        the first overflowing call, the float status register, the dumps."""
        sm = self.summary()
        lines = [f"aten calls: {sm['aten_calls']} on {self.options.soc} "
                 f"(ACL_PRECISION_MODE {self.options.effective_precision_mode})"]
        for engine, per in sm["per_engine_dtype"].items():
            lines.append(f"  {engine:<7} " + ", ".join(f"{dt}: {n}" for dt, n in per.items()))
        lines.append(f"steps: {sm['steps']} (skipped: {sm['skipped_steps']})")
        f = sm["first_overflow"]
        lines.append("first overflow: " + (f"{f['name']} ({f['aten']}), {f['phase']}, step {f['step']}" if f
                                           else "none"))
        lines.append(f"float status register: 0x{sm['float_status']:x}")
        for step, path in sorted(sm["dumps"].items()):
            ref = sm["reference_dumps"].get(step)
            lines.append(f"dump of step {step}: {path}" + (f" (reference: {ref})" if ref else ""))
        return "\n".join(lines)

    # -- context manager ----------------------------------------------------------------------------------------------
    def __enter__(self) -> "TorchRun":
        if self._modes is not None:
            raise AscendEmuError("this emulate(...) run is already active; make a new one with ae.torch.emulate")
        act = activate(self.options)
        act.__enter__()
        auto = AutocastMode(lambda: self.options)
        disp = DispatchMode(self, self.end_step)
        auto.__enter__()
        disp.__enter__()
        self._modes = (act, auto, disp)
        self._t0 = time.perf_counter()
        self.float_status.clear()
        self._scale_saved = _hook_grad_scaler(self)
        if self.progress:
            from tqdm import tqdm

            # aten calls as they run, the steps done beside them; off when stderr is not a terminal (disable=None)
            self._bar = tqdm(desc="torch-run", unit="op", leave=False, dynamic_ncols=True, disable=None)
        self._open_step()
        return self

    def __exit__(self, *exc) -> None:
        act, auto, disp = self._modes
        self._modes = None
        torch.amp.GradScaler.scale = self._scale_saved
        try:
            disp.__exit__(*exc)
            auto.__exit__(*exc)
        finally:
            act.__exit__(*exc)
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            if self._step_info or self._writers is not None:
                if exc[0] is None:
                    info = {"step": self.step, "skipped": False, **self._step_info}
                    info.setdefault("first_overflow", None)
                    if self._step_info:
                        self.steps.append(info)
                self._close_step(exc[1])


def _hook_grad_scaler(run):
    """torch.amp.GradScaler.scale (and so every subclass's, the shim's included) tells ``run`` first: where torch_npu
    clears the float status register. Returns the method to restore."""
    original = torch.amp.GradScaler.scale

    def scale(scaler, outputs):
        run.grad_scaler_scale(scaler)
        return original(scaler, outputs)
    scale.__doc__ = original.__doc__
    torch.amp.GradScaler.scale = scale
    return original


#: aten ops whose outputs are uninitialised memory (torch fills them later, in place)
UNINITIALISED = frozenset(("aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
                           "aten.new_empty_strided", "aten.empty_permuted"))


def emulate(soc: str = "Ascend910B", precision_mode: str | None = None, *, aicpu_fallback: bool = True, dump=None,
            dump_steps=None, stats_only: bool = False, reference: bool = False, overwrite: bool = False,
            progress: bool = False, **options) -> TorchRun:
    """Run a PyTorch eager script's aten ops on the emulated NPU, with torch_npu's numerics.

    Parameters
    ----------
    soc : the SoC (``ascend-emu socs``); torch_npu's defaults follow it (ASCEND-FACTS.md 13.1).
    precision_mode : ``ACL_PRECISION_MODE`` (``allow_fp32_to_fp16`` or ``must_keep_origin_dtype``); None: the
        SoC's default (must_keep_origin_dtype from the 910B on, allow_fp32_to_fp16 on the 910).
    aicpu_fallback : an aten op without an emulated kernel runs in torch float32 as the AI CPU would (recorded);
        False: it is refused in one line naming it.
    dump, dump_steps : an ascend-emu dump of each listed step (default [0]) in ``dump/step-N``; ``stats_only``
        records statistics only. With ``reference``, the same aten calls in plain torch float32 on the same inputs
        and weights, dumped in ``dump/reference/step-N`` under the same names.
    **options : torch_npu switches (``allow_hf32_matmul``, ``allow_hf32_conv``, ``cube_math_type``,
        ``compatible_impl``, ``deterministic``) and device numerics (``overflow_mode``, ``hf32_rounding``, ...).
    progress : a progress bar on standard error (aten calls, the steps done) while standard error is a terminal.

    Returns
    -------
    TorchRun
        ``with emulate(...) as run:`` ... ``run.records``, ``run.steps``, ``run.first_overflow``, ``run.options``.
    """
    return TorchRun(soc, precision_mode, aicpu_fallback=aicpu_fallback, dump=dump, dump_steps=dump_steps,
                    stats_only=stats_only, reference=reference, overwrite=overwrite, progress=progress, **options)

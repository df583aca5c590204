"""A PyTorch eager script on the emulated NPU: ``with ascend_emu.torch.emulate(...) as run:``.

torch_npu runs every aten op as one aclnn kernel (ASCEND-FACTS.md section 13). Inside the context the front end
(:mod:`ascend_emu.frontend.torch.intercept`) hands each aten call of the script - forward, autograd's backward,
the optimizer's update - to :class:`TorchRun`, which runs it on an emulated :class:`~ascend_emu.npu.device.Device`
built with torch_npu's defaults: the aten op's lowering (:mod:`ascend_emu.frontend.torch.aten`, the one table)
launches registry ops through :class:`_Launcher`, which decides each op's compute dtype from its inputs and, for
cube ops, the cubeMathType torch_npu derives from ``ACL_PRECISION_MODE``, ``allow_hf32`` and
``cube_math_type`` (read from ``run.options`` at every call); the op's status bits go into the float status
register. An aten op without a lowering runs on the AI CPU (torch, float32) or is refused; data movement runs on
the host. Each call is one record (``run.records``) named as msprobe names it, ``Aten.<op>.<n>.forward`` (or
``.backward`` inside autograd's backward), and, for the dumped steps, one op of an ascend-emu dump.

GradScaler's aten ops (``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``) follow
torch_npu's rule per SoC (13.2); NUMERICS.md section 16 states every rule with its source.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..frontend import torch as _front  # noqa: F401  (first: without torch, the one-line error of the extra)
import torch  # noqa: E402
from torch.utils._mode_utils import no_dispatch  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary

from ..errors import AscendEmuError
from ..fileio import check_output_dir
from ..frontend.torch import aten as _aten
from ..frontend.torch.autocast import AutocastMode
from ..frontend.torch.convert import dtype_name, from_numpy, to_numpy
from ..frontend.torch.intercept import DispatchMode
from ..frontend.torch.npu_ops import npu_rms_norm, npu_rotary_mul, npu_swiglu  # noqa: F401  (ae.torch.npu_*)
from ..frontend.torch.options import DEFAULT_SOURCE, NpuOptions, activate
from ..numerics.policy import SOCS, soc_name
from ..numerics.status import FloatStatus, decode_status
from ..ops import CUBE, OPS
from ..ops.ascend_types import ascend_type
from .device import Device

#: torch_npu's cubeMathType codes ([PT] npu_config.py _CubeMathType; ASCEND-FACTS 13.1)
KEEP_DTYPE, ALLOW_FP32_DOWN_PRECISION, USE_FP16, USE_HF32, USE_FP32_ADD = 0, 1, 2, 3, 4
_CMT_NAMES = {0: "KEEP_DTYPE", 1: "ALLOW_FP32_DOWN_PRECISION", 2: "USE_FP16", 3: "USE_HF32", 4: "USE_FP32_ADD"}
#: GetCubeMathType's 2-bit code (allowHf32 << 1) | IsAllowFP32ToFP16() -> cubeMathType ([PT] CalcuOpUtil.cpp)
_CMT_FROM_CODE = {0b00: KEEP_DTYPE, 0b01: USE_FP16, 0b10: USE_HF32, 0b11: ALLOW_FP32_DOWN_PRECISION}
_STATUS_NONFINITE = 0x20
#: bytes a dump leaves free on its file system: past them the rest of the step is dumped as statistics
DUMP_MARGIN = 1 << 30   # the AI CPU's verdict on an output holding Inf/NaN (as the replay's AI CPU ops)


def cube_math_type(options: NpuOptions, family: str) -> int:
    """The cubeMathType torch_npu passes to the aclnn cube kernel of ``family`` (``matmul``, ``conv``): matmul
    reads ``matmul.allow_hf32`` and an explicit ``cube_math_type`` overrides it; conv reads ``conv.allow_hf32``
    only (ASCEND-FACTS 13.1, [OP] OpUtils.cpp, ConvolutionKernelNpuOpApi.cpp)."""
    if family == "matmul" and options.cube_math_type is not None:
        return options.cube_math_type
    hf32 = options.allow_hf32_matmul if family == "matmul" else options.allow_hf32_conv
    fp16 = options.effective_precision_mode == "allow_fp32_to_fp16"
    return _CMT_FROM_CODE[(int(hf32) << 1) | int(fp16)]


def float32_cube_operands(chip, cmt: int) -> str:
    """What the aclnn cube kernel does with float32 operands under ``cmt`` on ``chip`` (ASCEND-FACTS 13.3, [NN]
    cube_util.cpp CheckCubeMathType): ``float32`` (true float32), ``hfloat32`` (HF32), ``float16`` (cast to fp16),
    ``aicpu`` (no float32 cube: the op leaves the AI Core) or ``refused`` (the kernel rejects it)."""
    if chip.fp32_cube:
        return {KEEP_DTYPE: "float32", USE_FP32_ADD: "float32", ALLOW_FP32_DOWN_PRECISION: "hfloat32",
                USE_HF32: "hfloat32", USE_FP16: "float16"}[cmt]
    return {KEEP_DTYPE: "aicpu", USE_FP32_ADD: "aicpu", ALLOW_FP32_DOWN_PRECISION: "float16", USE_FP16: "float16",
            USE_HF32: "refused"}[cmt]


@dataclass
class AtenRecord:
    """What the emulated NPU did for one aten call."""

    name: str                 # Aten.<op>.<n>.forward / .backward
    aten: str                 # the overload, aten.addmm.default
    phase: str                # forward, backward, update
    step: int
    engine: str               # AICORE, AICPU, HOST
    op_types: list            # the registry ops it ran (AICORE), or the aten op
    compute_dtype: str
    dtypes: dict              # torch dtypes of the tensor inputs and outputs
    status: int = 0
    reason: str = ""
    cube_math_type: str | None = None
    inputs: list = field(default_factory=list)

    @property
    def status_names(self) -> list:
        return decode_status(self.status)

    def to_dict(self) -> dict:
        return {"name": self.name, "aten": self.aten, "phase": self.phase, "step": self.step, "engine": self.engine,
                "op_types": list(self.op_types), "compute_dtype": self.compute_dtype, "dtypes": self.dtypes,
                "status": self.status, "status_names": self.status_names, "reason": self.reason,
                "cube_math_type": self.cube_math_type}


class _Launcher:
    """The ``k`` of an aten lowering: runs registry ops on the device for one aten call and keeps its record."""

    def __init__(self, run: "TorchRun", name: str):
        self.run = run
        self.name = name
        self.options = run.options
        self.stash = run._stash
        self.types: list = []
        self.status = 0
        self.notes: list = []
        self.compute = None
        self.cmt = None
        self.exact_run = False

    def note(self, text: str) -> None:
        self.notes.append(text)

    def host_copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with no_dispatch(), torch.no_grad():
            dst.copy_(src)

    def exact(self):
        """Let torch compute this call itself (an exact op: a maximum, a selection)."""
        self.exact_run = True
        raise _Exact

    def fa_available(self) -> bool:
        """FlashAttentionScore: torch_npu's SDPA on the 910B and later (ASCEND-FACTS 13.5)."""
        return self.run.chip.fp32_cube

    def cast(self, a: np.ndarray, dtype: str) -> np.ndarray:
        """The vector unit's Cast (rint, the SoC's overflow mode), its status into this call's."""
        from ..numerics.vector import cast

        y, st = cast(a, dtype, overflow_mode=self.run.device.overflow_mode, subnormals=self.run.device.subnormals)
        self.status |= int(st)
        self.types.append("Cast")
        self.compute = self.compute or dtype
        return y

    def op(self, tf_type: str, *arrays, family: str | None = None, op_model: str | None = None, **attrs) -> tuple:
        """Run registry op ``tf_type`` on ``arrays`` in their float dtype (a cube op's float32 operands as its
        cubeMathType says); returns its outputs."""
        opdef = OPS[tf_type]
        run = self.run
        dtype = next((a.dtype.name for a in arrays if isinstance(a, np.ndarray) and a.dtype.kind in "fV"
                      and a.dtype.itemsize in (2, 4) and a.ndim), None) or \
            next((a.dtype.name for a in arrays if isinstance(a, np.ndarray) and a.dtype.kind in "fV"), "float32")
        if dtype not in ("float16", "bfloat16", "float32"):
            raise _aten.Fallback(f"{dtype} has no AI Core kernel")
        cube_out = None
        if opdef.kind == CUBE:
            if dtype not in run.chip.cube_dtypes and dtype != "float32":
                raise AscendEmuError(f"{self.name}: {run.chip.name}'s cube has no {dtype} (torch_npu supports "
                                     f"bfloat16 from the Ascend910B on); use float16 or an A2/A3 SoC")
            if dtype == "float32":
                cmt = cube_math_type(self.options, family or "matmul")
                self.cmt = _CMT_NAMES[cmt]
                how = float32_cube_operands(run.chip, cmt)
                if how == "aicpu":
                    raise _aten.Fallback(f"{run.chip.name}'s cube has no float32 (cubeMathType {self.cmt}): "
                                         "the op runs on the AI CPU")
                if how == "refused":
                    raise AscendEmuError(f"{self.name}: cubeMathType USE_HF32 is not supported on {run.chip.name} "
                                         "(no HF32); drop torch.npu.matmul.allow_hf32 / cube_math_type")
                arrays = list(arrays)
                n_operands = 2 if tf_type != "_FlashAttentionScore" else 3
                idx = [i for i in range(min(n_operands, len(arrays)))
                       if isinstance(arrays[i], np.ndarray) and arrays[i].dtype == np.float32]
                if tf_type == "Conv2DBackpropInput":
                    idx = [1, 2]
                elif tf_type == "Conv2DBackpropFilter":
                    idx = [0, 2]
                if how == "hfloat32":
                    from ..numerics.hf32 import to_hf32

                    for i in idx:
                        arrays[i], st = to_hf32(arrays[i], run.device.hf32_rounding, overflow_mode=run.device.
                                                overflow_mode, subnormals=run.device.subnormals)
                        self.status |= int(st)
                    self.types.append("HF32")
                elif how == "float16":
                    for i in idx:
                        arrays[i] = self.cast(arrays[i], "float16")
                    dtype = "float16"
        ctx = run.device.context(dtype, cube_out, op=self.name, tf_type=tf_type, launch=run.step)
        if op_model is not None:
            ctx.op_model = op_model
        try:
            with np.errstate(all="ignore"):
                outs = opdef(*arrays, ctx=ctx, **attrs)
        except NotImplementedError as e:
            raise _aten.Fallback(str(e)) from None
        self.status |= int(ctx.status)
        self.types.append(tf_type)
        # an output that is (a view of) an input would alias the script's tensor once wrapped: copied
        ins = [a for a in arrays if isinstance(a, np.ndarray) and a.size]
        outs = tuple(np.array(o) if isinstance(o, np.ndarray) and any(np.may_share_memory(o, a) for a in ins)
                     else o for o in outs)
        if self.compute is None or opdef.kind == CUBE:
            self.compute = dtype
        return outs


class _Exact(Exception):
    pass


#: the aten ops of GradScaler, run by the device's own rule
_AMP_UNSCALE = "aten._amp_foreach_non_finite_check_and_unscale_"
_AMP_UPDATE = "aten._amp_update_scale_"


class TorchRun:
    """One emulated torch_npu run: the options, the device, the records and the dumps of the script's steps.

    Use :func:`emulate` to make one. ``records`` holds one :class:`AtenRecord` per aten call; ``steps`` one
    dict per step (an optimizer step, or a GradScaler iteration: its ``skipped`` flag, ``loss_scale``, the first
    overflowing call); ``float_status`` the float status register; ``options`` the torch_npu switches.
    """

    def __init__(self, soc: str = "Ascend910B", precision_mode: str | None = None, *, aicpu_fallback: bool = True,
                 dump=None, dump_steps=None, stats_only: bool = False, reference: bool = False,
                 overwrite: bool = False, allow_hf32_matmul=None, allow_hf32_conv=None, cube_math_type=None,
                 compatible_impl=None, deterministic=None, keep_records: bool = True, **device_options):
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
                                     "run_seed", "multicore", "hf32_rounding", "reduce_accumulate"}
        if bad:
            raise AscendEmuError(f"emulate: unknown option(s) {', '.join(sorted(bad))}")
        self._device_options = device_options
        self._devices: dict = {}
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
        self.records: list[AtenRecord] = []
        self.steps: list[dict] = []
        self.float_status = FloatStatus()
        self.step = 0
        self.dumps: dict = {}
        self.reference_dumps: dict = {}
        self._counts: dict = {}
        self._stash: dict = {}
        self._names = WeakIdKeyDictionary()      # tensor -> the dump name of the op output it is
        self._shadow = WeakIdKeyDictionary()     # tensor -> its float32 reference twin (reference=True)
        self._writers = None
        self._budget = None
        self._dump_bytes = 0
        self._budget_said = False
        self._step_info: dict = {}
        self._modes = None
        self._t0 = None

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

    def clear_float_status(self) -> None:
        """npu_clear_float_status: what torch_npu's GradScaler.scale does first in an iteration on a SoC in
        saturation mode (the ``torch_npu`` shim calls it)."""
        self.float_status.clear()

    def autocast(self, dtype=torch.float16, enabled: bool = True):
        """``torch.autocast("npu", dtype)`` of this run: a ``with`` block of torch_npu's autocast."""
        return self.options.overridden("run.autocast", autocast_enabled=bool(enabled), autocast_dtype=dtype)

    # -- one aten call ------------------------------------------------------------------------------------------
    def __call__(self, func, args, kwargs, phase: str):
        packet = str(func.overloadpacket)
        short = packet.split(".", 1)[1] if "." in packet else packet
        prefix = "Aten" if packet.startswith("aten.") else "NPU"     # msprobe's prefixes (13.6)
        if packet == _AMP_UNSCALE:
            return self._amp_unscale(func, args, kwargs, phase)
        if packet == _AMP_UPDATE:
            return self._amp_update(func, args, kwargs, phase)
        if not packet.startswith(("aten.", "ascend_emu.")):
            return func(*args, **kwargs)
        low = _LOWERINGS.get(func, _MISSING)
        if low is _MISSING:
            low = _LOWERINGS[func] = _aten.lookup(func) or _composite(func)
        if low is None and packet in _aten.HOST:
            return self._host_call(func, args, kwargs, phase, short)
        n = self._counts.get(short, 0)
        self._counts[short] = n + 1
        name = f"{prefix}.{short}.{n}.{'backward' if phase == 'backward' else 'forward'}"
        k = _Launcher(self, name)
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
        except _Exact:
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
        k = _Launcher(self, f"Aten.{short}.{n}.{'backward' if phase == 'backward' else 'forward'}")
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
        halves = [a for a in _tensors(args, kwargs) if a.dtype in (torch.float16, torch.bfloat16)]
        with no_dispatch():
            if not halves:
                out = func(*args, **kwargs)
            else:
                up = {id(t): t.float() for t in halves}
                wide = _map(lambda t: up.get(id(t), t), args)
                wkw = _map(lambda t: up.get(id(t), t), kwargs)
                out = func(*wide, **wkw)
                schema = func._schema
                for i, arg in enumerate(schema.arguments[:len(args)]):
                    if arg.alias_info is not None and arg.alias_info.is_write:
                        for orig, new in zip(_flat(args[i]), _flat(wide[i])):
                            if orig is not new and isinstance(orig, torch.Tensor):
                                orig.copy_(new)
                expect = _out_dtypes(func, args, kwargs)
                out = _map_out(out, expect, args, wide)
        st = 0
        for t in _flat(out):
            if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel():
                with no_dispatch():
                    if not bool(torch.isfinite(t).all()):
                        st |= _STATUS_NONFINITE
        return out, st

    # -- GradScaler (ASCEND-FACTS 13.2) -----------------------------------------------------------------------------
    def _amp_unscale(self, func, args, kwargs, phase):
        grads, found_inf, inv_scale = (list(args) + [kwargs.get("found_inf"), kwargs.get("inv_scale")])[:3]
        name = self._name("_amp_foreach_non_finite_check_and_unscale_", phase)
        k = _Launcher(self, name)
        inv = float(inv_scale.reshape(-1)[0])
        if self.device.overflow_mode == "saturation":
            # the 910: NPUGetFloatStatus - any overflow since the last clear, the forward included; on an
            # overflow the gradients stay scaled ([OP] aclops/AmpForeachNonFiniteCheckAndUnscaleKernelNpu.cpp)
            found = bool(self.float_status.get())
            reason = (f"saturation mode: the float status register since the last clear "
                      f"(0x{self.float_status.get():x}) decides")
            if not found:
                for g in grads:
                    k.host_copy(g, _aten._binary(k, "Mul", g, torch.tensor(inv, dtype=torch.float32)).to(g.dtype))
        else:
            # A2/A3/950: aclnnForeachNonFiniteCheckAndUnscale, a per-tensor non-finite check, then every
            # gradient times inv_scale
            found = False
            for g in grads:
                with no_dispatch():
                    found |= not bool(torch.isfinite(g).all())
                k.host_copy(g, _aten._binary(k, "Mul", g, torch.tensor(inv, dtype=torch.float32)).to(g.dtype))
            reason = "INF_NAN mode: per-tensor non-finite check of the gradients"
        if found:
            with no_dispatch():
                found_inf.fill_(1.0)
        k.types = ["ForeachNonFiniteCheckAndUnscale"]
        self._step_info["scaler"] = True
        self._step_info["found_inf"] = found
        self._record(k, func, phase, "AICORE", reason, args, None, name=name)
        return None

    def _amp_update(self, func, args, kwargs, phase):
        scale, tracker, found_inf, growth, backoff, interval = list(args)[:6]
        name = self._name("_amp_update_scale_", phase)
        k = _Launcher(self, name)
        with no_dispatch():
            old = float(scale.reshape(-1)[0])
            if float(found_inf.reshape(-1)[0]):
                scale.mul_(backoff)
                tracker.zero_()
            else:
                tracker.add_(1)
                if int(tracker.reshape(-1)[0]) == int(interval):
                    new = scale * growth
                    if bool(torch.isfinite(new).all()):     # torch_npu never grows the scale to Inf
                        scale.copy_(new)
                    tracker.zero_()
        k.types = ["AmpUpdateScale"]
        self._record(k, func, phase, "AICORE", "GradScaler's update (torch_npu _npu_update_scale)", args, scale,
                     name=name)
        self._step_info.update(loss_scale=old, next_loss_scale=float(scale.reshape(-1)[0]),
                               skipped=bool(self._step_info.get("found_inf")))
        self.end_step("grad_scaler")
        return scale

    # -- records, dumps, steps ----------------------------------------------------------------------------------------
    def _name(self, short: str, phase: str) -> str:
        n = self._counts.get(short, 0)
        self._counts[short] = n + 1
        return f"Aten.{short}.{n}.{'backward' if phase == 'backward' else 'forward'}"

    def _record(self, k: _Launcher, func, phase, engine, reason, args, out, name=None):
        name = name or k.name
        status = int(k.status)
        if engine != "HOST":
            self.float_status.record(status)
        if status and "first_overflow" not in self._step_info:
            self._step_info["first_overflow"] = {"name": name, "aten": str(func), "phase": phase,
                                                 "op_types": list(k.types)}
        w = self._writers
        if not self.keep_records and w is None:
            return          # (a benchmark's run: nothing kept per call)
        ins = [t for t in _flat(args) if isinstance(t, torch.Tensor)]
        outs = [t for t in _flat(out) if isinstance(t, torch.Tensor)]
        compute = k.compute or (_DTYPE_NAMES[outs[0].dtype] if outs else "")
        rec = AtenRecord(name, str(func), phase, self.step, engine, list(k.types), compute,
                         {"inputs": [_DTYPE_NAMES[t.dtype] for t in ins],
                          "outputs": [_DTYPE_NAMES[t.dtype] for t in outs]}, status, reason, k.cmt)
        if self.keep_records:
            self.records.append(rec)
        if w is not None:
            inputs = [self._names.get(t, "input") for t in ins]
            rec.inputs = inputs
            precision = {"list": None, "dtype": compute, "reason": reason or f"{engine}: {', '.join(k.types)}",
                         "aten": str(func), "torch_dtypes": rec.dtypes, "cube_math_type": k.cmt}
            arrays = self._dumped([to_numpy(t) for t in outs])
            main = _primary(k.types) or str(func)
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

    def _fp32_check(self, func, args, engine) -> dict | None:
        """msprobe's verdict input for an overflowing call: the same call in torch float32 on its inputs widened
        (an in-place call has changed its input: none)."""
        schema = func._schema
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            return None
        try:
            with no_dispatch(), torch.no_grad():
                outs = func(*_map(lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t, args))
        except Exception:
            return None
        finite, max_abs = True, 0.0
        for t in _flat(outs):
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
        from ..analysis.dump import StatsOnly
        from ..analysis.dump.stats import tensor_stats

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
        return _map(twin, args)

    def _reference(self, func, twins, args, out):
        """This call again in plain torch float32 on the reference twins ``(a, kwargs)`` of its inputs ``args``: the
        reference run, op by op, under the same names (autocast's casts keep float32 there)."""
        a, kwargs = twins
        if str(func.overloadpacket) == "aten._to_copy" and kwargs.get("dtype") in (torch.float16, torch.bfloat16):
            kwargs = dict(kwargs, dtype=torch.float32)
        with no_dispatch(), torch.no_grad():
            try:
                r = func(*a, **kwargs)
            except Exception:      # an op the float32 twins cannot take (a dtype it checks): no reference row
                return None
        if r is None:
            return None
        outs = [t for t in _flat(out) if isinstance(t, torch.Tensor)]
        refs = [t for t in _flat(r) if isinstance(t, torch.Tensor)]
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
        from ..analysis.dump import DumpWriter

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
        if self.chip.name and self.device.overflow_mode == "saturation" and info.get("scaler"):
            # torch_npu's GradScaler clears the register once per iteration (its next scale())
            self.float_status.clear()
        self.step += 1
        self._counts = {}
        self._step_info = {}
        self._open_step()

    def config(self) -> dict:
        return {"framework": "pytorch", "torch_npu_options": self.options.as_dict(),
                "device": self.device.config(), "aicpu_fallback": self.aicpu_fallback}

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
        self._open_step()
        return self

    def __exit__(self, *exc) -> None:
        act, auto, disp = self._modes
        self._modes = None
        try:
            disp.__exit__(*exc)
            auto.__exit__(*exc)
        finally:
            act.__exit__(*exc)
            if self._step_info or self._writers is not None:
                if exc[0] is None:
                    info = {"step": self.step, "skipped": False, **self._step_info}
                    info.setdefault("first_overflow", None)
                    if self._step_info:
                        self.steps.append(info)
                self._close_step(exc[1])


class _DtypeNames(dict):
    def __missing__(self, dtype):
        self[dtype] = name = dtype_name(dtype)
        return name


_DTYPE_NAMES = _DtypeNames()
#: aten overload -> its lowering (None: none), worked out once per overload
_LOWERINGS: dict = {}
_MISSING = object()


def _composite(func):
    """In-place and foreach forms of a lowered op: the op itself, its result copied into the target."""
    name = func.overloadpacket.__name__
    if name.startswith("_foreach_"):
        base = name[len("_foreach_"):]
        inplace = base.endswith("_")
        base = base.rstrip("_")
        lows = [l for l in (_aten.ATEN.get(f"aten.{base}.{o}") for o in ("Tensor", "Scalar", "default"))
                if l is not None] + [_aten.ATEN.get(f"aten.{base}")]
        lows = [l for l in lows if l is not None]
        if not lows:
            return None
        return lambda k, *a, **kw: _foreach(k, lows[0], inplace, a, kw)
    if name.endswith("_") and not name.startswith("_"):
        low = _aten.ATEN.get(f"aten.{name[:-1]}.{func._overloadname}") or _aten.ATEN.get(f"aten.{name[:-1]}")
        if low is None:
            return None

        def inplace(k, target, *a, **kw):
            y = low(k, target, *a, **kw)
            k.host_copy(target, y)
            return target
        return inplace
    return None


def _primary(types) -> str | None:
    """The op a record is named by: its cube or vector op, not the casts and HF32 roundings in front of it."""
    return next((t for t in types if t not in ("Cast", "HF32")), types[0] if types else None)


def _foreach(k, low, inplace, args, kwargs):
    lists = [i for i, a in enumerate(args) if isinstance(a, (list, tuple)) and a and
             all(isinstance(t, (torch.Tensor, int, float)) for t in a)]
    n = len(args[lists[0]]) if lists else 0
    outs = []
    for j in range(n):
        a = [args[i][j] if i in lists else args[i] for i in range(len(args))]
        y = low(k, *a, **kwargs)
        if inplace:
            k.host_copy(args[0][j], y)
        outs.append(y)
    return None if inplace else outs


def _flat(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _flat(v)
    else:
        yield x


def _tensors(args, kwargs):
    return [t for t in list(_flat(args)) + list(_flat(list(kwargs.values()))) if isinstance(t, torch.Tensor)]


def _map(fn, x):
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, v) for v in x)
    return fn(x) if isinstance(x, torch.Tensor) else x


def _out_dtypes(func, args, kwargs):
    """The dtypes ``func`` gives on these arguments (run on meta tensors)."""
    try:
        meta = _map(lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"), (args, kwargs))
        r = func(*meta[0], **meta[1])
        return [t.dtype if isinstance(t, torch.Tensor) else None for t in _flat(r)]
    except Exception:
        return None


def _map_out(out, expect, args, wide):
    if expect is None:
        return out
    it = iter(expect)

    def fix(t):
        want = next(it, None)
        if isinstance(t, torch.Tensor) and want is not None and t.dtype != want and t.dtype.is_floating_point:
            return t.to(want)
        return t
    # outputs that alias a widened argument are the original argument (written back above)
    if isinstance(out, torch.Tensor):
        for o, w in zip(_flat(args), _flat(wide)):
            if out is w:
                return o
        return fix(out)
    if isinstance(out, (list, tuple)):
        return type(out)(fix(t) for t in _flat(out)) if all(not isinstance(v, (list, tuple)) for v in out) else out
    return out


def emulate(soc: str = "Ascend910B", precision_mode: str | None = None, *, aicpu_fallback: bool = True, dump=None,
            dump_steps=None, stats_only: bool = False, reference: bool = False, overwrite: bool = False,
            **options) -> TorchRun:
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

    Returns
    -------
    TorchRun
        ``with emulate(...) as run:`` ... ``run.records``, ``run.steps``, ``run.first_overflow``, ``run.options``.
    """
    return TorchRun(soc, precision_mode, aicpu_fallback=aicpu_fallback, dump=dump, dump_steps=dump_steps,
                    stats_only=stats_only, reference=reference, overwrite=overwrite, **options)

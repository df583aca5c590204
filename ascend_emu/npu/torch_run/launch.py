"""One aten call's kernels on the emulated device: torch_npu's cubeMathType, the launcher a lowering runs registry
ops through (:class:`Launcher`), the call's record, and helpers over torch's argument structures."""
from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from ...frontend import torch as _front  # noqa: F401  (first: without torch, the one-line error of the extra)
import torch  # noqa: E402
from torch.utils._mode_utils import no_dispatch  # noqa: E402

from ...errors import AscendEmuError
from ...frontend.torch import aten as _aten
from ...frontend.torch.convert import dtype_name
from ...frontend.torch.options import NpuOptions
from ...numerics.status import decode_status
from ...ops import CUBE, OPS

#: torch_npu's cubeMathType codes ([PT] npu_config.py _CubeMathType; ASCEND-FACTS 13.1)
KEEP_DTYPE, ALLOW_FP32_DOWN_PRECISION, USE_FP16, USE_HF32, USE_FP32_ADD = 0, 1, 2, 3, 4
_CMT_NAMES = {0: "KEEP_DTYPE", 1: "ALLOW_FP32_DOWN_PRECISION", 2: "USE_FP16", 3: "USE_HF32", 4: "USE_FP32_ADD"}
#: GetCubeMathType's 2-bit code (allowHf32 << 1) | IsAllowFP32ToFP16() -> cubeMathType ([PT] CalcuOpUtil.cpp)
_CMT_FROM_CODE = {0b00: KEEP_DTYPE, 0b01: USE_FP16, 0b10: USE_HF32, 0b11: ALLOW_FP32_DOWN_PRECISION}
#: the float dtypes a launch reads its compute dtype from (float64 has no AI Core kernel)
_FLOATS = {np.dtype(np.float16): "float16", np.dtype(ml_dtypes.bfloat16): "bfloat16",
           np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}
#: the AI CPU's verdict on an output holding Inf/NaN (as the replay's AI CPU ops)
STATUS_NONFINITE = 0x20


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


class Launcher:
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

    @property
    def numerics(self):
        """The device's NumericsPolicy (the lowerings read the torch path's assumed parameters from it)."""
        return self.run.device.numerics

    #: an eager run keeps what a kernel's backward reads (FlashAttentionScore's softmax max and sum)
    keeps_backward_stats = True

    def note(self, text: str) -> None:
        self.notes.append(text)

    def host_copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with no_dispatch(), torch.no_grad():
            dst.copy_(src)

    def exact(self):
        """Let torch compute this call itself (an exact op: a maximum, a selection)."""
        self.exact_run = True
        raise Exact

    def aclnn_model(self) -> str | None:
        """The kernel family torch_npu calls: aclnn's Ascend C kernels on the 910B and later (jit off by default,
        ASCEND-FACTS 13.1), so ``"ascendc"``; None (the device's TBE model) before."""
        return "ascendc" if self.run.chip.fp32_cube else None

    def bias_after_transposed_conv(self) -> bool:
        """Whether aclnnConvolution adds a transposed convolution's bias with its own Add (the 950: IsSupportND, arch
        3510, the one SoC of the ``ascendc`` op model) rather than passing it to Conv2DTranspose."""
        return self.run.chip.op_model == "ascendc"

    def fa_available(self) -> bool:
        """FlashAttentionScore: torch_npu's SDPA on the 910B and later (ASCEND-FACTS 13.5)."""
        return self.run.chip.fp32_cube

    def cast(self, a: np.ndarray, dtype: str) -> np.ndarray:
        """The vector unit's Cast (rint, the SoC's overflow mode), its status into this call's."""
        from ...numerics.vector import cast

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
        dtype = None
        for a in arrays:        # the first float operand that is not a scalar; else the first float scalar
            if type(a) is np.ndarray and a.dtype in _FLOATS:
                if a.ndim:
                    dtype = _FLOATS[a.dtype]
                    break
                dtype = dtype or _FLOATS[a.dtype]
        dtype = dtype or "float32"
        if dtype not in ("float16", "bfloat16", "float32"):
            raise _aten.Fallback(f"{dtype} has no AI Core kernel")
        cube_out = None
        if dtype == "bfloat16" and not run.chip.supports_bf16:
            # torch_npu has no bfloat16 below the 910B1 (ASCEND-FACTS 13.2, NpuVariables.cpp IsBF16Supported)
            raise AscendEmuError(f"{self.name}: bfloat16 is not supported on {run.chip.name} (torch_npu allows it "
                                 f"from the Ascend910B on); use float16 or float32, or an A2/A3 SoC")
        if opdef.kind == CUBE:
            if dtype not in run.chip.cube_dtypes and dtype != "float32":
                raise AscendEmuError(f"{self.name}: {run.chip.name}'s cube has no {dtype}; use float16")
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
                n_operands = {"_FlashAttentionScore": 3, "_FlashAttentionScoreGrad": 4}.get(tf_type, 2)
                idx = [i for i in range(min(n_operands, len(arrays)))
                       if isinstance(arrays[i], np.ndarray) and arrays[i].dtype == np.float32]
                if tf_type in ("Conv2DBackpropInput", "Conv2DTranspose", "Conv3DBackpropInputV2"):
                    idx = [1, 2]        # (sizes, the two operands)
                elif tf_type in ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2"):
                    idx = [0, 2]        # (x, sizes, dy)
                if how == "hfloat32":
                    from ...numerics.hf32 import to_hf32

                    pol = run.device.numerics
                    family = "conv" if tf_type.startswith(("Conv", "Depthwise")) else "matmul"
                    for i in idx:
                        arrays[i], st = to_hf32(arrays[i], pol.hf32_rounding_of(family), overflow_mode=run.device.
                                                overflow_mode, subnormals=run.device.subnormals, bits=pol.hf32_bits)
                        self.status |= int(st)
                    self.types.append("HF32")
                elif how == "float16":
                    for i in idx:
                        arrays[i] = self.cast(arrays[i], "float16")
                    dtype = "float16"
                    # the fp16 operands' output dtype, or the accumulator's float32 (use_fp16_out: assumed)
                    if run.device.numerics.use_fp16_out == "float32":
                        cube_out = "float32"
        ctx = run.context(dtype, cube_out, self.name, tf_type)
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
        fresh = []
        for o in outs:
            if type(o) is np.ndarray:
                for a in arrays:
                    if type(a) is np.ndarray and a.size and np.may_share_memory(o, a):
                        o = np.array(o)
                        break
            fresh.append(o)
        outs = tuple(fresh)
        if self.compute is None or opdef.kind == CUBE:
            self.compute = dtype
        return outs


class Exact(Exception):
    """The lowering lets torch compute this call itself (an exact op)."""



class DtypeNames(dict):
    def __missing__(self, dtype):
        self[dtype] = name = dtype_name(dtype)
        return name


DTYPE_NAMES = DtypeNames()
#: aten overload -> its lowering (None: none), worked out once per overload
LOWERINGS: dict = {}
MISSING = object()


def composite(func):
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
        return lambda k, *a, **kw: foreach_(k, lows[0], inplace, a, kw)
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


def primary(types) -> str | None:
    """The op a record is named by: its cube or vector op, not the casts and HF32 roundings in front of it."""
    return next((t for t in types if t not in ("Cast", "HF32")), types[0] if types else None)


def foreach_(k, low, inplace, args, kwargs):
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


def flat(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from flat(v)
    else:
        yield x


def tensors(args, kwargs):
    return [t for t in list(flat(args)) + list(flat(list(kwargs.values()))) if isinstance(t, torch.Tensor)]


def tmap(fn, x):
    if isinstance(x, dict):
        return {k: tmap(fn, v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(tmap(fn, v) for v in x)
    return fn(x) if isinstance(x, torch.Tensor) else x


def out_dtypes(func, args, kwargs):
    """The dtypes ``func`` gives on these arguments (run on meta tensors)."""
    try:
        meta = tmap(lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"), (args, kwargs))
        r = func(*meta[0], **meta[1])
        return [t.dtype if isinstance(t, torch.Tensor) else None for t in flat(r)]
    except Exception:
        return None


def map_out(out, expect, args, wide):
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
        for o, w in zip(flat(args), flat(wide)):
            if out is w:
                return o
        return fix(out)
    if isinstance(out, (list, tuple)):
        return type(out)(fix(t) for t in flat(out)) if all(not isinstance(v, (list, tuple)) for v in out) else out
    return out


def same_values(t):
    """The reference twin holding ``t``'s own values (16-bit floats widened to float32)."""
    with no_dispatch():
        return t.detach().float() if t.dtype in (torch.float16, torch.bfloat16) else t.detach().clone()

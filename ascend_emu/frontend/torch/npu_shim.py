"""The ``torch_npu`` a script imports under ``ascend-emu torch-run``: its API mapped onto the emulated run.

:func:`installed` puts the shim directory (``shim/``, holding a ``torch_npu`` package whose modules are the
objects built here) on ``sys.path``, so ``import torch_npu`` works only inside it; nothing of it is importable
as ``torch_npu`` otherwise. While installed:

* the ``npu`` device: torch's PrivateUse1 backend is renamed ``npu`` (``torch.device("npu:0")`` parses) and
  a ``TorchFunctionMode`` maps every ``device=`` argument and ``Tensor.to(...)`` target of type ``npu`` to
  the CPU; ``Tensor.npu()`` and ``Module.npu()`` return their tensor / module. Tensors stay CPU tensors: the
  emulated device is the dispatch-level hook (``ae.torch.emulate``), not a torch backend.
* ``torch.npu`` (= ``torch_npu.npu``): ``set_device``, ``synchronize``, ``is_available`` (True),
  ``device_count`` (1: one emulated device per process), ``current_device``, ``matmul.allow_hf32``,
  ``conv.allow_hf32``, ``matmul.cube_math_type``, ``set_option`` validated against torch_npu's
  ``_option_map``, ``use_compatible_impl``, ``set_deterministic_level``, ``amp.autocast``, ``amp.GradScaler``;
* ``torch.autocast("npu")`` / ``torch.amp.autocast("npu")`` and ``torch.use_deterministic_algorithms``;
* ``torch.ops.npu.npu_*`` (torch_npu's schemas, composites of ``torch.ops.ascend_emu.*``), ``Tensor.device`` as
  ``npu:0`` (but for what ``.cpu()`` returned), ``torch.npu.Event`` / ``Stream`` (one synchronous stream) and
  ``torch.Generator(device="npu")`` (the CPU's generator, as ``torch.npu.manual_seed``, ``seed``, ``get_rng_state``
  and ``set_rng_state`` read and set it), ``torch.npu.device(0)``, ``Tensor.is_npu``, and the memory counters
  (``memory_allocated``, ``memory_reserved`` and their maxima: 0, the tensors being CPU tensors);
  ``get_device_properties`` (the SoC's name and sourced core counts) and ``mem_get_info`` (no source gives an HBM
  size: one line), in :mod:`.npu_device` with the placement mode, the device index and host memory.

Every switch the script sets goes into the run's :class:`~.options.NpuOptions` (:func:`.options.current`) with
the torch_npu spelling that set it as its source; options that change no emulated numerics (``ACL_AICORE_NUM``,
``ACL_OP_SELECT_IMPL_MODE``, ...) are validated and listed in :func:`calls`, the run record's "torch_npu
calls". Sources: ASCEND-FACTS.md 13.1 (options and defaults), 13.2 (autocast, GradScaler), 13.7 (determinism).
"""
from __future__ import annotations

import contextlib
import enum
import os
import sys
import time
import types

import torch

from ...errors import AscendEmuError
from ...numerics.policy import SOCS
from .npu_device import (_ABSENT, _ON_CPU, NpuDeviceMode, _check_device, _host_patches, _is_npu,
                         _module_npu, _new_shared_on_cpu, _soc_name, _tensor_npu, _to_cpu, get_device_properties,
                         mem_get_info)
from .npu_ops import TOP_LEVEL, _register_npu_ops  # noqa: F401  (torch_npu's npu_* functions and torch.ops.npu)
from .options import current

#: the directory put on sys.path: it holds the ``torch_npu`` package
SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")

#: torch_npu's set_option check ([PT] torch_npu/npu/npu_config.py ``_option_map``): allowed values, a check, or
#: None (any value); a key not listed passes, as in torch_npu
_OPTION_MAP = {"ACL_PRECISION_MODE": ["allow_fp32_to_fp16", "must_keep_origin_dtype"],
               "ACL_OP_SELECT_IMPL_MODE": ["high_performance", "high_precision"],
               "ACL_AICORE_NUM": (lambda value: value.isdigit() and 1 <= int(value) <= 32),
               "ACL_OPTYPELIST_FOR_IMPLMODE": None,
               "ACL_OP_DEBUG_LEVEL": ["0", "1", "2", "3", "4"],
               "ACL_DEBUG_DIR": None,
               "ACL_OP_COMPILER_CACHE_MODE": ["disable", "enable", "force"],
               "ACL_OP_COMPILER_CACHE_DIR": None}
_OPTION_RANGE = {"ACL_AICORE_NUM": "an integer from 1 to 32"}

#: what the script called that the options do not hold (set_device, GradScaler, set_option keys without numerics)
_CALLS: list = []


def calls() -> list:
    """The torch_npu calls of the current installation that are not options: ``[{"call", "args"}]``."""
    return list(_CALLS)


def _options(what: str):
    o = current()
    if o is None:
        raise AscendEmuError(f"{what} sets an option of the emulated NPU, but no emulated run is active; run the "
                             "script with ascend-emu torch-run, or inside ascend_emu.torch.emulate(...)")
    return o


def _record(call: str, **args) -> None:
    _CALLS.append({"call": call, "args": {k: (v if isinstance(v, (bool, int, float, str, type(None))) else str(v))
                                          for k, v in args.items()}})


# --------------------------------------------------------------------------- torch.npu

class CubeMathType(enum.IntEnum):
    """torch_npu's ``_CubeMathType`` ([PT] npu_config.py; ASCEND-FACTS.md 13.1)."""
    KEEP_DTYPE = 0
    ALLOW_FP32_DOWN_PRECISION = 1
    USE_FP16 = 2
    USE_HF32 = 3
    USE_FP32_ADD = 4
    FORCE_GRP_ACC_FOR_FP32 = 4


class _Switch:
    """``torch.npu.matmul`` / ``torch.npu.conv``: attributes read from and written to the run's options."""

    def __init__(self, family: str, fields: dict):
        object.__setattr__(self, "_family", family)
        object.__setattr__(self, "_fields", fields)   # attribute -> NpuOptions field

    def __getattr__(self, name):
        fields = object.__getattribute__(self, "_fields")
        if name not in fields:
            raise AttributeError(f"torch.npu.{self._family} has no attribute {name!r}")
        return getattr(_options(f"torch.npu.{self._family}.{name}"), fields[name])

    def __setattr__(self, name, value):
        if name not in self._fields:
            raise AscendEmuError(f"torch.npu.{self._family}.{name} is not a torch_npu switch; "
                                 f"choose one of: {', '.join(self._fields)}")
        _options(f"torch.npu.{self._family}.{name}").set(self._fields[name], value,
                                                         f"torch.npu.{self._family}.{name}")


def set_option(option):
    """``torch_npu.npu.set_option(dict)``: each value checked as torch_npu's ``_option_map`` checks it (a bad
    one raises ValueError, as torch_npu does); ACL_PRECISION_MODE becomes the run's precision mode."""
    if not isinstance(option, dict):
        raise TypeError("npu option must be a dict.")
    checked = {}
    for name, value in option.items():
        v = str(value)
        allowed = _OPTION_MAP.get(name)
        ok = name not in _OPTION_MAP or allowed is None or (allowed(v) if callable(allowed) else v in allowed)
        if not ok:
            want = _OPTION_RANGE.get(name) or ", ".join(allowed)
            raise AscendEmuError(f"torch_npu.npu.set_option: value of {name} should be in {want}, but got {value!r}")
        checked[str(name)] = v
    for name, v in checked.items():
        if name == "ACL_PRECISION_MODE":
            _options("set_option ACL_PRECISION_MODE").set("precision_mode", v, "torch_npu.npu.set_option"
                                                                               "(ACL_PRECISION_MODE)")
        else:
            _record("torch_npu.npu.set_option", **{name: v})


def use_compatible_impl(is_enable: bool):
    """``torch_npu.npu.use_compatible_impl``: GELU honours ``approximate`` (aclnnGeluV2), ... (13.4 item 6)."""
    _options("use_compatible_impl").set("compatible_impl", is_enable, "torch_npu.npu.use_compatible_impl")


def set_deterministic_level(level: int):
    """``torch_npu.npu.set_deterministic_level``: 0 off, 1 deterministic, 2 strong consistency, 3 batch-invariant
    (13.7)."""
    o = _options("set_deterministic_level")
    o.set("deterministic_level", level, "torch_npu.npu.set_deterministic_level")
    o.set("deterministic", bool(level), "torch_npu.npu.set_deterministic_level")


def set_compile_mode(jit_compile=False):
    """``torch_npu.npu.set_compile_mode``: aclop's JIT compilation. Recorded only: the emulated kernels are the
    aclnn ones, which torch_npu runs with JIT off, its default from the 910B on (13.1 "Kernel path")."""
    _record("torch_npu.npu.set_compile_mode", jit_compile=bool(jit_compile))


class _Config:
    """``torch_npu.npu.config``: ``allow_internal_format`` recorded (ND is what the emulated kernels read)."""

    def __setattr__(self, name, value):
        if name != "allow_internal_format":
            raise AscendEmuError(f"torch_npu.npu.config.{name} is not a torch_npu switch; "
                                 "choose allow_internal_format")
        _record("torch_npu.npu.config.allow_internal_format", value=bool(value))
        object.__setattr__(self, name, bool(value))


def set_device(device):
    _record("torch.npu.set_device", device=_check_device(device, "torch.npu.set_device"))


def _is_bf16_supported(including_emulation: bool = True) -> bool:
    return bool(SOCS[_soc_name()].supports_bf16)


def _amp_supported_dtypes():
    return [torch.float16, torch.bfloat16] if _is_bf16_supported() else [torch.float16]


def _get_autocast_dtype():
    o = current()
    return o.autocast_dtype if o is not None else torch.float16


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast("npu")``, ``torch.amp.autocast("npu")``, ``torch_npu.npu.amp.autocast``: the region's
    autocast switch and dtype become the run's (``NpuOptions.autocast_*``, restored on exit), which the
    emulated run applies with torch_npu's op lists; any other device type is torch's own autocast."""

    _source = "torch.autocast('npu')"

    def __init__(self, device_type="npu", dtype=None, enabled=True, cache_enabled=None):
        self._npu = device_type == "npu"
        self._npu_dtype, self._npu_enabled = dtype, bool(enabled)
        self._npu_stack = []
        if self._npu:
            # the run's options check the dtype (bf16 refused below the 910B1, 13.2) before torch, which would
            # only warn and disable autocast
            with self._region():
                pass
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def _region(self):
        return _options(self._source).overridden(
            self._source, autocast_enabled=bool(getattr(self, "_enabled", self._npu_enabled)),
            autocast_dtype=self._npu_dtype if self._npu_dtype is not None else torch.float16)

    def __enter__(self):
        if self._npu:
            ctx = self._region()
            ctx.__enter__()
            self._npu_stack.append(ctx)
        try:
            return super().__enter__()
        except BaseException:
            if self._npu:
                self._npu_stack.pop().__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            if self._npu and self._npu_stack:
                self._npu_stack.pop().__exit__(*exc)


class _NpuAmpAutocast(autocast):
    """``torch_npu.npu.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True)``."""

    _source = "torch_npu.npu.amp.autocast"

    def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
        super().__init__("npu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch_npu.npu.amp.GradScaler``: torch's GradScaler on the ``npu`` device with torch_npu's defaults
    (init_scale 2^16, growth 2, backoff 0.5, interval 2000; 13.2) and its ``dynamic`` switch: with
    ``dynamic=False`` the gradients are only multiplied by 1/scale, no overflow check, the step always runs
    and the scale stays. Its scale() clears the float status register at its first call of an iteration on a
    saturation SoC, as torch_npu's does (the run's GradScaler.scale hook reads this flag)."""

    _clears_float_status_at_scale = True

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True, dynamic=True):
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
        self._dynamic = bool(dynamic)
        self._static_unscaled = set()
        _record("torch_npu.npu.amp.GradScaler", init_scale=init_scale, growth_factor=growth_factor,
                backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled, dynamic=dynamic)

    def unscale_(self, optimizer):
        if self._dynamic or not self.is_enabled():
            return super().unscale_(optimizer)
        if id(optimizer) in self._static_unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        inv = 1.0 / self._init_scale
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(inv)
        self._static_unscaled.add(id(optimizer))

    def step(self, optimizer, *args, **kwargs):
        if self._dynamic or not self.is_enabled():
            return super().step(optimizer, *args, **kwargs)
        if id(optimizer) not in self._static_unscaled:
            self.unscale_(optimizer)
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        if self._dynamic or not self.is_enabled():
            return super().update(new_scale)
        self._static_unscaled.clear()


# --------------------------------------------------------------------------- streams, events, generators

class Event:
    """``torch.npu.Event``: the emulated NPU runs every kernel when the script calls it (one stream, no queue), so an
    event is complete once recorded; ``elapsed_time`` is the host time between two records, in milliseconds."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = bool(enable_timing)
        self._t = None

    def record(self, stream=None):
        self._t = time.perf_counter()

    def wait(self, stream=None):
        pass

    def query(self) -> bool:
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end_event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Events were not created with enable_timing=True (torch.npu.Event(enable_timing=True))")
        if self._t is None or end_event._t is None:
            raise RuntimeError("both events must be recorded before elapsed_time")
        return (end_event._t - self._t) * 1000.0


class Stream:
    """``torch.npu.Stream``: one in-order stream (the emulated kernels run synchronously); waits are no-ops."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device("npu", _check_device(device, "torch.npu.Stream"))
        self.priority = priority

    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self):
        pass

    def __eq__(self, other):
        return isinstance(other, Stream)

    def __hash__(self):
        return 0


_STREAM = None


def _current_stream(device=None):
    global _STREAM
    _STREAM = _STREAM or Stream()
    return _STREAM


@contextlib.contextmanager
def _stream(stream=None):
    """``torch.npu.stream(s)``: the kernels run in issue order whatever the stream."""
    yield stream


class _GeneratorType(type(torch._C.Generator)):
    # every torch generator is one (isinstance(torch.default_generator, torch.Generator) stays True)
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch._C.Generator)


class Generator(torch._C.Generator, metaclass=_GeneratorType):
    """``torch.Generator(device="npu")``: the CPU's generator (the tensors are CPU tensors)."""

    def __new__(cls, device=None):
        return super().__new__(cls, "cpu" if _is_npu(device) or isinstance(device, int) else (device or "cpu"))

    def __init__(self, device=None):
        pass


_NPU0 = None     # torch.device("npu", 0), made once torch's PrivateUse1 backend is named npu


def _npu_device(real):
    """``Tensor.device`` under the shim: a CPU tensor reports ``npu:0`` (to torch_npu every tensor the script computes
    is on the NPU: it moved its model and data there), except one ``.cpu()`` / ``.to("cpu")`` returned; a tensor
    computed from that reports ``npu:0`` again (NUMERICS.md section 17)."""
    get = real.__get__

    def device(self):
        d = get(self)
        if d.type != "cpu" or (_ON_CPU and self in _ON_CPU):
            return d
        return _NPU0
    return property(device, doc=real.__doc__)


def _tensor_cpu(real):
    def cpu(self, *args, **kwargs):
        return _to_cpu(real(self, *args, **kwargs), self)
    cpu.__doc__ = real.__doc__
    return cpu


def _seed_cpu_generator(seed) -> None:
    torch.default_generator.manual_seed(int(seed))


class _DeviceContext:
    """``torch.npu.device(0)``: a context manager selecting the (one) device; another index is refused."""

    def __init__(self, device):
        self.idx = _check_device(device, "torch.npu.device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _seed_cpu_randomly() -> None:
    """``torch.npu.seed()``: a random seed for the npu's generator, the CPU's (None, as torch.cuda.seed)."""
    torch.default_generator.seed()


def _module(name: str, doc: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name, doc)
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


amp = _module("torch_npu.npu.amp", "torch_npu.npu.amp on the emulated NPU", autocast=_NpuAmpAutocast,
              GradScaler=GradScaler)

#: ``torch_npu.npu``, registered as ``torch.npu``
npu = _module(
    "torch_npu.npu", "torch_npu.npu on the emulated NPU (ascend_emu.frontend.torch.npu_shim)",
    is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0, set_device=set_device,
    synchronize=lambda device=None: None, is_initialized=lambda: True, init=lambda: None,
    get_device_name=lambda device=None: _soc_name(), is_bf16_supported=_is_bf16_supported,
    get_amp_supported_dtype=_amp_supported_dtypes, get_autocast_dtype=_get_autocast_dtype,
    is_autocast_enabled=lambda: bool(current() and current().autocast_enabled),
    # the npu's generator is the CPU's (the tensors are CPU tensors); torch.manual_seed calls manual_seed_all of
    # the PrivateUse1 module, so these must not call torch.manual_seed back
    manual_seed=_seed_cpu_generator, manual_seed_all=_seed_cpu_generator, initial_seed=torch.initial_seed, empty_cache=lambda: None, memory_allocated=lambda device=None: 0,
    max_memory_allocated=lambda device=None: 0, reset_peak_memory_stats=lambda device=None: None,
    # the emulated device holds no memory of its own (the tensors are CPU tensors): 0, as memory_allocated
    memory_reserved=lambda device=None: 0, max_memory_reserved=lambda device=None: 0,
    reset_max_memory_allocated=lambda device=None: None,
    memory_summary=lambda device=None, abbreviated=False: (
        "ascend-emu's emulated NPU holds no memory of its own: its tensors are CPU tensors"),
    utilization=lambda device=None: 0, get_device_properties=get_device_properties, mem_get_info=mem_get_info,
    get_rng_state=lambda device="npu": torch.get_rng_state(),
    set_rng_state=lambda state, device="npu": torch.set_rng_state(state),
    seed=_seed_cpu_randomly, seed_all=_seed_cpu_randomly,
    device=_DeviceContext,
    _is_in_bad_fork=lambda: False,
    matmul=_Switch("matmul", {"allow_hf32": "allow_hf32_matmul", "cube_math_type": "cube_math_type"}),
    conv=_Switch("conv", {"allow_hf32": "allow_hf32_conv"}),
    CubeMathType=CubeMathType, set_option=set_option, use_compatible_impl=use_compatible_impl,
    set_deterministic_level=set_deterministic_level, set_compile_mode=set_compile_mode, config=_Config(), amp=amp,
    Event=Event, Stream=Stream, current_stream=_current_stream, default_stream=_current_stream, stream=_stream)


# --------------------------------------------------------------------------- installing it

def _use_deterministic_algorithms(original):
    def use_deterministic_algorithms(mode, *, warn_only=False):
        original(mode, warn_only=warn_only)
        o = current()
        if o is not None:
            o.set("deterministic", bool(mode), "torch.use_deterministic_algorithms")
    use_deterministic_algorithms.__doc__ = original.__doc__
    return use_deterministic_algorithms


def _register_npu_device() -> None:
    """torch's PrivateUse1 backend named ``npu`` and ``torch.npu`` registered: once per process (torch allows
    neither to be undone); a process whose PrivateUse1 backend has another name is refused."""
    name = torch._C._get_privateuse1_backend_name()
    if name != "npu":
        if name != "privateuseone":
            raise AscendEmuError(f"torch's PrivateUse1 backend is already {name!r} in this process; the torch_npu "
                                 "shim needs it as 'npu': run the script in a process of its own")
        torch.utils.rename_privateuse1_backend("npu")
    if getattr(torch, "npu", None) is not npu:
        if hasattr(torch, "npu"):
            raise AscendEmuError("torch.npu already exists in this process (a real torch_npu?); the shim cannot "
                                 "replace it: run the script in a process of its own")
        torch._register_device_module("npu", npu)


@contextlib.contextmanager
def installed():
    """``import torch_npu`` and the ``npu`` device for the duration of a ``with`` block (see the module)."""
    if "torch_npu" in sys.modules and not getattr(sys.modules["torch_npu"], "__ascend_emu_shim__", False):
        raise AscendEmuError("a real torch_npu is already imported in this process; the shim cannot replace it")
    global _NPU0
    _register_npu_device()
    _register_npu_ops()
    _NPU0 = torch.device("npu", 0)
    saved = {"Tensor.npu": getattr(torch.Tensor, "npu", None), "Module.npu": getattr(torch.nn.Module, "npu", None),
             "autocast": torch.autocast, "amp.autocast": torch.amp.autocast,
             "use_deterministic_algorithms": torch.use_deterministic_algorithms, "Generator": torch.Generator,
             "device": torch.Tensor.__dict__.get("device"), "Tensor.cpu": torch.Tensor.__dict__.get("cpu"),
             "is_npu": torch.Tensor.__dict__.get("is_npu"),
             "_new_shared": torch.UntypedStorage.__dict__.get("_new_shared")}
    _CALLS.clear()
    patches = [(o, a, o.__dict__.get(a, _ABSENT), v) for o, a, v in _host_patches()]
    for o, a, _, v in patches:
        setattr(o, a, v)
    torch.Tensor.npu = _tensor_npu
    torch.Tensor.is_npu = property(lambda self: self.device.type == "npu")   # as torch_npu's tensors have it
    torch.nn.Module.npu = _module_npu
    torch.UntypedStorage._new_shared = _new_shared_on_cpu(torch.UntypedStorage._new_shared)
    torch.autocast = torch.amp.autocast = autocast
    torch.use_deterministic_algorithms = _use_deterministic_algorithms(saved["use_deterministic_algorithms"])
    torch.Generator = Generator
    torch.Tensor.device = _npu_device(torch._C.TensorBase.device)
    torch.Tensor.cpu = _tensor_cpu(saved["Tensor.cpu"] or torch._C.TensorBase.cpu)
    sys.path.insert(0, SHIM_DIR)
    env = os.environ.get("TORCH_NPU_USE_COMPATIBLE_IMPL")
    if env is not None and current() is not None:      # torch_npu seeds the option from its environment variable
        current().set("compatible_impl", env.strip() == "1", "TORCH_NPU_USE_COMPATIBLE_IMPL")
    mode = NpuDeviceMode()
    try:
        with mode:
            yield npu
    finally:
        try:
            sys.path.remove(SHIM_DIR)
        except ValueError:
            pass
        for m in [m for m in sys.modules if m == "torch_npu" or m.startswith("torch_npu.")]:
            del sys.modules[m]
        for o, a, was, _ in patches:
            if was is _ABSENT:
                delattr(o, a)
            else:
                setattr(o, a, was)
        for attr, obj in (("npu", saved["Tensor.npu"]), ("is_npu", saved["is_npu"])):
            if obj is None:
                delattr(torch.Tensor, attr)
            else:
                setattr(torch.Tensor, attr, obj)
        if saved["Module.npu"] is None:
            delattr(torch.nn.Module, "npu")
        else:
            torch.nn.Module.npu = saved["Module.npu"]
        torch.autocast = saved["autocast"]
        torch.amp.autocast = saved["amp.autocast"]
        torch.use_deterministic_algorithms = saved["use_deterministic_algorithms"]
        torch.Generator = saved["Generator"]
        if saved["_new_shared"] is None:             # inherited from torch.storage._StorageBase
            del torch.UntypedStorage._new_shared
        else:
            torch.UntypedStorage._new_shared = saved["_new_shared"]
        for attr in ("device", "cpu"):            # torch.Tensor inherits both from TensorBase
            own = saved["device" if attr == "device" else "Tensor.cpu"]
            if own is None:
                delattr(torch.Tensor, attr)
            else:
                setattr(torch.Tensor, attr, own)

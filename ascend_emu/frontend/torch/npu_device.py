"""The ``npu`` device of the torch_npu shim (:mod:`.npu_shim`) on CPU tensors: the mode that makes every ``npu``
device argument the CPU, the one device index (npu:0), host memory as the device sees it (pinning, a DataLoader
worker's shared memory, torch.accelerator's device index) and the device's properties
(``torch.npu.get_device_properties``, ``mem_get_info``), each from a source or refused in one line."""
from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ...errors import AscendEmuError
from ...numerics.policy import SOCS
from .options import current
from .user_warnings import UserLineMode


def _is_npu(d) -> bool:
    if isinstance(d, torch.device):
        return d.type == "npu"
    return isinstance(d, str) and d.split(":")[0] == "npu"


def _is_cpu(d) -> bool:
    return (isinstance(d, torch.device) and d.type == "cpu") or d == "cpu"


def _cpu(d):
    return torch.device("cpu") if _is_npu(d) else d


#: the tensors ``.cpu()`` / ``.to("cpu")`` returned: they report the CPU (the shim keeps no other placement)
_ON_CPU = WeakIdKeyDictionary()


def _to_cpu(t, src):
    """``t`` (what ``.cpu()`` / ``.to("cpu")`` gave for ``src``) marked as on the CPU: an alias of ``src`` when torch
    returned ``src`` itself (marking ``src`` would move the script's own tensor)."""
    if t is src:
        t = src.view_as(src)
    _ON_CPU[t] = True
    return t


class NpuDeviceMode(UserLineMode):   # (its functions' warnings name the user's line)
    """Every ``npu`` device a torch function is given becomes the CPU (``device=`` anywhere, ``Tensor.to``'s
    positional target), so a script's ``.to("npu")`` and ``device="npu"`` run on CPU tensors."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs and _is_npu(kwargs["device"]):
            # npu:1 is refused as .npu(1) and set_device(1) refuse it (one emulated device), not run on npu:0
            _check_device(kwargs["device"], f"{_func_name(func)}(device=...)")
            kwargs = {**kwargs, "device": torch.device("cpu")}
        if func is torch.Tensor.to and any(_is_npu(a) for a in args[1:]):
            for a in args[1:]:
                if _is_npu(a):
                    _check_device(a, "Tensor.to")
            args = (args[0],) + tuple(_cpu(a) for a in args[1:])
        elif func is torch.Tensor.to and any(_is_cpu(a) for a in list(args[1:]) + [kwargs.get("device")]):
            return _to_cpu(func(*args, **kwargs), args[0])
        return func(*args, **kwargs)


def _func_name(func) -> str:
    return getattr(func, "__name__", None) or str(func)


def _tensor_npu(self, device=None, non_blocking=False, **kwargs):
    _check_device(device, "Tensor.npu")
    return self


def _module_npu(self, device=None):
    _check_device(device, "Module.npu")
    return self


def _check_device(device, what: str) -> int:
    """The index of ``device`` (an int, ``npu:N`` or a torch.device); only npu:0 exists (one emulated device)."""
    if device is None:
        return 0
    if isinstance(device, torch.device):
        if device.type != "npu":
            raise AscendEmuError(f"{what}: {device} is not an npu device")
        idx = device.index or 0
    elif isinstance(device, str) and device.split(":")[0] == "npu":
        idx = torch.device(device).index or 0
    elif isinstance(device, int) and not isinstance(device, bool):
        idx = device
    else:
        raise AscendEmuError(f"{what}: {device!r} is not an npu device (an index, 'npu:N' or torch.device)")
    if idx != 0:
        raise AscendEmuError(f"{what}: npu:{idx} does not exist; the emulated NPU is one device (npu:0) per "
                             "process; run one rank, or set the device to 0")
    return idx


def _soc_name():
    o = current()
    return o.soc if o is not None else "Ascend910B"


def _new_shared_on_cpu(original):
    """``UntypedStorage._new_shared`` with an ``npu`` device made the CPU: a DataLoader worker collates a batch
    into shared memory on ``elem.device``, which reports ``npu:0`` for the CPU tensor it is."""
    def _new_shared(cls, size, *, device="cpu"):
        return original(size, device="cpu" if _is_npu(device) else device)
    return classmethod(_new_shared)


def _pin_memory(self, device=None):
    """``Tensor.pin_memory``: the tensor itself. Page-locked host memory is where a real NPU's DMA copies from; the
    emulated npu's tensors are host tensors, so the copy torch would make changes no value (NUMERICS.md section 17).
    A method, not the device mode's: a DataLoader with workers pins in a thread of its own, which no mode reaches."""
    return self


def _host_patches() -> list:
    """(owner, attribute, value) set while the shim is installed. torch.accelerator's device index reaches the npu
    backend's device guard in C++, which the shim has not: a DataLoader with workers and pin_memory=True asks it
    for its pin-memory thread ("PyTorch is not linked with support for npu devices"); the one device is npu:0."""
    def set_index(device):
        _check_device(device, "torch.accelerator.set_device_index")
    return [(torch.Tensor, "pin_memory", _pin_memory),
            *((torch.accelerator, n, lambda: 0) for n in ("current_device_index", "current_device_idx")),
            *((torch.accelerator, n, set_index) for n in ("set_device_index", "set_device_idx"))]


_ABSENT = object()


class _NPUDeviceProperties:
    """``torch.npu.get_device_properties(0)``: torch_npu's ``_NPUDeviceProperties`` ([PT]
    torch_npu/csrc/npu/Module.cpp, ``RegisterNPUDeviceProperties`` / ``initDeviceProperty``: the SoC name, HBM
    ``total_memory``, ``cube_core_num`` and ``vector_core_num`` from aclGetDeviceCapability's AI Core and vector
    core counts, ``L2_cache_size``; ``major``, ``minor`` and the other CUDA-style fields never set: None). The
    emulated SoC's core counts are CANN platform_config's ``ai_core_cnt`` / ``vector_core_cnt`` (ASCEND-FACTS.md
    10, 12); a field no source gives (the HBM and L2 sizes of every SoC, the core counts the SoC table assumes)
    raises a one-line error naming it instead of a number."""

    major = minor = is_multi_gpu_board = is_integrated = multi_processor_count = None
    max_threads_per_multi_processor = warp_size = regs_per_multiprocessor = gcnArchName = None

    def __init__(self, soc):
        self._soc = soc
        self.name = soc.name

    @property
    def cube_core_num(self) -> int:
        return self._known("cube_core_num", "ai_cores", "AI Core count")

    @property
    def vector_core_num(self) -> int:
        return self._known("vector_core_num", "vector_cores", "vector core count")

    @property
    def total_memory(self) -> int:
        raise _unknown_memory(self.name, "get_device_properties(0).total_memory")

    @property
    def L2_cache_size(self) -> int:
        raise AscendEmuError(f"torch.npu.get_device_properties(0).L2_cache_size: the {self.name}'s L2 cache size "
                             "is in no source ascend-emu has (ASCEND-FACTS.md); it changes no emulated numerics")

    def _known(self, field: str, cell: str, what: str) -> int:
        if cell in self._soc.assumed:
            raise AscendEmuError(f"torch.npu.get_device_properties(0).{field}: the {self.name}'s {what} is not "
                                 "published (the SoC table assumes one: ascend-emu socs); pass --aicore-num for "
                                 "the multi-core model or write the number the script needs")
        return int(getattr(self._soc, cell))

    def __repr__(self) -> str:
        def show(f):
            try:
                return getattr(self, f)
            except AscendEmuError:
                return "unknown"
        return (f"_NPUDeviceProperties(name='{self.name}', total_memory=unknown, cube_core_num="
                f"{show('cube_core_num')}, vector_core_num={show('vector_core_num')}, L2_cache_size=unknown)")


def _unknown_memory(soc: str, what: str) -> AscendEmuError:
    return AscendEmuError(f"torch.npu.{what}: the {soc}'s device memory (HBM) size is in no source ascend-emu has "
                          "(ASCEND-FACTS.md), and the emulated NPU's tensors are host tensors: size batches by "
                          "the host's memory")


def get_device_properties(device=None) -> _NPUDeviceProperties:
    _check_device(device, "torch.npu.get_device_properties")
    return _NPUDeviceProperties(SOCS[_soc_name()])


def mem_get_info(device=None):
    _check_device(device, "torch.npu.mem_get_info")
    raise _unknown_memory(_soc_name(), "mem_get_info()")

"""The PyTorch front end: torch_npu's eager scripts intercepted at the dispatcher.

- :mod:`.options`: :class:`NpuOptions`, the torch_npu knobs (``ACL_PRECISION_MODE``, ``allow_hf32``,
  ``cube_math_type``, autocast, determinism) the emulated run reads at every aten call.

With ``ascend_emu.npu.torch_run``, the only code that imports torch; ``import ascend_emu`` never does.
"""
from __future__ import annotations

from ...errors import AscendEmuError

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - the extra is installed in CI
    raise AscendEmuError("PyTorch is not installed; install the torch extra: pip install 'ascend-emu[torch]'") \
        from None

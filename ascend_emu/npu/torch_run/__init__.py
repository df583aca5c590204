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

from ...frontend import torch as _front  # noqa: F401  (first: without torch, the one-line error of the extra)
from ...frontend.torch.npu_ops import npu_rms_norm, npu_rotary_mul, npu_swiglu  # noqa: F401  (ae.torch.npu_*)
from .launch import AtenRecord, cube_math_type, float32_cube_operands  # noqa: F401
from .run import DUMP_MARGIN, TorchRun, emulate  # noqa: F401

__all__ = ["emulate", "TorchRun", "AtenRecord", "cube_math_type", "float32_cube_operands", "npu_rms_norm",
           "npu_swiglu", "npu_rotary_mul"]

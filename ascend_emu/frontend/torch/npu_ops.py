"""torch_npu's fused kernels as torch ops (``torch.ops.ascend_emu.*``), so that a script (through the
``torch_npu`` shim) can call them and the emulated run can intercept them as single kernels.

Outside an emulated run they compute what the aclnn kernel computes in exact terms: float32 inside, one rounding
to the input dtype (ASCEND-FACTS.md 13.4, 13.5) - also what the reference run (torch float32) executes. Under
``ae.torch.emulate`` each call reaches the run as one call (``NPU.npu_rms_norm.N.forward``) and runs the
registry's ``_RmsNorm`` / ``_SwiGlu`` / ``_RotaryMul`` kernels. Their backward passes are torch ops (float32),
which the run executes like any other aten call.

torch_npu's own spellings of them are here too: its top-level functions (``torch_npu.npu_rms_norm``, ...: the shim's
``TOP_LEVEL``) and its schemas under ``torch.ops.npu`` (:func:`_register_npu_ops`).
"""
from __future__ import annotations

import torch

from ...errors import AscendEmuError
from . import npu_attention

_NS = "ascend_emu"


@torch.library.custom_op(f"{_NS}::npu_rms_norm", mutates_args=())
def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): y = x * rsqrt(mean(x^2) + eps) * gamma in float32, rounded once to x's dtype."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(x.dtype), rstd


@npu_rms_norm.register_fake
def _(x, gamma, epsilon=1e-6):
    return torch.empty_like(x), x.new_empty(x.shape[:-1] + (1,), dtype=torch.float32)


def _rms_setup(ctx, inputs, output):
    x, gamma, _ = inputs
    ctx.save_for_backward(x, gamma, output[1])


def _rms_backward(ctx, dy, drstd):
    x, gamma, rstd = ctx.saved_tensors
    xf, g, dyf = x.float(), gamma.float(), dy.float()
    xhat = xf * rstd
    dg = (dyf * xhat).reshape(-1, x.shape[-1]).sum(0)
    dxhat = dyf * g
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), dg.to(gamma.dtype), None


npu_rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


@torch.library.custom_op(f"{_NS}::npu_swiglu", mutates_args=())
def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """silu(a) * b of the halves (a, b) of x along dim, in float32, rounded once."""
    a, b = x.float().chunk(2, dim)
    return (a * torch.sigmoid(a) * b).to(x.dtype)


@npu_swiglu.register_fake
def _(x, dim=-1):
    shape = list(x.shape)
    shape[dim] //= 2
    return x.new_empty(shape)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.dim = inputs[1]


def _swiglu_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    a, b = x.float().chunk(2, ctx.dim)
    s = torch.sigmoid(a)
    g = dy.float()
    da = g * b * s * (1 + a * (1 - s))
    db = g * a * s
    return torch.cat((da, db), ctx.dim).to(x.dtype), None


npu_swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)


@torch.library.custom_op(f"{_NS}::npu_rotary_mul", mutates_args=())
def npu_rotary_mul(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin in float32 (cos and sin cast to x's dtype first), rounded once."""
    c, s = cos.to(x.dtype).float(), sin.to(x.dtype).float()
    xf = x.float()
    x1, x2 = xf.chunk(2, -1)
    return (xf * c + torch.cat((-x2, x1), -1) * s).to(x.dtype)


@npu_rotary_mul.register_fake
def _(x, cos, sin):
    return torch.empty_like(x)


def _rot_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _rot_backward(ctx, dy):
    x, cos, sin = ctx.saved_tensors
    g = dy.float()
    c, s = cos.to(x.dtype).float(), sin.to(x.dtype).float()
    gs = g * s
    g1, g2 = gs.chunk(2, -1)
    dx = g * c + torch.cat((g2, -g1), -1)
    return dx.to(x.dtype), None, None


npu_rotary_mul.register_autograd(_rot_backward, setup_context=_rot_setup)


def _rotary_mul(x, r1, r2, rotary_mode="half"):
    if rotary_mode != "half":
        raise AscendEmuError(f"torch_npu.npu_rotary_mul: rotary_mode {rotary_mode!r} is not emulated (only 'half')")
    return torch.ops.ascend_emu.npu_rotary_mul(x, r1, r2)


#: torch_npu's own op schemas ([OP] op_plugin/config/op_plugin_functions.yaml) under ``torch.ops.npu``: each a
#: composite of the emulator's kernel, so the run meets the ``torch.ops.ascend_emu`` op (one record, its autograd)
_NPU_OPS = {
    "npu_rms_norm": ("npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
                     lambda x, gamma, epsilon=1e-6: torch.ops.ascend_emu.npu_rms_norm(x, gamma, epsilon)),
    "npu_swiglu": ("npu_swiglu(Tensor self, int dim=-1) -> Tensor",
                   lambda x, dim=-1: torch.ops.ascend_emu.npu_swiglu(x, dim)),
    "npu_rotary_mul": ("npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor",
                       lambda x, r1, r2, rotary_mode="half": _rotary_mul(x, r1, r2, rotary_mode)),
    "npu_fusion_attention": (
        "npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, Tensor? pse=None, "
        "Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
        "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? prefix=None, "
        "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
        "bool sync=False) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)",
        lambda *a, **kw: npu_attention.fusion_attention(*a, **kw)),
}
_NPU_LIBRARY = []


def _register_npu_ops() -> None:
    """``torch.ops.npu.npu_*`` (torch_npu scripts call them so too): once per process, beside the shim's
    ``torch_npu.npu_*``; a process that already has them (a real torch_npu) keeps its own."""
    if _NPU_LIBRARY:
        return
    lib = torch.library.Library("npu", "FRAGMENT")
    for name, (schema, fn) in _NPU_OPS.items():
        if hasattr(torch.ops.npu, name):
            continue
        lib.define(schema)
        lib.impl(name, fn, "CompositeImplicitAutograd")
    _NPU_LIBRARY.append(lib)


#: torch_npu's top-level functions (``torch_npu.npu_rms_norm`` ...): the emulator's kernels (``torch.ops.ascend_emu``)
TOP_LEVEL = {"npu_fusion_attention": npu_attention.fusion_attention,
             "npu_rms_norm": lambda x, gamma, epsilon=1e-6: torch.ops.ascend_emu.npu_rms_norm(x, gamma, epsilon),
             "npu_rotary_mul": _rotary_mul,
             "npu_swiglu": lambda x, dim=-1: torch.ops.ascend_emu.npu_swiglu(x, dim),
             # a storage format (ND, NC1HWC0, FRACTAL_NZ) is how the NPU lays a tensor out in memory, not its values:
             # the emulated tensor, a CPU tensor, is the same tensor in any of them
             "npu_format_cast": lambda x, acl_format, *args, **kwargs: x,
             "npu_format_cast_": lambda x, *args, **kwargs: x}

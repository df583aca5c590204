"""torch_npu's fused kernels as torch ops (``torch.ops.ascend_emu.*``), so that a script (through the
``torch_npu`` shim) can call them and the emulated run can intercept them as single kernels.

Outside an emulated run they compute what the aclnn kernel computes in exact terms: float32 inside, one rounding
to the input dtype (ASCEND-FACTS.md 13.4, 13.5) - also what the reference run (torch float32) executes. Under
``ae.torch.emulate`` each call reaches the run as one call (``NPU.npu_rms_norm.N.forward``) and runs the
registry's ``_RmsNorm`` / ``_SwiGlu`` / ``_RotaryMul`` kernels. Their backward passes are torch ops (float32),
which the run executes like any other aten call.
"""
from __future__ import annotations

import torch

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

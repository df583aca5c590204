"""torch_npu's autocast, applied above autograd while ``options.autocast_enabled``.

torch_npu registers upstream's CUDA autocast lists on AutocastPrivateUse1 (ASCEND-FACTS.md 13.2,
[PT] torch_npu/csrc/aten/AutoCastOps.cpp): the ops of :data:`LOWER` run in the autocast dtype (float16 by
default), those of :data:`FP32` in float32, :data:`FP32_SET_DTYPE` in float32 unless the caller gave a dtype,
:data:`PROMOTE` in the widest dtype of their inputs; everything else runs in its input dtype. The script's tensors
are CPU tensors, so torch's own autocast keys never see them: this ``TorchFunctionMode`` casts the floating
inputs of those ops with ``Tensor.to`` before autograd records the op, exactly where the autocast key sits, so the
backward meets the same casts (``ToCopyBackward``) as on the NPU.
"""
from __future__ import annotations

import torch

from .user_warnings import UserLineMode

#: lower_precision_fp (the CUDA list; torch function names, free functions and Tensor methods)
LOWER = frozenset((
    "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "multi_dot", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention", "__matmul__", "__rmatmul__"))
#: fp32
FP32 = frozenset((
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "cross_entropy"))
#: fp32_set_opt_dtype: float32 unless the call gives a dtype
FP32_SET_DTYPE = frozenset(("prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
                            "linalg_matrix_norm", "sum"))
#: fp32_append_dtype
FP32_APPEND = frozenset(("norm",))
#: promote
PROMOTE = frozenset(("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put",
                     "tensordot", "scatter_add"))
#: banned: refused under autocast, as upstream does
BANNED = frozenset(("binary_cross_entropy",))

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _cast(x, dtype):
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.dtype in _FLOATS and x.dtype != dtype and x.dtype != torch.float64 else x
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _widest(args) -> torch.dtype | None:
    best = None
    order = {torch.float16: 0, torch.bfloat16: 0, torch.float32: 1, torch.float64: 2}
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype in order:
            if best is None or order[a.dtype] > order[best]:
                best = a.dtype
    return best


class AutocastMode(UserLineMode):   # (its functions' warnings name the user's line)
    """Casts the inputs of the listed ops while ``options().autocast_enabled`` (``options`` gives the run's
    :class:`~ascend_emu.frontend.torch.options.NpuOptions`)."""

    def __init__(self, options):
        super().__init__()
        self.options = options

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        opts = self.options()
        if opts is None or not opts.autocast_enabled or torch._C._current_autograd_node() is not None:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in LOWER:
            dt = opts.autocast_dtype
            return func(*_cast(args, dt), **{k: _cast(v, dt) for k, v in kwargs.items()})
        if name in FP32 or name in FP32_APPEND or (name in FP32_SET_DTYPE and kwargs.get("dtype") is None):
            return func(*_cast(args, torch.float32), **{k: _cast(v, torch.float32) for k, v in kwargs.items()})
        if name in PROMOTE:
            dt = _widest(list(args) + list(kwargs.values()))
            if dt is not None:
                return func(*_cast(args, dt), **{k: _cast(v, dt) for k, v in kwargs.items()})
        if name in BANNED:
            from ...errors import AscendEmuError

            raise AscendEmuError(f"torch.nn.functional.{name} is unsafe to autocast (as on the NPU); use "
                                 "binary_cross_entropy_with_logits, or compute it outside the autocast region")
        return func(*args, **kwargs)

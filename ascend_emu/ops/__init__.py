"""Op implementations, registered by TF op type (see :mod:`ascend_emu.ops.registry`)."""
from .registry import CUBE, HOST, MOVE, OPS, VECTOR, OpContext, get_op, register, run_op  # noqa: F401
from . import array_ops, list_ops, math_ops, nn_ops  # noqa: F401  (fill the registry)
from . import fused_ops  # noqa: F401  (the ops the fusion rules put in place)
from . import apply_ops, grad_ops  # noqa: F401  (the ops of training graphs, the optimizers' updates)
from . import index_ops, volume_ops  # noqa: F401  (selection, scan, scatter, resize; 3D convolution and pooling)
from . import rnn_ops  # noqa: F401  (recurrent cells: DynamicRNN, DynamicGRUV2)
from . import aclnn_grad_ops  # noqa: F401  (the torch path's backward kernels: SiluGrad, LayerNormGradV3, ...)

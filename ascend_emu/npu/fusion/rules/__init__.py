"""Fusion rules: CANN's graph and UB fusion passes as pattern matches over plain nodes.

Each rule is registered with :func:`..registry.fusion_rule` (its CANN pass name,
kind, pattern and numerics; NUMERICS.md section 6) and rewrites through a
:class:`Rewriter`. The rules run in registry order, which is the import order below:
graph passes (a dilated conv recovered, cube + bias or batch norm, then LayerNorm and Gelu), then UB passes. A
pattern matches only when no intermediate output is read outside it (nor is a model
output) and its parameters are constants (``Const`` nodes or chains computed from
them only).

The fused node takes the name of the last original op, ``meta["fusion"]`` records
the rule(s) and the original ops it replaces, ``meta["ascend_type"]`` the CANN op
type that decides its precision, and the swallowed ops go to ``Rewriter.fused_away``.
The fused implementations are in :mod:`ascend_emu.ops.fused_ops`.

- :mod:`.common`: pass limits, op-type tables (``ELTWISE``), fused-node builders;
- :mod:`.cube`: SpaceToBatchConv2dBatchToSpacePass, BiasaddConvFusionPass, ConvBatchnormFusionPass,
  MatMulBiasAddFusionPass, MatMulReshapeBiasAddFusionPass;
- :mod:`.composite`: LayerNormFusionPass, GeluFusionPass, SoftmaxGradFusionPass;
- :mod:`.ub`: TbeEltwiseFusionPass, AutomaticUbFusion.
"""
from __future__ import annotations

from ..rewriter import Rewriter  # noqa: F401  (imported from here by older code)
from .common import (BATCH_MATMUL_TYPES, BATCH_NORM_TYPES, BIAS_ADD_TYPES, CONST_RTOL, CONV_TYPES,  # noqa: F401
                     ELTWISE, FUSED_CUBE, MATMUL_TYPES, UB_MAX_OPS)
# the order of these imports is the order the rules apply in
from .cube import (spacetobatch_conv2d_batchtospace, biasadd_conv, conv_batchnorm,  # noqa: F401
                   matmul_biasadd, matmul_reshape_biasadd)
from .composite import gelu, layer_norm, softmax_grad  # noqa: F401
from .ub import automatic_ub, tbe_eltwise  # noqa: F401

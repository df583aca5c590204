"""The op types whose accumulation CANN splits over several AI Cores, and how (NUMERICS.md section 11).

This table is the one place that says which ops are non-deterministic when ``deterministic`` is
off: the device gives an op of a listed type a :class:`~ascend_emu.numerics.multicore.Launch`,
every other op runs in its canonical order. ``ascend-emu ops`` prints it. ``kind`` says how the op
splits (the numerics are in :mod:`ascend_emu.numerics.multicore`):

- ``reduce``: a sum over axes whose kept rows cannot fill the vector cores splits the reduced axis,
  one chunk per core; the partials are atomic-added to the output in arrival order.
- ``atomic``: the vector cores share the input rows and atomic-add each row into its output row;
  the cores' adds to one row interleave in arrival order.
- ``splitk``: a small-output matmul with a long K splits K over the cube cores (split-K); the fp32
  partials are atomic-added in arrival order, then converted once.
- ``batch``: a weight gradient accumulated over the batch splits the samples over the cube cores;
  the fp32 partial gradients are atomic-added in arrival order.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MultiCoreOp:
    kind: str
    split: str
    combine: str
    source: str


_REDUCE_SPLIT = "reduced axis over the vector cores when rows < cores and each chunk >= reduce_min_chunk"
_ATOMIC = "partials atomic-added to the +0 output in arrival order (a permutation per row)"
_SPLITK = "K over the cube cores in chunks of splitk_chunk when K >= splitk_min_k and M, N <= splitk_mn_max"
_FP32_ATOMIC = "fp32 partials atomic-added to the cleared output in arrival order, then one conversion"

MULTICORE_OPS: dict[str, MultiCoreOp] = {
    "Sum": MultiCoreOp("reduce", _REDUCE_SPLIT, _ATOMIC,
                       "assumed (TBE reduce schedules with atomic add; split thresholds assumed)"),
    "Mean": MultiCoreOp("reduce", _REDUCE_SPLIT, _ATOMIC + "; then the mean's scaling",
                        "assumed (as Sum); aclnnNorm / aclnnLinalgVectorNorm are listed non-deterministic"),
    "BiasAddGrad": MultiCoreOp("reduce", _REDUCE_SPLIT + " (rows: channels; reduced: batch and space)", _ATOMIC,
                               "assumed (a reduction over the batch, as Sum)"),
    "FusedBatchNormV3": MultiCoreOp("reduce", "training only: BNTrainingReduce's per-channel sums over N*H*W, "
                                    "as Sum", _ATOMIC, "sourced: aclnnBatchNorm is listed non-deterministic"),
    "FusedBatchNormGradV3": MultiCoreOp("reduce", "BNTrainingUpdateGrad's per-channel sums over N*H*W, as Sum",
                                        _ATOMIC, "sourced: aclnnBatchNormBackward is listed non-deterministic"),
    "UnsortedSegmentSum": MultiCoreOp("atomic", "input rows in contiguous shares over the vector cores",
                                      "each row atomic-added (fp32) to its segment; the cores' adds interleave "
                                      "in arrival order", "sourced: atomic add (aclnnEmbeddingDenseBackward, "
                                      "aclnnIndexAdd are listed non-deterministic)"),
    "MatMul": MultiCoreOp("splitk", _SPLITK, _FP32_ATOMIC,
                          "sourced: aclnnMatmul/Mm/Addmm listed non-deterministic; matmul_v3 split-K kernels; "
                          "thresholds from matmul_v3 tiling constants, their use assumed"),
    "_FusedMatMul": MultiCoreOp("splitk", _SPLITK + " (bias on the first chunk's core)", _FP32_ATOMIC,
                                "as MatMul"),
    "BatchMatMulV2": MultiCoreOp("splitk", _SPLITK + " and batch < cube cores", _FP32_ATOMIC,
                                 "as MatMul (aclnnBatchMatMul: assumed)"),
    "BatchMatMul": MultiCoreOp("splitk", _SPLITK + " and batch < cube cores", _FP32_ATOMIC, "as BatchMatMulV2"),
    "BatchMatMulV3": MultiCoreOp("splitk", _SPLITK + " and batch < cube cores", _FP32_ATOMIC, "as BatchMatMulV2"),
    "_FusedBatchMatMul": MultiCoreOp("splitk", _SPLITK + " and batch < cube cores", _FP32_ATOMIC,
                                     "as BatchMatMulV2"),
    "Conv2DBackpropFilter": MultiCoreOp("batch", "samples over the cube cores (min(cores, N) shares)",
                                        _FP32_ATOMIC, "assumed (dw accumulated over the batch with atomic add)"),
}

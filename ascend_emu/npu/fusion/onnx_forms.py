"""Which fusion passes match the graphs ONNX models load into (``ascend-emu rules`` prints it).

The ONNX frontend (:mod:`ascend_emu.frontend.onnx.loader`) maps ONNX nodes onto the registry's TF op types,
so a pass matches an ONNX model wherever the mapping produces its pattern; ``tests/frontend/test_onnx.py``
checks the ones said to match on models built in the test.
"""
from __future__ import annotations

#: rule name -> how it meets an ONNX model
ONNX_FORMS = {
    "SpaceToBatchConv2dBatchToSpacePass": "TF graphs only: an ONNX dilated Conv carries its dilations and loads as "
                                          "one Conv2D",
    "BiasaddConvFusionPass": "matches: Conv with a bias input loads as Conv2D -> BiasAdd",
    "ConvBatchnormFusionPass": "matches: Conv (+bias) -> BatchNormalization loads as Conv2D [-> BiasAdd] -> "
                               "FusedBatchNormV3 on the NHWC tensor",
    "MatMulBiasAddFusionPass": "matches: MatMul -> Add of a constant vector, and Gemm with a 1-D C (MatMul -> BiasAdd)",
    "MatMulReshapeBiasAddFusionPass": "not checked on ONNX models: a 2-D MatMul -> Reshape -> Add of a constant "
                                      "vector loads as this pattern (exporters emit a 3-D MatMul -> Add instead, "
                                      "a BatchMatMulV2 for MatMulBiasAddFusionPass)",
    "LayerNormFusionPass": "TF graphs only for the decomposed form (ONNX's ReduceMean, Sub, Pow, ReduceMean, Add, "
                           "Sqrt, Div is not matched: its ops run one by one); LayerNormalization (opset 17) "
                           "loads directly as the fused LayerNorm op",
    "GeluFusionPass": "matches the Erf form (Div by sqrt 2, Erf, Add 1, Mul, Mul 0.5); ONNX Gelu (opset 20) loads "
                      "directly as the fused Gelu op",
    "SoftmaxGradFusionPass": "TF training graphs only (ONNX models are inference graphs)",
    "TbeEltwiseFusionPass": "matches: after MatMul/Gemm/Einsum the elementwise ops load as their TF types; after "
                            "Conv the chain continues through the loader's Transpose back to NCHW (ATC's graph has "
                            "none), computed in NHWC with its other operands transposed alike (NUMERICS.md "
                            "section 9)",
    "AutomaticUbFusion": "matches: the elementwise ops load as their TF types",
}

"""The tests' "fp32 mode": ``must_keep_origin_dtype`` on a SoC whose cube takes float32 operands, HF32 off, with
the Ascend910's vector kernels and overflow mode.

Before the SoC table (NUMERICS.md section 13) ``must_keep_origin_dtype`` on the default Ascend910 ran the
emulated float32 cube; the 910's cube has no float32, so there GE places those ops on the AI CPU. The tests that
hold the emulated units against TensorFlow's float32 run use this configuration instead: the same numerics the
910 default gave them (golden case ``demo/must_keep_origin_dtype/float32_cube``), now on a cube that has them.
"""
FP32 = {"precision_mode": "must_keep_origin_dtype", "soc": "Ascend910B", "allow_hf32": "none", "op_model": "tbe_v100",
        "overflow_mode": "saturation"}


def fp32(**overrides) -> dict:
    """FP32 with ``overrides`` (e.g. ``op_model="exact"``) as Device / emulate keyword arguments."""
    return {**FP32, **overrides}


#: the same on the command line
FP32_ARGS = ["--precision-mode", "must_keep_origin_dtype", "--soc", "Ascend910B", "--allow-hf32", "none", "--op-model",
             "tbe_v100", "--overflow-mode", "saturation"]

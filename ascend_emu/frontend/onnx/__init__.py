"""The ONNX front end (the ATC path): ``.onnx`` models mapped onto the registry's ops, onnxruntime as their
float32 reference and as their AI CPU.

With :mod:`ascend_emu.npu.aicpu_onnx`, the only code that imports onnx and onnxruntime.
"""

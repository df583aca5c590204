"""ascend-emu's stand-in for the Ascend TF adapter's ``npu_bridge`` (TF1): the adapter's names over the
emulated NPU, importable under ``ascend-emu run`` only (ascend_emu/frontend/tf/shim)."""
from ascend_emu.frontend.tf.shim.runtime import runtime as _runtime

_runtime()      # ImportError with how to run the script, outside ascend-emu run
__version__ = "v1.15.0"

"""npu_device.train (stand-in)."""
from npu_device.train import optimizer  # noqa: F401

"""npu_device.compat.v1 (stand-in): the adapter builds it as a copy of npu_bridge, so its submodules are
npu_bridge's files (``from npu_device.compat.v1.npu_init import *``)."""
import npu_bridge as _npu_bridge

__path__ = list(_npu_bridge.__path__)
__version__ = _npu_bridge.__version__


class SessionConfigBuilder:
    """``.session_config`` with an NpuOptimizer entry and its ``.parameter_map`` (H TF2/compat/utils.py)."""

    def __init__(self, config=None):
        from ascend_emu.frontend.tf.shim.adapter import npu_config_proto, npu_optimizer

        self.session_config = npu_config_proto(config)
        self.parameter_map = npu_optimizer(self.session_config).parameter_map

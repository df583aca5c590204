"""npu_bridge.estimator.npu (stand-in)."""

"""npu_bridge.estimator (stand-in)."""

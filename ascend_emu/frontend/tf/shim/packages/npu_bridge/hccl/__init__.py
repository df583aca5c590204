"""npu_bridge.hccl (stand-in): collectives of one rank."""

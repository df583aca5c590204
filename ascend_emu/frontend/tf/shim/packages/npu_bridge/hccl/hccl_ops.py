"""npu_bridge.hccl.hccl_ops (stand-in): every collective of one rank returns its input (H TF1/hccl/hccl_ops.py)."""
from ascend_emu.frontend.tf.shim.adapter import one_rank

allreduce = one_rank("hccl_ops.allreduce")
allgather = one_rank("hccl_ops.allgather")
broadcast = one_rank("hccl_ops.broadcast")          # a list in, the same list out
reduce = one_rank("hccl_ops.reduce")
reduce_scatter = one_rank("hccl_ops.reduce_scatter")
all_to_all_v = one_rank("hccl_ops.all_to_all_v")
all_to_all_v_c = one_rank("hccl_ops.all_to_all_v_c")

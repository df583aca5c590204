"""npu_bridge.estimator.npu.npu_scope (stand-in): ``keep_dtype_scope`` keeps the ops made inside a TF1 graph in
their dtype on the emulated device; the other scopes change nothing here."""
from ascend_emu.frontend.tf.shim.adapter import keep_dtype_scope, noted_scope  # noqa: F401


def without_npu_compile_scope():
    return noted_scope("npu_scope.without_npu_compile_scope")


def npu_weight_prefetch_scope(*args, **kwargs):
    return noted_scope("npu_scope.npu_weight_prefetch_scope")


def subgraph_multi_dims_scope(*args, **kwargs):
    return noted_scope("npu_scope.subgraph_multi_dims_scope")


def disable_autofuse():
    return noted_scope("npu_scope.disable_autofuse")


def npu_recompute_scope():
    return noted_scope("npu_scope.npu_recompute_scope")


def npu_mem_type_scope(*args, **kwargs):
    return noted_scope("npu_scope.npu_mem_type_scope")

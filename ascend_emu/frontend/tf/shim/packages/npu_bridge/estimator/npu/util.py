"""npu_bridge.estimator.npu.util (stand-in; H TF1/estimator/npu/util.py)."""
import os

from ascend_emu.frontend.tf.shim.adapter import note


def set_iteration_per_loop(sess, train_op, iterations_per_loop=1):
    """The adapter runs ``iterations_per_loop`` steps per ``sess.run`` of the op it returns; each emulated
    ``sess.run`` is one step, recorded on its own (noted when n > 1)."""
    if iterations_per_loop > 1:
        note(f"set_iteration_per_loop({iterations_per_loop}): one emulated step per sess.run (the device loops "
             f"{iterations_per_loop} per run)")
    return train_op


def get_ranksize():
    return os.environ.get("RANK_SIZE", os.environ.get("CM_WORKER_SIZE", "1"))


def get_rank_id():
    return 0


def keep_tensors_dtypes(graph, input_tensors):
    note("util.keep_tensors_dtypes: use npu_scope.keep_dtype_scope for the emulated device")


def set_graph_exec_config(fetch, **kwargs):
    note("util.set_graph_exec_config: no effect on the emulated device")
    return fetch

"""npu_bridge.npu_init (stand-in; H TF1/npu_init.py): ``from npu_bridge.npu_init import *`` gives the names the
adapter's does (it has no ``__all__``: tf, os, session, config_pb2, RewriterConfig, ... come with it), and every
``tf.compat.v1.Session`` made afterwards is an NPU session, as after the adapter's ``decorator_tf_session``."""
import os  # noqa: F401

from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2  # noqa: F401
from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig  # noqa: F401
from tensorflow.python.client import session  # noqa: F401

from ascend_emu.frontend.tf.shim import adapter as _adapter
from ascend_emu.frontend.tf.shim.adapter import npu_config_proto  # noqa: F401
from ascend_emu.frontend.tf.tf import import_tf as _import_tf
from npu_bridge.estimator import npu_ops  # noqa: F401
from npu_bridge.estimator.npu import npu_plugin, npu_scope, util  # noqa: F401
from npu_bridge.estimator.npu import keras_to_npu  # noqa: F401
from npu_bridge.estimator.npu.npu_callbacks import NPUBroadcastGlobalVariablesCallback
from npu_bridge.estimator.npu.npu_config import (DumpConfig, DynamicInputConfig, MemoryConfig,  # noqa: F401
                                                 NPURunConfig, ProfilingConfig)
from npu_bridge.estimator.npu.npu_estimator import NPUEstimator, NPUEstimatorSpec  # noqa: F401
from npu_bridge.estimator.npu.npu_hook import (NPUBroadcastGlobalVariablesHook, NPUCheckpointSaverHook,  # noqa: F401
                                               NPUOutputTensorHook, SetIterationsVarHook, TellMeStepOrLossHook)
from npu_bridge.estimator.npu.npu_loss_scale_manager import (ExponentialUpdateLossScaleManager,  # noqa: F401
                                                             FixedLossScaleManager)
from npu_bridge.estimator.npu.npu_loss_scale_optimizer import NPULossScaleOptimizer  # noqa: F401
from npu_bridge.estimator.npu.npu_optimizer import (KerasDistributeOptimizer, NPUDistributedOptimizer,  # noqa: F401
                                                    NPUOptimizer, npu_allreduce, npu_distributed_optimizer_wrapper)
from npu_bridge.estimator.npu_unary_ops import npu_unary_ops  # noqa: F401
from npu_bridge.hccl import hccl_ops  # noqa: F401

tf = _import_tf()
try:
    from tensorflow.python.keras import backend  # noqa: F401  (the adapter's name; TF's legacy Keras)
except ImportError:     # pragma: no cover - TF builds without it
    import keras.backend as backend  # noqa: F401

_adapter.patch_sessions()

#: grappler passes the adapter's docs say must stay on
experimental_options = {"disable_model_pruning": False, "function_optimization": RewriterConfig.ON,
                        "constant_folding": RewriterConfig.ON, "shape_optimization": RewriterConfig.ON,
                        "arithmetic_optimization": RewriterConfig.ON, "loop_optimization": RewriterConfig.ON,
                        "dependency_optimization": RewriterConfig.ON, "layout_optimizer": RewriterConfig.ON}


def npu_graph_options(graph_options=None):
    graph_options = graph_options or config_pb2.GraphOptions()
    graph_options.optimizer_options.global_jit_level = config_pb2.OptimizerOptions.OFF
    return graph_options


def npu_optimizer_options(optimizer_options=None):
    optimizer_options = optimizer_options or config_pb2.OptimizerOptions()
    optimizer_options.global_jit_level = config_pb2.OptimizerOptions.OFF
    return optimizer_options


def npu_run_config_init(run_config=None):
    _adapter.note("npu_run_config_init: tf.estimator's RunConfig is not in this TensorFlow; the config as given")
    return run_config


def npu_hooks_append(hooks_list=()):
    return list(hooks_list) + [NPUBroadcastGlobalVariablesHook(0, 0)]


def npu_callbacks_append(callbacks_list=()):
    return list(callbacks_list) + [NPUBroadcastGlobalVariablesCallback(0)]


class NpuEmptyHook(tf.compat.v1.train.SessionRunHook):
    pass


def set_keras_session_npu_config(config=None):
    """The Keras session of the adapter: a Session with ``npu_config_proto(config)``; its options set the emulated
    device of the Keras training that follows (Keras 3 has no TF1 session to install it into)."""
    return _adapter.npu_session("set_keras_session_npu_config", config)


def npu_clear_session(config=None):
    return set_keras_session_npu_config(config)


def init_resource(config=None):
    """``(session, shutdown op)``: an NPU session of ``config``."""
    return _adapter.npu_session("init_resource", config), npu_ops.shutdown_system()


def shutdown_resource(sess, npu_shutdown):
    _adapter.note("shutdown_resource: nothing to shut down")


def close_session(sess):
    sess.close()


def get_npu_rank_id():
    return 0


def get_npu_local_rank_id():
    return 0


def get_npu_rank_size():
    return 1


def get_npu_local_rank_size():
    return 1


# hccl.manage.api (CANN, outside the adapter): one rank
def create_group(group, rank_num, rank_ids):
    _adapter.note("create_group: one rank")


def destroy_group(group):
    _adapter.note("destroy_group: one rank")


def get_rank_size(group="hccl_world_group"):
    return 1


def get_local_rank_size(group="hccl_world_group"):
    return 1


def get_rank_id(group="hccl_world_group"):
    return 0


def get_local_rank_id(group="hccl_world_group"):
    return 0


def get_world_rank_from_group_rank(group, group_rank_id):
    return group_rank_id


def get_group_rank_from_world_rank(world_rank_id, group):
    return world_rank_id


def npu_keras_optimizer(opt):
    return KerasDistributeOptimizer(opt)


def npu_tf_optimizer(opt):
    return NPUDistributedOptimizer(opt)


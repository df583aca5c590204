"""npu_bridge.estimator.npu.npu_optimizer (stand-in; H TF1/estimator/npu/npu_optimizer.py): one rank, so the
distributed wrappers give the optimizer back; NPUOptimizer's loss scaling is NPULossScaleOptimizer's."""
from ascend_emu.frontend.tf.shim.adapter import note, one_rank
from ascend_emu.frontend.tf.shim.runtime import runtime
from ascend_emu.frontend.tf.tf import import_tf

tf = import_tf()


def NPUDistributedOptimizer(optimizer, is_weight_update_sharding=False, name=None):
    """Averages gradients over RANK_SIZE ranks: one rank here, the optimizer itself."""
    note("NPUDistributedOptimizer: one rank, the optimizer unchanged")
    return optimizer


def KerasDistributeOptimizer(optimizer, name=None):
    note("KerasDistributeOptimizer: one rank, the optimizer unchanged")
    return optimizer


def npu_distributed_optimizer_wrapper(optimizer):
    """Patches the optimizer to all-reduce its gradients: one rank here (a name: the Keras optimizer)."""
    note("npu_distributed_optimizer_wrapper: one rank, the optimizer unchanged")
    if isinstance(optimizer, str):
        import keras

        return keras.optimizers.get(optimizer)
    return optimizer


def NPUOptimizer(opt, loss_scale_manager=None, is_distributed=False, is_loss_scale=False,
                 is_tailing_optimization=False, name=None):
    """With ``is_loss_scale`` (a manager required, as the adapter's) the optimizer loss-scaled as
    NPULossScaleOptimizer; otherwise ``opt`` (one rank)."""
    if is_loss_scale:
        if loss_scale_manager is None:
            raise ValueError("is_loss_scale is True, loss_scale_manager can not be None")
        return runtime().NPULossScaleOptimizer(opt, loss_scale_manager, is_distributed=is_distributed)
    return opt


npu_allreduce = one_rank("npu_allreduce")
allreduce = one_rank("allreduce")

"""npu_device.distribute (stand-in; H TF2/distribute/hccl.py): not a cluster worker, so the collectives give
their input back, as the adapter's do outside a cluster."""
from ascend_emu.frontend.tf.shim.adapter import note as _note
from ascend_emu.frontend.tf.shim.adapter import one_rank as _one_rank

all_reduce = _one_rank("distribute.all_reduce")
broadcast = _one_rank("distribute.broadcast")
grouping_broadcast = _one_rank("distribute.grouping_broadcast")


def npu_distributed_keras_optimizer_wrapper(optimizer, reduce_reduction="mean", fusion=1, fusion_id=-1,
                                            group="hccl_world_group"):
    import keras

    _note("distribute.npu_distributed_keras_optimizer_wrapper: one rank, the optimizer unchanged")
    return keras.optimizers.get(optimizer)


def shard_and_rebatch_dataset(dataset, global_bs):
    """``(dataset, per-worker batch size)`` for one worker."""
    return dataset, global_bs


def grouping_gradients_apply(apply_func, grads_and_vars, *args, **kwargs):
    return apply_func(grads_and_vars, *args, **kwargs)

"""TF1 scripts on the emulated NPU: ``ascend_emu.tf1.wrap(sess, ...)`` and the TF adapter's loss-scaling names.

A TF1 script written for the Ascend TF adapter wraps its optimizer in ``NPULossScaleOptimizer(opt,
loss_scale_manager)`` with an ``ExponentialUpdateLossScaleManager`` or ``FixedLossScaleManager``; the
same names here build the same graph as the plain optimizer (the loss scaling is the emulated device's
business) and register the manager for the train op, so a session wrapped by :func:`wrap` (or any
session inside :func:`ascend_emu.emulate`) scales the loss and checks the float status as the NPU does.
Outside the emulator the script trains unscaled in TensorFlow.
"""
from __future__ import annotations

from ..errors import AscendEmuError
from .emulate import Emulation, register_tf1_loss_scale
from .loss_scale import ExponentialUpdateLossScaleManager, FixedLossScaleManager


def wrap(session, precision_mode=None, **options):
    """``session`` (a ``tf.compat.v1.Session``) whose ``run`` of a train op trains on an emulated NPU.

    Takes :func:`ascend_emu.emulate`'s options. The wrapper runs everything else as the session does;
    ``wrapped.emulation`` holds the run record (``.steps``, ``.write_report(path)``).
    """
    from ..frontend.tf.hooks import SessionSteps, SessionWrapper

    if not hasattr(session, "run") or not hasattr(session, "graph"):
        raise AscendEmuError(f"ascend_emu.tf1.wrap needs a tf.compat.v1.Session, not {type(session).__name__}")
    emulation = Emulation(precision_mode, **options)
    wrapped = SessionWrapper(session, SessionSteps(emulation))
    wrapped.emulation = emulation
    return wrapped


class NPULossScaleOptimizer:
    """The TF adapter's ``NPULossScaleOptimizer(opt, loss_scale_manager, is_distributed=False)`` for TF1
    optimizers: ``minimize`` / ``compute_gradients`` / ``apply_gradients`` are ``opt``'s, and the train op
    they return is loss-scaled by ``loss_scale_manager`` on the emulated device."""

    def __init__(self, opt, loss_scale_manager, is_distributed: bool = False):
        if not isinstance(loss_scale_manager, (ExponentialUpdateLossScaleManager, FixedLossScaleManager)):
            raise AscendEmuError("NPULossScaleOptimizer: loss_scale_manager must be an "
                                 "ExponentialUpdateLossScaleManager or a FixedLossScaleManager (ascend_emu.tf1)")
        if is_distributed:
            raise AscendEmuError("NPULossScaleOptimizer(is_distributed=True): distributed training is not emulated")
        self._opt = opt
        self._manager = loss_scale_manager

    def get_loss_scale_manager(self):
        return self._manager

    def compute_gradients(self, *args, **kwargs):
        return self._opt.compute_gradients(*args, **kwargs)

    def apply_gradients(self, *args, **kwargs):
        op = self._opt.apply_gradients(*args, **kwargs)
        register_tf1_loss_scale(op.graph, op.name, self._manager)
        return op

    def minimize(self, *args, **kwargs):
        op = self._opt.minimize(*args, **kwargs)
        register_tf1_loss_scale(op.graph, op.name, self._manager)
        return op

    def __getattr__(self, name):
        return getattr(self._opt, name)


__all__ = ["wrap", "NPULossScaleOptimizer", "ExponentialUpdateLossScaleManager", "FixedLossScaleManager"]

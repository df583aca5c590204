"""Loss scaling as the Ascend TF adapter does it (ASCEND-FACTS.md section 5).

NPULossScaleOptimizer scales the loss, computes gradients, multiplies them by
1/scale, reads and clears the float status register, and applies the update only if
no overflow was flagged; the manager then adjusts the scale. These classes hold that
policy so a user (or a test) can drive it with the emulator's :class:`FloatStatus`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import AscendEmuError
from ..numerics.status import FloatStatus

#: the scale only grows while it stays below this divided by incr_ratio (float32 headroom)
SCALE_LIMIT = 3.4e38


@dataclass
class FixedLossScaleManager:
    """A constant loss scale (>= 1); overflowing steps are still skipped when checked."""

    loss_scale: float
    enable_overflow_check: bool = True

    def __post_init__(self):
        if not 1 <= self.loss_scale < float("inf"):
            raise AscendEmuError(f"FixedLossScaleManager: loss_scale must be a finite number >= 1, got "
                                 f"{self.loss_scale!r}")

    def get_loss_scale(self) -> float:
        return float(self.loss_scale)

    def update(self, finite: bool) -> bool:
        """Record one step; returns whether its update is applied."""
        return bool(finite) or not self.enable_overflow_check


@dataclass
class ExponentialUpdateLossScaleManager:
    """Grow the scale after ``incr_every_n_steps`` finite steps, shrink it after
    ``decr_every_n_nan_or_inf`` overflowing ones (counted since the last change)."""

    init_loss_scale: float
    incr_every_n_steps: int
    decr_every_n_nan_or_inf: int = 2
    incr_ratio: float = 2.0
    decr_ratio: float = 0.8

    def __post_init__(self):
        if self.init_loss_scale < 1 or self.incr_every_n_steps < 1 or self.decr_every_n_nan_or_inf < 1:
            raise AscendEmuError("ExponentialUpdateLossScaleManager: init_loss_scale >= 1, incr_every_n_steps >= 1 "
                                 "and decr_every_n_nan_or_inf >= 1 are required")
        if not (self.incr_ratio > 1 and 0 < self.decr_ratio < 1):
            raise AscendEmuError("ExponentialUpdateLossScaleManager: needs incr_ratio > 1 and 0 < decr_ratio < 1")
        self.loss_scale = float(self.init_loss_scale)
        self.good_steps = 0
        self.bad_steps = 0

    def get_loss_scale(self) -> float:
        return self.loss_scale

    def update(self, finite: bool) -> bool:
        """Record one step and adjust the scale; returns whether its update is applied."""
        if finite:
            if self.good_steps + 1 >= self.incr_every_n_steps:
                if self.loss_scale < SCALE_LIMIT / self.incr_ratio:
                    self.loss_scale *= self.incr_ratio
                self.good_steps = self.bad_steps = 0
            else:
                self.good_steps += 1
            return True
        if self.bad_steps + 1 >= self.decr_every_n_nan_or_inf:
            self.loss_scale = max(1.0, self.loss_scale * self.decr_ratio)
            self.good_steps = self.bad_steps = 0
        else:
            self.bad_steps += 1
            self.good_steps = 0
        return False


def apply_step(manager, status: FloatStatus) -> bool:
    """NPULossScaleOptimizer's check: read the float status, clear it, update the manager.

    Returns True when the step's gradients are finite and the update should be applied.
    """
    finite = not status.get()
    status.clear()
    return manager.update(finite)

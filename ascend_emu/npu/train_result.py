"""What a training run returns: :class:`TrainResult` (losses, loss scales, per-step records, dumps, ranks)
and the lines that summarise a data-parallel run (:mod:`ascend_emu.npu.training` runs the steps)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import AscendEmuError


@dataclass
class TrainResult:
    """What :meth:`Device.train` did, step by step.

    ``steps`` holds one dict per step with the fields of ``train --json``: ``step``, ``loss``,
    ``reference_loss`` (with a reference run), ``loss_scale`` (the scale used in that step),
    ``skipped``, ``float_status``, ``first_overflow`` (None or ``{"name", "tf_type", "phase"}``),
    and ``grad_zeros`` / ``grad_values`` (gradient elements that are exactly zero, of all).
    """

    config: dict
    steps: list
    state: dict
    reference_state: dict | None = None
    dumps: dict = field(default_factory=dict)            # step -> NPU dump dir
    reference_dumps: dict = field(default_factory=dict)  # step -> reference dump dir
    #: data-parallel training: ranks, all-reduce, the rank weight checks (None on one device)
    ranks: dict | None = None
    #: data-parallel training: every rank's final state (``state`` is rank 0's)
    rank_states: list | None = None

    def _col(self, key, dtype=float):
        return np.array([s.get(key) if s.get(key) is not None else np.nan for s in self.steps], dtype=dtype)

    losses = property(lambda self: self._col("loss"))
    reference_losses = property(lambda self: self._col("reference_loss"))
    loss_scales = property(lambda self: self._col("loss_scale"))
    skipped = property(lambda self: np.array([s["skipped"] for s in self.steps], dtype=bool))
    float_status = property(lambda self: np.array([s["float_status"] for s in self.steps], dtype=np.int64))

    def first_overflow(self, step: int) -> dict | None:
        return self.steps[step]["first_overflow"]

    def weights(self, reference: bool = False) -> dict:
        """Variable path -> array after training (trainable and non-trainable)."""
        state = self.reference_state if reference else self.state
        if state is None:
            raise AscendEmuError("no reference run: train with reference=True")
        return {k.split("/", 1)[1]: v for k, v in state.items() if not k.startswith("slot/")}

    def to_json(self) -> dict:
        out = {"config": self.config, "steps": self.steps,
               "dumps": {str(k): v for k, v in self.dumps.items()},
               "reference_dumps": {str(k): v for k, v in self.reference_dumps.items()}}
        if self.ranks is not None:
            out["ranks"] = self.ranks
        return out

    def rank_losses(self) -> np.ndarray:
        """(steps, ranks) losses of each rank's shard (data-parallel training)."""
        if self.ranks is None:
            raise AscendEmuError("not a data-parallel run: train with ranks=2 or more")
        return np.array([s["rank_losses"] for s in self.steps], dtype=np.float64)

    def format_text(self) -> str:
        skipped = [s["step"] for s in self.steps if s["skipped"]]
        lines = [f"steps: {len(self.steps)}; skipped: {len(skipped)}"
                 + (f" (steps {', '.join(map(str, skipped[:10]))}{', ...' if len(skipped) > 10 else ''})" if skipped else "")]
        first = next((s for s in self.steps if s["first_overflow"]), None)
        if first:
            f = first["first_overflow"]
            lines.append(f"first overflow: step {first['step']}, op {f['name']} ({f['tf_type']}), phase {f['phase']}")
        last = self.steps[-1]
        line = f"loss: first {self.steps[0]['loss']:.6g}, last {last['loss']:.6g}"
        if last.get("reference_loss") is not None:
            line += f"; reference last {last['reference_loss']:.6g}"
        lines.append(line)
        lines.append(f"loss scale: first {self.steps[0]['loss_scale']:.6g}, last {last['loss_scale']:.6g}")
        if self.ranks is not None:
            lines.extend(format_ranks(self.ranks, last))
        return "\n".join(lines)


def _differences(rows: list, limit: int = 6) -> str:
    shown = ", ".join(f"rank {d['rank']} {d['variable']} (max |diff| {d['max_abs_diff']:.3g})" for d in rows[:limit])
    return shown + (f", ... ({len(rows)} in all)" if len(rows) > limit else "")


def format_ranks(info: dict, last: dict) -> list[str]:
    """Report lines of a data-parallel run: the all-reduce, the rank weight checks, the last per-rank losses."""
    lines = [f"ranks: {info['ranks']} (shard {info['shard']} samples each); all-reduce {info['allreduce']} in "
             f"{info['allreduce_dtype']}, {'deterministic' if info['hccl_deterministic'] else 'arrival order drawn from the run seed'}"]
    init = info.get("initial_differences")
    if init is not None:
        lines.append("rank weights before training: " + (
            "every rank starts from rank 0's weights" if not init else
            f"WARNING: {len({d['rank'] for d in init})} rank(s) start from other weights than rank 0: "
            + _differences(init)))
    final = info.get("final_differences")
    if final is not None:
        lines.append("rank weights after training: " + ("identical on every rank" if not final else
                                                         "differ from rank 0: " + _differences(final)))
    nt = info.get("final_non_trainable_differences")
    if nt:
        lines.append(f"non-trainable state (per-rank batch statistics) differs on {len(nt)} rank/variable pair(s)")
    if last.get("rank_losses"):
        lines.append("last step's loss per rank: " + ", ".join(f"{v:.6g}" for v in last["rank_losses"]))
    return lines

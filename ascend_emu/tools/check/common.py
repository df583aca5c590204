"""The checklist's rows and result, its thresholds and tables (:mod:`ascend_emu.tools.check`)."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import numpy as np


PASSED, FAILED, NOT_CHECKED = "Passed", "Failed", "Not checked"
RESULTS = (PASSED, FAILED, NOT_CHECKED)

#: every threshold a row decides by, in one visible table
THRESHOLDS = {
    "duplicate_share": 0.01,       # item 6: duplicated samples, share of all samples
    "feature_scale_ratio": 100.0,  # item 6: largest / smallest per-feature RMS ("orders of magnitude apart")
    "sorted_label_batches": 0.5,   # item 7: share of single-label batches in file order without --shuffle
    "fp16_flop_share": 0.5,        # item 2/3: share of the matrix FLOPs that must run in fp16/bf16
    "explode_growth": 100.0,       # item 12: largest layer gradient norm grows this many times over the steps
    "vanish_ratio": 1e-5,          # item 12: smallest / largest layer gradient norm at step 0
    "pinned": 1e-3,                # item 13: sigmoid within this of 0 or 1, tanh within it of +-1
    "saturated_share": 0.5,        # item 13: share of pinned outputs (sigmoid, tanh) or dead units (ReLU)
    "underflow_share": 0.01,       # item 18: gradient elements zero in fp16 but not in float32
    "reduce_length": 2048,         # item 19: terms per output of an fp16 reduction (fp16 has 11 significant bits)
}
#: item 15: a sensible initial learning rate per optimizer (inclusive)
LR_RANGES = {"sgd": (1e-5, 1.0), "adam": (1e-6, 1e-2), "adamw": (1e-6, 1e-2), "rmsprop": (1e-6, 1e-2)}
#: reductions whose fp16 accumulation loses precision over long axes (ASCEND-FACTS section 3)
REDUCTIONS = {"Sum", "Mean", "Prod", "BiasAddGrad", "L2Loss"}
#: stateful random ops: their outputs differ between any two runs (item 1), so item 17 does not compare them
RANDOM_OPS = {"RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt", "Multinomial",
              "RandomShuffle", "RandomGamma", "RandomPoisson", "RandomPoissonV2"}
ACTIVATIONS = {"Sigmoid", "Tanh", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu"}
_HIST_BINS = 40


# --------------------------------------------------------------------------- rows and result

@dataclass
class CheckRow:
    """One checklist item: ``result`` is exactly ``Passed``, ``Failed`` or ``Not checked`` (the reason then
    in ``evidence``). ``plot`` holds the numbers behind a numeric row's report plot (not in the JSON)."""

    number: str
    item: str
    method: str
    result: str
    evidence: str
    plot: dict | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        return {"number": self.number, "item": self.item, "method": self.method, "result": self.result,
                "evidence": self.evidence}


@dataclass
class CheckResult:
    """What :func:`check` found: the rows in checklist order (iterate over it, or ``result["6"]``),
    the suggested CANN ``modify_mixlist`` (``ops_info``, None when no row failed for precision reasons)
    and the configuration checked."""

    rows: list
    ops_info: dict | None = None
    config: dict = field(default_factory=dict)
    #: the runs the check could not make (the reference, the emulated run), each why: their items are Not checked
    errors: list = field(default_factory=list)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, number) -> CheckRow:
        for r in self.rows:
            if r.number == str(number):
                return r
        raise KeyError(f"no checklist row {number!r}; rows: {', '.join(r.number for r in self.rows)}")

    @property
    def failed(self) -> list:
        return [r for r in self.rows if r.result == FAILED]

    @property
    def exit_code(self) -> int:
        """0 when nothing failed, 1 when something did or a run the items need could not be made (the CLI's
        exit status: a checklist most of whose items could not run is no pass)."""
        return 1 if self.failed or self.errors else 0

    def to_json(self) -> dict:
        """``{"rows": [{"number", "item", "method", "result", "evidence"}, ...]}``, and ``"errors"`` (the runs that
        could not be made) when there are any."""
        out = {"rows": [r.to_json() for r in self.rows]}
        if self.errors:
            out["errors"] = list(self.errors)
        return out

    def format_text(self, width: int = 160) -> str:
        """The checklist as a table: number, item, method, result, evidence (cells wrapped)."""
        heads = ["No.", "Item", "Method", "Result", "Evidence"]
        fixed = [5, 30, 38, 11]
        widths = fixed + [max(30, width - sum(fixed) - 2 * len(fixed))]
        out = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip(), "-" * min(width, sum(widths) + 8)]
        for r in self.rows:
            cells = [textwrap.wrap(str(v), w) or [""] for v, w in
                     zip((r.number, r.item, r.method, r.result, r.evidence), widths)]
            for k in range(max(len(c) for c in cells)):
                out.append("  ".join((c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths)).rstrip())
        counts = {k: sum(1 for r in self.rows if r.result == k) for k in RESULTS}
        out.append("")
        out.append(f"{counts[PASSED]} passed, {counts[FAILED]} failed, {counts[NOT_CHECKED]} not checked")
        out.extend(f"could not run: {e}" for e in self.errors)
        return "\n".join(out)

    def report_data(self) -> dict:
        """Everything the HTML report needs: the rows with their plot data, the suggestion, the config."""
        return {"rows": [dict(r.to_json(), plot=r.plot) for r in self.rows], "ops_info": self.ops_info,
                "config": self.config}


def _row(number, item, method, result, evidence, plot=None) -> CheckRow:
    assert result in RESULTS
    return CheckRow(str(number), item, method, result, evidence, plot)


def _not_checked(number, item, method, reason) -> CheckRow:
    return _row(number, item, method, NOT_CHECKED, reason)


def _no_emulated_run(c, number, item, method, *, dump: bool = True, bench: bool = False) -> CheckRow | None:
    """The Not checked row of an item that reads the emulated run (its dump unless ``dump=False``; with
    ``bench``, the float32 rerun's dump too) when that did not run; None when it did."""
    if (c.npu_dump if dump else c.npu) is None or (bench and c.bench_dump is None):
        return _not_checked(number, item, method, c.npu_error or "the emulated run did not run")
    return None


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.4g}"
    return str(v)


def _names(items, limit=5) -> str:
    items = list(items)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(map(str, items[:limit])) + more

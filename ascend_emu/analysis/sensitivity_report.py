"""A self-contained HTML report of a sensitivity run (``ascend-emu sensitivity --report``).

Input is the run's JSON (``SensitivityResult.to_json()``): numbers, not the device. Sections (their ids):
``conclusions`` (each conclusion, robust or not, and the variants that move it), ``bands`` (per op: the
cosine of its first output against the float32 reference under the default values, and its band min..max
across every variant, as a plot and a table) and ``variants`` (each variant's parameters and findings).
"""
from __future__ import annotations

import math

from ..fileio import atomic_write_text
from .report import _img, _page, _png, _report_input, _table


def _band_plot(ops: list) -> str:
    from matplotlib.figure import Figure

    xs = list(range(len(ops)))

    def gap(v):
        return max(1.0 - v, 1e-16) if isinstance(v, float) and math.isfinite(v) else math.nan

    fig = Figure(figsize=(11, 4.6))
    ax = fig.subplots()
    lo = [gap(o["max"]) for o in ops]
    hi = [gap(o["min"]) for o in ops]
    ax.fill_between(xs, lo, hi, color="#1f77b4", alpha=0.25, step="mid", label="band across variants")
    ax.plot(xs, [gap(o["default"]) for o in ops], "-o", ms=3, color="#1f77b4", label="default values")
    ax.set_yscale("log")
    ax.set_xlabel("op (execution order)")
    ax.set_ylabel("1 - cosine vs float32 (log)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return _png(fig)


def _loss_plot(lc: dict) -> str:
    from matplotlib.figure import Figure

    xs = list(range(len(lc["default"])))
    fig = Figure(figsize=(11, 4))
    ax = fig.subplots()
    ax.fill_between(xs, lc["min"], lc["max"], color="#ff7f0e", alpha=0.25, label="band across variants")
    ax.plot(xs, lc["default"], "-o", ms=3, color="#ff7f0e", label="default values")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return _png(fig)


def _value(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_value(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.6g}"
    return "-" if v is None else str(v)


def write_sensitivity_report(run: dict, path, *, title: str | None = None) -> str:
    """Write the HTML report of ``run`` (``SensitivityResult.to_json()``) to ``path``; returns ``path``."""
    path, variants, _ = _report_input(path, run, "variants", "the sensitivity run")
    title = title or f"ascend-emu sensitivity: {run.get('model', 'model')}"
    parts = _page(title)
    crows = []
    for name, c in (run.get("conclusions") or {}).items():
        moved = "; ".join(f"{m['variant']} -> {_value(m['value'])}" for m in c.get("moved_by", []))
        crows.append({"conclusion": name, "robust": "yes" if c.get("robust") else "NO",
                      "default": _value(c.get("default")), "moved by": moved or "-"})
    parts.append('<section id="conclusions"><h2>Conclusions</h2><p class="muted">A conclusion is robust when '
                 'every variant of the assumed parameters draws it too (the output cosine: within its tolerance)'
                 '.</p>' + _table(crows, ["conclusion", "robust", "default", "moved by"],
                                  classes=["" if r["robust"] == "yes" else "error" for r in crows]) + "</section>")
    lc = (run.get("conclusions") or {}).get("loss_curve")
    if isinstance(lc, dict) and lc.get("default"):
        parts.append('<section id="loss"><h2>Loss per step: default and band</h2><p class="muted">The loss of each '
                     'step under the default values, and its range over every variant.</p>'
                     + _img(_loss_plot(lc), "loss band across variants") + "</section>")
    ops = run.get("ops") or []
    body = "<p>No op compared with the reference.</p>"
    if ops:
        rows = [{"op": o["op"], "default": o["default"], "min": o["min"], "max": o["max"],
                 "worst variant": o["worst_variant"]} for o in ops]
        body = (_img(_band_plot(ops), "per-op cosine band across variants")
                + _table(rows, ["op", "default", "min", "max", "worst variant"], numeric=("default", "min", "max")))
    parts.append('<section id="bands"><h2>Per op: cosine against float32, default and band</h2>'
                 '<p class="muted">The cosine of each op\'s first output against the TensorFlow float32 reference '
                 'under the default values, and its range over every variant.</p>' + body + "</section>")
    training = isinstance(lc, dict)
    vrows = [{"variant": v["label"], "varies": ", ".join(v.get("varies") or []) or "-",
              "first divergent": _value(v.get("first_divergent")), "first overflow": _value(v.get("first_overflow")),
              "output cosine": v.get("output_cosine"), "float status": v.get("float_status"),
              "final loss": (v.get("losses") or [None])[-1], "skipped steps": _value(v.get("skipped_steps"))}
             for v in variants]
    cols = (["variant", "varies", "first overflow", "final loss", "skipped steps"] if training else
            ["variant", "varies", "first divergent", "first overflow", "output cosine", "float status"])
    parts.append('<section id="variants"><h2>Variants</h2>' + _table(vrows, cols) + "</section>")
    parts.append("</body></html>")
    atomic_write_text(path, "\n".join(parts))
    return path

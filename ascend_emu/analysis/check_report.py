"""A self-contained HTML report of the pre-tuning checklist (``ascend-emu check --report``).

Input is :meth:`ascend_emu.tools.check.common.CheckResult.report_data`: the rows (number, item, method, result,
evidence) and, for the numeric rows, the numbers behind their plots. Sections (their ids): ``summary``,
``checklist`` (the table, failed rows highlighted), ``plots`` (gradient norms per layer over the steps,
activation histograms at step 0, the loss over the first steps), ``ops-info`` (the suggested CANN
``modify_mixlist``, when a row failed for precision reasons) and ``config``. Numbers only: no device,
no TensorFlow.
"""
from __future__ import annotations

import json
import math

from ..fileio import atomic_write_text
from .report import _e, _flat, _img, _page, _report_input, _png, _table

SECTIONS = ["summary", "checklist", "plots", "ops-info", "config"]
_CLASS = {"Failed": "error", "Not checked": "diff", "Passed": ""}


def _grad_plot(plot: dict) -> str:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    norms = plot["norms"]
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.subplots()
    for j, name in enumerate(plot["layers"]):
        ys = [max(row[j], 1e-30) if math.isfinite(row[j]) else math.nan for row in norms]
        ax.plot(range(len(norms)), ys, "-o", ms=3, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("gradient norm (log)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return _png(fig)


def _activation_plot(plot: dict) -> str:
    from matplotlib.figure import Figure

    acts = plot["activations"][:8]
    cols = min(4, len(acts))
    rows = math.ceil(len(acts) / cols)
    fig = Figure(figsize=(3.2 * cols, 2.5 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= len(acts):
            ax.set_visible(False)
            continue
        a = acts[k]
        edges = a["edges"]
        ax.stairs(a["counts"], edges, fill=True, color="#d62728" if a["share"] > 0.5 else "#1f77b4")
        ax.set_title(f"{a['name'][-28:]} ({a['type']})\n{a['share']:.0%} {a['what']}", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return _png(fig)


def _loss_plot(plot: dict) -> str:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7.5, 3.2))
    ax = fig.subplots()
    ref = plot["reference"]
    ax.plot(range(len(ref)), ref, "-o", ms=3, color="#1f77b4", label="TensorFlow float32 reference")
    if plot.get("npu"):
        ax.plot(range(len(plot["npu"])), plot["npu"], "-o", ms=3, color="#d62728", label="emulated NPU")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


_PLOTS = (("norms", _grad_plot, "gradient norm per layer over the first steps (float32 reference)"),
          ("activations", _activation_plot, "activation histograms at step 0 (float32 reference)"),
          ("reference", _loss_plot, "loss over the first steps"))


def write_check_report(data: dict, path, *, title: str | None = None) -> str:
    """Write the HTML report of a checklist run.

    Parameters
    ----------
    data : dict
        ``CheckResult.report_data()``: ``rows`` (each with ``plot`` None or its numbers), ``ops_info``,
        ``config``.
    path : str or os.PathLike
        The HTML file, written atomically.

    Returns
    -------
    str
        ``path``.
    """
    path, rows, config = _report_input(path, data, "rows", "the checklist")
    title = title or f"ascend-emu pre-tuning checklist: {config.get('model') or 'model'}"
    counts = {k: sum(1 for r in rows if r["result"] == k) for k in _CLASS}
    parts = _page(title)
    failed = [f"{r['number']} {r['item']}" for r in rows if r["result"] == "Failed"]
    summary = [("rows", len(rows)), ("passed / failed / not checked",
                                     f"{counts['Passed']} / {counts['Failed']} / {counts['Not checked']}"),
               ("failed", ", ".join(failed) or "none")]
    parts.append('<section id="summary"><h2>Summary</h2><table class="kv">'
                 + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in summary) + "</table></section>")
    cols = ["number", "item", "method", "result", "evidence"]
    parts.append('<section id="checklist"><h2>Checklist</h2>'
                 '<p class="muted">Seed 000\'s numbering where it has one; 11-15 are seed 003\'s training checks, '
                 '16-19 what only the emulator sees. Red: failed; yellow: not checked (the evidence says why and how '
                 'to check by hand).</p>'
                 + _table(rows, cols, classes=[_CLASS.get(r["result"], "") for r in rows]) + "</section>")
    plots = []
    for r in rows:
        p = r.get("plot")
        if not p:
            continue
        for key, fn, alt in _PLOTS:
            if key in p and p[key]:
                plots.append(f"<h3>{_e(r['number'])}. {_e(r['item'])}: {_e(r['result'])}</h3>"
                             f"<p class=\"muted\">{_e(alt)}</p>" + _img(fn(p), alt))
                break
    parts.append('<section id="plots"><h2>Numeric rows</h2>'
                 + ("".join(plots) if plots else "<p>No numeric row ran (no usable samples?).</p>") + "</section>")
    info = data.get("ops_info")
    parts.append('<section id="ops-info"><h2>Suggested ops_info.json</h2>'
                 + (f'<p class="muted">A CANN modify_mixlist for the rows that failed for precision reasons; '
                    f'try it with <code>--modify-mixlist ops_info.json</code> (check --ops-info FILE writes it).</p>'
                    f"<pre>{_e(json.dumps(info, indent=1))}</pre>" if info else
                    "<p>No row failed for precision reasons.</p>") + "</section>")
    crow = [{"setting": k, "value": v} for k, v in sorted(_flat("", config, {}).items())]
    parts.append('<section id="config"><h2>Configuration</h2>' + _table(crow, ["setting", "value"]) + "</section>")
    parts.append("</body></html>\n")
    return atomic_write_text(path, "\n".join(parts))

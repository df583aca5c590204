"""A self-contained HTML report of a comparison: one file, plots embedded, opens offline.

Sections (their ids): ``summary``, ``graph`` (the op graph of the NPU dump as inline SVG, coloured by
error, fused ops grouped, the first divergent op marked: :mod:`.graph_view`), ``configs`` (both
configurations side by side), ``per-op`` (1 - cosine and max relative error along execution order, log scale,
overflowing ops and the first divergent op marked), ``worst`` (worst tensors),
``first-divergent``, ``overflow`` (the overflow panel), ``histogram`` (the culprit's
error distribution) and ``all-tensors`` (every row, folded).

Plots use matplotlib's Agg canvas directly (no pyplot, so the user's backend is left
alone); no TensorFlow, no external URL.
"""
from __future__ import annotations

import base64
import html
import io
import math

import numpy as np

from .compare import COLUMNS, ERROR, NAN, WARNING, Comparison, compare
from .dump import load_dump
from .graph_view import CSS as _GRAPH_CSS, graph_section
from .metrics import format_metric
from ..fileio import atomic_write_text, check_writable
from .overflow import OverflowReport, overflow_report

SECTIONS = ["summary", "graph", "configs", "per-op", "worst", "first-divergent", "overflow", "histogram", "all-tensors"]
_HIST_BINS = np.linspace(-12.0, 8.0, 81)  # log10 of the error, 4 bins per decade
_CHUNK = 1 << 18

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;color:#222;padding:0 16px}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 6px;text-align:left}
th{background:#f3f3f3}td.num{text-align:right;font-family:Menlo,Consolas,monospace}
tr.error td{background:#fde8e8}tr.diff td{background:#fff6d6}
pre{background:#f7f7f7;border:1px solid #e3e3e3;padding:10px;overflow-x:auto;font-size:12px}
.kv td:first-child{font-weight:600}.side{display:flex;gap:24px;flex-wrap:wrap}
.big{font-size:1.1em}.muted{color:#777}img{max-width:100%}
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _page(title: str, css: str = "") -> list[str]:
    """The opening parts of a report page: the document head with the style sheet (and ``css``), and the title."""
    return [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<style>{_CSS}{css}</style></head><body>", f"<h1>{_e(title)}</h1>"]


def _report_input(path, data: dict, key: str, what: str):
    """What a report writer starts from: the checked output ``path``, ``data[key]`` (the list the report is
    about; an empty or missing one is a user error) and ``data["config"]``."""
    from ..errors import AscendEmuError

    path = check_writable(path, "report")
    items = data.get(key) or []
    if not items:
        raise AscendEmuError(f"{what} has no {key}: nothing to report")
    return path, items, data.get("config") or {}


def _num(v) -> str:
    return format_metric(v) if isinstance(v, float) else _e(v)


def _png(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    # metadata=None-ish: no Software/date chunk, so the same run gives the same file
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{b64}">'


def _flat(prefix: str, dct, out: dict) -> dict:
    """A nested configuration dict as ``{"a.b.c": value}`` rows."""
    for k, v in (dct or {}).items():
        if isinstance(v, dict):
            _flat(f"{prefix}{k}.", v, out)
        else:
            out[f"{prefix}{k}"] = v
    return out


def _table(rows, columns, *, classes=None, numeric=()) -> str:
    out = ["<table><thead><tr>" + "".join(f"<th>{_e(c)}</th>" for c in columns) + "</tr></thead><tbody>"]
    for k, r in enumerate(rows):
        cls = f' class="{classes[k]}"' if classes and classes[k] else ""
        cells = []
        for c in columns:
            v = r.get(c) if isinstance(r, dict) else r[columns.index(c)]
            if c in numeric or isinstance(v, float):
                cells.append(f'<td class="num">{_num(v)}</td>')
            else:
                cells.append(f"<td>{_e(v)}</td>")
        out.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


# --------------------------------------------------------------------------- plots

def _per_op_plot(cmp: Comparison, ov: OverflowReport | None, first) -> str | None:
    from matplotlib.figure import Figure

    xs, one_minus_cos, rel, nan_x, bad = [], [], [], [], []
    for r in cmp.rows:
        if not isinstance(r.get("Index"), int) or r.get("NPU Name") is None:
            continue
        c = r["Cosine"]
        if c == NAN:
            nan_x.append(r["Index"])
            continue
        if not isinstance(c, float):
            continue
        xs.append(r["Index"])
        bad.append(r["Result"] == ERROR)
        one_minus_cos.append(max(1.0 - c, 1e-16))
        m = r["MaxRelativeErr"]
        rel.append(max(m, 1e-16) if isinstance(m, float) and math.isfinite(m) else np.nan)
    if not xs and not nan_x:
        return None
    fig = Figure(figsize=(11, 6.2))
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    from matplotlib.ticker import MaxNLocator
    colors = ["#d62728" if b else "#1f77b4" for b in bad]
    ax1.set_yscale("log")
    ax2.set_yscale("log")
    ax1.scatter(xs, one_minus_cos, s=10, c=colors, label="1 - cosine (red: Result error)")
    ax1.axhline(1 - cmp.thresholds.cosine, color="#999", lw=0.8, ls=":", label=f"cosine {cmp.thresholds.cosine}")
    ax1.set_ylabel("1 - cosine (log)")
    ax2.scatter(xs, rel, s=10, c=["#d62728" if b else "#ff7f0e" for b in bad], label="MaxRelativeErr")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_ylabel("max relative error (log)")
    ax2.set_xlabel("op index (execution order)")
    for ax in (ax1, ax2):
        ax.grid(True, which="major", alpha=0.3)
    if nan_x:
        for ax in (ax1, ax2):
            ax.plot(nan_x, [ax.get_ylim()[1]] * len(nan_x), "kx", ms=6, label="inf/nan mismatch (Nan)")
    if ov is not None and ov.ops:
        ox = [e["index"] for e in ov.ops]
        for ax in (ax1, ax2):
            lo = ax.get_ylim()[0]
            ax.plot(ox, [lo] * len(ox), "^", color="#d62728", ms=7, clip_on=False, label="overflow status")
    if first is not None:
        for ax in (ax1, ax2):
            ax.axvline(first.index, color="#d62728", lw=1.2, ls="--", label=f"first divergent: {first.name}"[:60])
    ax1.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return _png(fig)


def _error_histograms(cmp: Comparison, culprit_op: str, index: int, bench_op: str, bench_index: int):
    """Streaming log10 histograms of |n - b| and of the relative error of one tensor pair."""
    from .compare import dtype_eps
    from .dump import _dtype_from_name
    eps = dtype_eps(_dtype_from_name(cmp.bench.op(bench_op)["outputs"][bench_index]["dtype"]))
    h_abs = np.zeros(len(_HIST_BINS) - 1, np.int64)
    h_rel = np.zeros(len(_HIST_BINS) - 1, np.int64)
    exact = nonfinite = total = 0
    ni = cmp.npu.chunks(culprit_op, index, _CHUNK)
    bi = cmp.bench.chunks(bench_op, bench_index, _CHUNK)
    with np.errstate(all="ignore"):
        for nc in ni:
            n = nc.astype(np.float64)
            b = next(bi).astype(np.float64)
            d = np.abs(n - b)
            fin = np.isfinite(d)
            nonfinite += int((~fin).sum())
            d = d[fin]
            bb = np.abs(b[fin])
            bb[bb == 0] = eps
            r = d / bb
            total += n.size
            zero = d == 0
            exact += int(zero.sum())
            la = np.clip(np.log10(d[~zero]), _HIST_BINS[0], _HIST_BINS[-1] - 1e-9)
            lr = np.clip(np.log10(r[~zero]), _HIST_BINS[0], _HIST_BINS[-1] - 1e-9)
            h_abs += np.histogram(la, _HIST_BINS)[0]
            h_rel += np.histogram(lr, _HIST_BINS)[0]
    return h_abs, h_rel, exact, nonfinite, total


def _histogram_plot(name, h_abs, h_rel, exact, nonfinite, total, t) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.6))
    ax1, ax2 = fig.subplots(1, 2)
    centers = (_HIST_BINS[:-1] + _HIST_BINS[1:]) / 2
    w = _HIST_BINS[1] - _HIST_BINS[0]
    ax1.bar(centers, h_abs, width=w, color="#1f77b4")
    ax1.set_xlabel("log10 |npu - bench|")
    ax1.set_ylabel("elements")
    ax1.set_title(f"absolute error of {name}"[:70], fontsize=10)
    ax2.bar(centers, h_rel, width=w, color="#ff7f0e")
    for thr, lab in ((t.one_thousandth, "1/1000"), (t.five_thousandths, "5/1000")):
        ax2.axvline(math.log10(thr), color="#555", ls=":", lw=1)
        ax2.text(math.log10(thr), 0.5, lab, fontsize=8, ha="right", va="center", rotation=90,
                 transform=ax2.get_xaxis_transform())
    ax2.set_xlabel("log10 relative error")
    ax2.set_title(f"relative error ({exact} exact, {nonfinite} non-finite of {total})", fontsize=10)
    # show the decades that hold data (and the ratio thresholds), not the whole bin range
    used = np.nonzero(h_abs + h_rel)[0]
    if used.size:
        lo = min(_HIST_BINS[used[0]], math.log10(t.one_thousandth)) - 1
        hi = max(_HIST_BINS[used[-1] + 1], math.log10(t.five_thousandths)) + 1
        for ax in (ax1, ax2):
            ax.set_xlim(lo, hi)
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return _png(fig)


# --------------------------------------------------------------------------- report

def write_report(npu_dump, bench_dump, path, *, comparison: Comparison | None = None,
                 overflow: OverflowReport | None = None, title: str | None = None, rules: str = "ascend-emu",
                 force: bool = False) -> str:
    """Write a self-contained HTML report comparing two dumps.

    Parameters
    ----------
    npu_dump, bench_dump : str, os.PathLike or Dump
        The replay's dump and the reference dump.
    path : str or os.PathLike
        The HTML file to write (atomically: a temporary file renamed into place).
    comparison : Comparison, optional
        Reuse a comparison already computed (else :func:`compare` runs).
    overflow : OverflowReport, optional
        Reuse an overflow report (else :func:`overflow_report` of the NPU dump).
    title : str, optional
    force : bool
        Compare (and report) even dumps of different models or inputs; the report says so in
        a warning at the top.
    rules : {"ascend-emu", "msprobe"}
        How :func:`compare` decides each row's Result (when ``comparison`` is not given).

    Returns
    -------
    str
        ``path``.
    """
    path = check_writable(path, "report")
    npu = load_dump(npu_dump)
    bench = load_dump(bench_dump)
    cmp = comparison if comparison is not None else compare(npu, bench, rules=rules, force=force)
    ov = overflow if overflow is not None else overflow_report(cmp.npu)
    first = cmp.first_divergent()
    model = cmp.npu.model.get("name") or "model"
    title = title or f"ascend-emu accuracy report: {model}"
    counts = cmp.counts()
    parts = _page(title, _GRAPH_CSS)
    if cmp.forced:
        parts.append(f'<p id="forced" style="color:#b00;font-weight:bold">Warning: {_e(cmp.forced_note())}.</p>')

    # summary
    cos = [r["Cosine"] for r in cmp.rows if isinstance(r["Cosine"], float)]
    vf = ov.first["verdict"] if ov.first else None
    summary = [
        ("NPU dump", cmp.npu.path), ("bench dump", cmp.bench.path),
        ("tensors", counts["tensors"]), ("compared", counts["compared"]),
        ("Result rules", cmp.rules),
        ("pass / warning / error" if cmp.rules == "msprobe" else "pass / error",
         f"{counts['pass']} / {counts['warning']} / {counts['error']}" if cmp.rules == "msprobe"
         else f"{counts['pass']} / {counts['error']}"),
        ("lowest cosine", _num(min(cos)) if cos else "-"),
        ("first divergent op", f"[{first.op.get('tf_type')}][{first.index}] {first.name}" if first else "none"),
        ("float status register", f"0x{ov.register:x}"),
        ("ops with overflow status", len(ov.ops)),
        ("first overflowing op", f"[{ov.first['tf_type']}][{ov.first['index']}] {ov.first['name']}" if ov.first else "none"),
        ("overflow verdict", f"{vf['verdict']}" if vf else "-"),
    ]
    for k in ("cast", "npu only", "bench only", "fused", "stats only"):
        if counts.get(k):
            summary.append((k, counts[k]))
    from .robustness import read_sidecar, robust_line

    sens = read_sidecar(cmp.npu)
    if sens is not None:
        summary.append(("robustness (ascend-emu sensitivity)", robust_line(sens)))
    parts.append('<section id="summary"><h2>Summary</h2><table class="kv">'
                 + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in summary) + "</table></section>")

    # the op graph, coloured by error
    parts.append(graph_section(cmp, ov))

    # configurations side by side
    nconf = _flat("", cmp.npu.config, {})
    bconf = _flat("", cmp.bench.config, {})
    for side, dmp, conf in (("n", cmp.npu, nconf), ("b", cmp.bench, bconf)):
        conf["(kind)"] = dmp.kind
        conf["(model)"] = f"{dmp.model.get('name')} {dmp.model.get('fingerprint', '')}".strip()
        conf["(inputs sha256)"] = dmp.inputs_sha256
        conf["(tool version)"] = dmp.tool_version
    keys = sorted(set(nconf) | set(bconf))
    crow = [{"setting": k, "NPU": nconf.get(k, ""), "bench": bconf.get(k, "")} for k in keys]
    ccls = ["diff" if nconf.get(k) != bconf.get(k) and not k.startswith("(kind") else "" for k in keys]
    note = ""
    if cmp.npu.inputs_sha256 != cmp.bench.inputs_sha256:
        note = '<p class="big"><b>The two dumps were made from different inputs</b> (inputs sha256 differ).</p>'
    parts.append('<section id="configs"><h2>Configurations</h2>' + note
                 + _table(crow, ["setting", "NPU", "bench"], classes=ccls) + "</section>")

    # per-op plot
    plot = _per_op_plot(cmp, ov, first)
    parts.append('<section id="per-op"><h2>Error along execution order</h2>'
                 '<p class="muted">Top: 1 - cosine; bottom: max relative error; both log scale. Red triangles: '
                 'ops with overflow status bits; dashed line: the first divergent op; crosses: inf/nan mismatch.</p>'
                 + (_img(plot, "1 - cosine and max relative error per op") if plot else "<p>No tensor compared.</p>")
                 + "</section>")

    # worst
    worst = cmp.worst(cosine=cmp.thresholds.cosine, limit=20)
    wcols = ["Index", "NPU Name", "Op Type", "Compute Dtype", "Cosine", "MaxAbsErr", "MaxRelativeErr",
             "One Thousandth Err Ratio", "Overflow Status", "Result", "Err_message"]
    parts.append(f'<section id="worst"><h2>Worst tensors (cosine &lt;= {cmp.thresholds.cosine}, up to 20)</h2>'
                 + (_table(worst, wcols, classes=["error" if r["Result"] == ERROR else "" for r in worst])
                    if worst else "<p>No tensor at or below this cosine.</p>") + "</section>")

    # first divergent
    if first is not None:
        irows = [dict(i["row"], **{"input": i["tensor"]}) if i["row"] else {"input": i["tensor"],
                 "Result": "not compared (constant / placeholder)"} for i in first.inputs]
        fcols = ["NPU Name", "NPU Dtype", "Bench Dtype", "Cosine", "MaxAbsErr", "MaxRelativeErr",
                 "One Thousandth Err Ratio", "Result", "Err_message"]
        body = (f"<pre>{_e(first.format_text())}</pre><h3>Inputs</h3>"
                + _table(irows, ["input"] + fcols[1:]) + "<h3>Outputs</h3>" + _table(first.outputs, fcols))
    elif not cmp.counts()["error"]:
        body = "<p>Every op passes the accuracy rule: no divergent op.</p>"
    else:
        body = f"<p>No divergent op: {_e(cmp.no_divergence_reason().removeprefix('none: '))}.</p>"
    if first is None and cmp.noise_line():    # else the first divergent op's text names them
        body += f'<p class="muted">{_e(cmp.noise_line())}</p>'
    parts.append('<section id="first-divergent"><h2>First divergent op</h2>'
                 '<p class="muted">The earliest op whose output fails while all its inputs pass: where the error '
                 'enters rather than where it is passed on.</p>' + body + "</section>")

    # overflow
    parts.append(f'<section id="overflow"><h2>Overflow</h2><pre>{_e(ov.format_text())}</pre></section>')

    # histogram of the culprit
    culprit = None
    if first is not None:
        for k, r in enumerate(cmp.rows):
            info = cmp.info(k)
            if info["npu_op"] == first.name and r["Result"] == ERROR:
                culprit = (r, info)
                break
    hist_html = "<p>No failing op: no error histogram.</p>"
    if culprit is not None:
        r, info = culprit
        if r["NPU Tensor Shape"] != r["Bench Tensor Shape"]:
            hist_html = f"<p>{_e(r['NPU Name'])}: shapes differ, no histogram.</p>"
        elif not (cmp.npu.has_tensor(info["npu_op"], info["output"])
                  and cmp.bench.has_tensor(info["bench_op"], info["bench_output"])):
            hist_html = f"<p>{_e(r['NPU Name'])} was dumped as statistics only: no histogram.</p>"
        else:
            h = _error_histograms(cmp, info["npu_op"], info["output"], info["bench_op"], info["bench_output"])
            hist_html = (f"<p>Distribution of the error of {_e(r['NPU Name'])} against {_e(r['Bench Name'])} "
                         "(log10 bins, 4 per decade).</p>"
                         + _img(_histogram_plot(r["NPU Name"], *h, cmp.thresholds), f"error histogram of {r['NPU Name']}"))
    parts.append('<section id="histogram"><h2>Error histogram of the first divergent op</h2>' + hist_html
                 + "</section>")

    # every row
    parts.append(f'<section id="all-tensors"><h2>All tensors</h2><details><summary>{len(cmp.rows)} rows '
                 '(the CSV has the same columns)</summary><p class="muted">EucDist is the absolute Euclidean '
                 'distance |NPU - bench| (msprobe\'s column); RelEucDist is the relative one, |NPU - bench| / '
                 '|bench| (msaccucmp\'s RelativeEuclideanDistance).</p>'
                 + _table(cmp.rows, COLUMNS, classes=[{ERROR: "error", WARNING: "diff"}.get(r["Result"], "")
                                                      for r in cmp.rows])
                 + "</details></section>")
    parts.append("</body></html>\n")
    text = "\n".join(parts)

    return atomic_write_text(path, text)

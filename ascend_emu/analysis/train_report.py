"""A self-contained HTML report of a training run: loss curves, the loss scale, skipped steps, overflows.

Input is the run's JSON (``TrainResult.to_json()``, what ``train --json`` writes): this module reads
numbers, not the device, so it sits beside the comparison report. Sections (their ids): ``summary``,
``curves`` (loss of the emulated run against the float32 reference; the loss scale on a log2 axis;
gradient elements flushed to zero), ``overflows`` (per overflowing step: the first overflowing op and
its phase), ``steps`` (every step, folded), ``dumps`` (each dumped step, linking to its comparison
report when the reference dumped the same step) and ``config``.
"""
from __future__ import annotations

import math
import os

from ..fileio import atomic_write_text
from .report import _e, _flat, _img, _num, _page, _report_input, _png, _table, write_report

SECTIONS = ["summary", "curves", "overflows", "dumps", "steps", "config"]


def _curves(steps: list) -> str:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    xs = [s["step"] for s in steps]
    loss = [s["loss"] for s in steps]
    ref = [s.get("reference_loss") for s in steps]
    skipped = [s["step"] for s in steps if s["skipped"]]
    has_ref = any(r is not None for r in ref)
    fig = Figure(figsize=(11, 10.4 if has_ref else 8.4))
    if has_ref:
        ax1, axd, ax2, ax3 = fig.subplots(4, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.6, 2, 1.4]})
        diff = [abs(v - r) if r is not None and math.isfinite(v) else math.nan for v, r in zip(loss, ref)]
        axd.plot(xs, [max(d, 1e-12) for d in diff], "-o", ms=3, color="#ff7f0e", label="|loss - reference|")
        axd.set_yscale("log")
        axd.set_ylabel("|difference| (log)")
        axes = (ax1, axd, ax2, ax3)
    else:
        ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2, 1.4]})
        axes = (ax1, ax2, ax3)
    ax1.plot(xs, loss, "-o", ms=3, color="#d62728", label="emulated NPU" + (" (mean over ranks)"
                                                                          if steps[0].get("rank_losses") else ""))
    if steps[0].get("rank_losses"):
        for r in range(len(steps[0]["rank_losses"])):
            ax1.plot(xs, [s["rank_losses"][r] for s in steps], "-", lw=0.8, alpha=0.6,
                     label=f"rank {r} (its shard)" if r < 8 else None)
    if has_ref:
        ax1.plot(xs, [math.nan if r is None else r for r in ref], "-o", ms=3, color="#1f77b4",
                 label="TensorFlow float32 reference")
    finite = [v for v in loss + [r for r in ref if r is not None] if math.isfinite(v)]
    if finite and min(finite) > 0 and max(finite) / min(finite) > 50:
        ax1.set_yscale("log")
    ax1.set_ylabel("loss")
    scales = [s["loss_scale"] for s in steps]
    ax2.step(xs, scales, where="post", color="#2ca02c", label="loss scale used")
    if all(v > 0 for v in scales):
        ax2.set_yscale("log", base=2)
    ax2.set_ylabel("loss scale (log2)")
    frac = [s["grad_zeros"] / s["grad_values"] if s.get("grad_values") else math.nan for s in steps]
    ax3.plot(xs, frac, "-", color="#9467bd", label="emulated")
    if any(s.get("reference_grad_zeros") is not None for s in steps):
        ax3.plot(xs, [s["reference_grad_zeros"] / s["grad_values"] if s.get("reference_grad_zeros") is not None
                      and s.get("grad_values") else math.nan for s in steps], "--", color="#1f77b4",
                 label="reference")
    ax3.set_ylabel("gradient zeros\n(fraction)")
    ax3.set_xlabel("step")
    ax3.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes:
        ax.grid(True, alpha=0.3)
        for k, st in enumerate(skipped):
            ax.axvline(st, color="#d62728", lw=0.8, ls=":", label="skipped step (overflow)" if k == 0 else None)
        ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return _png(fig)


def _ranks_section(info: dict) -> str:
    """Data-parallel training: the ranks, the all-reduce, and every rank/variable unlike rank 0's."""
    kv = [("ranks", f"{info.get('ranks')} (shard of {info.get('shard')} samples each)"),
          ("all-reduce", f"{info.get('allreduce')} in {info.get('allreduce_dtype')}, "
                         + ("deterministic" if info.get("hccl_deterministic") else "arrival order drawn from the run seed"))]
    parts = ['<section id="ranks"><h2>Ranks</h2><table class="kv">'
             + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in kv) + "</table>"]
    for key, head, none in (("initial_differences", "Initial weights unlike rank 0's (--check-rank-weights)",
                             "Every rank starts from rank 0's weights."),
                            ("final_differences", "Weights after training unlike rank 0's",
                             "Every rank ends with rank 0's weights and optimizer state."),
                            ("final_non_trainable_differences",
                             "Non-trainable state unlike rank 0's (per-rank batch statistics, no SyncBN)",
                             "No non-trainable state differs.")):
        rows = info.get(key)
        if rows is None:
            continue
        parts.append(f"<h3>{_e(head)}</h3>" + (_table(rows, ["rank", "variable", "max_abs_diff"],
                                                          classes=["error" if key == "initial_differences" else "diff"
                                                                   for _ in rows]) if rows else f"<p>{_e(none)}</p>"))
    return "".join(parts) + "</section>"


def write_train_report(run: dict, path, *, compare_steps: bool = True, title: str | None = None) -> str:
    """Write the HTML report of a training run.

    Parameters
    ----------
    run : dict
        ``TrainResult.to_json()``: ``config``, ``steps`` (the fields of ``train --json``), and the
        ``dumps`` / ``reference_dumps`` (step -> directory) of the dumped steps.
    path : str or os.PathLike
        The HTML file, written atomically.
    compare_steps : bool
        For each step dumped by both runs, also write the comparison report of the two dumps
        (``<report stem>-step-N.html`` next to ``path``) and link it.

    Returns
    -------
    str
        ``path``.
    """
    path, steps, config = _report_input(path, run, "steps", "the training run")
    model = (config.get("model") or {}).get("name") or "model"
    title = title or f"ascend-emu training report: {model}"
    skipped = [s["step"] for s in steps if s["skipped"]]
    over = [s for s in steps if s.get("first_overflow")]
    last = steps[-1]
    parts = _page(title)
    dev = config.get("device") if isinstance(config.get("device"), dict) else {}
    summary = [("steps", len(steps)), ("precision mode", dev.get("precision_mode", "-")),
               ("SoC / overflow mode", f"{dev.get('soc', '-')} / {dev.get('overflow_mode', '-')}"),
               ("loss scale", config.get("loss_scale")), ("overflow check", config.get("overflow_check", "-")),
               ("skipped steps", f"{len(skipped)}" + (f" ({', '.join(map(str, skipped[:20]))}"
                                                      f"{', ...' if len(skipped) > 20 else ''})" if skipped else "")),
               ("steps with overflow status", len(over)),
               ("loss, first / last", f"{_num(steps[0]['loss'])} / {_num(last['loss'])}")]
    if last.get("reference_loss") is not None:
        summary.append(("reference loss, first / last",
                        f"{_num(steps[0]['reference_loss'])} / {_num(last['reference_loss'])}"))
        diffs = [abs(s["loss"] - s["reference_loss"]) for s in steps
                 if s.get("reference_loss") is not None and math.isfinite(s["loss"])]
        if diffs:
            summary.append(("largest |loss - reference|", _num(max(diffs))))
    summary.append(("loss scale, first / last", f"{_num(steps[0]['loss_scale'])} / {_num(last['loss_scale'])}"))
    if over:
        f = over[0]["first_overflow"]
        summary.append(("first overflow", f"step {over[0]['step']}: {f['name']} ({f['tf_type']}), phase {f['phase']}"))
    parts.append('<section id="summary"><h2>Summary</h2><table class="kv">'
                 + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in summary) + "</table></section>")

    if run.get("ranks"):
        parts.append(_ranks_section(run["ranks"]))
    parts.append('<section id="curves"><h2>Loss, loss scale and gradient zeros per step</h2>'
                 '<p class="muted">Top: the loss of each step (emulated run and TensorFlow float32 reference on the '
                 'same batches) and, with a reference, their absolute difference. Then the loss scale the step used. Bottom: the fraction of gradient elements '
                 'that are exactly zero (fp16 underflow shows here). Dotted red lines: skipped steps.</p>'
                 + _img(_curves(steps), "loss, loss scale and gradient zeros per step") + "</section>")

    orows = [{"step": s["step"], "op": s["first_overflow"]["name"], "type": s["first_overflow"]["tf_type"],
              "phase": s["first_overflow"]["phase"], "float status": f"0x{s['float_status']:x}",
              "loss scale": s["loss_scale"], "skipped": s["skipped"]} for s in over]
    parts.append('<section id="overflows"><h2>Overflowing steps</h2>'
                 '<p class="muted">The first op of the step (in execution order, forward and backward) whose status '
                 'bits are set; the update ops are not counted, as on the NPU, where the status is read after the '
                 'backward pass.</p>'
                 + (_table(orows, ["step", "op", "type", "phase", "float status", "loss scale", "skipped"],
                           classes=["error" if r["skipped"] else "diff" for r in orows]) if orows
                    else "<p>No step set a status bit.</p>") + "</section>")

    # dumped steps, with comparison reports where both runs dumped the step
    dumps = {int(k): v for k, v in (run.get("dumps") or {}).items()}
    rdumps = {int(k): v for k, v in (run.get("reference_dumps") or {}).items()}
    drows = []
    stem = os.path.splitext(os.path.basename(path))[0]
    for k in sorted(set(dumps) | set(rdumps)):
        row = {"step": k, "NPU dump": dumps.get(k, "-"), "reference dump": rdumps.get(k, "-"), "comparison": "-"}
        if compare_steps and k in dumps and k in rdumps:
            rpath = os.path.join(os.path.dirname(path), f"{stem}-step-{k}.html")
            write_report(dumps[k], rdumps[k], rpath, title=f"ascend-emu accuracy report: {model}, step {k}")
            row["comparison"] = os.path.basename(rpath)
        drows.append(row)
    if drows:
        body = ["<table><thead><tr><th>step</th><th>NPU dump</th><th>reference dump</th><th>comparison</th></tr>"
                "</thead><tbody>"]
        for r in drows:
            link = (f'<a href="{_e(r["comparison"])}">{_e(r["comparison"])}</a>' if r["comparison"] != "-" else "-")
            body.append(f"<tr><td>{r['step']}</td><td>{_e(r['NPU dump'])}</td><td>{_e(r['reference dump'])}</td>"
                        f"<td>{link}</td></tr>")
        body.append("</tbody></table>")
        dhtml = "".join(body)
    else:
        dhtml = "<p>No step was dumped (train with --dump DIR --dump-steps LIST, and --reference to compare).</p>"
    parts.append('<section id="dumps"><h2>Dumped steps</h2>'
                 '<p class="muted">Each step\'s dump holds its forward, backward and update ops with their phase; '
                 'the reference dump is TensorFlow float32 on the same inputs and weights, so the two compare op by '
                 'op (ascend-emu compare NPU REFERENCE).</p>' + dhtml + "</section>")

    cols = ["step", "loss", *(["rank_losses"] if steps[0].get("rank_losses") else []), "reference_loss",
            "loss_scale", "skipped", "float_status", "first_overflow", "grad_zeros", "reference_grad_zeros",
            "grad_values"]
    srows = [{**s, "float_status": f"0x{s['float_status']:x}",
              **({"rank_losses": ", ".join(_num(v) for v in s["rank_losses"])} if s.get("rank_losses") else {}),
              "first_overflow": (f"{s['first_overflow']['name']} ({s['first_overflow']['phase']})"
                                 if s.get("first_overflow") else "")} for s in steps]
    parts.append(f'<section id="steps"><h2>Every step</h2><details><summary>{len(steps)} steps (train --json has '
                 'the same fields)</summary>'
                 + _table(srows, cols, classes=["error" if s["skipped"] else "" for s in steps])
                 + "</details></section>")
    crow = [{"setting": k, "value": v} for k, v in sorted(_flat("", config, {}).items())]
    parts.append('<section id="config"><h2>Configuration</h2>' + _table(crow, ["setting", "value"]) + "</section>")
    parts.append("</body></html>\n")
    return atomic_write_text(path, "\n".join(parts))

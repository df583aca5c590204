"""The whole workflow on the bundled default model, in one call (``ascend-emu demo``).

Builds :func:`ascend_emu.frontend.tf.models.demo_model` (seeded random weights, nothing
downloaded), runs the TensorFlow float32 reference and an ``allow_mix_precision``
replay, compares them, analyses overflow, writes the HTML report, and prints the
worst ops, the first divergent op and where the report is. Then (``train=True``) it trains
:func:`ascend_emu.frontend.tf.models.train_demo_model` for 24 steps under a dynamic loss scale beside
TensorFlow float32: the planted backward overflow skips a step and halves the scale, and the
training report shows the loss curves and the loss scale.
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..fileio import make_output_dir


def run_demo(out_dir: str = "demo-output", *, overwrite: bool = True, progress: bool = True,
             precision_mode: str = "allow_mix_precision", soc: str = "Ascend910", stream=None,
             train: bool = True) -> dict:
    """Run the demo; returns the paths it wrote and the main findings."""
    from ..analysis.compare import compare
    from ..analysis.overflow import overflow_report
    from ..analysis.report import write_report
    from ..frontend.tf.models import demo_model
    from ..frontend.tf.reference import reference
    from ..npu.device import Device

    stream = stream or sys.stdout

    def say(*args):
        # flush so the lines interleave correctly with the progress bars on stderr
        print(*args, file=stream, flush=True)
    t0 = time.perf_counter()
    make_output_dir(out_dir, "--out")
    bench_dir = os.path.join(out_dir, "bench")
    npu_dir = os.path.join(out_dir, "npu")
    model = demo_model()
    say(f"[1/6] TensorFlow float32 reference of the demo model -> {bench_dir}")
    ref = reference(model, None, bench_dir, overwrite=overwrite, progress=progress)
    say(f"[2/6] replay on the emulated {soc} with precision_mode={precision_mode} -> {npu_dir}")
    device = Device(precision_mode, soc=soc)
    res = device.replay(ref.graph, ref.inputs, npu_dir, overwrite=overwrite, progress=progress)
    say(res.format_summary())
    say("[3/6] compare")
    cmp = compare(npu_dir, bench_dir)
    first = cmp.first_divergent()
    say(cmp.summary_text(first_divergent=first is None))     # the op's block below names it: once
    if first is not None:
        say(first.format_text())
    worst = cmp.worst(cosine=0.9999, limit=8)
    say(cmp.format_table(worst))
    csv_path = os.path.join(out_dir, "compare.csv")
    cmp.to_csv(csv_path)
    say("[4/6] overflow analysis")
    ovf = overflow_report(npu_dir)
    say(ovf.format_text())
    say("[5/6] HTML report")
    report = write_report(npu_dir, bench_dir, os.path.join(out_dir, "report.html"), comparison=cmp, overflow=ovf,
                          title="ascend-emu demo: allow_mix_precision vs float32")
    if not train:
        say(f"\nreport: {os.path.abspath(report)}")
        say(f"compare CSV: {os.path.abspath(csv_path)}; done in {time.perf_counter() - t0:.1f} s")
        return {"report": report, "csv": csv_path, "npu": npu_dir, "bench": bench_dir, "first_divergent": first,
                "first_overflow": ovf.first, "comparison": cmp, "overflow": ovf}

    from ..analysis.train_report import write_train_report
    from ..fileio import atomic_write_text
    from ..frontend.tf.models import train_demo_data, train_demo_model

    tdir = os.path.join(out_dir, "train")
    say(f"[6/6] training: 24 steps of a small CNN on the emulated {soc}, {precision_mode}, dynamic loss scale, "
        f"beside TensorFlow float32 -> {tdir}")
    tres = device.train(train_demo_model(), train_demo_data(), batch_size=32, steps=24, loss_scale="dynamic",
                        reference=True, dump_dir=tdir, dump_steps=[0, 1], overwrite=overwrite, progress=progress)
    say(tres.format_text())
    run = tres.to_json()
    tjson = atomic_write_text(os.path.join(out_dir, "train.json"), json.dumps(run, indent=1, sort_keys=True) + "\n")
    treport = write_train_report(run, os.path.join(out_dir, "train-report.html"),
                                 title="ascend-emu demo: training with a planted backward overflow")
    say(f"\nreport: {os.path.abspath(report)}")
    say(f"training report: {os.path.abspath(treport)} (loss curves, loss scale, skipped steps)")
    say(f"compare CSV: {os.path.abspath(csv_path)}; training record: {os.path.abspath(tjson)}; "
        f"done in {time.perf_counter() - t0:.1f} s")
    return {"report": report, "csv": csv_path, "npu": npu_dir, "bench": bench_dir, "first_divergent": first,
            "first_overflow": ovf.first, "comparison": cmp, "overflow": ovf, "train_report": treport,
            "train": tres}

"""fit on a ResNet50-size dump: the time of ``fit`` (every candidate of every assumed parameter, serially in this
process) against one replay of the same model with its dump (the baseline: what the dump cost to make).

ResNet50 (64x64 input, batch 1, allow_mix_precision on the Ascend910) is replayed once to warm the kernels, then
once more timed with its dump; ``fit`` then runs on that dump with ``Sweep("none")``. ``--quick``: the demo
model instead. ``python -m benchmarks.fit`` prints the measurements as JSON.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

from .common import row


def measure(quick: bool = False) -> dict:
    from ascend_emu.frontend.tf import models
    from ascend_emu.frontend.tf.loader import load_graph
    from ascend_emu.npu.device import Device
    from ascend_emu.tools.fit import fit

    g = load_graph(models.demo_model() if quick else models.resnet50((64, 64, 3)))
    spec = g.inputs[0]
    shape = [1 if d is None else d for d in spec.shape]
    feeds = {spec.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    dev = Device("allow_mix_precision")
    work = tempfile.mkdtemp(prefix="bench-fit-")
    try:
        dev.replay(g, feeds, progress=False, keep_tensors=False)      # kernels compiled
        t = time.perf_counter()
        dev.replay(g, feeds, os.path.join(work, "dump"), progress=False, keep_tensors=False)
        t_replay = time.perf_counter() - t
        t = time.perf_counter()
        res = fit(os.path.join(work, "dump"), g, device=dev, progress=False, scheduler="none")
        t_fit = time.perf_counter() - t
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"model": g.name, "ops": len(g.nodes), "t_replay_dump": t_replay, "t_fit": t_fit,
            "candidates": res.candidates, "identical": res.identical,
            "verdicts": {k: v["verdict"] for k, v in res.parameters.items()}, "load": os.getloadavg()}


def run(quick: bool = False) -> list:
    m = measure(quick)
    return [row("fit", f"fit of a {m['model']} dump ({m['ops']} nodes), serial", m["t_fit"], m["t_replay_dump"],
                "one replay with its dump", "s", higher_is_better=False,
                note=f"{m['candidates']} candidate reruns; best reproduces {m['identical']:.1%} of the tensors")]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(measure(quick="--quick" in sys.argv), indent=1))

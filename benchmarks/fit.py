"""fit on a ResNet50-size dump, serially and on a Dask LocalCluster (issue 46: within 60 s on 2 cores, the same
verdicts as serial), against one replay of the same model with its dump (what the dump cost to make).

ResNet50 (64x64 input, batch 1, allow_mix_precision on the Ascend910) is replayed once to warm the kernels, then
once more timed with its dump. ``fit`` then runs on that dump, alternately serially (``scheduler="none"``) and on a
LocalCluster of ``workers`` processes (``scheduler="local"``: the cluster's start, the workers' imports and the dump's
shipping included), ``rounds`` times each (A/B alternating: a shared machine's load moves both alike). Each run
records its wall time and CPU seconds: this process's, plus, for the cluster, its worker processes' (reaped when
the cluster closes: ``RUSAGE_CHILDREN``). The JSON of every run must be the first serial run's, byte for byte.
``--quick``: the demo model instead. ``python -m benchmarks.fit [--quick] [--rounds N] [--workers N]`` prints the
measurements as JSON.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import tempfile
import time

import numpy as np

from .common import row


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed_fit(dump, g, dev, scheduler, workers):
    from ascend_emu.tools.fit import fit

    load = os.getloadavg()[0]
    t, c, k = time.perf_counter(), time.process_time(), _children_cpu()
    res = fit(dump, g, device=dev, progress=False, scheduler=scheduler, n_workers=workers)
    wall, cpu, kids = time.perf_counter() - t, time.process_time() - c, _children_cpu() - k
    return res, {"scheduler": scheduler, "wall": wall, "cpu_client": cpu, "cpu_workers": kids, "load_1min": load,
                 "json": json.dumps(res.to_json(), sort_keys=True)}


def measure(quick: bool = False, rounds: int = 1, workers: int = 2) -> dict:
    from ascend_emu.frontend.tf import models
    from ascend_emu.frontend.tf.loader import load_graph
    from ascend_emu.npu.device import Device

    g = load_graph(models.demo_model() if quick else models.resnet50((64, 64, 3)))
    spec = g.inputs[0]
    shape = [1 if d is None else d for d in spec.shape]
    feeds = {spec.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    dev = Device("allow_mix_precision")
    work = tempfile.mkdtemp(prefix="bench-fit-")
    runs = []
    try:
        dev.replay(g, feeds, progress=False, keep_tensors=False)      # kernels compiled
        t = time.perf_counter()
        dev.replay(g, feeds, os.path.join(work, "dump"), progress=False, keep_tensors=False)
        t_replay = time.perf_counter() - t
        for _ in range(rounds):
            for scheduler in ("none", "local"):
                res, r = _timed_fit(os.path.join(work, "dump"), g, dev, scheduler, workers)
                runs.append(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    same = all(r["json"] == runs[0]["json"] for r in runs)
    for r in runs:
        del r["json"]
    best = {s: min(r["wall"] for r in runs if r["scheduler"] == s) for s in ("none", "local")}
    return {"model": g.name, "ops": len(g.nodes), "t_replay_dump": t_replay, "workers": workers,
            "t_fit_serial": best["none"], "t_fit_local": best["local"], "runs": runs, "same_json": same,
            "candidates": res.candidates, "identical": res.identical,
            "verdicts": {k: v["verdict"] for k, v in res.parameters.items()}, "load": os.getloadavg()}


def run(quick: bool = False) -> list:
    m = measure(quick)
    note = f"{m['candidates']} candidate reruns; best reproduces {m['identical']:.1%} of the tensors"
    return [row("fit", f"fit of a {m['model']} dump ({m['ops']} nodes), serial", m["t_fit_serial"],
                m["t_replay_dump"], "one replay with its dump", "s", higher_is_better=False, note=note),
            row("fit", f"fit of a {m['model']} dump, {m['workers']} local workers (cluster start included)",
                m["t_fit_local"], m["t_fit_serial"], "the serial fit", "s", higher_is_better=False,
                note=f"same JSON as serial: {m['same_json']}")]


if __name__ == "__main__":
    import sys

    def _arg(name, default):
        return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default

    print(json.dumps(measure(quick="--quick" in sys.argv, rounds=_arg("--rounds", 1), workers=_arg("--workers", 2)),
                     indent=1))

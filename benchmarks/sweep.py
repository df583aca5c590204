"""Sweep speed-up: 16 independent replays (the candidates of a mixlist-search step: the model with one more op
type black-listed each) serially in this process against a Dask LocalCluster of 2 worker processes, plus what
a 16-worker cluster would give on paper from the measured per-replay time and transfer sizes.

Serial: ``Sweep("none")`` after one warm-up replay (kernels compiled, graph loaded). Local: ``Sweep("local",
n_workers=2)``; "cold" counts the cluster start, the workers' first import of TensorFlow and the model's
shipping, "warm" is a second sweep of the same 16 replays on the running cluster. Each row's ratio is serial
time / sweep time (the speed-up). ``python -m benchmarks.sweep`` prints the rows and the estimate.
"""
from __future__ import annotations

import math
import os
import pickle
import time

import numpy as np

from .common import row

#: network bandwidth assumed for the 16-worker estimate (bytes/s): 1 Gbit/s Ethernet
BANDWIDTH = 125e6
#: the scheduler's cost per task assumed for the estimate (s): Dask documents ~1 ms of overhead per task
TASK_OVERHEAD = 1e-3


def _setup(quick: bool):
    from ascend_emu.frontend.tf import models
    from ascend_emu.frontend.tf.loader import load_graph
    from ascend_emu.frontend.tf.reference import reference
    from ascend_emu.npu.device import Device
    from ascend_emu.npu.precision import PrecisionPolicy
    from ascend_emu.tools.sweep import ReplayTask, SweepContext, flat_outputs

    g = load_graph(models.mobilenet_v2((32, 32, 3)) if not quick else models.transformer_encoder())
    spec = g.inputs[0]
    shape = [1 if d is None else d for d in spec.shape]
    feeds = {spec.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    ref = reference(g, feeds, progress=False)
    ctx = SweepContext(g, g.fingerprint, feeds, flat_outputs(ref.outputs[t] for t in g.outputs))
    base = Device("allow_mix_precision")
    types = sorted({n.op for n in g.nodes if n.op not in ("Const", "Placeholder", "Identity")})
    tasks = []
    for i in range(16):
        d = Device("allow_mix_precision")
        t = types[i % len(types)]
        d.precision = PrecisionPolicy("allow_mix_precision", {"black-list": {"to-add": [t]}} if i else None)
        tasks.append(ReplayTask(f"task{i}-{t}", d))
    return g, ctx, tasks, base


def measure(quick: bool = False) -> dict:
    from ascend_emu.tools.sweep import Sweep, run_task

    g, ctx, tasks, base = _setup(quick)
    run_task(ctx, tasks[0], "warm")       # compile the kernels in this process
    load0 = os.getloadavg()
    with Sweep("none", progress=False) as sw:
        t = time.perf_counter()
        serial = sw.run(ctx, tasks)
        t_serial = time.perf_counter() - t
    t = time.perf_counter()
    with Sweep("local", n_workers=2, progress=False) as sw:
        cold = sw.run(ctx, tasks)
        t_cold = time.perf_counter() - t
        t = time.perf_counter()
        warm = sw.run(ctx, tasks)
        t_warm = time.perf_counter() - t
    load1 = os.getloadavg()
    same = all(a.metrics == b.metrics == c.metrics for a, b, c in zip(serial, cold, warm))
    per_replay = float(np.mean([r.seconds for r in warm]))
    ctx_bytes = len(pickle.dumps(ctx, protocol=5))
    task_bytes = float(np.mean([len(pickle.dumps(t, protocol=5)) for t in tasks]))
    result_bytes = float(np.mean([len(pickle.dumps(r, protocol=5)) for r in warm]))
    # 16 workers on a network: the context goes once to each worker from the client (its uplink is the
    # bottleneck), then each worker replays n/16 tasks at the per-replay time measured in this process (an
    # unloaded worker's), plus the scheduler's per-task overhead and the small specs and results
    def est(n, workers=16):
        return (workers * ctx_bytes / BANDWIDTH + math.ceil(n / workers) * per_serial
                + n * ((task_bytes + result_bytes) / BANDWIDTH + TASK_OVERHEAD))

    per_serial = float(np.mean([r.seconds for r in serial]))
    est16, est160 = est(16), est(160)
    return {"model": g.name, "ops": len(g.nodes), "t_serial": t_serial, "t_cold": t_cold, "t_warm": t_warm,
            "per_replay_worker": per_replay, "per_replay_serial": per_serial,
            "ctx_bytes": ctx_bytes, "task_bytes": task_bytes, "result_bytes": result_bytes, "est16_warm": est16,
            "est16_speedup": 16 * per_serial / est16, "est160_speedup": 160 * per_serial / est160,
            "same_results": same, "load_before": load0, "load_after": load1}


def run(quick: bool = False) -> list:
    m = measure(quick)
    name = f"16 replays of {m['model']}"
    return [
        row("sweep", f"{name}, 2 local workers, warm", m["t_warm"], m["t_serial"], "serial (scheduler none)", "s",
            higher_is_better=False, note=f"same results: {m['same_results']}"),
        row("sweep", f"{name}, 2 local workers, cold start", m["t_cold"], m["t_serial"], "serial (scheduler none)",
            "s", higher_is_better=False),
        row("sweep", f"{name}, 16 workers (paper estimate)", m["est16_warm"], m["t_serial"],
            "serial (scheduler none)", "s", higher_is_better=False,
            note=f"per replay {m['per_replay_worker']:.2f} s, context {m['ctx_bytes'] / 1e6:.1f} MB per worker"),
    ]


if __name__ == "__main__":
    import json
    import sys

    out = measure(quick="--quick" in sys.argv)
    print(json.dumps(out, indent=1))

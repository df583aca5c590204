"""Replay without a dump against TensorFlow's own float32 inference (the model's ConcreteFunction, no
fetches): ResNet50 b8 224x224, MobileNetV2 b8 224x224, a Transformer encoder b8 seq 128 (issue 17).

Each model runs in a fresh process that measures both sides in alternating rounds (a load change on the
shared machine hits both alike). The emulated side is ``Device("allow_mix_precision").replay(graph, x,
keep_tensors=False)`` on one device after one warm-up replay of the same batch (kernel compilation, fusion;
what TensorFlow's first call does for it: tracing, grappler); TensorFlow's is one call of
``tf.function(model).get_concrete_function(spec)`` on a tensor, its result converted to numpy. Each row
reports the median of the rounds (3; the Transformer 9) and their spread (min-max) in its note. A second row per model replays the
Keras model object itself (``dev.replay(model, ...)``), which the device loads once and then takes from its
graph cache (``ascend_emu.frontend.tf.graph_cache``).

Beside each round's wall time the child records, outside the timed window, the process's CPU time, the calling
thread's own CPU time, the time its threads spent runnable but queued for a CPU (the kernel's schedstat), minor
page faults and Python GC collections of the call (the runs' ``cpu``, ``thread``, ``run_delay``, ``minflt``,
``gc``; seconds and counts): CPU / wall near 1 for a replay says its two Numba threads ran one after another (on
one vCPU, or the second one waiting to run), near 2 that they ran side by side; ``run_delay`` how much of a slow
call its threads spent queued behind other threads (RESULTS.md, "Session 17: the Transformer's slow replays").
"""
from __future__ import annotations

import json
import subprocess
import sys

from .common import row

_CHILD = r"""
import gc, json, os, resource, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
which, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import numpy as np
import tensorflow as tf
from ascend_emu.frontend.tf import models
from ascend_emu.frontend.tf.loader import load_graph
from ascend_emu import Device
if which == "transformer":
    model = models.transformer_encoder(seq_len=128, d_model=256, num_heads=4, ff_dim=1024)
    shape = (batch, 128, 256)
else:
    size = int(sys.argv[4])
    model = getattr(models, which)(input_shape=(size, size, 3))
    shape = (batch, size, size, 3)
graph = load_graph(model)
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
feeds = {graph.inputs[0].name: x}
cf = tf.function(lambda t: model(t, training=False)).get_concrete_function(tf.TensorSpec(shape, tf.float32))
xt = tf.constant(x)
dev = Device("allow_mix_precision")
def emu():
    dev.replay(graph, feeds, None, progress=False, keep_tensors=False)
def emu_model():   # the Keras model object itself, as a user passes it: loaded once, then from the cache
    dev.replay(model, feeds, None, progress=False, keep_tensors=False)
def ref():
    out = cf(xt)
    (out[0] if isinstance(out, (list, tuple)) else out).numpy()
emu(); emu_model(); ref(); ref()
collections = [0]
gc.callbacks.append(lambda phase, info: collections.__setitem__(0, collections[0] + (phase == "start")))
def waited():
    # seconds the process's threads spent runnable but not running (/proc/self/task/<tid>/schedstat's second
    # field, ns: on a run queue behind another thread), summed; None without the kernel's schedstat
    total = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (FileNotFoundError, ProcessLookupError):
                pass   # a thread that ended meanwhile
    except OSError:
        return None
    return total * 1e-9
times = {"emu": [], "emu_model": [], "ref": []}
diag = {name: {"cpu": [], "thread": [], "run_delay": [], "minflt": [], "gc": []} for name in times}
for r in range(rounds):
    for name, fn in (("emu", emu), ("emu_model", emu_model), ("ref", ref)):
        time.sleep(0.25)   # let the other side's worker threads go idle
        q = waited()
        g, f, p, th = collections[0], resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), time.thread_time()
        t = time.perf_counter(); fn(); times[name].append(time.perf_counter() - t)
        d = diag[name]   # diagnostics of the call just timed, read outside its window
        d["thread"].append(time.thread_time() - th); d["cpu"].append(time.process_time() - p)
        d["minflt"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f); d["gc"].append(collections[0] - g)
        d["run_delay"].append(None if q is None else waited() - q)
times["diag"] = diag
print(json.dumps(times))
"""

_MODELS = [("resnet50", "ResNet50 b8 224x224", 224), ("mobilenet_v2", "MobileNetV2 b8 224x224", 224),
           ("transformer", "Transformer encoder b8 seq128 (d256, 4 heads, ff1024)", 0)]
#: the Transformer's rounds: its replays are bimodal on a shared VM (both threads on one vCPU or not: RESULTS.md,
#: "Session 17: the Transformer's slow replays"), so a median of 3 was close to a coin toss between the modes;
#: 9 rounds of both sides (three calls a round, each after 0.25 s of sleep) cost ~7 s more
_ROUNDS = {"transformer": 9}


def _median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _cpu_per_wall(cpu, wall) -> str:
    """min-max over the rounds of process CPU time / wall time."""
    r = [c / w for c, w in zip(cpu, wall)]
    return f"{min(r):.2f}-{max(r):.2f}"


def _waits(d) -> str:
    """min-max over the rounds of the time the process's threads waited on a run queue during the call (ms)."""
    w = [x for x in d["run_delay"] if x is not None]
    return f"{min(w) * 1e3:.3g}-{max(w) * 1e3:.3g} ms" if w else "not known (no schedstat)"


def run(quick: bool = False, rounds: int = 3) -> list[dict]:
    batch = 1 if quick else 8
    rows = []
    for which, label, size in _MODELS:
        if quick and which != "transformer":
            size = 64
        n = max(rounds, _ROUNDS.get(which, 0))
        args = [sys.executable, "-c", _CHILD, which, str(batch), str(n)] + ([str(size)] if size else [])
        out = subprocess.run(args, capture_output=True, text=True, check=True)
        t = json.loads(out.stdout.strip().splitlines()[-1])
        ours, base = _median(t["emu"]), _median(t["ref"])
        spread = (f"emulated {min(t['emu']):.3g}-{max(t['emu']):.3g} s, TF {min(t['ref']):.3g}-{max(t['ref']):.3g} s "
                  f"over {n} alternating rounds")
        diag = t["diag"]
        r = row("replay", f"{label if not quick else which}, no dump: time", ours, base,
                "TF float32 ConcreteFunction", "s", target=1 / 1.5, higher_is_better=False,
                note=f"medians; {spread}; issue 34's target: emulated <= 1.5x TF; process CPU / wall "
                     f"{_cpu_per_wall(diag['emu']['cpu'], t['emu'])} emulated, "
                     f"{_cpu_per_wall(diag['ref']['cpu'], t['ref'])} TF; run-queue wait {_waits(diag['emu'])} "
                     f"emulated, {_waits(diag['ref'])} TF")
        r["runs"] = {"ours": t["emu"], "baseline": t["ref"], "ours_diag": diag["emu"], "baseline_diag": diag["ref"]}
        rows.append(r)
        again = _median(t["emu_model"])
        r = row("replay", f"{label if not quick else which}, Device.replay(model) again, no dump: time", again, base,
                "TF float32 ConcreteFunction", "s", target=1 / 1.8, higher_is_better=False,
                note=f"medians; the Keras model object replayed again (its graph from the cache, issue 34's target "
                     f"<= 1.8x TF); emulated {min(t['emu_model']):.3g}-{max(t['emu_model']):.3g} s")
        r["runs"] = {"ours": t["emu_model"], "baseline": t["ref"], "ours_diag": diag["emu_model"],
                     "baseline_diag": diag["ref"]}
        rows.append(r)
    return rows

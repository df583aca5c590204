"""Replay throughput: emulated allow_mix_precision replay of ResNet50 with a full dump vs the
TensorFlow float32 reference run that fetches every intermediate, each in its own process
(so peak RSS is each run's own), same model, same inputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from .common import row

_CHILD = r"""
import json, os, resource, sys, time, shutil
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
which, batch, size, dump = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import numpy as np
from ascend_emu.frontend.tf.models import resnet50
from ascend_emu.frontend.tf.loader import load_graph
from ascend_emu import Device, reference
model = resnet50(input_shape=(size, size, 3))
graph = load_graph(model)
name = graph.inputs[0].name
x = {name: np.random.default_rng(0).standard_normal((batch, size, size, 3)).astype(np.float32)}
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
# "emu_nondet": deterministic off (NUMERICS.md section 11), the multi-core ops' partial sums in a drawn order
opts = {"deterministic": False} if which == "emu_nondet" else {}
if which.startswith("emu"):
    # compile the kernels outside the timed region (Numba caches them on disk anyway)
    Device("allow_mix_precision", **opts).replay(graph, {name: x[name][:1]}, None, progress=False, keep_tensors=False)
t = time.perf_counter()
if which.startswith("emu"):
    Device("allow_mix_precision", **opts).replay(graph, x, dump, overwrite=True, progress=False, keep_tensors=False)
else:
    reference(graph, x, dump, overwrite=True, progress=False)
dt = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": dt, "peak_rss_mb": rss / 1024, "rss_before_mb": rss0 / 1024}))
"""


def _run(which, batch, size, dump):
    out = subprocess.run([sys.executable, "-c", _CHILD, which, str(batch), str(size), dump],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict]:
    batch, size = (1, 64) if quick else (8, 224)
    with tempfile.TemporaryDirectory() as tmp:
        ref = _run("ref", batch, size, os.path.join(tmp, "bench"))
        emu = _run("emu", batch, size, os.path.join(tmp, "npu"))
        nondet = _run("emu_nondet", batch, size, os.path.join(tmp, "npu-nondet"))
    label = f"ResNet50 b{batch} {size}x{size}, full dump"
    return [
        row("replay", f"{label}: time", emu["seconds"], ref["seconds"], "TF fp32 reference, every tensor", "s",
            target=1 / 3, higher_is_better=False,
            note="ratio = reference time / emulated time; target: emulated <= 3x reference"),
        row("replay", f"{label}: peak RSS", emu["peak_rss_mb"], ref["peak_rss_mb"], "TF fp32 reference", "MB",
            target=0.5, higher_is_better=False, note="target: emulated peak memory <= 2x reference"),
        row("replay", f"{label}: deterministic off", nondet["seconds"], emu["seconds"],
            "the same replay, deterministic on (the default)", "s", higher_is_better=False,
            note="ratio = deterministic time / non-deterministic time (NUMERICS.md section 11)"),
    ]

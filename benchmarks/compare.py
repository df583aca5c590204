"""Dump comparison throughput and memory: ``ascend_emu.compare`` (every metric, streamed in
chunks) vs plain numpy that loads both ``.npy`` files of each pair fully and computes the
cosine only. Two synthetic dumps of ResNet50-like size (about 100 tensors; fp16 NPU side,
fp32 bench side), each measurement in its own process so peak RSS is its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from .common import row

_CHILD = r"""
import json, os, sys, time
import numpy as np
which, npu, bench, repeat = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
from ascend_emu.analysis.compare import compare

def baseline():
    # plain numpy: load both files of every pair fully, cosine in float64
    with open(os.path.join(npu, "manifest.json")) as f:
        ops = json.load(f)["ops"]
    out = []
    for op in ops:
        for o in op["outputs"]:
            a = np.load(os.path.join(npu, o["file"])).astype(np.float64).ravel()
            b = np.load(os.path.join(bench, o["file"])).astype(np.float64).ravel()
            out.append(float(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b)))
    return out

def ours():
    return compare(npu, bench).rows

def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])

fn = baseline if which == "baseline" else ours
rss0 = status_kb("VmRSS")  # resident now, after imports
best = float("inf")
for _ in range(repeat):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
peak = max(status_kb("VmHWM"), rss0)  # high-water mark of resident memory
print(json.dumps({"seconds": best, "rss_increase_mb": (peak - rss0) / 1024}))
"""


def _shapes(total_elements: int, n: int, seed: int = 0) -> list[int]:
    """``n`` tensor sizes, log-uniform between 2^14 and 2^23 elements (ResNet50 batch-8 activations
    span that range), scaled to ``total_elements``."""
    rng = np.random.default_rng(seed)
    raw = 2.0 ** rng.uniform(14, 23, n)
    sizes = np.maximum(1024, (raw * total_elements / raw.sum()).astype(np.int64))
    return [int(s) for s in sizes]


def build(tmp: str, total_elements: int, n: int) -> tuple[str, str, int, int]:
    """Write the NPU (fp16) and bench (fp32) dumps; returns their paths, the tensor bytes and
    the largest pair's bytes."""
    from ascend_emu.analysis.dump import DumpWriter

    rng = np.random.default_rng(1)
    npu_dir, bench_dir = os.path.join(tmp, "npu"), os.path.join(tmp, "bench")
    model = {"name": "resnet50-like", "fingerprint": "synthetic"}
    total = largest = 0
    with DumpWriter(npu_dir, kind="npu", config={"precision_mode": "allow_mix_precision"}, model=model,
                    inputs_sha256="0") as wn, \
            DumpWriter(bench_dir, kind="bench", config={}, model=model, inputs_sha256="0") as wb:
        prev = None
        for i, size in enumerate(_shapes(total_elements, n)):
            b = rng.standard_normal(size, dtype=np.float32)
            nb = b.astype(np.float16)
            name = f"block{i // 3}/conv{i % 3}/Conv2D"
            ins = [prev] if prev else []
            wb.add_op(name, "Conv2D", "Conv2D", "CPU", "float32", ins, [b])
            wn.add_op(name, "Conv2D", "Conv2D", "AICORE", "float16", ins, [nb])
            prev = name
            total += b.nbytes + nb.nbytes
            largest = max(largest, b.nbytes + nb.nbytes)
    return npu_dir, bench_dir, total, largest


def _run(which, npu, bench, repeat):
    out = subprocess.run([sys.executable, "-c", _CHILD, which, npu, bench, str(repeat)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict]:
    total_elements, n, repeat = (6_000_000, 40, 2) if quick else (80_000_000, 100, 3)
    with tempfile.TemporaryDirectory() as tmp:
        npu, bench, nbytes, largest = build(tmp, total_elements, n)
        base = _run("baseline", npu, bench, repeat)
        ours = _run("ours", npu, bench, repeat)
    mb = nbytes / 2**20
    label = f"{n} tensor pairs, {mb:.0f} MB (fp16 vs fp32)"
    return [
        row("compare", f"{label}: throughput", mb / ours["seconds"], mb / base["seconds"],
            "np.load both + cosine only", "MB/s",
            note="ours computes all 8 metrics + stats in float64, streamed; baseline loads whole files"),
        row("compare", f"{label}: peak RSS increase", max(ours["rss_increase_mb"], 0.1),
            max(base["rss_increase_mb"], 0.1), "np.load both + cosine only", "MB", higher_is_better=False,
            note=f"largest pair {largest / 2**20:.0f} MB on disk ({largest / 2**20 * 8 / 3:.0f} MB as float64)"),
    ]


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    for r in run(quick=quick):
        print(r)

"""Peak memory of the TensorFlow reference on ResNet50 (224x224): full dump against --stats-only.

``python -m benchmarks.reference_memory [--batch 8 32]``: saves a seeded ResNet50 once, runs
``ascend-emu reference`` in a fresh process per configuration and reports each process's peak
resident set size (``ru_maxrss``). Not part of ``make bench`` (each run takes about a minute).
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

_CHILD = """
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(r.stderr[-2000:])
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_rss(argv, cwd) -> tuple[int, float]:
    """(peak RSS in bytes, seconds) of one command, measured in its own wrapper process."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, cwd=cwd)
    code, kib = out.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {out.stderr[-500:]}")
    return int(kib) * 1024, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    a = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="ascend-emu-refmem-")
    try:
        model = os.path.join(work, "resnet50.keras")
        from ascend_emu.frontend.tf.models import resnet50
        resnet50((224, 224, 3)).save(model)
        print(f"{'batch':>5}  {'mode':<11} {'peak RSS':>10} {'time':>7}")
        for batch in a.batch:
            for mode, extra in (("full dump", []), ("stats-only", ["--stats-only"])):
                dump = os.path.join(work, "dump")
                shutil.rmtree(dump, ignore_errors=True)
                rss, secs = peak_rss([sys.executable, "-m", "ascend_emu.cli", "-q", "reference", model,
                                      "--shape", f"image={batch},224,224,3", "--dump", dump, *extra], cwd=work)
                print(f"{batch:>5}  {mode:<11} {rss / 2**30:>8.2f} GiB {secs:>6.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Compile the kernels a first run needs into Numba's on-disk cache, in parallel processes (``ascend-emu warmup``).

Every kernel is ``@njit(cache=True)``: compiled on its first call with a new type signature, then loaded from
the cache (next to the kernel's source, or ``NUMBA_CACHE_DIR``). On a fresh install the first replay pays the
compilation: most of a first ``ascend-emu demo``'s time (benchmarks/RESULTS.md). Compilation is single-threaded,
so this runs the demo's two workloads, an inference replay with its dump and comparison and a short training
run with its dump, in separate processes at once: on two cores the kernels are compiled in about the time of
the larger part. ``make demo`` and ``make test`` run it once after installing the package.

The parts compute on the bundled demo models with their seeded weights in a temporary directory that is removed
afterwards; they write nothing else. A part that fails is reported with its last line of output.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from ..errors import AscendEmuError

PARTS = ("replay", "train")


def _part_replay(tmp: str) -> None:
    from .demo import run_demo

    with open(os.devnull, "w") as devnull:
        run_demo(os.path.join(tmp, "demo"), progress=False, stream=devnull, train=False)


def _part_train(tmp: str) -> None:
    from ..frontend.models import train_demo_data, train_demo_model
    from ..npu.device import Device

    Device("allow_mix_precision", soc="Ascend910").train(
        train_demo_model(), train_demo_data(), batch_size=32, steps=2, loss_scale="dynamic",
        dump_dir=os.path.join(tmp, "train"), dump_steps=[0], overwrite=True, progress=False)


def run_part(name: str) -> None:
    """One part, in this process."""
    fn = {"replay": _part_replay, "train": _part_train}.get(name)
    if fn is None:
        raise AscendEmuError(f"unknown warm-up part {name!r}; choose one of: {', '.join(PARTS)}")
    with tempfile.TemporaryDirectory(prefix="ascend-emu-warmup-") as tmp:
        fn(tmp)


def warmup(jobs: int | None = None, stream=None) -> dict:
    """Run every part, ``jobs`` at a time (default: the cores, at most the number of parts), each in its own
    process; returns ``{part: seconds}`` and the total as ``"total"``."""
    stream = stream or sys.stdout
    jobs = max(1, min(len(PARTS), jobs or os.cpu_count() or 1))
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    t0 = time.perf_counter()
    pending = list(PARTS)
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    took: dict[str, float] = {}
    print(f"compiling the kernels into Numba's cache ({len(PARTS)} parts, {jobs} at a time; once per install)",
          file=stream, flush=True)
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            proc = subprocess.Popen([sys.executable, "-m", "ascend_emu.tools.warmup", name], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            running[name] = (proc, time.perf_counter())
        for name, (proc, start) in list(running.items()):
            if proc.poll() is None:
                continue
            err = proc.stderr.read() if proc.stderr else ""
            proc.stderr and proc.stderr.close()
            del running[name]
            if proc.returncode != 0:
                for other, _ in running.values():
                    other.kill()
                lines = [ln for ln in err.strip().splitlines() if ln.strip()]
                raise AscendEmuError(f"warm-up part {name!r} failed (exit {proc.returncode}): "
                                     f"{lines[-1] if lines else 'no output'}; run `python -m "
                                     f"ascend_emu.tools.warmup {name}` to see it whole")
            took[name] = time.perf_counter() - start
            print(f"  {name}: {took[name]:.1f} s", file=stream, flush=True)
        time.sleep(0.05)
    took["total"] = time.perf_counter() - t0
    print(f"kernels compiled and cached in {took['total']:.1f} s", file=stream, flush=True)
    return took


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python -m ascend_emu.tools.warmup {{{','.join(PARTS)}}}")
    run_part(sys.argv[1])

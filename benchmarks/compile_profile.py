"""What a first run compiles: ``ascend-emu demo`` in this process with an empty Numba cache, every compilation
timed through Numba's compile events.

    python -m benchmarks.compile_profile [--top 30]

Not part of ``make bench``. Times are inclusive: a kernel's compilation holds those of the functions it calls
that were not compiled yet. The cache directory is a fresh temporary one (``NUMBA_CACHE_DIR``), removed after.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compile_profile", description=__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ae-compile-") as tmp:
        os.environ["NUMBA_CACHE_DIR"] = os.path.join(tmp, "cache")   # read by numba when it is first imported
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if "numba" in sys.modules:
            raise SystemExit("run this in a fresh process: numba is already imported")
        from numba.core import event

        total, count = collections.Counter(), collections.Counter()
        starts = {}

        class Timer(event.Listener):
            def on_start(self, ev):
                starts[id(ev.data["dispatcher"]), str(ev.data["args"])] = time.perf_counter()

            def on_end(self, ev):
                d = ev.data["dispatcher"]
                t0 = starts.pop((id(d), str(ev.data["args"])), None)
                name = f"{d.py_func.__module__}.{d.py_func.__qualname__}"
                total[name] += 0.0 if t0 is None else time.perf_counter() - t0
                count[name] += 1

        event.register("numba:compile", Timer())
        from ascend_emu.tools.demo import run_demo

        t0 = time.perf_counter()
        with open(os.devnull, "w") as devnull:
            run_demo(os.path.join(tmp, "demo"), progress=False, stream=devnull)
        wall = time.perf_counter() - t0
    print(f"demo with an empty Numba cache: {wall:.1f} s wall, {len(total)} kernels compiled "
          f"({sum(count.values())} signatures)")
    print(f"{'compile s':>10} {'sigs':>5}  kernel (inclusive of what it compiles inside)")
    for name, t in total.most_common(args.top):
        print(f"{t:10.2f} {count[name]:5d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m benchmarks [--quick] [--only NAME] [--json FILE]: print a table of measured ratios."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys

from . import MODULES


def machine() -> dict:
    info = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import numpy, numba
    info["numpy"] = numpy.__version__
    info["numba"] = numba.__version__
    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:
        pass
    info["OPENBLAS_CORETYPE"] = os.environ.get("OPENBLAS_CORETYPE", "(unset)")
    return info


def format_table(rows) -> str:
    head = f"{'group':<12} {'benchmark':<44} {'ours':>12} {'baseline':>12} {'unit':<10} {'ratio':>8} {'target':>7}  vs"
    lines = [head, "-" * len(head)]
    for r in rows:
        tgt = "" if r["target"] is None else f"{r['target']:.2f}x"
        flag = "" if r["ok"] is None else ("  ok" if r["ok"] else "  BELOW")
        lines.append(f"{r['group']:<12} {r['name']:<44} {r['ours']:>12.4g} {r['baseline']:>12.4g} {r['unit']:<10} "
                     f"{r['ratio']:>7.2f}x {tgt:>7}  {r['baseline_name']}{flag}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    p.add_argument("--only", action="append", default=[], help="run only modules whose name contains this")
    p.add_argument("--json", default="benchmarks/results.json", help="where to write the JSON results")
    args = p.parse_args(argv)
    rows = []
    for mod in MODULES:
        if args.only and not any(o in mod for o in args.only):
            continue
        print(f"# {mod} ...", file=sys.stderr, flush=True)
        rows.extend(importlib.import_module(mod).run(quick=args.quick))
    print(format_table(rows))
    with open(args.json, "w") as f:
        json.dump({"machine": machine(), "rows": rows}, f, indent=1)
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

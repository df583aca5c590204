"""The real ``msprobe compare`` (mindstudio-probe, installed by ``make test``), for the tests that run it."""
import csv
import importlib.util
import os
import subprocess
import sys

import pytest


def msprobe_missing():
    """Why the real msprobe cannot run here (None if it can). ``make test`` sets ASCEND_EMU_REQUIRE_MSPROBE: there
    a missing msprobe fails the run instead of skipping its tests."""
    missing = [m for m in ("msprobe", "torch", "pandas") if importlib.util.find_spec(m) is None]
    if missing and os.environ.get("ASCEND_EMU_REQUIRE_MSPROBE"):
        pytest.fail(f"ASCEND_EMU_REQUIRE_MSPROBE is set but {', '.join(missing)} is not installed", pytrace=False)
    return (f"needs {' and '.join(missing)} (pip install mindstudio-probe torch) to run the real msprobe compare"
            if missing else None)


def run_msprobe_compare(npu_step, bench_step, out) -> dict:
    """``msprobe compare -tp NPU_STEP -gp BENCH_STEP -o OUT`` in a subprocess; ``{csv file name: rows}``."""
    res = subprocess.run([sys.executable, "-c", "import sys; from msprobe.msprobe import main; sys.exit(main())",
                          "compare", "-tp", str(npu_step), "-gp", str(bench_step), "-o", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = os.fspath(out)
    results = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".csv"):
            with open(os.path.join(out, f), newline="") as fh:
                results[f] = list(csv.DictReader(fh))
    return results

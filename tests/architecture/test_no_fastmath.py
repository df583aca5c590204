"""No kernel may use Numba's fast-math flag: it reorders and contracts the very
roundings this project emulates. The pattern is assembled at run time so this file
does not match itself."""
from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATTERN = "fast" + "math"


def test_no_fastmath_anywhere():
    files = sorted([*(ROOT / "kernels").rglob("*.py"), *(ROOT / "ascend_emu").rglob("*.py")])
    assert any(f.name == "cast.py" for f in files)  # the search really covers the kernels
    hits = [f"{f.relative_to(ROOT)}:{n}" for f in files
            for n, line in enumerate(f.read_text().splitlines(), 1) if PATTERN in line.lower()]
    assert not hits, f"{PATTERN} found in: {', '.join(hits)}"

"""The README's op coverage table is the one generated from the registry (ascend_emu/ops/coverage.py), and the
generator reads the registry, the op-type map and the built-in lists as the device does."""
import pathlib

from ascend_emu.ops import OPS
from ascend_emu.ops.coverage import AICPU_MET, coverage_rows, coverage_table, readme_table

README = pathlib.Path(__file__).parents[2] / "README.md"


def test_readme_table_is_the_generated_one():
    table = readme_table(README.read_text(encoding="utf-8"))
    assert table is not None, "README.md lost its op-coverage markers"
    assert table == coverage_table(), "stale: run python -m ascend_emu.ops.coverage README.md"


def test_rows_follow_the_registry_and_the_device_lists():
    from ascend_emu.npu.precision import MixLists
    from ascend_emu.ops.ascend_types import ascend_type

    rows = {r[0]: r for r in coverage_rows()}
    assert {t for t in OPS if not t.startswith("_")} <= set(rows)
    lists = MixLists.default()
    for t, d in OPS.items():
        if t.startswith("_"):
            continue
        _, a, engine, lst = rows[t]
        assert a == ascend_type(t)
        assert engine.startswith("host") == (d.kind == "host")
        if d.kind != "host":
            assert lst == lists.classify(a), t      # the precision policy's own classification
    assert rows["Conv3D"][2:] == ("AI Core (cube)", "white")
    for t in AICPU_MET:
        assert t not in OPS and rows[t][2].startswith("AI CPU")

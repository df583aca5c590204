"""The source table (issue 42, part 4): every op type the AI Core runs states where its numerics come from where
it is registered (``@register(..., source=Source(...))``), NUMERICS.md holds exactly the generated table, and an
op type without a source or a registered assumption fails here."""
import pytest

from ascend_emu.ops import OPS
from ascend_emu.ops import sources
from ascend_emu.ops.registry import MOVE, VECTOR, Source, register


def test_numerics_md_holds_the_generated_table():
    with open(sources.NUMERICS_MD, encoding="utf-8") as f:
        assert sources.table_in(f.read()) == sources.block()


def test_every_aicore_op_type_has_a_source_or_a_registered_assumption():
    missing = sources.missing()
    assert not missing, f"AI Core op types without a source: {missing}; state it with @register(..., source=Source(...))"
    assert sources.unknown_parameters() == [], "a source names a parameter numerics/assumptions.py does not register"
    for t in sources.aicore_types():
        src = OPS[t].source
        assert src is None or isinstance(src, Source), t
        if src is not None:
            assert src.files or src.assumed or src.exact, t


def test_the_table_rows():
    rows = {line.split(" | ")[0][2:]: line for line in sources.markdown_table().splitlines()[2:]}
    assert set(rows) == set(sources.aicore_types()) and "Const" not in rows          # host ops are not AI Core
    assert "`hf32_matmul_rounding`" in rows["MatMul"] and "`hf32_conv_rounding`" in rows["Conv2D"]
    assert "`cube_conv_k_order`" in rows["Conv2D"] and "`cube_conv_k_order`" not in rows["Conv2DBackpropInput"]
    assert "copies bits" in rows["Reshape"] and "CAST_RINT" in rows["Cast"]
    assert "add.py (add_compute" in rows["Add"] and "tanh_dag.h" in rows["Tanh"]
    assert "exact: " in rows["Maximum"] and "exact: " in rows["Equal"] and "exact: " not in rows["Add"]
    assert not [t for t, r in rows.items() if "**not yet stated**" in r]


def test_an_op_registered_without_a_source_is_missing():
    register("_NoSourceYet", kind=VECTOR)(lambda x, *, ctx: x)
    try:
        assert sources.missing() == ["_NoSourceYet"]
        assert "**not yet stated**" in sources.markdown_table()
    finally:
        del OPS["_NoSourceYet"]
    assert sources.missing() == []


def test_register_takes_only_a_source():
    with pytest.raises(TypeError, match="source must be"):
        register("_NotAnOp", kind=MOVE, source="ops-math")(lambda x, *, ctx: x)
    assert "_NotAnOp" not in OPS
    assert Source("a/b.h", "impl_mode").files == ("a/b.h",) and Source("a/b.h", "impl_mode").assumed == ("impl_mode",)

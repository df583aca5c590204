"""Precision modes and mix lists: the decision table of NUMERICS.md section 5."""
import json

import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.npu.precision import PRECISION_MODES, MixLists, PrecisionPolicy, ascend_type

F16, BF16, F32 = "float16", "bfloat16", "float32"


@pytest.mark.parametrize("mode, kind, expect", [
    ("must_keep_origin_dtype", "cube", (F32, F32)),
    ("must_keep_origin_dtype", "vector", (F32, None)),
    ("force_fp16", "cube", (F16, F16)),
    ("force_fp16", "vector", (F16, None)),
    ("force_fp32", "cube", (F16, F32)),
    ("cube_fp16in_fp32out", "cube", (F16, F32)),
    ("force_fp32", "vector", (F32, None)),
    ("allow_fp32_to_fp16", "cube", (F16, F16)),
    ("allow_fp32_to_fp16", "vector", (F32, None)),
    ("allow_fp32_to_bf16", "cube", (BF16, BF16)),
    ("allow_fp32_to_bf16", "vector", (F32, None)),
])
def test_mode_table(mode, kind, expect):
    d = PrecisionPolicy(mode).decide(kind, "MatMulV2" if kind == "cube" else "Relu", F32, [F16])
    assert (d.dtype, d.cube_out) == expect


@pytest.mark.parametrize("mode, red", [("allow_mix_precision", F16), ("allow_mix_precision_fp16", F16),
                                       ("allow_mix_precision_bf16", BF16)])
def test_mixed_lists(mode, red):
    p = PrecisionPolicy(mode)
    assert p.decide("cube", "MatMulV2", F32, []).dtype == red            # white
    assert p.decide("cube", "MatMulV2", F32, []).list == "white"
    assert p.decide("vector", "ReduceSumD", F32, [red]).dtype == F32     # black, even after a reduced producer
    assert p.decide("vector", "Log", F32, [red]).list == "black"
    assert p.decide("vector", "Relu", F32, [red]).dtype == red           # gray follows its producer
    assert p.decide("vector", "Relu", F32, [F32]).dtype == F32
    assert p.decide("vector", "Add", F32, [F32, red]).dtype == red       # any reduced producer
    assert p.decide("vector", "Relu", F32, []).dtype == F32              # no producer: allow_fp32_to rule
    assert p.decide("cube", "SomethingCube", F32, []).dtype == red


def test_modify_mixlist_moves_ops(tmp_path):
    f = tmp_path / "ops_info.json"
    f.write_text(json.dumps({"black-list": {"to-add": ["MatMul"]}, "white-list": {"to-add": ["SoftmaxV2"],
                                                                                   "to-remove": ["Conv2D"]}}))
    p = PrecisionPolicy("allow_mix_precision", str(f))
    assert p.decide("cube", ascend_type("MatMul"), F32, []).list == "black"   # TF name mapped to MatMulV2
    assert p.decide("vector", "SoftmaxV2", F32, []).dtype == F16
    assert p.lists.classify("Conv2D") == "gray"
    assert "modified by" in p.lists.source


def test_unknown_names_warn_with_closest():
    with pytest.warns(UserWarning, match="closest: .*MatMulV2"):
        MixLists.default().modify({"black-list": {"to-add": ["MatMulV9"]}})


@pytest.mark.parametrize("spec, msg", [
    ({"blacklist": {}}, "unknown key 'blacklist'"),
    ({"black-list": {"add": ["X"]}}, "must be an object with 'to-add'"),
    ({"black-list": {"to-add": "MatMul"}}, "must be a list of op type names"),
    (["x"], "expected a JSON object"),
])
def test_bad_mixlist(spec, msg):
    with pytest.raises(AscendEmuError, match=msg):
        MixLists.default().modify(spec)


def test_bad_mixlist_files(tmp_path):
    with pytest.raises(AscendEmuError, match="not found"):
        PrecisionPolicy("allow_mix_precision", str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(AscendEmuError, match="not valid JSON"):
        PrecisionPolicy("allow_mix_precision", str(bad))


def test_unknown_mode_suggests():
    with pytest.raises(AscendEmuError, match="did you mean allow_mix_precision"):
        PrecisionPolicy("allow_mixed_precision")
    assert len(PRECISION_MODES) == 9


def test_default_lists_name_their_source():
    lists = MixLists.default()
    assert "hicann/ge" in lists.source
    assert not (lists.white & lists.black)
    assert {"MatMulV2", "Conv2D", "BatchMatMulV2"} <= lists.white
    assert {"ReduceSumD", "ReduceMeanD", "Log", "Pow", "LogSoftmaxV2"} <= lists.black

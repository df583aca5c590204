"""msprobe interchange: export to msprobe's dump layout, import msprobe dumps, msprobe's Result rules.

The layout is msprobe 26.2's (NUMERICS.md section 7, "msprobe dumps"); the fixture dumps below are
written from that description, not by msprobe. The last test runs the real ``msprobe compare`` when
mindstudio-probe and PyTorch are installed (`make test` installs them and sets ASCEND_EMU_REQUIRE_MSPROBE, so there it
fails rather than skips when they are missing), and is skipped (with the reason) otherwise.
"""
import csv
import importlib.util
import json
import math
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from ascend_emu.analysis.compare import ERROR, NAN, PASS, compare
from ascend_emu.analysis.dump import DumpWriter, load_dump
from ascend_emu.analysis.msprobe import (NAME_PATTERN, SIDECAR, WARNING, export_msprobe, import_msprobe,
                                         msprobe_names, read_mapping)
from ascend_emu.cli import main
from ascend_emu.errors import AscendEmuError

KEY = "Functional.{}.0.forward"


def write(path, kind, ops, *, fused=(), summary=None, model="m", **kw):
    """ops: list of (name, tf_type, inputs, [arrays], extra add_op kwargs)."""
    with DumpWriter(path, kind=kind, config={"kind": kind, "precision_mode": "force_fp16"},
                    model={"name": model, "fingerprint": model}, inputs_sha256="abc", **kw) as w:
        for name, tf_type, inputs, outs, *extra in ops:
            w.add_op(name, tf_type, tf_type.upper(), "AICORE", str(outs[0].dtype) if outs else None, inputs, outs,
                     **(extra[0] if extra else {}))
        for f in fused:
            w.add_fused(*f)
        w.finish(summary or {})
    return path


def rich_ops(seed=0):
    """Every kind of output the writer records: fp16/fp32/bf16/int/bool, 0-d, empty, inf and nan,
    two outputs, status bits, names msprobe does not allow and names that collide once mapped."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 8)).astype(np.float16)
    special = rng.standard_normal((3, 5)).astype(np.float16)
    special[0, 0], special[1, 2], special[2, 4] = np.inf, -np.inf, np.nan
    only_inf = np.array([1.0, np.inf, -2.0], np.float32)
    return [
        ("model/dense/MatMul", "MatMul", [], [x], {"status": 0x10, "attrs": {"transpose_a": False},
                                                 "precision": {"list": "white", "dtype": "float16",
                                                               "cube_out": "float16", "reason": "white list"}}),
        ("model/dense/BiasAdd", "BiasAdd", ["model/dense/MatMul:0"], [(x.astype(np.float32) + 1)],
         {"fusion": {"rule": "MatMulBiasAddFusionPass", "replaces": ["model/dense/BiasAdd"]}}),
        ("model/act/Relu [weird]:name", "Relu", ["model/dense/BiasAdd:0"], [special],
         {"fp32_check": {"overflow": False, "max_abs": 3.5}}),
        ("model/a.b", "Identity", ["model/act/Relu [weird]:name:0"], [only_inf]),
        ("model/a/b", "Identity", [], [rng.standard_normal(6).astype(ml_dtypes.bfloat16)]),
        ("model/split", "Split", ["model/dense/MatMul:0"], [x[:2], x[2:]], {"status": [0, 0x4]}),
        ("model/shape", "Shape", [], [np.array([4, 8], np.int32)]),
        ("model/mask", "Greater", [], [np.array([True, False, True])]),
        ("model/scalar", "Sum", [], [np.array(-2.5, np.float32)]),
        ("model/empty", "Slice", [], [np.zeros((0, 3), np.float16)]),
    ]


def manifest_without_provenance(d):
    m = json.loads(json.dumps(d.manifest, default=str))
    m.pop("tool_version", None)
    return m


def assert_same_dump(a, b):
    a, b = load_dump(a), load_dump(b)
    assert manifest_without_provenance(a) == manifest_without_provenance(b)
    for op in a.ops:
        for o in op["outputs"]:
            if o["file"] is None:
                continue
            x, y = np.asarray(a.tensor(op["name"], o["index"])), np.asarray(b.tensor(op["name"], o["index"]))
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes()


# --------------------------------------------------------------------------- names

def test_names_match_msprobe_pattern_and_are_unique():
    names = ["model/dense/MatMul", "a b", "a/b", "a.b", "A.B", "x:0", "ü/名", "/lead/", "..", "z" * 400]
    m = msprobe_names(names)
    assert list(m) == names
    assert len({v.lower() for v in m.values()}) == len(names)
    for v in m.values():
        assert NAME_PATTERN.match(KEY.format(v)) and "/" not in v and len(v) <= 160
    assert m["model/dense/MatMul"] == "model.dense.MatMul"
    assert m["a/b"] == "a.b" and m["a.b"] == "a.b_2" and m["A.B"] == "A.B_3"


# --------------------------------------------------------------------------- export layout

def test_export_layout(tmp_path):
    src = write(tmp_path / "d", "npu", rich_ops(), fused=[("model/dense/Add", "AddV2", "R", "model/dense/BiasAdd")],
                summary={"outputs": ["model/split:1"]})
    root = export_msprobe(src, tmp_path / "ms", step=3, rank=1)
    assert root == os.path.join(str(tmp_path / "ms"), "step3", "rank1")
    for f in ("dump.json", "stack.json", "construct.json", SIDECAR):
        assert os.path.isfile(os.path.join(root, f))
    dj = json.load(open(os.path.join(root, "dump.json")))
    assert dj["task"] == "tensor" and dj["level"] == "L1" and dj["framework"] == "pytorch"
    assert os.path.samefile(dj["dump_data_dir"], os.path.join(root, "dump_tensor_data"))
    names = msprobe_names(op[0] for op in rich_ops())
    assert list(dj["data"]) == [KEY.format(names[op[0]]) for op in rich_ops()]
    for key, ent in dj["data"].items():
        assert NAME_PATTERN.match(key) and set(ent) == {"input_args", "input_kwargs", "output"}
        for role, leaves in (("output", ent["output"]), ("input", ent["input_args"])):
            for i, leaf in enumerate(leaves):
                assert set(leaf) == {"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad",
                                     "data_name"}
                assert leaf["type"] == "torch.Tensor" and leaf["dtype"].startswith("torch.")
                assert leaf["data_name"] == f"{key}.{role}.{i}.npy"
                arr = np.load(os.path.join(root, "dump_tensor_data", leaf["data_name"]))
                assert list(arr.shape) == leaf["shape"]
    mm = dj["data"][KEY.format("model.dense.MatMul")]["output"][0]
    x = rich_ops()[0][3][0]
    assert mm["dtype"] == "torch.float16" and mm["shape"] == [4, 8]
    assert mm["Max"] == float(x.max()) and mm["Min"] == float(x.min())
    assert mm["Norm"] == pytest.approx(float(np.linalg.norm(x.astype(np.float64))), rel=1e-15)
    # the BiasAdd reads the MatMul's output: same values, file linked to the producer's
    ba = dj["data"][KEY.format("model.dense.BiasAdd")]
    assert ba["input_args"][0]["Max"] == mm["Max"]
    assert os.path.samefile(os.path.join(root, "dump_tensor_data", ba["input_args"][0]["data_name"]),
                            os.path.join(root, "dump_tensor_data", mm["data_name"]))
    assert dj["data"][KEY.format("model.dense.MatMul")]["input_args"] == []   # its input is not in the dump
    # msprobe's statistics include inf and nan: a nan makes all four nan; infs show with their sign
    sp = dj["data"][KEY.format(names["model/act/Relu [weird]:name"])]["output"][0]
    assert all(math.isnan(sp[k]) for k in ("Max", "Min", "Mean", "Norm"))
    oi = dj["data"][KEY.format("model.a.b")]["output"][0]
    assert (oi["Max"], oi["Min"], oi["Mean"], oi["Norm"]) == (math.inf, -2.0, math.inf, math.inf)
    assert dj["data"][KEY.format("model.a.b_2")]["output"][0]["dtype"] == "torch.bfloat16"
    mask = dj["data"][KEY.format("model.mask")]["output"][0]
    assert (mask["Max"], mask["Min"], mask["Mean"], mask["Norm"]) == (True, False, None, None)
    sc = dj["data"][KEY.format("model.scalar")]["output"][0]
    assert sc["shape"] == [] and sc["Max"] == sc["Min"] == sc["Mean"] == sc["Norm"] == -2.5
    em = dj["data"][KEY.format("model.empty")]["output"][0]
    assert em["Max"] is None and em["Norm"] is None
    assert "NaN" in open(os.path.join(root, "dump.json")).read()   # bare tokens, as msprobe's json.dump writes
    st = json.load(open(os.path.join(root, "stack.json")))
    assert st["0"][0] == [KEY.format("model.dense.MatMul")] and "model/dense/MatMul" in st["0"][1][0]
    assert json.load(open(os.path.join(root, "construct.json"))) == {k: None for k in dj["data"]}


def test_export_statistics_level_and_overwrite(tmp_path):
    src = write(tmp_path / "d", "npu", rich_ops(), stats_only=True)
    root = export_msprobe(src, tmp_path / "ms")
    dj = json.load(open(os.path.join(root, "dump.json")))
    assert dj["task"] == "statistics" and dj["dump_data_dir"] is None
    assert not os.path.exists(os.path.join(root, "dump_tensor_data"))
    assert all("data_name" not in leaf for e in dj["data"].values() for leaf in e["output"] + e["input_args"])
    # without the tensor the sign of an inf is unknown: Max/Min/Mean null, Norm inf
    oi = dj["data"][KEY.format("model.a.b")]["output"][0]
    assert (oi["Max"], oi["Min"], oi["Mean"], oi["Norm"]) == (None, None, None, math.inf)
    with pytest.raises(AscendEmuError, match="not empty; pass --overwrite"):
        export_msprobe(src, tmp_path / "ms")
    export_msprobe(src, tmp_path / "ms", overwrite=True)
    open(os.path.join(root, "notes.txt"), "w").close()
    with pytest.raises(AscendEmuError, match="not part of an msprobe dump"):
        export_msprobe(src, tmp_path / "ms", overwrite=True)
    with pytest.raises(AscendEmuError, match="tensor format"):
        export_msprobe(src, tmp_path / "ms2", tensor_format="h5")
    with pytest.raises(AscendEmuError, match="step must be"):
        export_msprobe(src, tmp_path / "ms2", step=-1)


# --------------------------------------------------------------------------- round trip

@pytest.mark.parametrize("mode", ["tensor", "stats_only", "selected"])
def test_round_trip_is_identical(tmp_path, mode):
    kw = {"stats_only": True} if mode == "stats_only" else (
        {"select": lambda name, t: t in ("MatMul", "Split", "Identity")} if mode == "selected" else {})
    src = write(tmp_path / "d", "npu", rich_ops(), fused=[("model/dense/Add", "AddV2", "R", "model/dense/BiasAdd")],
                summary={"outputs": ["model/split:1"], "float_status": 0x14}, **kw)
    export_msprobe(src, tmp_path / "ms")
    back = import_msprobe(tmp_path / "ms", tmp_path / "back")
    assert_same_dump(src, back)
    # and the comparison of the round-tripped dump with the original finds nothing
    cmp = compare(back, src)
    assert all(r["Result"] == PASS for r in cmp.rows if r["Result"] != "N/A")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch for .pt files")
def test_round_trip_through_pt_files(tmp_path):
    import torch

    src = write(tmp_path / "d", "npu", rich_ops())
    root = export_msprobe(src, tmp_path / "ms", tensor_format="pt")
    dj = json.load(open(os.path.join(root, "dump.json")))
    leaf = dj["data"][KEY.format("model.a.b_2")]["output"][0]
    assert leaf["data_name"].endswith(".output.0.pt")
    t = torch.load(os.path.join(root, "dump_tensor_data", leaf["data_name"]), weights_only=True)
    assert t.dtype == torch.bfloat16 and str(t.dtype) == leaf["dtype"]
    assert_same_dump(src, import_msprobe(tmp_path / "ms", tmp_path / "back"))
    os.remove(os.path.join(root, SIDECAR))   # as a dump from msprobe itself: named by its keys
    d = import_msprobe(tmp_path / "ms", tmp_path / "back2", against=src)
    assert [op["name"] for op in d.ops] == [op[0] for op in rich_ops()]
    for op in load_dump(src).ops:
        for o in op["outputs"]:
            a = np.asarray(load_dump(src).tensor(op["name"], o["index"]))
            b = np.asarray(d.tensor(op["name"], o["index"]))
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------- import of msprobe's own layout

def _leaf(arr, data_name=None, dtype=None):
    a = np.asarray(arr)
    f = a.astype(np.float64)
    leaf = {"type": "torch.Tensor", "dtype": dtype or f"torch.{a.dtype.name}", "shape": list(a.shape),
            "Max": float(f.max()), "Min": float(f.min()), "Mean": float(f.mean()),
            "Norm": float(np.sqrt((f * f).sum())), "requires_grad": True}
    if data_name:
        leaf["data_name"] = data_name
    return leaf


def write_msprobe_fixture(root, entries, task="tensor", ext=".npy"):
    """A dump as msprobe 26.2 lays it out (documented format): entries = {key: ([inputs], [outputs])}."""
    rdir = os.path.join(root, "step0", "rank0")
    ddir = os.path.join(rdir, "dump_tensor_data")
    os.makedirs(ddir)
    data = {}
    for key, (ins, outs) in entries.items():
        ent = {"input_args": [], "input_kwargs": {"alpha": {"type": "float", "value": 1.0}}, "output": []}
        for role, arrs, field in (("input", ins, "input_args"), ("output", outs, "output")):
            for i, a in enumerate(arrs):
                name = f"{key}.{role}.{i}{ext}" if task == "tensor" else None
                if name and ext == ".npy":
                    np.save(os.path.join(ddir, name), a)
                elif name:
                    open(os.path.join(ddir, name), "wb").write(b"not really a torch file")
                ent[field].append(_leaf(a, name))
        ent["output"].append({"type": "int", "value": 3})  # a non-tensor output, skipped on import
        data[key] = ent
    with open(os.path.join(rdir, "dump.json"), "w") as f:
        json.dump({"task": task, "level": "L1", "framework": "pytorch",
                   "dump_data_dir": "/home/user/dump/step0/rank0/dump_tensor_data" if task == "tensor" else None,
                   "data": data}, f, indent=1)
    with open(os.path.join(rdir, "stack.json"), "w") as f:
        json.dump({"0": [list(entries), ["File train.py, line 10, in forward"]]}, f)
    with open(os.path.join(rdir, "construct.json"), "w") as f:
        json.dump({k: None for k in entries}, f)
    return root


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    """An emulator replay (and the float32 reference) of a small real Keras model."""
    import tensorflow as tf

    from ascend_emu import Device, reference
    from ascend_emu.frontend.tf.loader import load_graph

    tmp = tmp_path_factory.mktemp("replay")
    tf.keras.utils.set_random_seed(3)
    inp = tf.keras.Input((8,), name="x")
    h = tf.keras.layers.Dense(16, activation="tanh", name="hidden")(inp)
    out = tf.keras.layers.Dense(4, name="head")(h)
    g = load_graph(tf.keras.Model(inp, out))
    ref = reference(g, None, tmp / "bench", progress=False)
    Device("force_fp16").replay(g, ref.inputs, tmp / "npu", progress=False)
    return tmp, load_dump(tmp / "npu")


def _hardware_like(npu, name, plant=False):
    """What a hardware dump of this op would hold: the replay's tensor, with an inf and a nan planted."""
    a = np.array(npu.tensor(name), dtype=np.float16)
    if plant:
        a.reshape(-1)[0] = np.inf
        a.reshape(-1)[1] = np.nan
    return a


def _fixture_entries(npu):
    ops = [op for op in npu.ops if op["outputs"] and op["outputs"][0]["file"]]
    pick = ops[:3]
    entries = {}
    for k, op in enumerate(pick):
        entries[f"Functional.op{k}.0.forward"] = ([], [_hardware_like(npu, op["name"], plant=(k == 1))])
    entries["Functional.dropout.0.forward"] = ([], [np.ones((2, 2), np.float16)])
    mapping = {f"Functional.op{k}.0.forward": op["name"] for k, op in enumerate(pick)}
    return entries, mapping, pick


def test_import_msprobe_fixture_and_compare_with_replay(tmp_path, replay):
    rtmp, npu = replay
    entries, mapping, pick = _fixture_entries(npu)
    write_msprobe_fixture(tmp_path / "hw", entries)
    yml = tmp_path / "map.yaml"
    yml.write_text("# msprobe name: ascend-emu name\n" + "".join(f'{k}: "{v}"\n' for k, v in mapping.items()))
    assert read_mapping(yml) == mapping
    # the unmatched msprobe name is listed, with the way out
    with pytest.raises(AscendEmuError, match=r"1 of 4 msprobe op\(s\) have no counterpart.*Functional\.dropout"
                                             r"\.0\.forward.*--mapping"):
        import_msprobe(tmp_path / "hw", tmp_path / "imp", mapping=yml, against=npu)
    with pytest.raises(AscendEmuError, match="Functional.op0.0.forward, Functional.op1.0.forward"):
        import_msprobe(tmp_path / "hw", tmp_path / "imp", against=npu)   # no mapping: nothing matches
    d = import_msprobe(tmp_path / "hw", tmp_path / "imp", mapping=yml, against=npu, allow_unmatched=True)
    assert [op["name"] for op in d.ops] == [op["name"] for op in pick] + ["Functional.dropout.0.forward"]
    assert d.ops[0]["tf_type"] == pick[0]["tf_type"] and d.ops[1]["inputs"] == pick[1]["inputs"]
    assert d.tensor(pick[1]["name"]).dtype == np.float16 and d.op(pick[1]["name"])["outputs"][0]["inf"] == 1
    cmp = compare(d, npu)
    rows = {r["NPU Name"]: r for r in cmp.rows}
    r0 = rows[f"{pick[0]['name']}:0"]
    assert r0["Result"] == PASS and r0["Cosine"] > 0.9999
    r1 = rows[f"{pick[1]['name']}:0"]
    assert r1["Cosine"] == NAN and r1["Result"] == ERROR and "inf or nan" in r1["Err_message"]
    assert rows["Functional.dropout.0.forward:0"]["Result"] == "N/A"
    csv_path = cmp.to_csv(tmp_path / "c.csv")
    assert "Nan" in open(csv_path).read()
    # msprobe's rules: the planted inf/nan is an error of the InfNan rule; fp16 against fp16 passes
    cm = compare(d, npu, rules="msprobe")
    rows = {r["NPU Name"]: r for r in cm.rows}
    assert rows[f"{pick[1]['name']}:0"]["Result"] == ERROR and "InfNan" in rows[f"{pick[1]['name']}:0"]["Err_message"]
    # overflow analysis runs on it
    from ascend_emu.analysis.overflow import overflow_report
    rep = overflow_report(d)
    assert rep.first is not None and rep.first["name"] == pick[1]["name"]


def test_import_statistics_level_fixture(tmp_path, replay):
    rtmp, npu = replay
    entries, mapping, pick = _fixture_entries(npu)
    write_msprobe_fixture(tmp_path / "hw", entries, task="statistics")
    csvf = tmp_path / "map.csv"
    csvf.write_text("msprobe,ascend-emu\n" + "".join(f"{k},{v}\n" for k, v in mapping.items()))
    assert read_mapping(csvf) == mapping
    d = import_msprobe(tmp_path / "hw", tmp_path / "imp", mapping=csvf, against=npu, allow_unmatched=True)
    o = d.op(pick[1]["name"])["outputs"][0]
    assert o["file"] is None and math.isnan(o["max"]) and o["nan"] == 1
    o0 = d.op(pick[0]["name"])["outputs"][0]
    a0 = entries["Functional.op0.0.forward"][1][0].astype(np.float64)
    assert (o0["max"], o0["min"]) == (float(a0.max()), float(a0.min()))
    cmp = compare(d, npu)
    rows = {r["NPU Name"]: r for r in cmp.rows}
    assert rows[f"{pick[0]['name']}:0"]["Result"] == PASS
    assert rows[f"{pick[1]['name']}:0"]["Result"] == ERROR
    text = open(cmp.to_csv(tmp_path / "c.csv")).read()
    row = next(r for r in csv.DictReader(open(tmp_path / "c.csv")) if r["NPU Name"] == f"{pick[1]['name']}:0")
    assert row["NPU max"] == "nan" and row["NPU l2norm"] == "nan"   # never an empty cell
    assert text


def test_import_errors(tmp_path, monkeypatch):
    a = np.arange(6, dtype=np.float16).reshape(2, 3)
    write_msprobe_fixture(tmp_path / "pt", {"Functional.relu.0.forward": ([a], [a])}, ext=".pt")
    monkeypatch.setitem(sys.modules, "torch", None)   # PyTorch not installed
    with pytest.raises(AscendEmuError, match=r"\.pt tensor file .* needs PyTorch.*pip install torch"):
        import_msprobe(tmp_path / "pt", tmp_path / "o1")
    monkeypatch.undo()
    with pytest.raises(AscendEmuError, match="does not exist"):
        import_msprobe(tmp_path / "nope", tmp_path / "o2")
    os.makedirs(tmp_path / "multi" / "step0")
    os.makedirs(tmp_path / "multi" / "step1")
    with pytest.raises(AscendEmuError, match=r"several step directories \(step0, step1\); choose one with --step"):
        import_msprobe(tmp_path / "multi", tmp_path / "o3")
    write_msprobe_fixture(tmp_path / "ok", {"Functional.relu.0.forward": ([a], [a])})
    with pytest.raises(AscendEmuError, match="not in .*dump.json: Functional.gelu.0.forward"):
        import_msprobe(tmp_path / "ok", tmp_path / "o4", mapping={"Functional.gelu.0.forward": "x"})
    bad = tmp_path / "m.yaml"
    bad.write_text("just words\n")
    with pytest.raises(AscendEmuError, match="line 1: expected 'msprobe name: ascend-emu name'"):
        read_mapping(bad)
    d = import_msprobe(tmp_path / "ok" / "step0", tmp_path / "o5")
    assert [op["name"] for op in d.ops] == ["Functional.relu.0.forward"] and d.op(d.ops[0]["name"])["tf_type"] == "relu"
    assert np.array_equal(d.tensor("Functional.relu.0.forward"), a)


# --------------------------------------------------------------------------- compare semantics

def test_absolute_and_relative_euclidean_distance(tmp_path):
    b = np.array([3.0, 4.0], np.float32)
    n = np.array([3.0, 5.0], np.float32)
    write(tmp_path / "n", "npu", [("y", "Identity", [], [n])])
    write(tmp_path / "b", "bench", [("y", "Identity", [], [b])])
    r = compare(tmp_path / "n", tmp_path / "b").rows[0]
    assert r["EucDist"] == 1.0 and r["RelEucDist"] == pytest.approx(0.2, rel=1e-15)
    head = open(compare(tmp_path / "n", tmp_path / "b").to_csv(tmp_path / "c.csv")).readline().strip().split(",")
    assert head.index("RelEucDist") == head.index("EucDist") + 1


def _chain(tmp_path, npu_vals, bench_vals, *, npu_dtype=np.float32, stats_only=False):
    ops_n = [("a", "Identity", [], [np.asarray(npu_vals[0], npu_dtype)]),
             ("b", "Relu", ["a:0"], [np.asarray(npu_vals[1], npu_dtype)])]
    ops_b = [("a", "Identity", [], [np.asarray(bench_vals[0], np.float32)]),
             ("b", "Relu", ["a:0"], [np.asarray(bench_vals[1], np.float32)])]
    write(tmp_path / "n", "npu", ops_n, stats_only=stats_only)
    write(tmp_path / "b", "bench", ops_b, stats_only=stats_only)
    return compare(tmp_path / "n", tmp_path / "b", rules="msprobe")


def test_msprobe_rules(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1000)
    y = np.maximum(x, 0) + 1.0
    # identical values in another dtype: DType rule error on both rows (our rule passes them)
    cmp = _chain(tmp_path / "1", [x, y], [x, y], npu_dtype=np.float16)
    assert [r["Result"] for r in cmp.rows] == [ERROR, ERROR] and "DType" in cmp.rows[1]["Err_message"]
    assert cmp.counts()["error"] == 2
    # exact inputs, an output off by 1 % everywhere: One Thousandth rule error on the output only
    cmp = _chain(tmp_path / "2", [x, y * 1.01], [x, y])
    assert [r["Result"] for r in cmp.rows] == [PASS, ERROR] and "OneThousandth" in cmp.rows[1]["Err_message"]
    assert compare(tmp_path / "2" / "n", tmp_path / "2" / "b").rows[1]["Result"] == PASS   # cosine rule passes it
    # a cosine drop of more than 0.1 from input to output: warning (cosine 0.85 also fails our rule)
    z = y + rng.standard_normal(1000) * 0.9
    cmp = _chain(tmp_path / "3", [x, z], [x, y])
    assert cmp.rows[1]["Cosine"] < 0.9 and cmp.rows[1]["Result"] in (WARNING, ERROR)
    assert "CosineWarn" in cmp.rows[1]["Err_message"]
    # NPU inf where the bench is finite: InfNan rule error
    xi = x.copy()
    xi[5] = np.inf
    cmp = _chain(tmp_path / "4", [xi, y], [x, y])
    assert cmp.rows[0]["Result"] == ERROR and "InfNan" in cmp.rows[0]["Err_message"]
    # statistics only: norm of the output 60 % off while the input's is exact -> RelativeErr error
    cmp = _chain(tmp_path / "5", [x, y * 1.6], [x, y], stats_only=True)
    assert [r["Result"] for r in cmp.rows] == [PASS, ERROR] and "RelativeErr" in cmp.rows[1]["Err_message"]
    # ... 20 % off: only the growth warning (in 0, out > 0.1)
    cmp = _chain(tmp_path / "6", [x, y * 1.2], [x, y], stats_only=True)
    assert [r["Result"] for r in cmp.rows] == [PASS, WARNING] and "RelativeWarn" in cmp.rows[1]["Err_message"]
    assert "1 warning" in cmp.summary_text()


def test_report_with_msprobe_rules(tmp_path):
    from ascend_emu.analysis.report import write_report

    rng = np.random.default_rng(2)
    x = rng.standard_normal(100)
    y = np.maximum(x, 0) + 1.0
    cmp = _chain(tmp_path, [x, y * 1.2], [x, y], stats_only=True)
    text = open(write_report(cmp.npu, cmp.bench, tmp_path / "r.html", rules="msprobe")).read()
    assert "<td>Result rules</td><td>msprobe</td>" in text and "<td>1 / 1 / 0</td>" in text
    assert '<tr class="diff">' in text and "RelEucDist is the relative one" in text


def test_unknown_rules(tmp_path):
    write(tmp_path / "n", "npu", [("y", "Identity", [], [np.ones(3, np.float32)])])
    with pytest.raises(AscendEmuError, match="unknown rules 'tf'; choose one of: ascend-emu, msprobe"):
        compare(tmp_path / "n", tmp_path / "n", rules="tf")


# --------------------------------------------------------------------------- CLI

def test_cli_export_import(tmp_path, capsys):
    src = write(tmp_path / "d", "npu", rich_ops())
    assert main(["export-msprobe", str(src), str(tmp_path / "ms"), "--step", "2", "--rank", "5"]) == 0
    assert os.path.isfile(tmp_path / "ms" / "step2" / "rank5" / "dump.json")
    assert main(["import-msprobe", str(tmp_path / "ms"), str(tmp_path / "back")]) == 0
    assert_same_dump(src, tmp_path / "back")
    assert main(["compare", str(tmp_path / "back"), str(src), "--rules", "msprobe"]) == 0
    assert "rules: msprobe" in capsys.readouterr().out
    assert main(["import-msprobe", str(tmp_path / "nothing"), str(tmp_path / "b2")]) == 2
    assert "does not exist" in capsys.readouterr().err


# --------------------------------------------------------------------------- the real msprobe

from msprobe_real import msprobe_missing as _msprobe_missing  # noqa: E402


@pytest.mark.models
@pytest.mark.skipif(_msprobe_missing() is not None, reason=_msprobe_missing() or "")
@pytest.mark.parametrize("model", ["demo", "transformer"])
def test_real_msprobe_compare_agrees(tmp_path, model):
    from ascend_emu import Device, reference
    from ascend_emu.frontend.tf import models
    from ascend_emu.frontend.tf.loader import load_graph

    g = load_graph(models.demo_model() if model == "demo" else models.transformer_encoder())
    ref = reference(g, None, tmp_path / "bench", progress=False)
    Device("allow_mix_precision").replay(g, ref.inputs, tmp_path / "npu", progress=False)
    for side in ("npu", "bench"):
        export_msprobe(tmp_path / side, tmp_path / f"ms_{side}", tensor_format="pt")
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-c", "import sys; from msprobe.msprobe import main; sys.exit(main())",
                          "compare", "-tp", str(tmp_path / "ms_npu" / "step0"),
                          "-gp", str(tmp_path / "ms_bench" / "step0"),
                          "-o", str(out)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    [csv_file] = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".csv")]
    theirs = list(csv.DictReader(open(csv_file)))
    keys = json.load(open(tmp_path / "ms_npu" / "step0" / "rank0" / SIDECAR))["keys"]
    ours = {r["NPU Name"]: r for r in compare(tmp_path / "npu", tmp_path / "bench").rows if r["NPU Name"]}
    ours_ms = {r["NPU Name"]: r for r in compare(tmp_path / "npu", tmp_path / "bench", rules="msprobe").rows
               if r["NPU Name"]}
    checked = 0
    for t in theirs:
        name = t["NPU Name"]
        if ".forward.output." not in name or t["Bench Name"] in ("", "N/A"):
            continue
        key, idx = name.rsplit(".output.", 1)
        safe = key[len("Functional."):-len(".0.forward")]
        r = ours[f"{keys[safe]}:{idx}"]
        if r["NPU Dtype"].startswith(("int", "uint", "bool")):
            # ascend-emu's rules compare integers exact or not (no metric); msprobe's rules keep its numbers
            assert r["Cosine"] == "N/A" and r["Result"] in ("pass", "warning"), r
            r = ours_ms[f"{keys[safe]}:{idx}"]
        for col in ("Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr"):
            try:
                v = float(t[col])
            except ValueError:
                continue   # msprobe's "unsupported" / "Nan" (single-element or all-zero tensors)
            assert isinstance(r[col], float), (name, col, r[col], t[col])
            if col == "Cosine":
                assert abs(r[col] - v) <= 1e-6, (name, col, r[col], v)
            else:
                assert r[col] == pytest.approx(v, rel=1e-6, abs=1e-9), (name, col, r[col], v)
            checked += 1
        assert ours_ms[f"{keys[safe]}:{idx}"]["Result"] == t["Result"], (name, t["Err_message"])
    assert checked >= 30

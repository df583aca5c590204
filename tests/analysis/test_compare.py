"""Comparison metrics (hand-computed cases and their definitions), alignment, CSV, first divergent op."""
import csv
import math
import os

import ml_dtypes
import numpy as np
import pytest

from ascend_emu.analysis.compare import (COLUMNS, MSPROBE_COLUMNS, NAN, Thresholds, accuracy_reached, compare,
                                dtype_eps, tensor_metrics)
from ascend_emu.analysis.dump import DumpWriter, load_dump
from ascend_emu.errors import AscendEmuError, DumpError

M = ["Cosine", "EucDist", "RelEucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
     "Five Thousandths Err Ratio", "MeanAbsErr", "RMSE"]


def write(path, kind, ops, *, fused=(), summary=None, model="m", **kw):
    """ops: list of (name, tf_type, inputs, [arrays], extra kwargs)."""
    with DumpWriter(path, kind=kind, config={"kind": kind}, model={"name": model, "fingerprint": model},
                    inputs_sha256="0", **kw) as w:
        for name, tf_type, inputs, outs, *extra in ops:
            w.add_op(name, tf_type, tf_type, "AICORE", str(outs[0].dtype) if outs else None, inputs, outs,
                     **(extra[0] if extra else {}))
        for f in fused:
            w.add_fused(*f)
        w.finish(summary or {})
    return path


# --------------------------------------------------------------------------- metric definitions

def naive(n, b, bench_dtype=None):
    """The definitions of NUMERICS.md section 7, written out element by element."""
    n = [float(v) for v in np.asarray(n, np.float64).reshape(-1)]
    b = [float(v) for v in np.asarray(b, np.float64).reshape(-1)]
    eps = dtype_eps(bench_dtype if bench_dtype is not None else np.float32)
    for i in range(len(n)):
        if not (math.isfinite(n[i]) and math.isfinite(b[i])):
            same = (math.isnan(n[i]) and math.isnan(b[i])) or n[i] == b[i]
            if not same:
                return None
            n[i] = b[i] = 0.0
    dot = sum(x * y for x, y in zip(n, b))
    nn = math.sqrt(sum(x * x for x in n))
    bb = math.sqrt(sum(y * y for y in b))
    cos = 1.0 if nn == 0 and bb == 0 else (0.0 if nn == 0 or bb == 0 else dot / (nn * bb))
    d = [x - y for x, y in zip(n, b)]
    rel = [abs(di) / (abs(y) if y != 0 else eps) for di, y in zip(d, b)]
    dn = math.sqrt(sum(di * di for di in d))
    return {"Cosine": min(1.0, cos), "EucDist": dn, "RelEucDist": 0.0 if dn == 0 else (dn / bb if bb else math.inf),
            "MaxAbsErr": max(abs(di) for di in d), "MaxRelativeErr": max(rel),
            "One Thousandth Err Ratio": sum(r < 0.001 for r in rel) / len(rel),
            "Five Thousandths Err Ratio": sum(r < 0.005 for r in rel) / len(rel),
            "MeanAbsErr": sum(abs(di) for di in d) / len(d), "RMSE": math.sqrt(sum(di * di for di in d) / len(d))}


def test_hand_computed():
    n = np.array([1, 2, 0, 4], np.float32)
    b = np.array([1, 2, 0, 5], np.float32)
    m = tensor_metrics(n, b)
    assert m["Cosine"] == pytest.approx(25 / math.sqrt(21 * 30), rel=1e-15)
    assert m["RelEucDist"] == pytest.approx(1 / math.sqrt(30), rel=1e-15)
    assert m["EucDist"] == 1.0  # absolute (msprobe's)
    assert m["MaxAbsErr"] == 1.0
    assert m["MaxRelativeErr"] == pytest.approx(0.2)
    assert m["One Thousandth Err Ratio"] == 0.75 and m["Five Thousandths Err Ratio"] == 0.75
    assert m["MeanAbsErr"] == 0.25 and m["RMSE"] == 0.5
    assert m["Err_message"] == "" and m["count"] == 4
    # bench value 0: the bench dtype's eps stands in for |b|
    m16 = tensor_metrics(np.array([2.0**-12, 1.0]), np.array([0.0, 1.0], np.float16))
    assert m16["MaxRelativeErr"] == 2.0**-12 / 2.0**-10
    m32 = tensor_metrics(np.array([2.0**-12, 1.0]), np.array([0.0, 1.0], np.float32))
    assert m32["MaxRelativeErr"] == 2.0**-12 / 2.0**-23
    mbf = tensor_metrics(np.array([2.0**-12, 1.0]), np.array([0.0, 1.0], ml_dtypes.bfloat16))
    assert mbf["MaxRelativeErr"] == 2.0**-12 / 2.0**-7
    # the ratio thresholds are strict: rel err exactly 0.001 is not "< 0.001"
    m = tensor_metrics(np.array([1001.0, 1.0]), np.array([1000.0, 1.0]), bench_dtype=np.float64)
    assert m["One Thousandth Err Ratio"] == 0.5 and m["Five Thousandths Err Ratio"] == 1.0


def test_eps_table():
    assert dtype_eps(np.float16) == 2.0**-10 and dtype_eps(np.float32) == 2.0**-23
    assert dtype_eps(ml_dtypes.bfloat16) == 2.0**-7 and dtype_eps(np.float64) == 2.0**-52
    assert dtype_eps(np.int32) == 1.0 and dtype_eps(np.bool_) == 1.0


def test_zero_tensors():
    z = np.zeros(5, np.float32)
    m = tensor_metrics(z, z)
    assert m["Cosine"] == 1.0 and m["EucDist"] == m["RelEucDist"] == 0.0
    assert m["MaxAbsErr"] == 0.0 and m["MaxRelativeErr"] == 0.0
    assert m["One Thousandth Err Ratio"] == 1.0
    one = np.array([0, 0, 3, 4], np.float32)
    m = tensor_metrics(one, np.zeros(4, np.float32))  # bench all zero, NPU not
    assert m["Cosine"] == 0.0 and m["RelEucDist"] == math.inf and m["EucDist"] == 5.0 and "bench" in m["Err_message"]
    assert not accuracy_reached(m["Cosine"], m["MaxAbsErr"])
    m = tensor_metrics(np.zeros(4, np.float32), one)  # NPU all zero
    assert m["Cosine"] == 0.0 and m["RelEucDist"] == 1.0 and m["EucDist"] == 5.0 and "NPU" in m["Err_message"]
    m = tensor_metrics(np.zeros(0, np.float32), np.zeros(0, np.float32))
    assert m["Cosine"] == "N/A" and "empty" in m["Err_message"]


def test_inf_nan_patterns():
    n = np.array([1.0, np.inf, np.nan, -np.inf, 2.0], np.float32)
    m = tensor_metrics(n, n.copy())
    assert m["Cosine"] == 1.0 and m["MaxAbsErr"] == 0.0 and "3 matching inf/nan" in m["Err_message"]
    b = n.copy()
    b[1] = 65504.0  # saturated on one side, inf on the other
    m = tensor_metrics(n, b)
    assert all(m[c] == NAN for c in M) and "do not match (1 element" in m["Err_message"]
    assert not accuracy_reached(m["Cosine"], m["MaxAbsErr"])
    b = n.copy()
    b[1] = -np.inf  # same position, other sign
    assert tensor_metrics(n, b)["Cosine"] == NAN
    b = n.copy()
    b[2] = 0.0
    assert tensor_metrics(n, b)["Cosine"] == NAN


def test_size_mismatch_raises():
    with pytest.raises(AscendEmuError):
        tensor_metrics(np.ones(3), np.ones(4))


@pytest.mark.parametrize("seed", range(6))
def test_metrics_match_definitions_on_random_data(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 3000))
    b = rng.standard_normal(size).astype(np.float32)
    b[rng.random(size) < 0.1] = 0.0  # zeros in the bench
    n = (b.astype(np.float64) * (1 + 1e-3 * rng.standard_normal(size))).astype(np.float16)
    if seed % 2:
        idx = rng.choice(size, size // 20, replace=False)
        vals = rng.choice([np.nan, np.inf, -np.inf], idx.size)
        n[idx] = vals
        b[idx] = vals
    want = naive(n, b, np.float32)
    for chunk in (7, 64, 1 << 16):
        got = tensor_metrics(n, b, chunk=chunk)
        for c in M:
            assert got[c] == pytest.approx(want[c], rel=1e-9, abs=1e-12), (c, chunk)
    # and a single element where the masks differ turns every metric into Nan
    n2 = n.copy()
    n2[0] = np.nan if np.isfinite(b[0]) else 1.0
    assert naive(n2, b) is None and tensor_metrics(n2, b)["Cosine"] == NAN


def test_accuracy_rule_truth_table():
    assert accuracy_reached(0.995, 0.5)
    assert not accuracy_reached(0.985, 0.002)        # cos < 0.99 and MaxAbsErr > 0.001
    assert accuracy_reached(0.985, 0.0009)           # small absolute error forgives a lower cosine
    assert not accuracy_reached(0.89, 0.0)           # cos < 0.9 always fails
    assert not accuracy_reached(0.9999, 1.5)         # MaxAbsErr > 1 always fails
    assert accuracy_reached(0.9999, 1.0)
    assert not accuracy_reached(NAN, NAN)
    assert accuracy_reached("N/A", "N/A")
    t = Thresholds(cosine=0.999, max_abs_err_max=10.0)
    assert not accuracy_reached(0.995, 0.5, t) and accuracy_reached(0.9999, 5.0, t)
    with pytest.raises(AscendEmuError, match="unknown threshold"):
        Thresholds.coerce({"cos": 1})


# --------------------------------------------------------------------------- dumps

def chain_pair(tmp_path, planted=3, **kw):
    """x -> op1 MatMul -> op2 Relu -> op3 Mul -> op4 AddV2(op3, op1) -> op5 Softmax; error planted in op `planted`."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    o1 = x @ w
    o2 = np.maximum(o1, 0)
    o3 = o2 * 0.5
    o4 = o3 + o1
    o5 = np.exp(o4 - o4.max(1, keepdims=True))
    o5 /= o5.sum(1, keepdims=True)
    bench = [("x", "Placeholder", [], [x]), ("op1", "MatMul", ["x:0", "w:0"], [o1]), ("op2", "Relu", ["op1"], [o2]),
             ("op3", "Mul", ["op2:0", "c:0"], [o3]), ("op4", "AddV2", ["op3:0", "op1:0"], [o4]),
             ("op5", "Softmax", ["op4:0"], [o5])]
    npu = []
    err = 0.0
    for name, t, ins, (v,) in bench:
        if name == f"op{planted}":
            err = 1.0
        noisy = v + err * rng.standard_normal(v.shape).astype(np.float32) * np.abs(v).mean() if err else v
        npu.append((name, t, ins, [noisy.astype(np.float16)]))
    write(tmp_path / "bench", "bench", bench, summary={"outputs": ["op5:0"]})
    write(tmp_path / "npu", "npu", npu, **kw)
    return tmp_path / "npu", tmp_path / "bench"


def test_first_divergent_is_where_error_enters(tmp_path):
    npu, bench = chain_pair(tmp_path, planted=3)
    c = compare(load_dump(npu), load_dump(bench))  # Dump objects or paths
    res = {r["NPU Name"]: r["Result"] for r in c.rows}
    assert res == {"x:0": "pass", "op1:0": "pass", "op2:0": "pass", "op3:0": "error", "op4:0": "error",
                   "op5:0": "error"}
    fd = c.first_divergent()
    assert fd is not None and fd.name == "op3" and fd.index == 3
    assert fd.chain == ["op3", "op4", "op5"]
    assert [i["tensor"] for i in fd.inputs] == ["op2:0", "c:0"]
    assert fd.inputs[0]["row"]["Result"] == "pass" and fd.inputs[1]["row"] is None
    text = fd.format_text()
    assert "[Mul][3] op3" in text and "op4" in text and "c:0: not compared" in text
    d = fd.to_dict()
    assert d["name"] == "op3" and d["chain"] == ["op3", "op4", "op5"]
    # without summary["outputs"] the output is found as the op nobody consumes
    assert c.chain_to_output("op2") == ["op2", "op3", "op4", "op5"]
    worst = c.worst(cosine=0.999, limit=2)
    assert len(worst) == 2 and worst[0]["Cosine"] <= worst[1]["Cosine"] <= 0.999
    assert all(r["Result"] == "error" for r in worst)
    s = c.summary_text()
    assert "first divergent op: [Mul][3] op3" in s and "3 error" in s


def test_no_divergence(tmp_path):
    npu, bench = chain_pair(tmp_path, planted=99)
    c = compare(npu, bench)
    assert c.first_divergent() is None and not c.failing()
    assert "none" in c.summary_text()


def test_alignment_kinds(tmp_path):
    a = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    bench = [("x", "Placeholder", [], [a]), ("fc", "MatMul", ["x"], [a * 2]), ("bias", "BiasAdd", ["fc"], [a * 2 + 1]),
             ("shape", "Reshape", ["bias"], [(a * 2 + 1).reshape(4, 3)]), ("cnt", "Size", ["x"], [np.array(12, np.int32)]),
             ("two", "Split", ["x"], [a[:1], a[1:]]), ("benchonly", "Identity", ["x"], [a])]
    npu = [("x", "Placeholder", [], [a]),
           ("x/ascend_cast", "Cast", ["x:0"], [a.astype(np.float16)]),
           # the fused node takes the name of the last original op (ascend_emu/fusion.py)
           ("bias", "MatMul", ["x/ascend_cast:0"], [(a * 2 + 1).astype(np.float16)],
            {"fusion": {"rule": "MatMulBiasAddFusionPass", "replaces": ["fc", "bias"]}}),
           ("shape", "Reshape", ["bias"], [(a * 2 + 1).reshape(2, 6)]),
           ("cnt", "Size", ["x"], [np.array(12.0, np.float32)]),
           ("two", "Split", ["x"], [a[:1]]),
           ("npuonly", "Identity", ["x"], [a])]
    write(tmp_path / "b", "bench", bench)
    write(tmp_path / "n", "npu", npu, fused=[("fc", "MatMul", "MatMulBiasAddFusionPass", "bias")])
    c = compare(tmp_path / "n", tmp_path / "b")
    by = {(r["NPU Name"], r["Bench Name"]): (r, c.info(i)) for i, r in enumerate(c.rows)}
    # the inserted cast is compared with the value it casts
    r, i = by[("x/ascend_cast:0", "x:0")]
    assert i["kind"] == "cast" and r["Result"] == "pass" and r["Cosine"] > 0.9999 and "inserted Cast" in r["Err_message"]
    # the op fused away: listed, not dropped; the fused op is compared with the last op it replaces
    r, i = by[(None, "fc:0")]
    assert i["kind"] == "fused" and r["Result"] == "N/A" and "MatMulBiasAddFusionPass into bias" in r["Err_message"]
    r, i = by[("bias:0", "bias:0")]
    assert i["kind"] == "matched" and r["Result"] == "pass" and r["Op Type"] == "MatMul"
    # shape mismatch: a row with a message, not a crash
    r, i = by[("shape:0", "shape:0")]
    assert r["Result"] == "error" and "Shape" in r["Err_message"] and r["Cosine"] == "N/A"
    # int vs float: compared, with a message
    r, i = by[("cnt:0", "cnt:0")]
    assert r["Result"] == "pass" and "Dtype" in r["Err_message"]
    # an output only in the bench dump, an op only in the bench, an op only in the NPU
    assert by[(None, "two:1")][1]["kind"] == "bench only"
    assert by[(None, "benchonly:0")][1]["kind"] == "bench only"
    assert by[("npuonly:0", None)][1]["kind"] == "npu only"
    # every tensor of both dumps appears
    names = {r["NPU Name"] for r in c.rows} | {r["Bench Name"] for r in c.rows}
    assert {"x:0", "fc:0", "bias:0", "shape:0", "cnt:0", "two:0", "two:1", "benchonly:0", "x/ascend_cast:0",
            "npuonly:0"} <= names
    # rows keep the NPU execution order; bench-only rows follow the op that precedes them in the bench
    order = [r["NPU Name"] or r["Bench Name"] for r in c.rows]
    assert order.index("x:0") < order.index("x/ascend_cast:0") < order.index("fc:0") < order.index("bias:0") \
        < order.index("shape:0")
    assert order.index("two:0") < order.index("two:1") < order.index("benchonly:0")
    assert list(c.rows[0]) == COLUMNS
    assert c.counts()["fused"] == 1


def test_stats_only(tmp_path):
    a = np.linspace(1, 2, 10, dtype=np.float32)
    write(tmp_path / "b", "bench", [("y", "Relu", [], [a]), ("z", "Relu", [], [a])])
    write(tmp_path / "n", "npu", [("y", "Relu", [], [a.astype(np.float16)]), ("z", "Relu", [], [a * 3])],
          stats_only=True)
    c = compare(tmp_path / "n", tmp_path / "b")
    y, z = c.rows
    assert c.info(0)["kind"] == "stats only"
    assert y["Result"] == "pass" and y["Cosine"] == "N/A" and "statistics only" in y["Err_message"]
    assert z["Result"] == "error" and z["NPU max"] == pytest.approx(6.0)


def test_csv(tmp_path):
    npu, bench = chain_pair(tmp_path)
    c = compare(npu, bench)
    out = tmp_path / "cmp.csv"
    assert c.to_csv(out) == str(out)
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    # msprobe's columns in its order, our relative Euclidean distance right after its absolute one, then ours
    assert [h for h in rows[0] if h in MSPROBE_COLUMNS] == MSPROBE_COLUMNS
    assert rows[0][rows[0].index("EucDist") + 1] == "RelEucDist"
    assert rows[0][len(MSPROBE_COLUMNS) + 1:] == ["MeanAbsErr", "RMSE", "Op Type", "Ascend Op Type", "Engine",
                                                   "Compute Dtype", "Overflow Status", "Index"]
    assert len(rows) == 1 + len(c.rows)
    got = dict(zip(rows[0], rows[4]))
    assert got["NPU Name"] == "op3:0" and got["Result"] == "error"
    assert float(got["Cosine"]) == c.rows[3]["Cosine"]  # full precision
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []
    with pytest.raises(AscendEmuError, match="does not exist"):
        c.to_csv(tmp_path / "nodir" / "x.csv")
    table = c.format_table(c.worst(1.0, 3)).splitlines()
    # worst first: op4 (cos 0.809) then op3 (0.855) then op5 (0.953), after the header and the rule
    assert [line.split()[1] for line in table[2:]] == ["op4:0", "op3:0", "op5:0"]


def test_bad_inputs(tmp_path):
    npu, bench = chain_pair(tmp_path)
    write(tmp_path / "other", "bench", [("conv", "Conv2D", [], [np.ones(3, np.float32)])], model="other")
    with pytest.raises(AscendEmuError, match="no op name in common") as e:
        compare(npu, tmp_path / "other", force=True)
    assert "\n" not in str(e.value)
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "INCOMPLETE").write_text("")
    with pytest.raises(DumpError, match="incomplete"):
        compare(npu, tmp_path / "inc")
    with pytest.raises(DumpError, match="does not exist"):
        compare(tmp_path / "missing", bench)
    # a truncated tensor file is reported by name when it is read
    f = load_dump(npu).op("op2")["outputs"][0]["file"]
    data = (npu / f).read_bytes()
    (npu / f).write_bytes(data[:-10])
    with pytest.raises(DumpError, match=f"{f} is truncated"):
        compare(npu, bench)


def test_workers_give_the_same_rows(tmp_path):
    """Pairs compared in threads: the rows (every metric bit, every message, inserted casts' notes) are those
    of the serial run for any number of workers, and the first bad pair in row order is the one reported."""
    rng = np.random.default_rng(7)
    bench, npu = [], []
    for i in range(12):
        b = rng.standard_normal(3000 + 977 * i).astype(np.float32)
        n = (b + rng.standard_normal(b.size).astype(np.float32) * 10.0 ** -(i % 5)).astype(np.float16)
        if i == 4:
            n[::7] = np.inf
            b[::7] = np.inf
        bench.append((f"op{i}", "Relu", [f"op{i - 1}"] if i else [], [b]))
        npu.append((f"op{i}", "Relu", [f"op{i - 1}"] if i else [], [n]))
    npu.insert(3, ("op2/ascend_cast", "Cast", ["op2:0"], [bench[2][3][0].astype(np.float16)]))
    write(tmp_path / "b", "bench", bench)
    write(tmp_path / "n", "npu", npu)
    serial = compare(tmp_path / "n", tmp_path / "b", workers=1, chunk=1024)
    assert any("inserted Cast" in r["Err_message"] for r in serial.rows)
    assert any("inf/nan value(s) zeroed" in r["Err_message"] for r in serial.rows)
    for w in (2, 3, 8):
        rows = compare(tmp_path / "n", tmp_path / "b", workers=w, chunk=1024).rows
        assert [list(r.items()) for r in rows] == [list(r.items()) for r in serial.rows], w
    # two truncated files: the earlier pair's is reported, as serially, whatever finishes first
    d = load_dump(tmp_path / "n")
    for name in ("op5", "op9"):
        f = d.op(name)["outputs"][0]["file"]
        (tmp_path / "n" / f).write_bytes((tmp_path / "n" / f).read_bytes()[:-10])
    first = d.op("op5")["outputs"][0]["file"]
    for w in (1, 4):
        with pytest.raises(DumpError, match=f"{first} is truncated"):
            compare(tmp_path / "n", tmp_path / "b", workers=w, chunk=1024)


def test_streaming_reads_one_chunk_at_a_time(tmp_path):
    """Chunked reading gives the same metrics as whole-tensor numpy, for any chunk size."""
    rng = np.random.default_rng(5)
    b = rng.standard_normal(100_003).astype(np.float32)
    n = b.astype(np.float16)
    write(tmp_path / "b", "bench", [("t", "Relu", [], [b])])
    write(tmp_path / "n", "npu", [("t", "Relu", [], [n])])
    whole = tensor_metrics(n, b)
    for chunk in (1000, 65536, 1 << 20):
        r = compare(tmp_path / "n", tmp_path / "b", chunk=chunk).rows[0]
        for col in M:
            assert r[col] == pytest.approx(whole[col], rel=1e-12), (col, chunk)


def test_package_level_compare_is_the_function(tmp_path):
    """``ascend_emu.compare(npu_dump, bench_dump)`` is the function, whatever was imported before."""
    import ascend_emu
    import ascend_emu.analysis.compare  # noqa: F401
    import ascend_emu.analysis.report  # noqa: F401
    npu, bench = chain_pair(tmp_path)
    assert ascend_emu.compare(npu, bench).first_divergent().name == "op3"


def _scaled_loss_pair(tmp_path, grow: bool):
    """loss (a small float32 error that passes) -> scaled = loss * 2^16 (fails MaxAbsErr > 1 with the loss's
    relative error) -> grad = f(scaled) whose error grows (grow=True) or stays the scaled loss's."""
    rng = np.random.default_rng(1)
    loss = (rng.random(64) + 1.0).astype(np.float32)
    npu_loss = loss * np.float32(1 + 2e-5)
    scaled, npu_scaled = loss * np.float32(65536), npu_loss * np.float32(65536)
    grad = scaled * np.float32(0.25)
    npu_grad = (npu_scaled * np.float32(0.25)) * ((1 + 0.05 * rng.standard_normal(64)).astype(np.float32)
                                                   if grow else np.float32(1))
    bench = [("loss", "Exp", ["x:0"], [loss]), ("scale", "Mul", ["loss:0", "s:0"], [scaled]),
             ("grad", "Mul", ["scale:0", "h:0"], [grad])]
    npu = [("loss", "Exp", ["x:0"], [npu_loss]), ("scale", "Mul", ["loss:0", "s:0"], [npu_scaled]),
           ("grad", "Mul", ["scale:0", "h:0"], [npu_grad.astype(np.float32)])]
    write(tmp_path / "bench", "bench", bench, summary={"outputs": ["grad:0"]})
    write(tmp_path / "npu", "npu", npu)
    return compare(tmp_path / "npu", tmp_path / "bench")


def test_a_loss_scale_multiply_is_passed_over(tmp_path):
    """A multiply by GradScaler's 2^16 fails msprobe's MaxAbsErr > 1 rule with its input's relative error and
    cosine: the error does not enter there. The first divergent op is the first whose error grows, and the text
    names the op passed over; when none grows, the scaled op is named and said to carry its inputs' error."""
    c = _scaled_loss_pair(tmp_path / "grow", grow=True)
    res = {r["NPU Name"]: r["Result"] for r in c.rows}
    assert res == {"loss:0": "pass", "scale:0": "error", "grad:0": "error"}
    fd = c.first_divergent()
    assert fd.name == "grad" and fd.carried == ["scale"] and not fd.scaled_only
    assert "passed over before it" in fd.format_text() and "scale" in fd.format_text()
    assert fd.to_dict()["carried"] == ["scale"]

    c = _scaled_loss_pair(tmp_path / "flat", grow=False)
    fd = c.first_divergent()
    assert fd.name == "scale" and fd.scaled_only and fd.carried == []
    assert "its relative error and cosine are its inputs'" in fd.format_text()


def test_the_cli_names_the_first_divergent_op_once(tmp_path, capsys):
    """`ascend-emu compare` printed "first divergent op: ..." twice, in the summary and as the head of the op's
    own block; with no divergent op the summary's "none" line is the one."""
    from ascend_emu.cli.main import main

    npu, bench = chain_pair(tmp_path, planted=3)
    assert main(["compare", str(npu), str(bench)]) == 0
    out = capsys.readouterr().out
    assert out.count("first divergent op") == 1 and "first divergent op: [Mul][3] op3  (Mul" in out, out
    npu, bench = chain_pair(tmp_path / "clean", planted=99)
    assert main(["compare", str(npu), str(bench)]) == 0
    out = capsys.readouterr().out
    assert out.count("first divergent op") == 1 and "first divergent op: none (every op passes)" in out, out


def test_integer_outputs_exact_or_not_but_coded_floats_as_floats(tmp_path):
    """An int32 output is compared exact or not (no metric); a hifloat8 output, stored as uint8 codes, is a float
    tensor and gets the float metrics (its decoded values truncated to integers would have compared equal)."""
    from ascend_emu.analysis.compare import compare
    from ascend_emu.analysis.dump import Coded, DumpWriter

    def write(name, ints, hif8):
        with DumpWriter(tmp_path / name, kind="npu", config={"kind": "npu"}, model={"name": "m", "fingerprint": "m"},
                        inputs_sha256="0") as w:
            w.add_op("idx", "ArgMax", "ArgMaxV2", "AICORE", "int32", [], [np.asarray(ints, np.int32)])
            w.add_op("q", "Cast", "Cast", "AICORE", "hifloat8", [], [Coded(np.asarray(hif8, np.float32), "hifloat8")])
            w.finish({})
        return tmp_path / name

    n = write("npu", [0, 1, 2, 3], [0.5, 0.25, 0.125, 0.75])
    b = write("bench", [0, 1, 2, 2], [0.25, 0.125, 0.5, 0.5])
    rows = {r["NPU Name"]: r for r in compare(n, b).rows}
    assert rows["idx:0"]["Result"] == "warning" and "integers differ at 1 of 4" in rows["idx:0"]["Err_message"]
    assert rows["idx:0"]["Cosine"] == "N/A"
    assert rows["q:0"]["Result"] == "error" and "integers" not in rows["q:0"]["Err_message"]
    assert isinstance(rows["q:0"]["Cosine"], float) and rows["q:0"]["Cosine"] < 0.9

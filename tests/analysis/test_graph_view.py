"""The report's op graph (issue 33): its markup against the dumps and the comparison rows.

Every computing op of the NPU dump has one node (``data-op``), every data edge between two of them one
edge (``data-from``, ``data-to``), each node's ``data-status`` comes from the op's comparison rows, the
first divergent op carries ``data-first="true"``; fused ops list the ops they replaced; folded name scopes
keep every node and edge.
"""
import re

import numpy as np
import pytest

from ascend_emu.analysis.compare import compare
from ascend_emu.analysis.dump import DumpWriter, load_dump
from ascend_emu.analysis.graph_view import graph_section
from ascend_emu.analysis.overflow import overflow_report
from ascend_emu.analysis.report import write_report
from graph_markup import check_graph, parse
from test_report import check_html, dumps


def rich_dumps(tmp_path):
    """A toy model with what the view marks: an inserted Cast, a fused op (and the ops it replaced), an
    AI CPU op, constants (a weight, its folded Cast, a reduction axis), an error and an overflow."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    mm = x @ w
    act = np.tanh(mm)
    top = np.sort(act, axis=1)[:, ::-1][:, :4].copy()
    scale = top * 3
    total = scale.sum(axis=1)
    axis = np.array(1, np.int32)
    bench = [("x", "Placeholder", [], [x]), ("w", "Const", [], [w]), ("axis", "Const", [], [axis]),
             ("fc/MatMul", "MatMul", ["x", "w"], [mm]), ("fc/BiasAdd", "BiasAdd", ["fc/MatMul"], [mm]),
             ("act", "Tanh", ["fc/BiasAdd"], [act]), ("topk", "TopKV2", ["act"], [top]),
             ("scale", "Mul", ["topk"], [scale]), ("sum", "Sum", ["scale", "axis"], [total]),
             ("fill", "Fill", ["axis"], [np.ones(3, np.float32)])]
    with DumpWriter(tmp_path / "b", kind="bench", config={}, model={"name": "rich", "fingerprint": "f"},
                    inputs_sha256="s") as wr:
        for name, t, ins, outs in bench:
            wr.add_op(name, t, t, "CPU", "float32", ins, outs)
    white = {"list": "white", "dtype": "float16", "reason": "white list: runs in float16"}
    with DumpWriter(tmp_path / "n", kind="npu", config={"precision_mode": "allow_mix_precision"},
                    model={"name": "rich", "fingerprint": "f"}, inputs_sha256="s") as wr:
        wr.add_op("x", "Placeholder", "Data", "HOST", "float32", [], [x])
        wr.add_op("w", "Const", "Const", "HOST", "float32", [], [w])
        wr.add_op("axis", "Const", "Const", "HOST", "int32", [], [axis])
        wr.add_op("w/ascend_cast_0_to_fp16", "Cast", "Cast", "HOST", "float16", ["w:0"], [w.astype(np.float16)],
                  precision={"list": None, "reason": "inserted at a precision boundary (float32 -> float16); "
                             "constant-folded by the graph engine"})
        wr.add_op("x/ascend_cast_0_to_fp16", "Cast", "Cast", "AICORE", "float16", ["x:0"], [x.astype(np.float16)],
                  precision={"list": None, "reason": "inserted at a precision boundary (float32 -> float16)"})
        wr.add_op("fc/BiasAdd", "_FusedMatMul", "MatMulV2", "AICORE", "float16", ["x:0", "w:0"],
                  [mm.astype(np.float16)], precision=white,
                  fusion={"rule": "MatMulBiasAddFusionPass", "replaces": ["fc/MatMul", "fc/BiasAdd"]})
        wr.add_fused("fc/MatMul", "MatMul", "MatMulBiasAddFusionPass", "fc/BiasAdd")
        bad = (act + rng.standard_normal(act.shape).astype(np.float32)).astype(np.float16)
        wr.add_op("act", "Tanh", "Tanh", "AICORE", "float16", ["fc/BiasAdd:0"], [bad], precision=white)
        wr.add_op("topk", "TopKV2", "TopK", "AICPU", "float32", ["act:0"], [top],
                  precision={"list": "black", "dtype": "float32", "reason": "black list: keeps the original dtype"})
        sat = scale.astype(np.float16)
        sat[0, 0] = 65504.0
        wr.add_op("scale", "Mul", "Mul", "AICORE", "float16", ["topk:0"], [sat], 0x20,
                  fp32_check={"overflow": False, "max_abs": 9e4})
        wr.add_op("sum", "Sum", "ReduceSum", "AICORE", "float16", ["scale:0", "axis:0"], [total.astype(np.float16)])
        wr.add_op("fill", "Fill", "Fill", "AICORE", "float32", ["axis:0"], [np.ones(3, np.float32)])
    return tmp_path / "n", tmp_path / "b"


def test_graph_markup_of_the_report(tmp_path):
    n, b = dumps(tmp_path)
    write_report(n, b, tmp_path / "r.html")
    _, text = check_html(tmp_path / "r.html")
    cmp = compare(n, b)
    m = check_graph(text, cmp)
    assert m.nodes["act"]["data-first"] == "true" and m.nodes["act"]["data-status"] == "error"
    assert m.nodes["scale"]["data-status"] == "overflow" and m.nodes["scale"].get("data-first-overflow") == "true"
    assert m.nodes["x"]["data-status"] == "pass"   # the input, dumped on both sides
    # the error's path from the first divergent op to the output
    assert re.findall(r'<path class="edge chain" data-from="([^"]*)" data-to="([^"]*)"', text) == [
        ("act", "scale"), ("scale", "sum")]


def test_graph_marks_casts_fusion_and_ai_cpu(tmp_path):
    n, b = rich_dumps(tmp_path)
    cmp = compare(n, b)
    text = graph_section(cmp, overflow_report(n))
    m = check_graph(text, cmp)
    # the constants and the cast folded from one are left out; the inserted cast of the input is drawn
    assert "w" not in m.nodes and "axis" not in m.nodes and "w/ascend_cast_0_to_fp16" not in m.nodes
    assert "fill" in m.nodes   # fed by a constant only, but computed on the AI Core
    assert "cast" in m.nodes["x/ascend_cast_0_to_fp16"]["class"].split()
    # drawn feeding the float16 op that reads it (not a data edge of the dump: other attributes)
    assert 'data-cast-from="x/ascend_cast_0_to_fp16" data-cast-to="fc/BiasAdd"' in text
    assert "aicpu" in m.nodes["topk"]["class"].split() and "AI CPU" in text
    assert "fused" in m.nodes["fc/BiasAdd"]["class"].split()
    # the fused op's group: the ops it replaced, collapsed (hidden) until opened
    assert m.fused["fc/BiasAdd"] == ["fc/MatMul", "fc/BiasAdd"]
    assert all(o["style"] == "display:none" for o in m.overlays.values())
    assert 'data-fused-from="fc/MatMul" data-fused-to="fc/BiasAdd"' in text
    # what a click shows: precision decision and why, fusion rule, status bits
    assert "black list: keeps the original dtype" in text and "MatMulBiasAddFusionPass" in text
    assert "0x20" in text
    assert m.nodes["act"]["data-first"] == "true"


def blocks_dumps(tmp_path):
    """Six repeated blocks (scopes ``model/block<k>_``) with a residual edge each; block 3 diverges."""
    rng = np.random.default_rng(0)
    v = rng.standard_normal((4, 4)).astype(np.float32)
    ops = [("in", "Placeholder", [])]
    prev = "in"
    for blk in range(6):
        a = f"model/block{blk}_conv/Relu"
        c = f"model/block{blk}_conv/Add"
        neg = f"model/block{blk}_conv/Neg"
        ops += [(a, "Relu", [prev]), (neg, "Neg", [a]), (c, "AddV2", [a, neg]),
                (f"model/block{blk}_out", "Identity", [c, prev])]
        prev = f"model/block{blk}_out"
    for kind in ("n", "b"):
        with DumpWriter(tmp_path / kind, kind="npu" if kind == "n" else "bench", config={},
                        model={"name": "blocks", "fingerprint": "f"}, inputs_sha256="s") as wr:
            for name, t, ins in ops:
                out = v + (1 if kind == "n" and name == "model/block3_conv/Neg" else 0)
                wr.add_op(name, t, t, "AICORE", "float32", ins, [out])
    return tmp_path / "n", tmp_path / "b"


def test_folded_scopes_keep_every_node_and_edge(tmp_path):
    """Many ops in repeated scopes: above the size limit the scopes fold into groups, and the markup
    still has every op and every edge (inside the groups' views and between the groups)."""
    blocks_dumps(tmp_path)
    cmp = compare(tmp_path / "n", tmp_path / "b")
    text = graph_section(cmp, None, fold_above=10, fold_target=10)
    m = check_graph(text, cmp)
    assert 6 <= len(m.groups) <= 10
    scopes = {g["data-scope"]: g for g in m.groups}
    assert "model/block3_" in scopes and scopes["model/block3_"]["data-status"] == "error"
    # unfolded below the limit
    assert parse(graph_section(cmp, None)).groups == []


def test_graph_of_a_dump_against_itself(tmp_path):
    n, b = dumps(tmp_path, overflow=False)
    cmp = compare(b, b)
    m = check_graph(graph_section(cmp), cmp)
    assert {a["data-status"] for a in m.nodes.values()} <= {"pass", "na"}


@pytest.mark.parametrize("bad", ["</script><script>alert(1)</script>", 'a"b<c>&d', "a\rb", "c\r\nd"])
def test_op_names_are_escaped(tmp_path, bad):
    x = np.ones((2, 2), np.float32)
    for kind in ("n", "b"):
        with DumpWriter(tmp_path / kind, kind="npu" if kind == "n" else "bench", config={},
                        model={"name": "esc", "fingerprint": "f"}, inputs_sha256="s") as wr:
            wr.add_op("in", "Placeholder", "Data", "HOST", "float32", [], [x])
            wr.add_op(bad, "Relu", "Relu", "AICORE", "float32", ["in:0"], [x])
    write_report(tmp_path / "n", tmp_path / "b", tmp_path / "r.html")
    _, text = check_html(tmp_path / "r.html")
    # as a browser reads it: the input stream's CR and CRLF become LF before parsing (R1, issue 45)
    m = parse(text.replace("\r\n", "\n").replace("\r", "\n"))
    assert bad in m.nodes and ("in", bad) in m.edges
    assert "<script>alert" not in text
    assert load_dump(tmp_path / "n").op(bad)


@pytest.mark.parametrize("make", [rich_dumps, blocks_dumps])
def test_layout_puts_producers_above_consumers_without_overlap(tmp_path, make):
    """Layered layout: every edge points down, and no two op boxes overlap."""
    n, b = make(tmp_path)
    text = graph_section(compare(n, b))
    boxes = {}
    for name, x, y, w, h in re.findall(r'<g class="node[^"]*" data-op="([^"]*)"[^>]*transform="translate\(([-\d.]+),'
                                       r'([-\d.]+)\)"><title>[^<]*</title>(?:<rect class="ring"[^>]*/>)*<rect '
                                       r'class="box" width="([\d.]+)" height="([\d.]+)"', text):
        boxes[name] = (float(x), float(y), float(w), float(h))
    m = parse(text)
    assert set(boxes) == set(m.nodes)
    for s, d in m.edges:
        assert boxes[s][1] + boxes[s][3] < boxes[d][1], (s, d)
    items = list(boxes.items())
    for i, (a, (ax, ay, aw, ah)) in enumerate(items):
        for c, (cx, cy, cw, ch) in items[i + 1:]:
            apart = ax + aw <= cx or cx + cw <= ax or ay + ah <= cy or cy + ch <= ay
            assert apart, (a, c)

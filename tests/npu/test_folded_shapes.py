"""Shape arithmetic kept between replays (npu/node_plan.py ``Light.fold``, ``fold_key``): with no dump and no kept
tensors, a "host" or "int" node that meets the input values (for Shape: the input shapes) of the last replay hands
the same outputs on. It changes no bit nor record, sees a new batch and a constant edited in place, and is never
used for a graph output or when tensors are kept."""
import dataclasses

import numpy as np

from ascend_emu import Device
from ascend_emu.graph.core import Graph, InputSpec, Node
from ascend_emu.npu.node_plan import Light

I32 = {"T": "int32"}


def _graph():
    # x [batch, 6] -> Reshape(x, [batch] ++ c) * 2, the new shape computed from Shape(x) and a constant c = [2, 3];
    # the constant's element count is a graph output of its own (never handed on from a replay)
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [None, 6]}),
             Node("shp", "Shape", ["x"], {"T": "float32", "out_type": "int32"}),
             Node("b0", "Const", [], {"dtype": "int32", "value": np.array([0], np.int32)}),
             Node("b1", "Const", [], {"dtype": "int32", "value": np.array([1], np.int32)}),
             Node("batch", "StridedSlice", ["shp", "b0", "b1", "b1"], {"T": "int32", "Index": "int32"}),
             Node("c", "Const", [], {"dtype": "int32", "value": np.array([2, 3], np.int32)}),
             Node("axis", "Const", [], {"dtype": "int32", "value": np.array(0, np.int32)}),
             Node("newshape", "ConcatV2", ["batch", "c", "axis"], {**I32, "N": 2, "Tidx": "int32"}),
             Node("y", "Reshape", ["x", "newshape"], {"T": "float32", "Tshape": "int32"}),
             Node("two", "Const", [], {"dtype": "float32", "value": np.array(2.0, np.float32)}),
             Node("out", "Mul", ["y", "two"], {"T": "float32"}),
             Node("n", "Prod", ["c", "axis"], {**I32, "Tidx": "int32", "keep_dims": False})]
    return Graph(nodes=nodes, inputs=[InputSpec("x", "float32", [None, 6])], outputs=["out:0", "n:0"])


def _x(batch, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((batch, 6)).astype(np.float32)}


def _result(res):
    outs = {k: (v.dtype.str, v.shape, np.ascontiguousarray(v).tobytes()) for k, v in res.outputs.items()}
    return outs, [dataclasses.asdict(r) for r in res.records], res.summary["float_status"]


def _folds(dev):
    (entry,) = dev._plan_cache.values()
    return {p.node.name: p.fold for p in entry[3][2].values() if type(p) is Light and p.kind in ("host", "int")}


def test_kept_shape_arithmetic_changes_no_bit_and_sees_a_new_batch():
    g = _graph()
    dev = Device("allow_mix_precision")
    first = dev.replay(g, _x(4), progress=False, keep_tensors=False)
    again = dev.replay(g, _x(4), progress=False, keep_tensors=False)
    folds = _folds(dev)
    assert folds["shp"] is not None and folds["batch"] is not None and folds["newshape"] is not None
    assert folds["n"] is None       # a graph output: the caller's array, made afresh each replay
    assert _result(again) == _result(first)
    assert again.outputs["n:0"] is not first.outputs["n:0"]
    # the same inputs again, kept or not: as a fresh device that keeps every tensor
    assert _result(dev.replay(g, _x(4), progress=False, keep_tensors=False)) == \
        _result(Device("allow_mix_precision").replay(g, _x(4), progress=False, keep_tensors=True))
    # a new batch: Shape's key (the input's shape) differs, so the chain is computed again
    five = dev.replay(g, _x(5, 1), progress=False, keep_tensors=False)
    assert five.outputs["out:0"].shape == (5, 2, 3)
    assert _result(five) == _result(Device("allow_mix_precision").replay(g, _x(5, 1), progress=False,
                                                                        keep_tensors=True))


def test_a_constant_edited_in_place_is_seen():
    g = _graph()
    dev = Device("allow_mix_precision")
    for _ in range(2):
        dev.replay(g, _x(4), progress=False, keep_tensors=False)
    c = next(n for n in g.nodes if n.name == "c")
    c.attrs["value"][...] = [3, 2]      # the same array, new values: the fold key compares values
    res = dev.replay(g, _x(4), progress=False, keep_tensors=False)
    assert res.outputs["out:0"].shape == (4, 3, 2)
    assert _result(res) == _result(Device("allow_mix_precision").replay(g, _x(4), progress=False, keep_tensors=True))


def test_nothing_is_kept_when_tensors_are_kept_or_dumped(tmp_path):
    g = _graph()
    dev = Device("allow_mix_precision")
    for _ in range(2):
        dev.replay(g, _x(4), progress=False, keep_tensors=True)
    assert not any(_folds(dev).values())
    dev = Device("allow_mix_precision")
    for i in range(2):
        dev.replay(g, _x(4), tmp_path / f"d{i}", progress=False, keep_tensors=False)
    assert not any(_folds(dev).values())


def test_the_kept_outputs_are_private_copies():
    """What a replay keeps is its own copy, handed on as a copy: a consumer or caller changing a handed-on array in
    place (through an Identity, say) cannot reach the next replay."""
    g = _graph()
    dev = Device("allow_mix_precision")
    for _ in range(3):
        res = dev.replay(g, _x(4), progress=False, keep_tensors=False)
    kept = _folds(dev)["newshape"][1][0]
    assert kept.tolist() == [4, 2, 3] and kept.flags.owndata
    assert not any(np.shares_memory(kept, v) for v in res.outputs.values())


def test_a_kept_node_is_not_computed_again(monkeypatch):
    """The third replay with the second's inputs takes the int nodes' kept outputs (no call of the op)."""
    from ascend_emu.npu import replay as R

    g = _graph()
    dev = Device("allow_mix_precision")
    ran = []
    real = R._Run._run

    def spy(self, opdef, node, *a, **k):
        ran.append(node.name)
        return real(self, opdef, node, *a, **k)

    monkeypatch.setattr(R._Run, "_run", spy)
    for _ in range(2):
        dev.replay(g, _x(4), progress=False, keep_tensors=False)
    assert "newshape" in ran and "batch" in ran
    ran.clear()
    res = dev.replay(g, _x(4), progress=False, keep_tensors=False)
    assert "newshape" not in ran and "batch" not in ran and "out" in ran
    assert _result(res) == _result(Device("allow_mix_precision").replay(g, _x(4), progress=False, keep_tensors=True))


def test_results_of_two_replays_share_no_memory():
    """A kept output reaching the caller through views (Identity, ExpandDims) is a copy each replay: editing one
    result, or refilling the buffer fed to an earlier replay, changes no other result."""
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [None, 6]}),
             Node("ids", "Placeholder", [], {"dtype": "int32", "shape": [3]}),
             Node("shp", "Shape", ["x"], {"T": "float32", "out_type": "int32"}),
             Node("id", "Identity", ["shp"], {"T": "int32"}),
             Node("i", "Identity", ["ids"], {"T": "int32"}),
             Node("ax", "Const", [], {"dtype": "int32", "value": np.array(0, np.int32)}),
             Node("e", "ExpandDims", ["i", "ax"], {"T": "int32", "Tdim": "int32"}),
             Node("two", "Const", [], {"dtype": "float32", "value": np.array(2.0, np.float32)}),
             Node("out", "Mul", ["x", "two"], {"T": "float32"})]
    g = Graph(nodes=nodes, inputs=[InputSpec("x", "float32", [None, 6]), InputSpec("ids", "int32", [3])],
              outputs=["out:0", "id:0", "e:0"])
    dev = Device("allow_mix_precision")
    feeds = [{"x": np.zeros((4, 6), np.float32), "ids": np.array([1, 2, 3], np.int32)} for _ in range(3)]
    r = [dev.replay(g, f, progress=False, keep_tensors=False).outputs for f in feeds]
    for name in ("id:0", "e:0"):
        assert not np.shares_memory(r[1][name], r[2][name])
    assert not np.shares_memory(r[2]["e:0"], feeds[1]["ids"])
    r[2]["id:0"][0] = 99
    feeds[1]["ids"][:] = 7
    assert r[1]["id:0"].tolist() == [4, 6] and r[2]["e:0"].tolist() == [[1, 2, 3]]


def test_an_int_node_attribute_edited_in_place_is_seen():
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [3]}),
             Node("c", "Const", [], {"dtype": "int32", "value": np.array([1, 2, 3], np.int32)}),
             Node("axis", "Const", [], {"dtype": "int32", "value": np.array(0, np.int32)}),
             Node("cs", "Cumsum", ["c", "axis"], {**I32, "Tidx": "int32", "exclusive": False, "reverse": False}),
             Node("f", "Cast", ["cs"], {"SrcT": "int32", "DstT": "float32"}),
             Node("out", "Mul", ["x", "f"], {"T": "float32"})]
    g = Graph(nodes=nodes, inputs=[InputSpec("x", "float32", [3])], outputs=["out:0"])
    dev = Device("allow_mix_precision")
    x = {"x": np.ones(3, np.float32)}
    for _ in range(2):
        assert dev.replay(g, x, progress=False, keep_tensors=False).outputs["out:0"].tolist() == [1, 3, 6]
    next(n for n in g.nodes if n.name == "cs").attrs["reverse"] = True
    assert dev.replay(g, x, progress=False, keep_tensors=False).outputs["out:0"].tolist() == [6, 5, 3]

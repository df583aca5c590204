"""The per-node work a replay does around nodes that move no data (npu/replay.py ``_Run.eval_node``: the signature of
a node of no inputs is the empty one, not worked out; a single output's check key is made without a list) and the
shape lists the shape ops read (ops/_util.py ``as_int_list``: an integer array's own ``tolist``) change nothing: the
output check still catches a kept Const whose value a later replay meets with another shape or dtype, and a kept
Placeholder fed another dtype; ``as_int_list`` gives what ``int()`` of each element gives, as Python ints."""
import numpy as np
import pytest

from ascend_emu import Device
from ascend_emu.errors import AscendEmuError
from ascend_emu.graph.core import Graph, InputSpec, Node
from ascend_emu.ops._util import as_int_list


def _graph():
    c = np.arange(6, dtype=np.float32).reshape(2, 3)
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [2, 3]}, output_shapes=[[2, 3]],
                  output_dtypes=["float32"]),
             Node("c", "Const", [], {"dtype": "float32", "value": c}, output_shapes=[[2, 3]],
                  output_dtypes=["float32"]),
             Node("shape", "Const", [], {"dtype": "int32", "value": np.array([3, 2], np.int32)},
                  output_shapes=[[2]], output_dtypes=["int32"]),
             Node("s", "AddV2", ["x", "c"], {"T": "float32"}, output_shapes=[[2, 3]], output_dtypes=["float32"]),
             Node("i", "Identity", ["s"], {"T": "float32"}, output_shapes=[[2, 3]], output_dtypes=["float32"]),
             Node("r", "Reshape", ["i", "shape"], {"T": "float32", "Tshape": "int32"}, output_shapes=[[3, 2]],
                  output_dtypes=["float32"])]
    return Graph(nodes=nodes, inputs=[InputSpec("x", "float32", [2, 3])], outputs=["r:0"])


def _bits(res):
    return {k: (v.dtype.str, v.shape, np.ascontiguousarray(v).tobytes()) for k, v in res.outputs.items()}


@pytest.mark.parametrize("keep", [True, False])
def test_kept_nodes_give_the_first_replays_outputs_and_records(keep):
    g = _graph()
    x = np.array([[0.0, -0.0, np.inf], [np.nan, 65504.0, 1e-8]], np.float32)
    dev = Device("allow_mix_precision")
    first = dev.replay(g, {"x": x}, progress=False, keep_tensors=keep)
    for _ in range(2):
        again = dev.replay(g, {"x": x}, progress=False, keep_tensors=keep)
        assert _bits(again) == _bits(first)
        assert [r.__dict__ for r in again.records] == [r.__dict__ for r in first.records]
    fresh = Device("allow_mix_precision").replay(g, {"x": x}, progress=False, keep_tensors=keep)
    assert _bits(fresh) == _bits(first)
    assert first.outputs["r:0"].shape == (3, 2)


@pytest.mark.parametrize("value, match", [
    (np.zeros((3, 2), np.float32), r"op 'c' \(Const\) produced output 0 of shape \(3, 2\) where TensorFlow infers "
                                   r"\(2, 3\)"),
    (np.zeros((2, 3), np.int64), r"op 'c' \(Const\) produced output 0 of dtype int64 where TensorFlow gives "
                                 r"float32"),
])
def test_a_kept_const_met_with_another_shape_or_dtype_is_caught(value, match):
    g = _graph()
    dev = Device("allow_mix_precision")
    x = np.ones((2, 3), np.float32)
    for _ in range(2):      # the Const kept (Light), its output checked and remembered
        dev.replay(g, {"x": x}, progress=False, keep_tensors=False)
    g.nodes[1].attrs["value"] = value
    with pytest.raises(AscendEmuError, match=match):
        dev.replay(g, {"x": x}, progress=False, keep_tensors=False)


def test_a_kept_identity_met_with_another_output_shape_is_caught():
    """A kept single-output move (Light "move") whose output a later replay meets with another shape: caught there."""
    g = _graph()
    g.inputs = [InputSpec("x", "float32", [None, 3])]
    g.nodes[0].output_shapes = [[None, 3]]
    g.nodes[1].attrs["value"], g.nodes[1].output_shapes = np.arange(3, dtype=np.float32), [[3]]
    g.nodes[3].output_shapes = None       # (the AddV2 broadcasts to whatever x is)
    dev = Device("allow_mix_precision")
    for _ in range(2):
        dev.replay(g, {"x": np.ones((2, 3), np.float32)}, progress=False, keep_tensors=False)
    from ascend_emu.npu.node_plan import Light
    (entry,) = dev._plan_cache.values()
    assert type(entry[3][2][id(g.nodes[4])]) is Light      # the Identity is kept
    with pytest.raises(AscendEmuError, match=r"op 'i' \(Identity\) produced output 0 of shape \(4, 3\) where "
                                             r"TensorFlow infers \(2, 3\)"):
        dev.replay(g, {"x": np.ones((4, 3), np.float32)}, progress=False, keep_tensors=False)


def _old(x):
    return [int(v) for v in np.asarray(x).reshape(-1)]


_INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", _INTS)
def test_as_int_list_of_integer_arrays_is_int_of_each_element(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    cases = [np.array([info.min, info.max, 0, 1], dtype), np.array(info.max, dtype), np.zeros((0,), dtype),
             np.array([[2, 3], [5, 7]], dtype)[:, ::-1],     # non-contiguous
             rng.integers(info.min, info.max, (2, 3, 4), dtype=dtype, endpoint=True)]
    if info.min < 0:
        cases.append(np.array([-1, 32, -1], dtype))
    for a in cases:
        got = as_int_list(a)
        assert got == _old(a)
        assert all(type(v) is int for v in got)


@pytest.mark.parametrize("x", [[32, -1], (4,), 7, np.int32(5), np.float32(2.9), np.array([1.5, -2.5, 3.0], np.float64),
                               np.array([True, False]), np.array(-0.0, np.float16)])
def test_as_int_list_of_other_inputs_is_int_of_each_element(x):
    got = as_int_list(x)
    assert got == _old(x)
    assert all(type(v) is int for v in got)

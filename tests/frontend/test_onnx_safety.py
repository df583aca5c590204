"""Hostile ONNX models (issue 45): what a shared .onnx file can make ascend-emu read, and the models it must refuse.

Every model is built here with onnx.helper (a few elements each), so the file runs in seconds.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ascend_emu import Device
from ascend_emu.cli.main import main
from ascend_emu.errors import AscendEmuError
from ascend_emu.frontend.onnx.loader import load_onnx
from ascend_emu.frontend.tf.reference import reference

FP32 = dict(soc="Ascend910B", precision_mode="must_keep_origin_dtype")
SECRET = np.arange(1, 5, dtype=np.float32)      # what a file outside the model's directory holds


def _external(name: str, location: str, n: int = 4) -> TensorProto:
    """A float32 tensor of ``n`` elements whose data lives in file ``location`` (external data)."""
    t = helper.make_tensor(name, TensorProto.FLOAT, [n], np.zeros(n, np.float32).tobytes(), raw=True)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(4 * n))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def _model(nodes, inputs=(("x", [4]),), outputs=(("y", [4]),), opset=17, initializers=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                          initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _constant_model(location):
    """y = x + c, c a Constant node whose value is external data."""
    return _model([helper.make_node("Constant", [], ["c"], name="c", value=_external("cv", location)),
                   helper.make_node("Add", ["x", "c"], ["y"], name="add")])


def _if_body_model(location):
    """y = x + If(cond) then w_t else w_e, each ``w`` an initializer of its branch with external data."""
    def branch(tag):
        return helper.make_graph([helper.make_node("Identity", [f"w_{tag}"], [f"o_{tag}"], name=f"id_{tag}")],
                                 f"b_{tag}", [], [helper.make_tensor_value_info(f"o_{tag}", TensorProto.FLOAT, [4])],
                                 initializer=[_external(f"w_{tag}", location)])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    return _model([helper.make_node("Constant", [], ["k"], name="k", value=cond),
                   helper.make_node("If", ["k"], ["w"], name="if", then_branch=branch("t"), else_branch=branch("e")),
                   helper.make_node("Add", ["x", "w"], ["y"], name="add")])


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """``tmp_path/model`` for the model, the current directory ``tmp_path/cwd`` holding ``secret.bin``."""
    (tmp_path / "model").mkdir()
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "secret.bin").write_bytes(SECRET.tobytes())
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


@pytest.mark.parametrize("build", [_constant_model, _if_body_model])
def test_external_data_is_read_beside_the_model_only(layout, build, capsys):
    """S1: the external data of a Constant node or of an initializer in an If body is never resolved against
    the current directory; beside the model it is read, and replay and reference agree on it."""
    p = layout / "model" / "m.onnx"
    onnx.save(build("secret.bin"), str(p))
    with pytest.raises(AscendEmuError, match="external data.*not regular file"):
        load_onnx(p)
    assert main(["reference", str(p), "--dump", str(layout / "bench")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "external data" in err
    assert not (layout / "bench").exists()
    # a path out of the model's directory and a link out of it are refused the same way
    for location in ("../cwd/secret.bin", str(layout / "cwd" / "secret.bin")):
        onnx.save(build(location), str(p))
        with pytest.raises(AscendEmuError, match="external data"):
            load_onnx(p)
    os.symlink(layout / "cwd" / "secret.bin", layout / "model" / "link.bin")
    onnx.save(build("link.bin"), str(p))
    with pytest.raises(AscendEmuError, match="symbolic link"):
        load_onnx(p)
    # the data beside the model: read from there, from any current directory
    (layout / "model" / "w.bin").write_bytes((SECRET * 10).tobytes())
    onnx.save(build("w.bin"), str(p))
    x = {"x": np.ones(4, np.float32)}
    ref = reference(p, x, None, progress=False)
    res = Device(**FP32).replay(load_onnx(p), ref.inputs, progress=False)
    want = 1 + SECRET * 10
    np.testing.assert_array_equal(next(iter(ref.outputs.values())), want)
    np.testing.assert_array_equal(next(iter(res.outputs.values())), want)


def test_in_memory_model_with_external_data_is_refused(layout):
    with pytest.raises(AscendEmuError, match="in-memory model has no directory"):
        load_onnx(_constant_model("secret.bin"))


def test_negative_input_dim_is_a_dynamic_dim(tmp_path, capsys):
    """T1 (issue 45): an input dim of -3 reached numpy's random generator (a traceback); it is a dim of no
    size, so random inputs ask for --shape, and --shape fixes it."""
    p = tmp_path / "neg.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], inputs=(("x", [2, -3]),),
                     outputs=(("y", [2, -3]),)), str(p))
    for cmd in ("replay", "reference"):
        assert main([cmd, str(p), "-q"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "unknown dimensions (2, ?); give them with --shape" in err[0], err
    assert main(["replay", str(p), "-q", "--shape", "x=2,3"]) == 0


def _w4_models():
    relu = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    w = onnx.numpy_helper.from_array(np.ones((4, 1, 3, 3), np.float32), "w")
    conv = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=0)], inputs=(("x", [1, 4, 8, 8]),),
                  outputs=(("y", [1, 4, 6, 6]),), initializers=[w])
    cplx = _model([helper.make_node("Add", ["x", "z"], ["y"], name="add")])
    cplx.graph.input.append(helper.make_tensor_value_info("z", TensorProto.COMPLEX64, [4]))
    z = onnx.numpy_helper.from_array(np.ones(4, np.complex64), "z")
    cplx2 = _model([helper.make_node("Add", ["x", "z"], ["y"], name="add")], initializers=[z])
    return {"opset 1": (_model(relu, opset=1), "imports opset 1 of ai.onnx"),
            "opset 99": (_model(relu, opset=99), "imports opset 99 of ai.onnx"),
            "Conv group=0": (conv, "has group 0"),
            "float32 + complex64 input": (cplx, "rejected by onnxruntime"),
            "float32 + complex64 initializer": (cplx2, "rejected by onnxruntime")}


@pytest.mark.parametrize("case", list(_w4_models()))
def test_models_onnxruntime_rejects_are_refused(tmp_path, case, capsys):
    """W4 (issue 45): replay produced numbers for models onnxruntime (and ATC) reject."""
    model, msg = _w4_models()[case]
    p = tmp_path / "m.onnx"
    onnx.save(model, str(p))
    assert main(["replay", str(p), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert msg in err[-1] and err[-1].startswith("ascend-emu: error:"), err


def test_random_0d_bool_input_runs_in_the_reference(tmp_path):
    """F3 (issue 45): the reference failed on its own random 0-d bool input (a numpy scalar, not an array)."""
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Not", ["b"], ["nb"], name="not"),
                           helper.make_node("Where", ["nb", "x", "z"], ["y"], name="where")], "g",
                          [vi("b", TensorProto.BOOL, []), vi("x", TensorProto.FLOAT, [4]),
                           vi("z", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])])
    p = tmp_path / "b.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    ref = reference(p, None, None, progress=False)
    assert isinstance(ref.inputs["b"], np.ndarray) and ref.inputs["b"].shape == () and ref.inputs["b"].dtype == bool
    res = Device(**FP32).replay(load_onnx(p), ref.inputs, progress=False)
    np.testing.assert_array_equal(next(iter(res.outputs.values())), next(iter(ref.outputs.values())))


def _endless_loop_model():
    """y = x + 1, 2^62 times: a Loop whose condition stays true (what Ctrl-C must stop)."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
         helper.make_node("Add", ["v_in", "one"], ["v_out"], name="inc")], "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("v_in", TensorProto.FLOAT, [4])],
        [vi("cond_out", TensorProto.BOOL, []), vi("v_out", TensorProto.FLOAT, [4])],
        initializer=[onnx.numpy_helper.from_array(np.ones(4, np.float32), "one")])
    return _model([helper.make_node("Loop", ["M", "c", "x"], ["y"], name="loop", body=body)],
                  initializers=[onnx.numpy_helper.from_array(np.array(1 << 62, np.int64), "M"),
                                onnx.numpy_helper.from_array(np.array(True), "c")])


@pytest.mark.parametrize("cmd", ["reference", "replay"])
def test_ctrl_c_stops_an_endless_loop(tmp_path, cmd, capsys):
    """H1 (issue 45): onnxruntime held the interpreter in an endless Loop, so Ctrl-C waited for it for ever."""
    import _thread
    import signal
    import threading
    import time

    p = tmp_path / "loop.onnx"
    onnx.save(_endless_loop_model(), str(p))
    load_onnx(p)    # (loaded once first: the interrupt below lands in the run, not in the imports)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(2.0, _thread.interrupt_main)
    try:
        t0 = time.perf_counter()
        timer.start()
        assert main([cmd, str(p), "-q"]) == 130
        took = time.perf_counter() - t0
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    assert "interrupted" in capsys.readouterr().err and took < 15, took
    assert not [t for t in threading.enumerate() if t.name == "onnxruntime"]


def test_if_and_loop_bodies_read_outer_tensors(tmp_path):
    """F1 (issue 45): an If branch or a Loop body that reads a tensor of the enclosing graph by name failed in
    replay (the AI CPU ran the node alone, without that tensor); it comes along as an extra input now, and
    replay equals onnxruntime's reference."""
    vi = helper.make_tensor_value_info
    F, B, I = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64

    def branch(op, tag):       # reads the outer "h" and "w", makes nothing else of its own
        return helper.make_graph([helper.make_node(op, ["h", "w"], [f"o_{tag}"], name=f"{op}_{tag}")], f"b_{tag}",
                                 [], [vi(f"o_{tag}", F, [4])])
    body = helper.make_graph(   # v += h * w, three times; the cond passes through
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
         helper.make_node("Mul", ["h", "w"], ["hw"], name="mul"),
         helper.make_node("Add", ["v_in", "hw"], ["v_out"], name="acc")], "body",
        [vi("i", I, []), vi("cond_in", B, []), vi("v_in", F, [4])], [vi("cond_out", B, []), vi("v_out", F, [4])])
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["k"], name="positive"),
             helper.make_node("If", ["k"], ["a"], name="if", then_branch=branch("Add", "t"),
                              else_branch=branch("Sub", "e")),
             helper.make_node("Loop", ["M", "c", "a"], ["y"], name="loop", body=body)]
    inits = [onnx.numpy_helper.from_array(np.asarray([0.5, -1, 2, 3], np.float32), "w"),
             onnx.numpy_helper.from_array(np.asarray(0, np.float32), "zero"),
             onnx.numpy_helper.from_array(np.asarray(3, np.int64), "M"),
             onnx.numpy_helper.from_array(np.asarray(True), "c")]
    p = tmp_path / "cf.onnx"
    onnx.save(_model(nodes, initializers=inits), str(p))
    for x in (np.asarray([1, -2, 3, 4], np.float32), np.asarray([-1, -2, 3, -4], np.float32)):
        ref = reference(p, {"x": x}, None, progress=False)
        res = Device(**FP32).replay(load_onnx(p), ref.inputs, progress=False)
        h = np.maximum(x, 0)
        want = (h + [0.5, -1, 2, 3] if x.sum() > 0 else h - [0.5, -1, 2, 3]) + 3 * h * [0.5, -1, 2, 3]
        np.testing.assert_allclose(next(iter(ref.outputs.values())), want, rtol=1e-6)
        np.testing.assert_array_equal(next(iter(res.outputs.values())), next(iter(ref.outputs.values())))


def test_a_sparse_initializer_is_read(tmp_path):
    """F4 (issue 45): a sparse initializer was blamed on the graph ("reads 'w', which nothing before it makes");
    it is densified as onnxruntime does, in replay and in the reference."""
    vals = onnx.numpy_helper.from_array(np.asarray([5.0, 7.0], np.float32), "w")
    idx = onnx.numpy_helper.from_array(np.asarray([1, 3], np.int64), "w_idx")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")])
    m.graph.sparse_initializer.extend([helper.make_sparse_tensor(vals, idx, [4])])
    p = tmp_path / "sparse.onnx"
    onnx.save(m, str(p))
    assert load_onnx(p).name == "sparse"
    x = {"x": np.ones(4, np.float32)}
    ref = reference(p, x, tmp_path / "bench", progress=False)
    res = Device(**FP32).replay(load_onnx(p), ref.inputs, progress=False)
    for got in (ref.outputs, res.outputs):
        np.testing.assert_array_equal(next(iter(got.values())), [1, 6, 1, 8])
    from ascend_emu.analysis.dump import load_dump

    np.testing.assert_array_equal(load_dump(tmp_path / "bench").tensor("w"), [0, 5, 0, 7])

"""The TF1 dataflow executor on hand-built graphs (no TensorFlow): dead branches, loop frames, names."""
import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.graph.core import Node
from ascend_emu.graph.dataflow import check_live, run_dataflow, sibling_name


def _eval(node, args):
    fns = {"Placeholder": lambda: (np.float32(3.0),), "Const": lambda: (np.asarray(node.attrs["value"]),),
           "Neg": lambda: (-args[0],), "Less": lambda: (args[0] < args[1],), "AddV2": lambda: (args[0] + args[1],),
           "Mul": lambda: (args[0] * args[1],), "Identity": lambda: (args[0],)}
    return fns[node.op]()


def N(name, op, inputs=(), n=1, control=(), **attrs):
    return Node(name=name, op=op, inputs=list(inputs), attrs=attrs, num_outputs=n, control_inputs=list(control))


def test_switch_merge_runs_one_branch_and_constants_follow_their_pivot():
    nodes = [N("x", "Placeholder"), N("p", "Const", value=np.bool_(False)),
             N("sw", "Switch", ["x", "p"], 2), N("t", "Identity", ["sw:1"]), N("f", "Identity", ["sw:0"]),
             N("c", "Const", control=["t"], value=np.float32(100)),       # the true branch's constant
             N("neg", "Neg", ["f"]), N("m", "Merge", ["c", "neg"], 2)]
    ran, reported = [], []
    env = run_dataflow(nodes, {}, lambda n, a: (ran.append(n.name), _eval(n, a))[1],
                       on_control=lambda n, o: reported.append(n.name))
    assert env["m:0"] == -3.0 and env["m:1"] == 1            # the false branch's value, input index 1
    assert "c" not in ran and "neg" in ran and reported == ["m"]


def test_switch_n_takes_the_index_and_the_last_branch_out_of_range():
    for index, want in ((1, "b1"), (7, "b2")):
        nodes = [N("x", "Placeholder"), N("i", "Const", value=np.int32(index)),
                 N("sw", "_SwitchN", ["x", "i"], 3, num_outs=3)] + \
                [N(f"b{k}", "Neg", [f"sw:{k}"]) for k in range(3)]
        env = run_dataflow(nodes, {}, lambda n, a: _eval(n, a))
        assert [k for k in ("b0:0", "b1:0", "b2:0") if k in env] == [want + ":0"]


def _loop(limit):
    """i = 0; acc = x; while i < limit: i += 1; acc *= 2"""
    frame = {"frame_name": "loop/while_context"}
    return [N("x", "Placeholder"), N("zero", "Const", value=np.int32(0)), N("lim", "Const", value=np.int32(limit)),
            N("loop/Enter", "Enter", ["zero"], **frame), N("loop/Enter_1", "Enter", ["x"], **frame),
            N("loop/Enter_2", "Enter", ["lim"], is_constant=True, **frame),
            N("loop/Merge", "Merge", ["loop/Enter", "loop/NextIteration"], 2),
            N("loop/Merge_1", "Merge", ["loop/Enter_1", "loop/NextIteration_1"], 2),
            N("loop/Less", "Less", ["loop/Merge", "loop/Enter_2"]), N("loop/LoopCond", "LoopCond", ["loop/Less"]),
            N("loop/Switch", "Switch", ["loop/Merge", "loop/LoopCond"], 2),
            N("loop/Switch_1", "Switch", ["loop/Merge_1", "loop/LoopCond"], 2),
            N("loop/one", "Const", control=["loop/Switch"], value=np.int32(1)),
            N("loop/two", "Const", control=["loop/Switch"], value=np.float32(2)),
            N("loop/add", "AddV2", ["loop/Switch:1", "loop/one"]),
            N("loop/mul", "Mul", ["loop/Switch_1:1", "loop/two"]),
            N("loop/NextIteration", "NextIteration", ["loop/add"]),
            N("loop/NextIteration_1", "NextIteration", ["loop/mul"]),
            N("loop/Exit", "Exit", ["loop/Switch"]), N("loop/Exit_1", "Exit", ["loop/Switch_1"]),
            N("out", "Neg", ["loop/Exit_1"])]


@pytest.mark.parametrize("limit", [0, 1, 4])
def test_loop_runs_each_iteration_under_its_own_name(limit):
    ran = []
    env = run_dataflow(_loop(limit), {}, lambda n, a: (ran.append(n.name), _eval(n, a))[1])
    check_live(env, ["out"])
    assert env["out:0"] == -3.0 * 2 ** limit and env["loop/Exit:0"] == limit
    assert [n for n in ran if n.endswith("/mul")] == [f"loop/body/{k}/mul" for k in range(limit)]
    assert [n for n in ran if n.endswith("/Less")] == [f"loop/cond/{k}/Less" for k in range(limit + 1)]
    assert f"loop/body/{limit}/add" not in env and f"loop/cond/{limit}/Merge_1:0" in env


def test_dead_output_and_names():
    nodes = [N("x", "Placeholder"), N("p", "Const", value=np.bool_(False)),
             N("sw", "Switch", ["x", "p"], 2), N("y", "Neg", ["sw:1"])]
    env = run_dataflow(nodes, {}, lambda n, a: _eval(n, a))
    with pytest.raises(AscendEmuError, match="output 'y:0' of the graph is dead"):
        check_live(env, ["y"])
    assert sibling_name("loop/body/2/add", "loop/add", "loop/mul") == "loop/body/2/mul"
    assert sibling_name("a/b", "a/b", "a/c") == "a/c"

"""A replay whose first overflowing op is a Cast the replay inserted in front of a fused op."""
import numpy as np


def cast_into_chain(tmp_path, **device):
    """x / 1e3 -> Relu -> Tanh fused into one _EltwiseChain under force_fp16: the float32 input 1e5 overflows in
    the Cast the replay inserts in front of the chain (the first overflowing op), not in the chain. Returns the
    dump directory ``tmp_path / "d"``."""
    from ascend_emu import Device
    from ascend_emu.graph import Graph, InputSpec, Node

    x = Node("x", "Placeholder", [], {"dtype": "float32", "shape": [4]})
    c = Node("c", "Const", [], {"dtype": "float32", "value": np.float32(1e3)})
    nodes = [x, c, Node("d", "RealDiv", ["x", "c"], {"T": "float32"}), Node("r", "Relu", ["d"], {"T": "float32"}),
             Node("t", "Tanh", ["r"], {"T": "float32"})]
    g = Graph(nodes, [InputSpec("x", "float32", [4])], ["t:0"], name="g")
    Device("force_fp16", **device).replay(g, {"x": np.full(4, 1e5, np.float32)}, tmp_path / "d", progress=False)
    return tmp_path / "d"

"""A replayed node's fixed cost (issue 46): ``python -m benchmarks.node_cost``. A chain of 300 float32 nodes of 16
floats (Mul, AddV2, Relu by turns; fusion off, so each stays a node; ``must_keep_origin_dtype``, so no cast is
inserted) replayed with no dump and no kept tensors, against the same registry functions called alone on the same
arguments with a copy of the replay's op context each call. Process CPU, rounds alternating, each round's best of 5;
the difference per node is what the device does around an op. Not part of ``python -m benchmarks``'s rows."""
from __future__ import annotations

import copy
import statistics
import time

import numpy as np

N = 300
OPS3 = ("Mul", "AddV2", "Relu")


def chain(n: int = N, size: int = 16):
    from ascend_emu.graph.core import Graph, InputSpec, Node

    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [size]}),
             Node("c", "Const", [], {"dtype": "float32", "value": np.full(size, 0.75, np.float32)})]
    prev = "x"
    for i in range(n):
        op = OPS3[i % 3]
        nodes.append(Node(f"n{i}", op, [prev] if op == "Relu" else [prev, "c"], {"T": "float32"}))
        prev = f"n{i}"
    return Graph(nodes=nodes, inputs=[InputSpec("x", "float32", [size])], outputs=[f"{prev}:0"])


def measure(rounds: int = 14) -> dict:
    """Microseconds a node: the replay's and the ops' alone (median and best of ``rounds``)."""
    import ascend_emu as ae
    from ascend_emu.ops import OPS

    g = chain()
    x = {"x": np.random.default_rng(0).standard_normal(16).astype(np.float32)}
    dev = ae.Device("must_keep_origin_dtype", fusion_switch="off")
    ctx = dev.context("float32")
    a, c = x["x"], np.full(16, 0.75, np.float32)
    fns = [OPS[OPS3[i % 3]].fn for i in range(N)]

    def replay():
        dev.replay(g, x, progress=False, keep_tensors=False)

    def alone():
        for i, fn in enumerate(fns):
            if i % 3 == 2:
                fn(a, ctx=copy.copy(ctx))
            else:
                fn(a, c, ctx=copy.copy(ctx))

    for _ in range(3):
        replay()
        alone()
    got: dict = {"replay": [], "alone": []}
    for r in range(rounds):
        for name, fn in ((("replay", replay), ("alone", alone)) if r % 2 else (("alone", alone), ("replay", replay))):
            best = float("inf")
            for _ in range(5):
                t = time.process_time()
                fn()
                best = min(best, time.process_time() - t)
            got[name].append(best / N * 1e6)
    return {k: (statistics.median(v), min(v)) for k, v in got.items()}


def main() -> None:
    m = measure()
    (rm, rb), (am, ab) = m["replay"], m["alone"]
    print(f"a node in the replay: {rm:.2f} us (median; best {rb:.2f}); its op alone: {am:.2f} us (best {ab:.2f}); "
          f"the device's own work: {rm - am:.2f} us a node ({N} float32 nodes of 16 values, process CPU)")


if __name__ == "__main__":
    main()

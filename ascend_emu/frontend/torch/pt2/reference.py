"""The float32 reference of an exported PyTorch program: torch on the CPU, every FX node's outputs dumped.

The decomposed program the graph was built from (:class:`.loader.Pt2Source`) runs node by node in torch, each
aten call as torch computes it on the CPU, in the program's own dtypes (float32 for a float32 model), on the same
inputs as the replay. The dump has one op per graph node that stands for an FX node, input or parameter, under
the graph's names and output indices, so the emulator's dump of the same graph aligns op for op (its own helper
nodes, such as a layout transpose or a lowering's inner ops, are NPU-only rows in compare). Engines: ``HOST`` for
Const and Placeholder, ``TORCH`` for the rest.
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from ....errors import AscendEmuError
from ....graph.core import Graph
from ..convert import from_numpy, to_numpy


def run_program(graph: Graph, feeds: dict) -> dict:
    """FX node name -> value (a tensor or a tuple of them) of every node of ``graph``'s program, run in torch."""
    src = graph.pt2
    ep = src.program
    consts = {**ep.state_dict, **ep.constants}
    kinds = {s.arg.name: s for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    env: dict = {}

    def value(x):
        if isinstance(x, torch.fx.Node):
            return env[x.name]
        if isinstance(x, (list, tuple)):
            return type(x)(value(v) for v in x)
        if isinstance(x, dict):
            return {k: value(v) for k, v in x.items()}
        return x

    with torch.no_grad():
        for n in ep.graph.nodes:
            if n.op == "placeholder":
                spec = kinds.get(n.name)
                if spec is None or spec.kind.name == "USER_INPUT":
                    env[n.name] = from_numpy(np.asarray(feeds[n.name]))
                else:
                    env[n.name] = consts[spec.target].detach()
            elif n.op == "call_function":
                if n.target is operator.getitem:
                    env[n.name] = value(n.args[0])[n.args[1]]
                    continue
                try:
                    env[n.name] = n.target(*value(n.args), **value(n.kwargs))
                except Exception as e:
                    line = str(e).strip().splitlines()
                    raise AscendEmuError(f"torch failed on node {n.name} ({n.target}) of program {graph.name!r}: "
                                         f"{(line[0] if line else type(e).__name__)[:300]}") from None
    return env


def pt2_records(graph: Graph, feeds: dict) -> tuple[list, dict]:
    """``(node, outputs)`` for every graph node that stands for an FX node, input or parameter, in graph order,
    and the tensors by graph name (``"node:i"``), from one torch run."""
    env = run_program(graph, feeds)
    ran, tensors = [], {}
    for node in graph.nodes:
        names = graph.pt2.nodes.get(node.name)
        if names is None:
            continue        # a node of the emulator's own (a lowering's inner op, a helper constant)
        outs = []
        for fx, idx in names:
            v = env.get(fx)
            if idx is not None and isinstance(v, (list, tuple)):
                v = v[idx]
            outs.append(np.array(to_numpy(v.contiguous())) if isinstance(v, torch.Tensor) else np.zeros(0, np.float32))
        for i, v in enumerate(outs):
            tensors[f"{node.name}:{i}"] = v
        ran.append((node, outs))
    return ran, tensors


def version() -> str:
    return torch.__version__


def config(version: str) -> dict:
    return {"framework": "pytorch", "torch_version": version, "device": "CPU",
            "dtype": "original (float32 for float32 models)",
            "program": "torch.export, decomposed to the aten ops the eager dispatcher calls"}

"""The benchmark: run the loaded graph in TensorFlow on the CPU and dump every op.

The cleaned GraphDef of :func:`ascend_emu.frontend.tf.loader.load_graph` is imported into a
``tf.compat.v1`` Session with Grappler switched off, so TensorFlow executes
exactly the nodes the emulator replays, one kernel per node, in the model's own
dtypes (float32 for float32 models). Every output of every node is fetched in
one run and written with :class:`ascend_emu.analysis.dump.DumpWriter` as a ``"bench"``
dump whose op names are the graph's node names, so the emulator's dump of the
same graph aligns op for op.

With ``stats_only`` the run streams instead (:func:`run_graph_streaming`): the nodes
run in segments of :data:`SEGMENT_OPS` in one Session, each segment fed the tensors
it needs from earlier ones, each op's statistics written as soon as it has run, and
a tensor kept only until its last consumer has run. Peak memory is then a segment's
outputs plus the tensors still waiting for a consumer, not every tensor of the
model; every op still runs exactly once, with the same kernels on the same inputs.

Engines in the dump: ``HOST`` for ``Const`` and ``Placeholder`` (nothing is
computed; the interpreter records them the same way), ``TF`` for every other op.
The compute dtype of an op is the dtype of its first output.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from ...analysis.dump import check_dump_dir
from ...errors import AscendEmuError
from ...graph.core import Graph, split_tensor_name, tensor_name

#: op types recorded with engine HOST (no computation)
HOST_OPS = frozenset({"Const", "Placeholder"})
#: nodes per Session.run when the reference streams (--stats-only)
SEGMENT_OPS = 16


@dataclass
class ReferenceResult:
    """What :func:`reference` returns.

    Attributes
    ----------
    graph : Graph
        The graph that ran.
    inputs : dict
        Placeholder name -> the array fed.
    outputs : dict
        The model's output tensor names (``graph.outputs``) -> arrays.
    tensors : dict
        Every tensor of the run, ``"node:index"`` -> array (with ``stats_only``, which
        streams, only the model's outputs).
    dump : str or None
        The dump directory, if one was written.
    summary : dict
        Op counts per engine and dtype, non-finite ops, TensorFlow version, seconds.
    """

    graph: Graph
    inputs: dict
    outputs: dict
    tensors: dict = field(repr=False)
    dump: str | None = None
    summary: dict = field(default_factory=dict)

    def tensor(self, name: str) -> np.ndarray:
        """Output ``"node:i"`` (or ``"node"`` for output 0) of the run."""
        key = tensor_name(name)
        try:
            return self.tensors[key]
        except KeyError:
            node, idx = split_tensor_name(key)
            raise KeyError(f"no tensor {key!r} in the reference run (node {node!r} "
                           f"{'does not exist' if not any(k.startswith(node + ':') for k in self.tensors) else f'has no output {idx}'})") from None

    @property
    def output_list(self) -> list[np.ndarray]:
        """The outputs in ``graph.outputs`` order."""
        return [self.outputs[t] for t in self.graph.outputs]


def run_graph(graph: Graph, feeds: dict, fetches: list[str]) -> list[np.ndarray]:
    """Run ``graph.graph_def`` in TensorFlow on the CPU (no Grappler), feeding placeholders by name."""
    from .tf import first_line
    with _session(graph) as sess:
        try:
            return sess.run(fetches, {f"{k}:0": v for k, v in feeds.items()})
        except Exception as e:
            raise AscendEmuError(f"TensorFlow failed to run graph {graph.name!r}: {first_line(e)}") from None


def _session(graph: Graph):
    from .tf import first_line, import_tf, session_config
    tf = import_tf()
    if not graph.graph_def:
        raise AscendEmuError(f"graph {graph.name!r} carries no GraphDef; build it with load_graph")
    gd = tf.compat.v1.GraphDef.FromString(graph.graph_def)
    tfg = tf.Graph()
    try:
        with tfg.as_default():
            tf.compat.v1.import_graph_def(gd, name="")
    except Exception as e:
        raise AscendEmuError(f"TensorFlow cannot import graph {graph.name!r}: {first_line(e)}") from None
    return tf.compat.v1.Session(graph=tfg, config=session_config())


def run_graph_streaming(graph: Graph, feeds: dict, on_node, segment: int = SEGMENT_OPS) -> dict:
    """Run every node of ``graph`` once, ``segment`` nodes per ``Session.run``, calling
    ``on_node(node, outputs)`` in graph order; returns the model's outputs.

    Each run fetches one segment's outputs and feeds the tensors it reads from earlier
    segments; a tensor is dropped once its last consumer has run (the model's outputs
    are kept), so memory stays at a segment plus the tensors still in flight.
    """
    from ...graph.interpreter import last_uses
    from .tf import first_line

    nodes = graph.nodes
    last = last_uses(nodes, keep=graph.outputs)
    out_names = {tensor_name(o) for o in graph.outputs}
    live: dict = {}
    outputs: dict = {}
    base = {f"{k}:0": v for k, v in feeds.items()}
    with _session(graph) as sess:
        for start in range(0, len(nodes), segment):
            seg = nodes[start:start + segment]
            fetches = [t for node in seg for t in node.outputs()]
            made = set(fetches)
            feed = dict(base)
            for node in seg:
                for ref in node.inputs:
                    t = tensor_name(ref)
                    if t not in made and t in live:
                        feed[t] = live[t]
            try:
                values = sess.run(fetches, feed) if fetches else []
            except Exception as e:
                raise AscendEmuError(f"TensorFlow failed to run graph {graph.name!r}: {first_line(e)}") from None
            got = dict(zip(fetches, (np.asarray(v) for v in values)))
            del values
            for i, node in enumerate(seg, start):
                outs = [got[t] for t in node.outputs()]
                on_node(node, outs)
                for t in node.outputs():
                    if t in last:
                        live[t] = got[t]
                    if t in out_names:
                        outputs[t] = got[t]
                for ref in node.inputs:
                    t = tensor_name(ref)
                    if last.get(t) == i:
                        live.pop(t, None)
            del got
    return outputs


def reference(model, inputs=None, dump_dir=None, *, signature=None, shapes=None, seed: int = 0,
              overwrite: bool = False, stats_only: bool = False, select=None,
              progress: bool = True) -> ReferenceResult:
    """Run ``model`` in TensorFlow (float32 for float32 models) on the CPU; optionally dump every op. An ONNX
    model runs in onnxruntime, an exported PyTorch program (``.pt2``) in torch.

    Parameters
    ----------
    model : Keras model, path, tf.function, ConcreteFunction or Graph
        Anything :func:`ascend_emu.frontend.tf.loader.load_graph` accepts.
    inputs : None, dict, array, list
        As :func:`ascend_emu.frontend.inputs.make_inputs`: ``None`` for seeded random inputs.
    dump_dir : str or os.PathLike, optional
        Write a ``"bench"`` dump here. Refused if it exists and is not empty,
        unless ``overwrite``.
    signature : str, optional
        SavedModel signature (default ``"serving_default"``).
    shapes : dict or list of str, optional
        Shapes for inputs whose signature leaves dimensions unknown.
    seed : int
        Seed of random inputs.
    overwrite, stats_only, select
        Passed to :class:`ascend_emu.analysis.dump.DumpWriter`: replace an existing dump;
        statistics only; ``select(name, tf_type) -> bool`` chooses which ops get
        tensor files.
    progress : bool
        Show a progress bar (stderr) while the dump is written.

    Returns
    -------
    ReferenceResult
    """
    from ..inputs import make_inputs
    from .loader import load_graph
    if dump_dir is not None:
        check_dump_dir(dump_dir, overwrite)   # refuse before spending time on the run
    graph = model if isinstance(model, Graph) else load_graph(model, signature=signature,
                                                              input_shapes=shapes)
    feeds = make_inputs(graph, inputs, seed=seed, shapes=shapes)
    if graph.onnx is not None:
        return _door_reference(graph, feeds, dump_dir, overwrite=overwrite, stats_only=stats_only, select=select,
                               progress=progress)
    if graph.pt2 is not None:
        return _door_reference(graph, feeds, dump_dir, overwrite=overwrite, stats_only=stats_only, select=select,
                               progress=progress, torch=True)
    if stats_only and dump_dir is not None and not _has_loops(graph):
        # (loops and branches run call by call, which streaming by segments cannot do: their
        # statistics are written from the full run)
        return _reference_streaming(graph, feeds, dump_dir, overwrite=overwrite, select=select, progress=progress)
    t0 = time.perf_counter()
    tensors, ran = _run_all(graph, feeds)
    seconds_run = time.perf_counter() - t0

    from .tf import import_tf

    tally = _Tally()
    records = [(node, *tally.add(node, outs), outs) for node, outs in ran]
    summary = tally.summary(graph, import_tf().__version__, ops=len(records))

    if dump_dir is not None:
        _write_dump(dump_dir, graph, feeds, records, summary, overwrite=overwrite,
                    stats_only=stats_only, select=select, progress=progress)
    summary = dict(summary, seconds=round(time.perf_counter() - t0, 3), seconds_run=round(seconds_run, 3))
    outputs = {t: tensors[tensor_name(t)] for t in graph.outputs}
    return ReferenceResult(graph, feeds, outputs, tensors,
                           dump=os.fspath(dump_dir) if dump_dir is not None else None, summary=summary)


def _door_reference(graph, feeds, dump_dir, *, overwrite, stats_only, select, progress,
                    torch: bool = False) -> ReferenceResult:
    """An ONNX model's reference: onnxruntime float32 on the CPU (:mod:`.onnx_reference`), engine ``ORT``; an
    exported PyTorch program's (``torch``): torch on the CPU (:mod:`..torch.pt2.reference`), engine ``TORCH``."""
    if torch:
        from ..torch.pt2.reference import config, pt2_records as records_of, version
    else:
        from ..onnx.reference import config, onnx_records as records_of, version

    t0 = time.perf_counter()
    ran, tensors = records_of(graph, feeds)
    seconds_run = time.perf_counter() - t0
    tally = _Tally(engine="TORCH" if torch else "ORT")
    records = [(node, *tally.add(node, outs), outs) for node, outs in ran]
    summary = tally.summary(graph, None, ops=len(records))
    key = "torch" if torch else "onnxruntime"
    summary[key] = version()
    if dump_dir is not None:
        _write_dump(dump_dir, graph, feeds, records, summary, overwrite=overwrite, stats_only=stats_only,
                    select=select, progress=progress, config=config(summary[key]))
    summary = dict(summary, seconds=round(time.perf_counter() - t0, 3), seconds_run=round(seconds_run, 3))
    outputs = {t: tensors[tensor_name(t)] for t in graph.outputs}
    return ReferenceResult(graph, feeds, outputs, tensors,
                           dump=os.fspath(dump_dir) if dump_dir is not None else None, summary=summary)


def _has_loops(graph: Graph) -> bool:
    from ...graph.control_flow import CONTROL_FLOW
    from ...graph.dataflow import has_dataflow_control_flow
    return has_dataflow_control_flow(graph.nodes) or any(n.op in CONTROL_FLOW for n in graph.nodes)


def _run_all(graph: Graph, feeds: dict) -> tuple[dict, list]:
    """Every tensor of the run by name, and ``(node, outputs)`` per op in execution order, loops and
    branches included: each iteration's ops under the names the emulated device gives them (:mod:`.loops`)."""
    from ...graph.dataflow import has_dataflow_control_flow
    from .loops import expand_control_flow, run_tf1_graph, variant_placeholder

    if has_dataflow_control_flow(graph.nodes):
        return run_tf1_graph(graph, feeds)
    # a TF variant (a loop's TensorList) cannot be fetched: it is recorded without a tensor
    variant = {t for node in graph.nodes for i, t in enumerate(node.outputs())
               if node.output_dtypes is not None and node.output_dtypes[i] in ("variant", "resource")}
    fetches = [t for node in graph.nodes for t in node.outputs() if t not in variant]
    values = run_graph(graph, feeds, fetches)
    tensors = {t: np.asarray(v) for t, v in zip(fetches, values)}
    tensors.update((t, variant_placeholder()) for t in variant)
    ran = [(node, [tensors[t] for t in node.outputs()]) for node in graph.nodes]
    return tensors, expand_control_flow(graph, tensors, feeds, ran)


def _reference_streaming(graph, feeds, dump_dir, *, overwrite, select, progress) -> ReferenceResult:
    """The stats-only reference: statistics written op by op while the graph runs in segments."""
    from ...analysis.dump import DumpWriter
    from ..inputs import inputs_sha256
    from .tf import import_tf

    tf = import_tf()
    t0 = time.perf_counter()
    tally = _Tally()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(graph.nodes), desc="reference", unit="op", leave=False, dynamic_ncols=True, disable=None)
    try:
        with DumpWriter(dump_dir, kind="bench", config=_config(tf.__version__), model=graph.dump_model(),
                        inputs_sha256=inputs_sha256(feeds), overwrite=overwrite, stats_only=True,
                        select=select) as w:
            def on_node(node, outs):
                _add_op(w, node, *tally.add(node, outs), outs)
                if bar is not None:
                    bar.update(1)

            outputs = run_graph_streaming(graph, feeds, on_node, SEGMENT_OPS)
            summary = tally.summary(graph, tf.__version__)
            w.finish(summary)
    finally:
        if bar is not None:
            bar.close()
    seconds = round(time.perf_counter() - t0, 3)
    summary = dict(summary, seconds=seconds, seconds_run=seconds)
    outputs = {t: outputs[tensor_name(t)] for t in graph.outputs}
    return ReferenceResult(graph, feeds, outputs, dict(outputs), dump=os.fspath(dump_dir), summary=summary)


class _Tally:
    """Ops per engine and dtype, and the ops with inf/nan outputs, as the reference runs them."""

    def __init__(self, engine: str = "TF"):
        self.counts: dict = {}
        self.nonfinite: list = []
        self.engine = engine

    def add(self, node, outs) -> tuple[str, str]:
        engine = "HOST" if node.op in HOST_OPS else self.engine
        dtype = outs[0].dtype.name if outs else ""
        per = self.counts.setdefault(engine, {})
        per[dtype or "-"] = per.get(dtype or "-", 0) + 1
        if any(o.dtype.kind == "f" and o.size and not np.isfinite(o).all() for o in outs):
            self.nonfinite.append(node.name)
        return engine, dtype

    def summary(self, graph, tf_version: str, ops: int | None = None) -> dict:
        out = {"ops": len(graph.nodes) if ops is None else ops, "per_engine_dtype": self.counts,
               "nonfinite_ops": len(self.nonfinite),
               "first_nonfinite": self.nonfinite[0] if self.nonfinite else None,
               "outputs": list(graph.outputs)}
        if tf_version is not None:
            out["tensorflow"] = tf_version
        return out


def _add_op(w, node, engine: str, dtype: str, outs) -> None:
    """One reference op in the dump (its phase too, for a training step's graph)."""
    from ...ops.ascend_types import ascend_type

    atype = "Data" if node.op == "Placeholder" else ascend_type(node.op)
    w.add_op(node.name, node.op, atype, engine, dtype or None, [tensor_name(r) for r in node.inputs], outs, 0,
             attrs=node.attrs, phase=node.meta.get("phase"))


def _config(tf_version: str) -> dict:
    return {"framework": "tensorflow", "tensorflow_version": tf_version, "device": "CPU",
            "dtype": "original (float32 for float32 models)", "grappler": "off"}


def _write_dump(dump_dir, graph, feeds, records, summary, *, overwrite, stats_only, select, progress, config=None):
    from ...analysis.dump import DumpWriter
    from ..inputs import inputs_sha256

    config = config or _config(summary["tensorflow"])
    model = graph.dump_model()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(records), desc="reference dump", unit="op", leave=False, dynamic_ncols=True, disable=None)
    try:
        with DumpWriter(dump_dir, kind="bench", config=config, model=model,
                        inputs_sha256=inputs_sha256(feeds), overwrite=overwrite,
                        stats_only=stats_only, select=select, sources=graph.sources()) as w:
            for node, engine, dtype, outs in records:
                _add_op(w, node, engine, dtype, outs)
                if bar is not None:
                    bar.update(1)
            w.finish(summary)
    finally:
        if bar is not None:
            bar.close()

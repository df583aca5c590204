"""``fit``: which values of the assumed parameters reproduce a dump (NUMERICS.md, "Assumed parameters").

Every dumped AI Core op is rerun alone on the dump's own input tensors (teacher forcing: what the op saw
on the device that made the dump, not what the emulator would have computed upstream), through the
device's own node evaluator (its precision decision, inserted casts and the op of the registry), under
each candidate value of the assumed parameters that act on its kind
(:data:`ascend_emu.numerics.assumptions.ASSUMED`). A candidate's score on an op is the fraction of the
op's output elements it reproduces bit for bit (its inserted casts count as ops of their own); where it
does not, the largest absolute error is kept.

Parameters that act on the same ops are fitted together (one group: the cube's block sum, extra bits,
normalisation and Conv2D K order), over every combination; the groups are fitted one after the other with
the others at their current best, twice if the first round moved something and left an op unexplained.
A group's best combination reproduces the most elements (ties: the current values, then registry
order). Per parameter the verdict is

- ``decided``: one value reaches the best score and some op tells the values apart;
- ``undecided``: several values reach it (no op of the dump could tell them apart; also a parameter
  acting on no op of the dump, or one inactive under the best values of its group);
- ``contradicted``: some op of its group is reproduced by no candidate at all.

The candidates run on the sweep layer (:class:`ascend_emu.tools.sweep.Sweep`, serially or on Dask): the dump is
read once into a :class:`FitContext` that each worker receives once, and a candidate is a :class:`FitJob` of a few
parameter values. The result does not depend on where the candidates ran.
"""
from __future__ import annotations

import copy
import itertools
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..analysis.compare import added_nodes
from ..analysis.dump.format import CODED_FORMATS
from ..errors import AscendEmuError
from ..numerics import assumptions as _asm
from ..npu.precision import HIF8_MODES

#: the groups fitted jointly, in the order they are fitted: HF32's first, as its casts are scored alone and the
#: cube ops' accumulation then sees the right operands
GROUPS = ("hf32", "cube", "vector", "multicore")


@dataclass
class FitContext:
    """What every candidate of a fit shares, read from the dump once: the model, the run's device and every
    dumped tensor a rerun reads. A sweep ships it to each worker once (:meth:`~ascend_emu.tools.sweep.Sweep.map`'s
    ``shared``); a candidate is then a :class:`FitJob` of a few parameters. The dump need not be on the workers'
    disks: its tensors travel here."""

    model: object            # a path (each worker loads it once) or a Graph (without its serialised GraphDef)
    fingerprint: str
    dump: str                # the dump's path, for messages
    device: object
    tensors: dict            # "op:index" -> the dumped tensor, read once (a coded format already widened)
    ops: dict                # op name -> its engine, for every op of the dump
    coded: frozenset         # ops whose first output the dump holds as codes of a format (hifloat8)
    host: tuple              # the graph engine's constants of the dump (HOST ops' outputs), as "op:index"
    signature: str | None = None
    shapes: object = None
    #: this process's graph and fused graph (made on first use where the context lands; never shipped)
    _prepared: tuple | None = field(default=None, repr=False, compare=False)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_prepared"] = None
        return state

    def prepared(self):
        """(graph, fused graph) in this process: loaded and fused once, not once per candidate."""
        if self._prepared is None:
            graph = _graph(self)
            self._prepared = (graph, self.device._fused(graph))
        return self._prepared


@dataclass
class FitJob:
    """One candidate's rerun: the assumed parameters' values and which ops it reruns (what a worker gets);
    ``skip``: ops another candidate's rerun answers for this one (:func:`k_order_blind`)."""

    params: dict
    select: str              # "cube", "vector", "multicore" or "all"
    skip: frozenset = frozenset()


def k_order_blind(fused, tensors: dict) -> frozenset:
    """The forward Conv2D ops of graph ``fused`` whose dumped filter (in ``tensors``) no ``cube_conv_k_order`` can
    act on (:func:`ascend_emu.numerics.conv.k_order_acts`): two candidates differing in the order alone give them
    the same bits, so one rerun serves both."""
    from ..numerics.conv import k_order_acts

    out = set()
    for node in fused.nodes:
        if node.op not in ("Conv2D", "_FusedConv2D") or node.attrs.get("base", "Conv2D") != "Conv2D":
            continue
        refs = list(node.input_names())
        w = tensors.get(refs[1]) if len(refs) > 1 else None
        if w is not None and w.ndim == 4 and not k_order_acts(*w.shape[:3]):
            out.add(node.name)
    return frozenset(out)


def _twins(combos: list) -> list:
    """For each combination, the index of the first one equal to it but for ``cube_conv_k_order`` (None: itself
    first, or no such parameter)."""
    first: dict = {}
    out = []
    for i, c in enumerate(combos):
        if "cube_conv_k_order" not in c:
            out.append(None)
            continue
        key = repr(sorted((k, repr(v)) for k, v in c.items() if k != "cube_conv_k_order"))
        if key in first:
            out.append(first[key])
        else:
            first[key] = i
            out.append(None)
    return out


def read_context(dump: str, dm, model, fingerprint: str, device, signature=None, shapes=None) -> FitContext:
    """Every tensor of dump ``dm`` (at ``dump``) read once into a :class:`FitContext` for the candidates."""
    tensors = {}
    for op in dm.ops:
        for o in op.get("outputs", []):
            if o.get("file") and not o.get("skipped"):
                tensors[f"{op['name']}:{o['index']}"] = np.array(dm.tensor(op["name"], int(o["index"]), mmap=False))
    for base, added in added_nodes(dm).items():
        # an op a fusion pass split (AvgPool and its <name>_mul_layer): the graph's op gives, and its consumers
        # read, what the added node dumped (the op's own output, the window sum, is not the graph's tensor)
        if f"{added}:0" in tensors:
            tensors[f"{base}:0"] = tensors[f"{added}:0"]
    coded = frozenset(op["name"] for op in dm.ops if op.get("outputs") and op["outputs"][0].get("dtype")
                      in CODED_FORMATS)
    # the graph engine's constants; not the model's inputs (HOST in the dump too): a move of an input (an ONNX
    # model's NCHW->NHWC Transpose) runs on the AI Core with its cast, as in the replay, not folded
    host = tuple(f"{op['name']}:{o['index']}" for op in dm.ops
                 if op.get("engine") == "HOST" and op.get("tf_type") != "Placeholder" for o in op.get("outputs", []))
    return FitContext(model, fingerprint, os.fspath(dump), device, tensors,
                      {op["name"]: op.get("engine") for op in dm.ops}, coded, host, signature, shapes)


def _graph(ctx: FitContext):
    from .sweep import SweepContext, _graph_of

    return _graph_of(SweepContext(ctx.model, ctx.fingerprint, {}, np.zeros(0), ctx.signature, ctx.shapes))


def variant(device, params: dict):
    """A copy of ``device`` with the assumed parameters ``params`` set (its caches fresh)."""
    dev = copy.copy(device)
    dev.numerics = _asm.with_params(device.numerics, params)
    dev._fusion_cache = {}
    dev._plan_cache = {}
    return dev


def _fuses_alike(dev, base) -> bool:
    """Whether ``dev`` (a :func:`variant` of ``base``) fuses a graph as ``base`` does: same fusion config, lists
    and chip (the assumed parameters set none of them)."""
    return (dev.fusion is base.fusion and dev.precision is base.precision
            and dev.numerics.chip == base.numerics.chip)


def _selected(node, select: str, opdef) -> bool:
    from ..ops import CUBE, HOST
    from ..ops.multicore import MULTICORE_OPS

    if select == "all":
        return True
    if select == "cube":
        return opdef.kind == CUBE
    if select == "vector":
        return opdef.kind not in (CUBE, HOST)
    return node.op in MULTICORE_OPS


def _is_conv(node) -> bool:
    return "Conv" in str(node.attrs.get("base", node.op))


def _score(out, ref, coded: bool = False) -> tuple:
    """(elements identical bit for bit, elements, largest absolute error elsewhere); ``coded``: the dump holds the
    tensor as codes of a format it widens to float32 (hifloat8)."""
    out, ref = np.asarray(out), np.asarray(ref)
    n = int(ref.size)
    if coded and out.dtype == np.float16 and ref.dtype == np.float32 and out.shape == ref.shape:
        out = out.astype(np.float32)    # a HiFloat8 operand travels as float16; the dump widens it to float32
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return 0, n, math.inf
    if n == 0:
        return 0, 0, 0.0
    u = np.dtype(f"u{ref.dtype.itemsize}")
    o, r = out.reshape(-1), ref.reshape(-1)
    same = o.view(u) == r.view(u)
    k = int(same.sum())
    if k == n:
        return k, n, 0.0
    # only the elements whose bits differ are widened: a NaN on both sides counts as reproduced
    with np.errstate(all="ignore"):
        o64, r64 = o[~same].astype(np.float64), r[~same].astype(np.float64)
        nan = np.isnan(o64) & np.isnan(r64)
        k += int(nan.sum())
        d = np.abs(o64[~nan] - r64[~nan])
    d = d[np.isfinite(d)]
    return k, n, float(d.max()) if d.size else math.inf


def rerun_ops(ctx: FitContext, job: FitJob) -> tuple:
    """Rerun the dumped ops ``job.select`` chooses (but ``job.skip``) on the dump's own inputs under
    ``job.params``: (scores, casts) with scores op (or inserted cast) name -> (identical elements, elements, max
    abs error, tf type, whether it is a conv), casts op name -> the inserted casts first scored with it."""
    from ..graph.control_flow import CONTROL_FLOW
    from ..npu.replay import _Run
    from ..ops import HOST, OPS
    from ..ops._util import is_float

    graph, fused = ctx.prepared()
    dev = variant(ctx.device, job.params)
    if _fuses_alike(dev, ctx.device):
        # the fusion passes read the fusion config, the precision lists and the chip, none of which an assumed
        # parameter sets: the graph fused once serves every candidate
        dev._fusion_cache[id(graph)] = (graph, fused, dev.fusion, dev.precision, dev.numerics)
    fused = dev._fused(graph)
    made: dict = {}      # constants this candidate computed from the graph (the dump lacks them)

    def tensor(ref: str):
        if ref in made:
            return made[ref]
        t = ctx.tensors.get(ref)
        if t is None:
            return None
        # a read-only view: the tensors are every candidate's, and no op may change them in place
        v = t.view()
        v.flags.writeable = False
        return v

    feeds = {n.name: tensor(f"{n.name}:0") for n in fused.nodes if n.op == "Placeholder"}
    if any(v is None for v in feeds.values()):
        raise AscendEmuError(f"{ctx.dump} holds no tensor for the model input(s) "
                             f"{', '.join(k for k, v in feeds.items() if v is None)}; fit needs a dump with tensors")
    run = _Run(dev, graph, feeds, None, True)
    run.const.update(ctx.host)
    scores: dict = {}
    casts: dict = {}
    for node in fused.nodes:
        opdef = OPS.get(node.op)
        if opdef is not None and opdef.kind == HOST and node.op not in CONTROL_FLOW:
            # the graph engine's constants (weights, shapes): from the graph where the dump lacks them (an
            # imported msprobe dump holds the AI Core ops' tensors only)
            outs_in = [f"{node.name}:{i}" for i in range(max(1, len(node.output_names())))]
            if any(tensor(r) is None for r in outs_in):
                args = [tensor(r) for r in node.input_names()]
                if all(a is not None for a in args):
                    for r, o in zip(outs_in, run.eval_node(node, args)):
                        made[r] = o
            run.const.update(outs_in)
            continue
        if (opdef is None or node.op in CONTROL_FLOW or node.name not in ctx.ops
                or ctx.ops[node.name] in ("HOST", "AICPU") or not _selected(node, job.select, opdef)
                or node.name in job.skip):
            continue
        refs = list(node.input_names())
        args = [tensor(r) for r in refs]
        if any(a is None for a in args) or not any(is_float(a) for a in args):
            continue
        first = len(run.records)
        run.casts.clear()
        run.cast_outputs.clear()
        try:
            outs = run.eval_node(node, args)
        except AscendEmuError as e:
            raise AscendEmuError(f"{ctx.dump}: op {node.name} does not rerun on the dump's tensors: {e}") from None
        conv = _is_conv(node)
        for rec in run.records[first:]:
            if rec.inserted and rec.name not in scores and rec.name + ":0" in ctx.tensors:
                got = run.cast_outputs.get(rec.name + ":0")
                if got is not None:
                    scores[rec.name] = (*_score(got, tensor(rec.name + ":0"), rec.name in ctx.coded), "Cast", False)
                    casts.setdefault(node.name, []).append(rec.name)
        for i, o in enumerate(outs):
            ref = tensor(f"{node.name}:{i}")
            if ref is None or not is_float(ref):
                continue
            k, n, err = _score(o, ref)
            old = scores.get(node.name, (0, 0, 0.0))
            scores[node.name] = (old[0] + k, old[1] + n, max(old[2], err), node.op, conv)
    return scores, casts


# --------------------------------------------------------------------------------------------- combining

@dataclass
class FitResult:
    """What :func:`fit` found; ``to_json()`` is the issue's JSON, ``format_text()`` what the CLI prints."""

    dump: str
    model: str
    best: dict
    identical: float
    parameters: dict
    ops: list
    tensors: int = 0
    candidates: int = 0
    rounds: int = 1
    notes: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"dump": self.dump, "model": self.model,
                "best": {"params": dict(self.best), "identical": self.identical, "tensors": self.tensors},
                "parameters": self.parameters, "ops": self.ops, "candidates": self.candidates,
                "rounds": self.rounds, "notes": list(self.notes)}

    def format_text(self) -> str:
        lines = [f"fit {self.dump} against {self.model}: {self.candidates} candidate reruns, {self.rounds} round(s)",
                 "", f"{'parameter':<28} {'verdict':<13} value          votes (ops preferring each value)"]
        for name, p in self.parameters.items():
            votes = ", ".join(f"{k}: {v}" for k, v in p["votes"].items()) or "-"
            lines.append(f"{name:<28} {p['verdict']:<13} {str(p['value']):<14} {votes}"
                         + (f"  ({p['why']})" if p.get("why") else ""))
        bad = [o for o in self.ops if not o["reproduced"]]
        lines.append("")
        lines.append(f"best setting reproduces {self.identical:.1%} of the {self.tensors} dumped float tensors "
                     "bit for bit" + (f"; {len(bad)} op(s) no candidate reproduces: "
                                      + ", ".join(o["name"] for o in bad[:5]) + (" ..." if len(bad) > 5 else "")
                                      if bad else ""))
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in self.best.items()
                         if k not in ("multicore_reduce_min_chunk",) and v is not None)
        lines.append(f"replay with it: ascend-emu replay MODEL {flags}")
        lines += self.notes
        return "\n".join(lines)


def _label(combo: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in combo.items()) or "current"


def _combos(params: list, current: dict) -> list:
    """Every combination of the group's relevant ``params`` (inactive ones at their current value)."""
    out: list = []
    names = [a.name for a in params]
    grids = [a.tried() for a in params]
    for values in itertools.product(*grids):
        c = dict(zip(names, values))
        full = {**current, **c}
        for a in params:
            if not _asm.is_active(a.name, full):
                c[a.name] = current[a.name]
        if c not in out:
            out.append(c)
    # the current values first: ties go to them
    cur = {n: current[n] for n in names}
    if cur in out:
        out.remove(cur)
    return [cur] + out


def _verdicts(params: list, combos: list, table: dict, current: dict) -> tuple:
    """(best combo, per parameter verdict dict, per op rows) of one group's scores.

    ``table``: op -> list over combos of (identical, elements, err, type, conv) or None where not run."""
    totals = [sum(table[o][i][0] for o in table) for i in range(len(combos))]
    top = max(totals) if totals else 0
    best_i = next(i for i, t in enumerate(totals) if t == top) if totals else 0
    best = combos[best_i] if combos else {}
    out = {}
    for a in params:
        values = set()
        for i, c in enumerate(combos):
            if totals[i] != top:
                continue
            if _asm.is_active(a.name, {**current, **c}):
                values.add(c[a.name])
            else:
                values.update(a.tried())     # inactive: every value reproduces the same
        votes: dict = {}
        telling = 0
        for o, row in table.items():
            by_value: dict = {}
            for i, c in enumerate(combos):
                if _asm.is_active(a.name, {**current, **c}):
                    v = c[a.name]
                    by_value[v] = max(by_value.get(v, 0), row[i][0])
            if len(set(by_value.values())) > 1:
                telling += 1
                m = max(by_value.values())
                for v, s in by_value.items():
                    if s == m:
                        votes[str(v)] = votes.get(str(v), 0) + 1
        unexplained = [o for o, row in table.items() if max(r[0] for r in row) < row[0][1]]
        if unexplained:
            verdict, why = "contradicted", f"no candidate reproduces {unexplained[0]}" + (
                f" and {len(unexplained) - 1} more" if len(unexplained) > 1 else "")
        elif len(values) == 1 and telling:
            verdict, why = "decided", ""
        else:
            verdict = "undecided"
            tied = ", ".join(map(str, sorted(values, key=str)))
            why = ("no op of the dump tells its values apart" if len(values) == len(a.tried()) and not telling
                   else f"{tied} reproduce the dump equally (each with its own values of the other parameters "
                        f"of its group)")
        out[a.name] = {"verdict": verdict, "value": best.get(a.name, current[a.name]), "votes": votes,
                       "ops_telling": telling, "candidates": [str(v) for v in a.tried()], "why": why}
    return best, out


#: the configuration a dump's manifest records that a rerun must share for its conclusions to be about that dump
CONFIG_KEYS = ("canonical_mode", "soc", "overflow_mode", "allow_hf32", "cube_mx", "cce_ftz", "subnormals")


def refuse_other_configuration(dump, made: dict, device, command: str) -> None:
    """One line if ``device`` differs from the configuration dump ``dump`` was made with (``made``: its
    manifest's ``config``) in a key both record: a rerun in another mode or on another SoC says nothing
    about the dump (issue 45: every parameter came out "contradicted"). A run's options the user did not give
    are the dump's (:func:`adopt_configuration`), so what differs here is what the user asked for."""
    mine = device.config()
    differ = [k for k in CONFIG_KEYS if k in made and k in mine and made[k] != mine[k]]
    if differ:
        raise AscendEmuError(f"{dump} was made with {', '.join(f'{k}={made[k]}' for k in differ)}, not this "
                             f"run's {', '.join(f'{k}={mine[k]}' for k in differ)}: drop those options (then "
                             f"{command} takes the dump's) or give the dump's (its conclusions are about that "
                             "configuration)")


#: Device keywords a run takes from the dump's manifest when its user gave none (manifest key, keyword)
ADOPTED = (("soc", "soc"), ("overflow_mode", "overflow_mode"), ("allow_hf32", "allow_hf32"),
           ("subnormals", "subnormals"), ("cce_ftz", "cce_ftz"), ("cube_mx", "cube_mx"), ("keep_dtype", "keep_dtype"))


#: the keywords whose default is the SoC's
_FOLLOW_SOC = ("overflow_mode", "allow_hf32", "cce_ftz")


def adopt_configuration(made: dict, kwargs: dict, given) -> tuple[dict, list]:
    """Device keywords ``kwargs`` with the configuration dump's manifest ``made`` records in place of every
    keyword not in ``given`` (the options the user gave): the precision mode (as it was asked for, v1 or v2),
    the SoC, the overflow mode, HF32, subnormals, cce_ftz, cube_mx and the --keep-dtype lines. Returns the
    keywords and the adopted settings that differ from what the run would have used ("soc=Ascend910B", ...),
    for the one line saying so (issue 45 item 9: the manifest records the configuration, so use it)."""
    from ..npu.device import Device

    given = set(given)
    base = Device(**kwargs).config()
    out = dict(kwargs)
    if not given & {"precision_mode", "precision_mode_v2"} and made.get("precision_mode"):
        out.pop("precision_mode", None)
        out.pop("precision_mode_v2", None)
        if made.get("precision_mode_option") == "precision_mode_v2" and made.get("precision_mode_v2"):
            out["precision_mode_v2"] = made["precision_mode_v2"]
        else:
            out["precision_mode"] = made["precision_mode"]
    other_soc = "soc" in given and base.get("soc") != made.get("soc")
    for key, kw in ADOPTED:
        if other_soc and kw in _FOLLOW_SOC:
            continue        # the SoC the user gave decides them (another SoC's HF32 may not exist on it)
        if kw not in given and (key in made or key == "keep_dtype"):
            out[kw] = made.get(key)
    adopted = []
    if out != dict(kwargs):
        try:
            mine = Device(**out).config()
        except AscendEmuError:      # the dump's settings do not go with the options given: those are refused
            return dict(kwargs), []
        for key in ("precision_mode", "precision_mode_v2", *(k for k, _ in ADOPTED)):
            if mine.get(key) != base.get(key) and mine.get(key) is not None:
                v = mine[key]
                adopted.append(f"{key}={','.join(map(str, v)) if isinstance(v, list) else v}")
    return out, adopted


def fit(dump, model, inputs=None, *, device=None, device_kwargs=None, signature=None, shapes=None,
        progress: bool = True, scheduler="none", n_workers: int | None = None, params=None) -> FitResult:
    """Fit the assumed parameters to ``dump`` (a dump of ``model``'s run: a real NPU's imported with
    ``import-msprobe``, or another emulator run's).

    ``device`` (or ``device_kwargs``) is the run's configuration (precision mode, SoC, ...); its values of
    the assumed parameters are where the fit starts (and what wins ties). Without ``device``, the configuration
    keywords ``device_kwargs`` leaves out are the ones the dump's manifest records (:func:`adopt_configuration`);
    a configuration that differs from the dump's is refused. The fit runs on the dump's own
    tensors; ``inputs``, if given, are only checked against the dump's (its ``inputs_sha256``). ``params``: the
    parameter names to fit (default every one of :data:`ascend_emu.numerics.assumptions.ASSUMED`). Returns a
    :class:`FitResult`.
    """
    from ..analysis.dump import load_dump
    from ..frontend.tf.loader import load_graph
    from ..graph.core import Graph
    from ..ops import CUBE, OPS
    from ..ops.multicore import MULTICORE_OPS
    from .sweep import Sweep, SweepContext, check_scheduler, remember, sweep_device

    scheduler = check_scheduler(scheduler)
    if device is None and "device" not in (device_kwargs or {}):
        # the options not given are the dump's own (a Device given whole is the user's choice throughout)
        device_kwargs = adopt_configuration(load_dump(dump).config, dict(device_kwargs or {}), device_kwargs or ())[0]
    device = sweep_device(device, device_kwargs)
    names = list(params) if params else [a.name for a in _asm.ASSUMED]
    for n in names:
        _asm.assumed(n)
    dm = load_dump(dump)
    if dm.kind != "npu":
        raise AscendEmuError(f"{dump} is a {dm.kind} dump (a reference's, float32), not an NPU run's: fit "
                             "reproduces an NPU's dump; give that")
    if not any(o.get("engine") not in ("HOST", "AICPU") for o in dm.ops):
        raise AscendEmuError(f"{dump}: no AI Core op in the dump: nothing to fit")
    refuse_other_configuration(dump, dm.config, device, "fit")
    with Sweep(scheduler, n_workers=n_workers, progress=progress, desc="fit") as sweep:
        graph = model if isinstance(model, Graph) else load_graph(model, signature=signature, input_shapes=shapes)
        path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
        ctx = SweepContext(path or graph, graph.fingerprint, {}, np.zeros(0), signature=signature, shapes=shapes)
        remember(graph, ctx)
        fused = device._fused(graph)
        aicore = [n for n in fused.nodes if n.name in dm and dm.op(n.name).get("engine") not in ("HOST", "AICPU")
                  and n.op in OPS]
        have = {"cube": any(OPS[n.op].kind == CUBE for n in aicore),
                "conv": any(OPS[n.op].kind == CUBE and _is_conv(n) for n in aicore),
                "vector": any(OPS[n.op].kind != CUBE for n in aicore),
                "multicore": any(n.op in MULTICORE_OPS for n in aicore)}
        if not aicore:
            raise AscendEmuError(f"no AI Core op of {dump} is an op of model {graph.name!r} (no name in common): is "
                                 "it this model's dump? fit reruns the dump's ops of the model")
        pol = device.numerics
        # the allow_hf32 families the dump shows HF32 on: a cube op fed by an inserted HF32 cast (an emulator's
        # dump), or a float32 cube op of the family (a real NPU's dump holds no inserted casts: the op's output
        # carries the rounding)
        hf32_in = {o.get("name", "").rsplit("/", 1)[0] for o in dm.ops if o.get("compute_dtype") == "hfloat32"}
        hf32_fams = {device.hf32_family(n) for n in aicore
                     if any(r.split(":")[0] in hf32_in for r in n.input_names())
                     or (OPS[n.op].kind == CUBE and dm.op(n.name).get("compute_dtype") == "float32")} - {None}

        def hf32_family_absent(fam):
            if fam not in pol.allow_hf32:
                return f"HF32 is off for {fam} on this device (allow_hf32={','.join(pol.allow_hf32) or 'none'})"
            if pol.hf32_rounding is not None:
                return f"--hf32-rounding {pol.hf32_rounding} overrides every family's tie rule on this device"
            return None if fam in hf32_fams else f"no HF32 {fam} operand (cast or float32 {fam} op) in the dump"

        absent = {
            _asm.CUBE: None if have["cube"] else "no cube op in the dump",
            _asm.CONV: None if have["conv"] else "no Conv2D in the dump",
            _asm.HF32: (None if hf32_fams else
                        "HF32 is off on this device (allow_hf32=none)" if not pol.allow_hf32 else
                        "no HF32 cast and no float32 cube op of an allow_hf32 family in the dump"),
            _asm.HF32_CONV: hf32_family_absent("conv"),
            _asm.HF32_MATMUL: hf32_family_absent("matmul"),
            _asm.HIF8: ("the device is not in cube_hif8 / mixed_hif8" if device.precision.mode not in HIF8_MODES else
                        None if any(o.get("compute_dtype") == "hifloat8" and o.get("tf_type") == "Cast"
                                    for o in dm.ops) else "no HiFloat8 cast in the dump"),
            _asm.VECTOR: None if have["vector"] else "no vector op in the dump",
            _asm.MULTICORE: (None if have["multicore"] and pol.deterministic_level == 0 else
                             "the run is deterministic: the split does not reach the bits"
                             if pol.deterministic_level else "no multi-core op in the dump"),
            _asm.TORCH: "a torch eager-path parameter (ae.torch.emulate, torch-run): a graph's ops never read it",
        }
        select = {"hf32": "cube", "cube": "cube", "vector": "vector", "multicore": "multicore"}
        current = _asm.current(pol)
        results: dict = {}
        njobs = 0
        rounds = 0

        if isinstance(inputs, (list, tuple)) and not inputs:
            inputs = None
        if inputs is not None and dm.inputs_sha256:
            from ..frontend.inputs import inputs_sha256, make_inputs

            if inputs_sha256(make_inputs(graph, inputs, shapes=shapes)) != dm.inputs_sha256:
                raise AscendEmuError(f"{dump} was made from other inputs than --input gives (the inputs' sha256 "
                                     "differ); fit uses the dump's own tensors: drop --input or give the run's")

        # the dump read once, here; shipped to each worker once with the model (ctx.model: a graph without its
        # serialised GraphDef, which a worker never reads) and the device
        shared = read_context(dump, dm, ctx.model, graph.fingerprint, device, signature, shapes)
        shared._prepared = (graph, fused)     # this process has both already
        # (an MX what-if's casts group K: left out of the shortcut)
        blind = k_order_blind(fused, shared.tensors) if device.numerics.cube_mx is None else frozenset()

        for rounds in (1, 2):
            moved = False
            for g in GROUPS:
                ps = [a for a in _asm.ASSUMED if a.group == g and a.name in names and absent[a.family] is None]
                if not ps:
                    continue
                combos = _combos(ps, current)
                # a candidate differing from an earlier one in the conv K order alone leaves the convolutions no
                # order can act on to that one's rerun
                twins = _twins(combos)
                jobs = [FitJob({**current, **c}, select[g], blind if t is not None else frozenset())
                        for c, t in zip(combos, twins)]
                outs = sweep.map(rerun_ops, jobs, names=[f"{g}: {_label(c)}" for c in combos], shared=shared)
                runs = [r for r, _ in outs]
                for i, t in enumerate(twins):
                    if t is None:
                        continue
                    got, casts = outs[t]
                    for o in blind:
                        for name in [o] + casts.get(o, []):
                            if name in got:
                                runs[i].setdefault(name, got[name])
                njobs += len(combos)
                ops = sorted({o for r in runs for o in r})
                table = {o: [r.get(o, (0, 0, math.inf, "", False)) for r in runs] for o in ops}
                # an op a parameter cannot reach (a conv order on a MatMul) still counts for the group
                best, verdicts = _verdicts(ps, combos, table, current)
                results[g] = (combos, table, verdicts)
                if any(current[k] != v for k, v in best.items()):
                    moved = True
                    current.update(best)
            unexplained = any(max(r[0] for r in row) < row[0][1] for _, t, _ in results.values()
                              for row in t.values())
            if not moved or not unexplained:
                break
        final = sweep.map(rerun_ops, [FitJob(dict(current), "all")], names=["best setting"], shared=shared)[0][0]
        njobs += 1
    tensors = len(final)
    same = sum(1 for k, n, *_ in final.values() if k == n)
    parameters = {}
    for a in _asm.ASSUMED:
        if a.name not in names:
            continue
        for g, (_, _, verdicts) in results.items():
            if a.name in verdicts:
                parameters[a.name] = verdicts[a.name]
        if a.name not in parameters:
            parameters[a.name] = {"verdict": "undecided", "value": current[a.name], "votes": {}, "ops_telling": 0,
                                  "candidates": [str(v) for v in a.tried()],
                                  "why": absent[a.family] or "not fitted"}
    ops = []
    for g, (combos, table, _) in results.items():
        for o, row in table.items():
            n = row[0][1]
            best_k = max(r[0] for r in row)
            at = final.get(o)
            ops.append({"name": o, "type": row[0][3], "group": g, "elements": n,
                        "best_identical": best_k / n if n else 1.0, "reproduced": best_k == n,
                        "identical_at_best": (at[0] / at[1] if at and at[1] else None),
                        "max_abs_err_at_best": (at[2] if at and math.isfinite(at[2]) else None),
                        "candidates": {_label(c): (r[0] / n if n else 1.0) for c, r in zip(combos, row)}})
    notes = []
    added = set(added_nodes(dm).values())     # (scored as the op they follow: its output is theirs)
    left = [o["name"] for o in dm.ops if o.get("engine") not in ("HOST", "AICPU") and o["name"] not in final
            and o["name"] not in added
            and o.get("tf_type") not in ("Placeholder",) and any(out.get("file") for out in o.get("outputs", []))
            and any(str(out.get("dtype")) in ("float16", "bfloat16", "float32", "hifloat8") for out in o.get("outputs", []))]
    if left:
        notes.append(f"not rerun: {len(left)} dumped op(s) with float tensors ({', '.join(left[:3])}"
                     f"{' ...' if len(left) > 3 else ''}): inside a control-flow body, without their input "
                     "tensors in the dump, or not ops of this model's graph")
    return FitResult(os.fspath(dump), graph.name, dict(current), same / tensors if tensors else 1.0, parameters,
                     ops, tensors=tensors, candidates=njobs, rounds=rounds, notes=notes)

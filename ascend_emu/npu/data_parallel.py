"""Data-parallel training over emulated ranks (NUMERICS.md section 12).

Each global batch splits into ``ranks`` contiguous shards; every rank replays the forward and
backward part of the traced step on its shard with its own copy of the state, the gradients are
all-reduced (their mean over the ranks, summed as HCCL's algorithm does:
:mod:`ascend_emu.numerics.allreduce`), and every rank replays the update part of the step from the
reduced gradients and its own state. The step graph is cut once into those two graphs, as the
all-reduce cuts it on the NPU (no fusion crosses it): the *update* part is every update-phase op
and everything downstream of one; the gradients and any other tensor the update reads from the
first part become its inputs.

Loss scaling: the float status registers of the ranks are all-reduced (an OR: any rank's overflow
skips the step on every rank, as the TF adapter's NPULossScaleOptimizer does with
``is_distributed``), and one loss-scale manager decides for all.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import AscendEmuError
from ..graph.core import Graph, InputSpec, Node, split_tensor_name, tensor_name
from ..numerics.allreduce import DTYPES, allreduce_mean, default_algorithm, resolve_algorithm


@dataclass
class _Split:
    """The step cut at the all-reduce: ``fb`` (forward + backward) and the update's nodes."""

    step: object
    fb: Graph
    post: list                # the update part's nodes, in order
    post_placeholders: list   # original placeholders the update part reads (names)
    boundary: list            # tensors of the first part the update part reads, in order
    grad_of: dict             # boundary tensor -> gradient index (the reduced value replaces it)
    out_src: list             # per step output: ("fb", tensor) | ("post", tensor) | ("feed", placeholder)
    _update: dict = None      # dtype signature -> update Graph

    def update_graph(self, dtypes: tuple) -> Graph:
        """The update part as a graph whose inputs are its placeholders and the boundary tensors (in the
        dtypes they have on the device, which a precision mode may make 16-bit)."""
        if self._update is None:
            self._update = {}
        g = self._update.get(dtypes)
        if g is not None:
            return g
        orig = self.step.graph
        specs = {s.name: s for s in orig.inputs}
        by_name = {n.name: n for n in orig.nodes}
        nodes, inputs, rename = [], [], {}
        for name in self.post_placeholders:
            nodes.append(by_name[name])
            inputs.append(specs[name])
        for k, (t, dt) in enumerate(zip(self.boundary, dtypes)):
            ph = f"dp_boundary_{k}"
            rename[t] = f"{ph}:0"
            nodes.append(Node(ph, "Placeholder", [], {"dtype": dt, "shape": None}, output_dtypes=[dt]))
            inputs.append(InputSpec(ph, dt, None))
        for n in self.post:
            nodes.append(replace(n, inputs=[rename.get(tensor_name(r), r) for r in n.inputs]))
        outs = [t for kind, t in self.out_src if kind == "post"]
        g = Graph(nodes, inputs, outs, name=f"{orig.name}_update", fingerprint=orig.fingerprint + ":update")
        self._update[dtypes] = g
        return g


def split_step(step) -> _Split:
    """Cut ``step`` (a :class:`~ascend_emu.frontend.tf.training.TrainStep`) before its update."""
    g = step.graph
    ng = step.n_grads
    by_name = {n.name: n for n in g.nodes}
    post: set[str] = set()
    for n in g.nodes:
        if n.op == "Placeholder":
            continue
        if step.phase(n.name) == "update" or any(split_tensor_name(r)[0] in post for r in n.inputs):
            post.add(n.name)
    # each gradient output, through the Identity ops the function's outputs go through
    grad_of = {}
    cores = []
    for i in range(ng):
        t = tensor_name(g.outputs[1 + i])
        while True:
            grad_of.setdefault(t, i)
            node = by_name[split_tensor_name(t)[0]]
            if node.op != "Identity" or node.name in post:
                break
            t = tensor_name(node.inputs[0])
        cores.append(split_tensor_name(t)[0])
    # ops computed from the gradients before the update (a gradient norm for clipping, say) would see
    # one rank's gradients, not the reduced ones
    derived = set(cores)
    for n in g.nodes:
        if n.name not in post and n.op != "Placeholder" and any(split_tensor_name(r)[0] in derived
                                                                for r in n.inputs):
            derived.add(n.name)
    boundary, post_ph, seen = [], [], set()
    for n in g.nodes:
        if n.name not in post:
            continue
        for r in n.inputs:
            t = tensor_name(r)
            src = by_name[split_tensor_name(t)[0]]
            if src.name in post or t in seen:
                continue
            seen.add(t)
            if src.op == "Placeholder":
                post_ph.append(src.name)
                continue
            if t not in grad_of and src.name in derived:
                raise AscendEmuError(f"the update reads {t}, which is computed from the gradients (gradient "
                                     "clipping?); data-parallel training all-reduces the gradients only: drop it "
                                     "or train on one rank")
            boundary.append(t)
    out_src = []
    for o in g.outputs:
        src = by_name[split_tensor_name(o)[0]]
        out_src.append(("feed", src.name) if src.op == "Placeholder" else
                       ("post", tensor_name(o)) if src.name in post else ("fb", tensor_name(o)))
    fb_outs = [t for kind, t in out_src if kind == "fb"]
    fb_outs += [t for t in boundary if t not in fb_outs]
    pre_reads = {split_tensor_name(r)[0] for n in g.nodes if n.name not in post for r in n.inputs}
    fb_nodes = [n for n in g.nodes if n.name not in post and (n.op != "Placeholder" or n.name in pre_reads)]
    fb_ph = {n.name for n in fb_nodes if n.op == "Placeholder"}
    fb = Graph(fb_nodes, [s for s in g.inputs if s.name in fb_ph], fb_outs, name=g.name,
               fingerprint=g.fingerprint + ":forward_backward")
    return _Split(step, fb, [by_name[n.name] for n in g.nodes if n.name in post], post_ph, boundary,
                  {t: grad_of[t] for t in boundary if t in grad_of}, out_src)


# --------------------------------------------------------------------------- options

def check_options(ranks, allreduce, allreduce_dtype, rank_init, check_rank_weights, dump_dir):
    """Validate the data-parallel options; returns (ranks, rank_init dict)."""
    if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise AscendEmuError(f"ranks must be a positive integer, got {ranks!r}")
    ranks = int(ranks)
    if ranks == 1:
        given = [k for k, v in (("allreduce", allreduce), ("rank_init", rank_init),
                                ("check_rank_weights", check_rank_weights)) if v]
        if allreduce_dtype not in (None, "float32"):
            given.append("allreduce_dtype")
        if given:
            raise AscendEmuError(f"{', '.join(given)} apply to data-parallel training: give ranks of 2 or more "
                                 "(--ranks N)")
        return ranks, {}
    if ranks > 1024:
        raise AscendEmuError(f"ranks must be at most 1024, got {ranks}")
    if allreduce is not None:
        resolve_algorithm(allreduce)
    if allreduce_dtype not in (None, *DTYPES):
        raise AscendEmuError(f"unknown all-reduce dtype {allreduce_dtype!r}; choose one of: {', '.join(DTYPES)}")
    if dump_dir is not None:
        raise AscendEmuError("dumps of data-parallel training are not supported yet; drop --dump or use --ranks 1")
    plant = {}
    for r, v in dict(rank_init or {}).items():
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r < ranks:
            raise AscendEmuError(f"rank_init names rank {r!r}; ranks are 0..{ranks - 1}")
        if not isinstance(v, dict) and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
            raise AscendEmuError(f"rank_init[{r}] must be a seed (a non-negative integer) or a dict state key -> "
                                 f"array, got {v!r}")
        plant[int(r)] = v
    return ranks, plant


def rank_states(run, base: dict, ranks: int, plant: dict) -> list[dict]:
    """Each rank's initial state: a copy of ``base``, or the planted initialisation of ``rank_init``."""
    from ..frontend.tf import training as T

    states = []
    for r in range(ranks):
        st = {k: v.copy() for k, v in base.items()}
        v = plant.get(r)
        if isinstance(v, dict):
            for key, arr in v.items():
                if key not in st:
                    raise AscendEmuError(f"rank_init[{r}] names state {key!r}, which the step does not have "
                                         f"(it has e.g. {', '.join(list(st)[:3])})")
                a = np.asarray(arr)
                if a.shape != st[key].shape:
                    raise AscendEmuError(f"rank_init[{r}][{key!r}] has shape {a.shape}, the state {st[key].shape}")
                st[key] = a.astype(st[key].dtype)
        elif v is not None:
            st = T.reinitialised_state(run.model, run.fopt, v)
        states.append(st)
    return states


def compare_ranks(states: list[dict], keys=None) -> list[dict]:
    """Every (rank, variable) whose value differs from rank 0's, bit for bit (``max_abs_diff`` says by how much)."""
    out = []
    keys = sorted(states[0]) if keys is None else keys
    for r in range(1, len(states)):
        for k in keys:
            a, b = states[0][k], states[r][k]
            if a.shape != b.shape or a.tobytes() != b.tobytes():
                d = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) \
                    if a.shape == b.shape and a.size else float("nan")
                out.append({"rank": r, "variable": k.split("/", 1)[1] if "/" in k else k, "state": k,
                            "max_abs_diff": d})
    return out


# --------------------------------------------------------------------------- the loop

def train_data_parallel(device, model, data, *, ranks: int, plant: dict, allreduce, allreduce_dtype,
                        check_rank_weights: bool, overflow_check: str, reference: bool, progress: bool,
                        dump_steps=None, **prepare):
    """Data-parallel training of :meth:`ascend_emu.npu.device.Device.train` with ``ranks`` > 1 (the options
    checked by :func:`check_options`; ``prepare`` the arguments of :func:`ascend_emu.npu.training._prepare`)."""
    from ..frontend.tf import training as T
    from .training import OVERFLOW_CHECKS, TrainResult, _prepare, _progress, _tick, reference_step

    if overflow_check not in OVERFLOW_CHECKS:
        raise AscendEmuError(f"unknown overflow_check {overflow_check!r}; choose one of: {', '.join(OVERFLOW_CHECKS)}")
    run = _prepare(model, data, dump_dir=None, dump_steps=dump_steps, **prepare)
    manager = run.manager
    for i, idx in enumerate(run.order):
        if len(idx) % ranks:
            raise AscendEmuError(f"step {i}'s batch has {len(idx)} samples, which do not split evenly over {ranks} "
                                 f"ranks; make the batch size a multiple of the ranks (and the sample count a "
                                 f"multiple of the batch size, so no batch is partial)")
    algorithm = resolve_algorithm(allreduce) if allreduce is not None else default_algorithm(device.soc)
    dtype = allreduce_dtype or "float32"
    deterministic = device.deterministic_level > 0
    sg = run.step_graph
    split = split_step(sg)
    base = T.initial_state(run.model, run.fopt)
    states = rank_states(run, base, ranks, plant)
    ref_state = {k: v.copy() for k, v in states[0].items()} if reference else None
    keys = [k for k, _, _ in sg.state]
    info = {"ranks": ranks, "allreduce": algorithm, "allreduce_dtype": dtype, "shard": len(run.order[0]) // ranks,
            "hccl_deterministic": deterministic, "planted": sorted(plant),
            "initial_differences": compare_ranks(states) if check_rank_weights else None}
    config = {"device": device.config(), **run.config, "overflow_check": overflow_check,
              "reference": bool(reference), "data_parallel": {k: info[k] for k in
                                                              ("ranks", "allreduce", "allreduce_dtype",
                                                               "hccl_deterministic")}}
    result = TrainResult(config, [], states[0], ref_state)
    result.ranks = info
    bar = _progress(progress, run.steps, f"train x{ranks}")
    fb_specs = {s.name for s in split.fb.inputs}
    try:
        for i, idx in enumerate(run.order):
            rec = data_parallel_step(device, split, states, run.x[idx], run.y[idx], i, manager=manager,
                                     overflow_check=overflow_check, algorithm=algorithm, dtype=dtype,
                                     fb_specs=fb_specs)
            if reference:
                rec.update(reference_step(sg, run.x[idx], run.y[idx], i, ref_state))
            result.steps.append(rec)
            _tick(bar, rec)
    finally:
        if bar is not None:
            bar.close()
    info["final_differences"] = compare_ranks(states, [k for k in keys if not k.startswith("non_trainable/")])
    info["final_non_trainable_differences"] = compare_ranks(states, [k for k in keys
                                                                     if k.startswith("non_trainable/")])
    result.rank_states = states
    return result


def data_parallel_step(device, split: _Split, states: list, x, y, i: int, *, manager, overflow_check: str,
                       algorithm: str, dtype: str, fb_specs=None) -> dict:
    """One data-parallel training step: the batch ``(x, y)`` in ``len(states)`` contiguous shards, each rank's
    forward and backward from its own state, the gradients' all-reduce, the overflow decision (the OR of every
    rank's status and the all-reduce's), and on an applied step each rank's update of its state in place.
    Returns the step's record (``train --json``'s fields and ``rank_losses``)."""
    from .training import step_applied, step_feeds, step_record, step_status

    sg = split.step
    ranks = len(states)
    ng = sg.n_grads
    fb_specs = {s.name for s in split.fb.inputs} if fb_specs is None else fb_specs
    deterministic = device.deterministic_level > 0
    scale = manager.get_loss_scale() if manager is not None else 1.0
    xs, ys = np.split(np.asarray(x), ranks), np.split(np.asarray(y), ranks)
    losses, grads, bounds, rank_feeds, bits, first = [], [], [], [], 0, None
    for r in range(ranks):
        rank_feeds.append(step_feeds(sg, xs[r], ys[r], i, scale, states[r]))
        feeds = {k: v for k, v in rank_feeds[r].items() if k in fb_specs}
        # each rank's multi-core ops draw their own orders (with determinism off)
        res = device.replay(split.fb, feeds, None, progress=False, keep_tensors=False, phases=sg.phase,
                            launch=i * ranks + r)
        outs = {t: res.outputs[t] for t in split.fb.outputs}
        losses.append(float(np.asarray(outs[tensor_name(sg.graph.outputs[0])], np.float64)))
        grads.append([outs[tensor_name(t)] for t in sg.graph.outputs[1:1 + ng]])
        bounds.append(outs)
        rank_bits, rank_first = step_status(res.records, sg.phase, rank=r)
        bits |= rank_bits
        first = first if first is not None else rank_first
    reduced, ar_bits, _ = allreduce_mean(grads, algorithm=algorithm, deterministic=deterministic,
                                         run_seed=device.run_seed, launch=i, dtype=dtype,
                                         overflow_mode=device.overflow_mode)
    if ar_bits and first is None:
        first = {"name": f"HcomAllReduce ({algorithm})", "tf_type": "HcomAllReduce", "phase": "backward",
                 "rank": None}
    bits |= ar_bits
    applied = step_applied(manager, overflow_check, bits, reduced)
    if applied:
        for r in range(ranks):
            _update_rank(device, split, sg, states[r], rank_feeds[r], bounds[r], reduced, launch=i * ranks + r)
    rec = step_record(i, float(np.mean(losses)), scale, applied, bits, first, reduced)
    rec["rank_losses"] = losses
    return rec


def _update_rank(device, split: _Split, sg, state: dict, all_feeds: dict, fb_outs: dict, reduced: list, *,
                 launch: int) -> None:
    """Replay the update part on one rank from its feeds (batch shard, scale, iteration, its state), the other
    tensors it read from its forward and backward part, and the reduced gradients; write its new state."""
    values = [reduced[split.grad_of[t]] if t in split.grad_of else fb_outs[t] for t in split.boundary]
    values = [np.asarray(v, np.float32) if t in split.grad_of else np.asarray(v)
              for t, v in zip(split.boundary, values)]
    ug = split.update_graph(tuple(v.dtype.name for v in values))
    feeds = {name: all_feeds[name] for name in split.post_placeholders}
    feeds.update({f"dp_boundary_{k}": v for k, v in enumerate(values)})
    res = device.replay(ug, feeds, None, progress=False, keep_tensors=False, phases=sg.phase, launch=launch)
    post = {t: res.outputs[t] for t in ug.outputs}
    ng = sg.n_grads
    for (key, ph, _), (kind, t) in zip(sg.state, split.out_src[1 + ng:]):
        v = all_feeds[t] if kind == "feed" else post[t] if kind == "post" else fb_outs[t]
        state[key] = np.asarray(v, dtype=state[key].dtype)

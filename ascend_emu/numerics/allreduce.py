"""The gradient all-reduce of data-parallel training over emulated ranks (NUMERICS.md section 12).

Each rank holds its own gradients; the all-reduce gives every rank their mean, as Horovod's and
the TF adapter's ``allreduce(average=True)`` do: a sum over the ranks (HCCL's AllReduce, op sum),
then a division by the rank count. The sum is where the numerics live: which partial sums meet in
which order depends on HCCL's algorithm (its open-source user guide, ``coll_algo_intro``):

- ``ring``: the ranks form a ring; in the reduce-scatter half each chunk of the (fused) gradient
  buffer travels once round the ring and every rank adds its own share as it passes, so chunk c
  is ``((g[c+1] + g[c+2]) + ...) + g[c]`` (ranks mod N). One writer per step: the order is fixed.
- ``hd``: recursive halving-doubling (HCCL's H-D_R): ranks exchange with partners at doubling
  distances, so every element is a balanced binary tree of pairwise sums,
  ``((g0 + g1) + (g2 + g3)) + ...``; with N not a power of two the first ``2r`` ranks
  (``r = N - 2^floor(log2 N)``) first fold pairwise (rank 1 into rank 0, ...). Fixed order.
- ``mesh``: the fully connected server of the Atlas A2 (Ascend910B): every rank owns one chunk,
  copies its own share in, and its peers write theirs into it. With HCCL's determinism off the
  910B executors take the atomic reduce-scatter (``MultiStreamReduceScatterMeshAtomic``), whose
  adds land in arrival order: drawn here per chunk from the run seed and the step. Deterministic:
  the peers' shares are added in rank order (assumed).

The accumulator is float32, or float16 with ``dtype="float16"`` (the gradients cast to fp16 first,
as Horovod's ``Compression.fp16``): every add rounds to it, with the device's overflow mode; the
mean divides the float32 sum by N (``RealDiv``, float32).
"""
from __future__ import annotations

import numpy as np

from ..errors import AscendEmuError
from .multicore import _seed_words, even_bounds
from .policy import soc as _soc
from .vector import cast, vector

ALGORITHMS = ("ring", "hd", "mesh")
#: another name users know (NCCL's tree is a reduction tree too); HCCL's own is halving-doubling
ALIASES = {"tree": "hd", "halving-doubling": "hd", "h-d_r": "hd"}
DTYPES = ("float32", "float16")


def resolve_algorithm(name) -> str:
    key = str(name).lower() if isinstance(name, str) else name
    key = ALIASES.get(key, key)
    if key not in ALGORITHMS:
        raise AscendEmuError(f"unknown all-reduce algorithm {name!r}; choose one of: {', '.join(ALGORITHMS)} "
                             "(tree = hd)")
    return key


def default_algorithm(soc: str) -> str:
    """The intra-server algorithm HCCL picks by topology: the SoC row's ``allreduce`` (fullmesh on the Atlas A2
    and A3 and the 950, a ring on the Ascend910's 8-device server and the 310P; assumed for every rank count)."""
    return _soc(soc).allreduce


def _fold(order) -> object:
    """Left fold of rank indices: ``[a, b, c]`` -> ``((a, b), c)``."""
    tree = order[0]
    for r in order[1:]:
        tree = (tree, r)
    return tree


def _hd_tree(n: int) -> object:
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    blocks = [(2 * i, 2 * i + 1) for i in range(extra)] + list(range(2 * extra, n))
    while len(blocks) > 1:
        blocks = [(blocks[i], blocks[i + 1]) for i in range(0, len(blocks), 2)]
    return blocks[0]


def schedules(algorithm: str, ranks: int, chunks: int, *, deterministic: bool, rng=None) -> list:
    """For each chunk of the fused buffer, the order its rank shares are added in: a nested pair tree of
    rank indices (``((0, 1), 2)`` adds rank 0's share to rank 1's, then rank 2's)."""
    out = []
    for c in range(chunks):
        if algorithm == "ring":
            out.append(_fold([(c + 1 + k) % ranks for k in range(ranks)]))
        elif algorithm == "hd":
            out.append(_hd_tree(ranks))
        else:
            owner = c % ranks
            peers = [r for r in range(ranks) if r != owner]
            if deterministic:
                out.append(_fold(list(range(ranks))))
            else:
                out.append(_fold([owner] + [peers[i] for i in rng.permutation(len(peers))]))
    return out


def allreduce_mean(rank_grads: list, *, algorithm: str = "ring", deterministic: bool = True, run_seed: int = 0,
                   launch: int = 0, dtype: str = "float32", overflow_mode: str = "inf_nan"):
    """The mean over ranks of each gradient, summed as HCCL's ``algorithm`` does.

    Parameters
    ----------
    rank_grads : list over ranks of lists of arrays (each rank's gradients, same shapes on every rank).
    algorithm : ``ring``, ``hd`` or ``mesh`` (module docstring).
    deterministic : HCCL's determinism; off, ``mesh`` draws its arrival orders from (run_seed, launch).
    dtype : the accumulator, ``float32`` or ``float16``.

    Returns
    -------
    (list of float32 arrays, int status bits of the adds and casts, list of the chunk schedules)
    """
    algorithm = resolve_algorithm(algorithm)
    if dtype not in DTYPES:
        raise AscendEmuError(f"unknown all-reduce dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    n = len(rank_grads)
    if n < 1:
        raise AscendEmuError("all-reduce needs at least one rank")
    shapes = [np.shape(g) for g in rank_grads[0]]
    for r, grads in enumerate(rank_grads):
        if [np.shape(g) for g in grads] != shapes:
            raise AscendEmuError(f"rank {r}'s gradients have other shapes than rank 0's")
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    status = 0
    bufs = []
    for grads in rank_grads:
        flat = np.concatenate([np.asarray(g, np.float32).ravel() for g in grads]) if grads else \
            np.zeros(0, np.float32)
        if dtype == "float16":
            flat, st = cast(flat, "float16", "rint", overflow_mode)
            status |= int(st)
        bufs.append(flat)
    total = sum(sizes)
    bounds = even_bounds(total, n) if total else np.array([0, 0], dtype=np.int64)
    rng = None if deterministic else np.random.default_rng(
        np.random.SeedSequence(_seed_words(run_seed, launch, f"hccl/allreduce/{algorithm}")))
    plans = schedules(algorithm, n, len(bounds) - 1, deterministic=deterministic, rng=rng)
    summed = np.empty(total, dtype=np.float16 if dtype == "float16" else np.float32)
    for c, plan in enumerate(plans):
        lo, hi = int(bounds[c]), int(bounds[c + 1])

        def value(tree):
            nonlocal status
            if isinstance(tree, tuple):
                out, st = vector("add", value(tree[0]), value(tree[1]), dtype=dtype, overflow_mode=overflow_mode)
                status |= int(st)
                return out
            return bufs[tree][lo:hi]
        summed[lo:hi] = value(plan) if n > 1 else bufs[0][lo:hi]
    if dtype == "float16":
        summed, st = cast(summed, "float32")
        status |= int(st)
    mean, st = vector("realdiv", summed, np.float32(n), dtype="float32", overflow_mode=overflow_mode)
    status |= int(st)
    out, at = [], 0
    for s, k in zip(shapes, sizes):
        out.append(np.asarray(mean[at:at + k], np.float32).reshape(s))
        at += k
    return out, status, plans

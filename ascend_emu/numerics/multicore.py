"""Non-deterministic multi-core accumulation: how a split op's partial results meet (NUMERICS.md section 11).

CANN runs some operators on several AI Cores that each accumulate a part of a reduction and then
add their partial results into the output with atomic adds, in whatever order the cores finish;
with ``deterministic`` off the same inputs can give different float results from run to run
(ACL_OPT_DETERMINISTIC, ATC ``--deterministic``). The emulator models this for the op types of
:data:`ascend_emu.ops.multicore.MULTICORE_OPS`: with determinism off, each such op gets a
:class:`Launch`, which decides from the shapes how the work splits over the SoC's cores
(:class:`MultiCoreModel` holds the split thresholds, sourced or assumed) and draws the order in
which the partials arrive from a generator seeded by the run seed, the launch (a training step)
and the op's name. With determinism on (the default) ops get no launch and keep their one
canonical order, bit for bit what they computed before this model existed.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import AscendEmuError
from ..kernels import multicore as _km

#: deterministic_level values: 0 off (CANN's default), 1 deterministic, 2 strong consistency (a row's
#: result does not depend on the other rows of its batch)
DETERMINISTIC_LEVELS = (0, 1, 2)


def resolve_level(deterministic, deterministic_level) -> int:
    """The effective deterministic level from the two user options (either may be None).

    ``deterministic_level`` wins when given; ``deterministic=True`` alone is level 1, ``False`` level 0.
    Contradictory pairs (``deterministic=False`` with a level above 0, ``True`` with level 0) are errors.
    """
    if deterministic is not None and not isinstance(deterministic, (bool, np.bool_, int, np.integer)):
        raise AscendEmuError(f"deterministic must be a bool (or 0/1), got {deterministic!r}")
    if deterministic is not None and int(deterministic) not in (0, 1):
        raise AscendEmuError(f"deterministic must be 0 or 1, got {deterministic!r}")
    if deterministic_level is None:
        return 1 if deterministic is None or bool(deterministic) else 0
    if isinstance(deterministic_level, bool) or not isinstance(deterministic_level, (int, np.integer)) \
            or int(deterministic_level) not in DETERMINISTIC_LEVELS:
        raise AscendEmuError(f"deterministic_level must be 0, 1 or 2, got {deterministic_level!r}")
    level = int(deterministic_level)
    if deterministic is not None and bool(deterministic) != (level > 0):
        raise AscendEmuError(f"deterministic={int(bool(deterministic))} contradicts deterministic_level={level}; "
                             "give one of them, or a level above 0 with deterministic on")
    return level


def check_run_seed(run_seed) -> int:
    if isinstance(run_seed, bool) or not isinstance(run_seed, (int, np.integer)) or not 0 <= int(run_seed) < 2 ** 63:
        raise AscendEmuError(f"run_seed must be an integer in 0..2**63-1, got {run_seed!r}")
    return int(run_seed)


@dataclass(frozen=True)
class MultiCoreModel:
    """When an op splits its accumulation over cores (NUMERICS.md section 11 says which are sourced).

    reduce_min_chunk : a ReduceSum/Mean-style reduction splits its reduced axis over the cores only
        when its kept rows cannot fill them (rows < cores) and every core gets at least this many
        elements (assumed: 256).
    splitk_min_k : MatMul / BatchMatMul split K over cores only when K >= this (matmul_v3 tiling's
        MIN_SPLITK_K = 1000) and the output is small, M <= splitk_mn_max and N <= splitk_mn_max
        (the tiling's M_THRESHOLD / N_THRESHOLD = 256).
    splitk_chunk : K elements per core in a split-K matmul (the tiling's MULTI_CORE_SINGLE_K = 384);
        when K / splitk_chunk exceeds the cores, each core takes ceil(K / cores) rounded up to 16.
    aicore_num : cores to use (ATC ``--aicore_num``); None: the SoC's ``ai_core_cnt`` (cube work) and
        vector cores (vector work).
    """

    reduce_min_chunk: int = 256
    splitk_min_k: int = 1000
    splitk_mn_max: int = 256
    splitk_chunk: int = 384
    aicore_num: int | None = None

    def __post_init__(self):
        for name in ("reduce_min_chunk", "splitk_min_k", "splitk_mn_max", "splitk_chunk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise AscendEmuError(f"MultiCoreModel.{name} must be a positive integer, got {v!r}")
        if self.aicore_num is not None and (isinstance(self.aicore_num, bool) or
                                            not isinstance(self.aicore_num, (int, np.integer)) or
                                            not 1 <= self.aicore_num <= 1024):
            raise AscendEmuError(f"MultiCoreModel.aicore_num must be an integer in 1..1024 or None, "
                                 f"got {self.aicore_num!r}")

    def to_dict(self) -> dict:
        return asdict(self)


DEFAULT_MULTICORE_MODEL = MultiCoreModel()


def _seed_words(run_seed: int, launch: int, op_name: str) -> list[int]:
    # a stable hash (Python's hash() is salted per process)
    digest = hashlib.blake2b(op_name.encode("utf-8"), digest_size=8).digest()
    return [int(run_seed) & 0xFFFFFFFF, int(run_seed) >> 32, int(launch) & 0xFFFFFFFF,
            int.from_bytes(digest, "little") & 0xFFFFFFFF, int.from_bytes(digest, "little") >> 32]


def even_bounds(n: int, chunks: int, align: int = 1) -> np.ndarray:
    """Chunk boundaries 0 = b0 < b1 < ... = n: ``chunks`` chunks of ceil(n / chunks) elements (rounded
    up to ``align``), the last one shorter; fewer chunks when the rounding leaves nothing for them."""
    size = -(-n // chunks)
    size = -(-size // align) * align
    b = list(range(0, n, size)) + [n]
    return np.asarray(b, dtype=np.int64)


@dataclass
class Launch:
    """One non-deterministic launch of a split op: its cores, split model, and order generator.

    ``kind`` is the op's row of :data:`ascend_emu.ops.multicore.MULTICORE_OPS` (``"reduce"``,
    ``"atomic"``, ``"splitk"``, ``"batch"``); ``cube_cores``/``vector_cores`` the cores its
    unit has; the generator is drawn lazily from (run seed, launch, op name).
    """

    kind: str
    op_name: str
    run_seed: int
    launch: int
    cube_cores: int
    vector_cores: int
    model: MultiCoreModel = DEFAULT_MULTICORE_MODEL
    _rng: np.random.Generator | None = None

    @property
    def rng(self) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.default_rng(np.random.SeedSequence(_seed_words(self.run_seed, self.launch,
                                                                                  self.op_name)))
        return self._rng

    # -- how the work splits ---------------------------------------------------------------------
    def reduce_bounds(self, rows: int, inner: int) -> np.ndarray | None:
        """Chunk bounds of a reduced axis of ``inner`` elements kept over ``rows`` rows, or None (unsplit)."""
        cores = self.vector_cores
        if rows >= cores or inner < 2 * self.model.reduce_min_chunk:
            return None
        chunks = min(max(cores // max(rows, 1), 1), inner // self.model.reduce_min_chunk)
        if chunks < 2:
            return None
        return even_bounds(inner, chunks)

    def splitk_bounds(self, batch: int, m: int, n: int, k: int) -> np.ndarray | None:
        """K bounds of a split-K matmul of ``batch`` (M, K) x (K, N) products, or None (unsplit)."""
        mdl = self.model
        if k < mdl.splitk_min_k or m > mdl.splitk_mn_max or n > mdl.splitk_mn_max or batch >= self.cube_cores:
            return None
        chunks = min(-(-k // mdl.splitk_chunk), max(self.cube_cores // max(batch, 1), 1))
        if chunks < 2:
            return None
        return even_bounds(k, chunks, 16)

    def batch_bounds(self, samples: int, per_sample: int) -> np.ndarray | None:
        """K bounds of a cube accumulation over ``samples`` samples of ``per_sample`` terms each, split
        over the cores by whole samples (Conv2DBackpropFilter's batch split), or None."""
        chunks = min(self.cube_cores, samples)
        if chunks < 2:
            return None
        per_core = -(-samples // chunks)
        starts = list(range(0, samples, per_core)) + [samples]
        return np.asarray(starts, dtype=np.int64) * per_sample

    # -- the order in which partial results arrive -------------------------------------------------
    def order(self, chunks: int) -> np.ndarray:
        """One arrival order of ``chunks`` partial results (a permutation)."""
        return self.rng.permutation(chunks).astype(np.int64)

    def row_orders(self, rows: int, chunks: int) -> np.ndarray:
        """One arrival order per row: (rows, chunks) permutations."""
        base = np.broadcast_to(np.arange(chunks, dtype=np.int64), (rows, chunks))
        return np.ascontiguousarray(self.rng.permuted(base, axis=1))

    def arrival(self, n: int) -> np.ndarray | None:
        """Arrival order of ``n`` atomic adds issued by the vector cores, each core adding its
        contiguous share of the n items in order; the cores' streams interleave at random.
        None when one core does it all."""
        cores = min(self.vector_cores, n)
        if cores < 2:
            return None
        core = (np.arange(n, dtype=np.int64) * cores) // n        # contiguous shares, as even as they go
        # each core issues its adds at its own pace from its own start: exponential gaps
        gaps = self.rng.exponential(1.0, n)
        start = self.rng.exponential(1.0, cores)
        t = np.empty(n, dtype=np.float64)
        for c in range(cores):
            sel = core == c
            t[sel] = start[c] + np.cumsum(gaps[sel])
        return np.argsort(t, kind="stable").astype(np.int64)


def segment_add(acc: np.ndarray, rows: np.ndarray, ids: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``acc[ids[i]] += rows[i]`` in float32 for i in ``order`` (atomic adds in arrival order; negative ids
    dropped); ``acc`` (num_segments, ...) float32 is updated in place and returned."""
    flat = np.ascontiguousarray(np.asarray(rows, dtype=np.float32).reshape(len(ids), -1))
    _km.segment_add_f32(flat, np.ascontiguousarray(ids, dtype=np.int64),
                        np.ascontiguousarray(order, dtype=np.int64), acc.reshape(acc.shape[0], -1))
    return acc

"""The Numba thread count of a replay: one thread for small ops, all of them for the others, a training step's cube ops
on one thread when its first replays timed that faster (:class:`Trial`); where the threads run (:class:`Pinned`).
Results do not depend on it: fixed chunks and work items, statuses ORed."""
from __future__ import annotations

import functools

import numba

#: an op (or inserted cast) whose largest input has at most this many elements runs its kernels on one
#: thread: the vector kernels split their work into chunks of 32768 elements, so a second thread gets
#: nothing to do, yet the parallel region still waits for it; on cores shared with other processes that
#: wait was a scheduler time slice (a scalar Pow took 5 ms instead of 0.07 ms). Results do not depend
#: on the thread count (fixed chunks and work items, statuses ORed).
#: (A product through numerics/cube.py of at most cube_core.SERIAL_MACS multiply-adds runs on one thread even when
#: its op's inputs are larger: for a MatMul or BatchMatMul node the replay fits one thread for it from its operands'
#: shapes too (:func:`product_macs`), so such a node neither wakes the second thread nor pins the replay.)
SMALL_OP_ELEMENTS = 1 << 15
#: the same limit for the ops of the vector unit and the inserted casts (every op but the cube's): their
#: kernels stream memory at a few ns per element or less, so below a million elements a second thread saved
#: less than its parallel region cost. Measured on the CNN training step (2 vCPUs, medians of 20 steps, runs
#: alternated): 47.8-50.7 ms against 48.2-68.7 ms with the 2^15 limit on a quiet machine; 40.6-44.6 against
#: 50.8-60.8 ms beside another busy process; ResNet50, MobileNetV2 and Transformer replays unchanged.
SMALL_VECTOR_ELEMENTS = 1 << 20


#: the products whose multiply-adds :func:`product_macs` counts from their operands' shapes: MatMul's attributes
#: transpose_a / transpose_b, BatchMatMul's adj_x / adj_y
_PRODUCTS = {"MatMul": ("transpose_a", "transpose_b"), "_FusedMatMul": ("transpose_a", "transpose_b"),
             "BatchMatMul": ("adj_x", "adj_y"), "BatchMatMulV2": ("adj_x", "adj_y"),
             "BatchMatMulV3": ("adj_x", "adj_y")}


def product_macs(op: str, args, attrs: dict) -> int | None:
    """The multiply-adds of a MatMul or BatchMatMul node on ``args`` (batch x M x K x N, the batch broadcast), or
    None for any other op (an Einsum, a convolution) or operands it cannot read. A product of at most
    ``numerics.cube_core.SERIAL_MACS`` runs its kernels on one thread (``cube_core._batched``): the replay fits one
    thread for it too, so that it neither wakes the second thread nor pins the replay's threads for nothing."""
    names = _PRODUCTS.get(op)
    if op == "_FusedBatchMatMul" and attrs.get("base", "BatchMatMulV2") != "Einsum":
        names = ("adj_x", "adj_y")
    if names is None or len(args) < 2:
        return None
    a, b = args[0], args[1]
    if getattr(a, "ndim", 0) < 2 or getattr(b, "ndim", 0) < 2:
        return None
    m = a.shape[-1] if attrs.get(names[0]) else a.shape[-2]
    n = b.shape[-2] if attrs.get(names[1]) else b.shape[-1]
    return max(a.size * n, b.size * m)


class Threads:
    """The Numba thread count of the replaying thread: one for small ops, all for the others."""

    def __init__(self):
        self.full = self.current = numba.get_num_threads()
        self.pin = None   # a Pinned to enter at the replay's first op on all threads (a replay of small ops: never)

    def fit(self, elements: int, limit: int = SMALL_OP_ELEMENTS) -> None:
        want = 1 if elements <= limit else self.full
        if want != self.current:
            numba.set_num_threads(want)
            self.current = want
        if want > 1 and self.pin is not None:
            pin, self.pin = self.pin, None
            pin.__enter__()

    def restore(self) -> None:
        self.pin = None
        self.fit(SMALL_OP_ELEMENTS + 1)


class Trial:
    """Whether the cube ops of a training step's replays run on one Numba thread or as :meth:`Threads.fit` says (all
    of them past ``SMALL_OP_ELEMENTS``), chosen by timing the replays of the step's plan (``Device._plan``: the same
    fused graph every step). After the first replay (Numba's first calls, cold caches: not timed) the replays
    alternate between the two until each has run :data:`ROUNDS` times; the one with the smaller best time is kept
    for the plan. A size rule could not stand for both places measured on the 2-vCPU VM (RESULTS.md, session 24):
    in the Keras CNN's training step the convolutions (14-38 M multiply-adds) on one thread made the step faster
    (their outputs stay in the replaying core's cache for the vector ops after them, the step pins no thread), while
    MobileNetV2's inference replay of convolutions of the same size was 10% slower so. Results never depend on the
    thread count (fixed chunks and work items, statuses ORed): only the time does."""

    __slots__ = ("times", "choice", "timed")

    #: timed replays per way
    ROUNDS = 3

    def __init__(self):
        self.times: tuple = ([], [])   # seconds of the replays with the cube ops on one thread, as fit says
        self.choice: int | None = None   # 0: one thread, 1: as fit says; None: still timing
        self.timed = False   # the first replay is not timed

    def pick(self) -> int | None:
        """0 (the cube ops on one thread) or 1 (as :meth:`Threads.fit` says) for the next replay; None: untimed, as
        fit says (the first replay)."""
        if self.choice is not None:
            return self.choice
        if not self.timed:
            self.timed = True
            return None
        one, every = self.times
        return 0 if len(one) <= len(every) else 1

    def add(self, which: int, seconds: float) -> None:
        """A timed replay of ``seconds`` the way ``which`` (as :meth:`pick` said)."""
        self.times[which].append(seconds)
        one, every = self.times
        if len(one) >= self.ROUNDS and len(every) >= self.ROUNDS:
            self.choice = 0 if min(one) <= min(every) else 1


#: how a replay's Numba threads are placed (``ASCEND_EMU_PIN_THREADS``: ``auto``, the default; ``1``; ``0``). On the
#: 2-vCPU VM this project is measured on, the kernel woke the OpenMP worker (sleeping between kernels: passive wait,
#: set by ``import ascend_emu``) on the replaying thread's vCPU even with the other one idle, so the two threads of
#: every cube product ran one after the other: the zoo Transformer's replay 44.0 / 54.3 ms (best / median of 46
#: quiet rounds) unpinned, 31.2 / 42.5 ms pinned. Beside other busy processes a pinned thread cannot leave a vCPU
#: that another process holds (16-21% slower with ``1``), so ``auto`` pins a replay only when the CPUs were nearly
#: idle of other threads: in 385 busy rounds its median was the unpinned one's (benchmarks/RESULTS.md, session 17).
PIN_ENV = "ASCEND_EMU_PIN_THREADS"
_PIN_OFF = ("0", "false", "no", "off")
_PIN_ON = ("1", "true", "yes", "on")


class Pinned:
    """While entered (around one replay): the calling thread pinned to the CPU it is on, each other Numba thread of
    its OpenMP team to a CPU of another core it may run on; on exit every thread's former CPU set back, and a
    thread started meanwhile (it inherited the caller's one CPU) given the caller's former set. By default
    (``ASCEND_EMU_PIN_THREADS`` unset or ``auto``) only when threads outside the replay's team left the CPUs
    nearly idle since the previous replay (:func:`_others_idle`); ``1`` always; ``0`` never. A no-op with one
    Numba thread or with fewer cores allowed than threads (two SMT siblings of one core are one core here: pinning
    the threads onto one core's siblings is what must not happen). Results do not depend on it (where a thread
    runs decides no bit)."""

    def __init__(self):
        import os

        mode = os.environ.get(PIN_ENV, "auto").strip().lower() or "auto"
        if mode not in _PIN_OFF and mode not in _PIN_ON and mode != "auto":
            from ..errors import AscendEmuError

            raise AscendEmuError(f"{PIN_ENV}={mode!r} is not a thread placement: set it to auto, 1 or 0")
        self.mode = "off" if mode in _PIN_OFF else "auto" if mode == "auto" else "on"
        self.saved: list = []
        self.born_from: tuple = ()   # (the task ids before pinning, the caller's former CPU set, its pinned CPU)

    def __enter__(self):
        import os

        mode = self.mode
        if mode == "off" or not hasattr(os, "sched_setaffinity"):
            return self
        n = numba.get_num_threads()
        allowed = sorted(os.sched_getaffinity(0))
        if n < 2 or len(allowed) < n:
            return self
        here = _current_cpu()
        cpus = _one_per_core(([here] if here in allowed else []) + [c for c in allowed if c != here])
        if len(cpus) < n:
            return self
        team = _team(n)
        if mode == "auto" and not _others_idle(allowed, team):
            return self
        try:
            tasks = _tasks()
            for tid, cpu in zip(team, cpus):
                self.saved.append((tid, os.sched_getaffinity(tid)))
                os.sched_setaffinity(tid, {cpu})
            self.born_from = (tasks, self.saved[0][1], {cpus[0]})
        except OSError:   # a thread gone, or a CPU set the system refuses: leave every thread as it was
            self.__exit__(None, None, None)
        except BaseException:   # an interrupt half way: every thread as it was, then the interrupt
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        import os

        for tid, cpus in self.saved:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass   # the thread ended
        if self.born_from and self.born_from[0] is not None:
            # a thread started during the replay (a callback's pool, a library's lazily started workers) inherited
            # the caller's one CPU: the caller's former set, unless it has chosen a CPU set of its own since
            before, former, pinned = self.born_from
            for tid in set(_tasks() or ()) - before:
                try:
                    if os.sched_getaffinity(tid) == pinned:
                        os.sched_setaffinity(tid, former)
                except OSError:
                    pass   # the thread ended
        self.saved = []
        self.born_from = ()
        return False


_TEAMS: dict = {}   # {a calling thread's id: (Numba's thread count, its team: the caller first)}


def _team(n: int) -> tuple:
    """The ids of the threads that run the calling thread's parallel kernels at ``n`` Numba threads, the caller
    first. Asked of the threads once (``thread_ids``: a parallel region, most of what a declining ``auto`` cost)
    and kept per calling thread while the thread count is ``n`` and every team thread is alive
    (/proc/self/task/<id>): an OpenMP team keeps its threads from one parallel region to the next."""
    import os
    import threading

    me = threading.get_native_id()
    kept = _TEAMS.get(me)
    if kept is not None and kept[0] == n and all(os.path.exists(f"/proc/self/task/{t}") for t in kept[1][1:]):
        return kept[1]
    import numpy as np

    from ..kernels.parallel import thread_ids

    ids = np.zeros(n, np.int64)
    thread_ids(ids)
    # the calling thread first whatever the threading layer (OpenMP runs iteration 0 on it; a work queue may not)
    team = (me,) + tuple(t for t in dict.fromkeys(ids.tolist()) if t != me)
    if len(_TEAMS) >= 64:   # calling threads come and go (a server's request threads): forget the old ones
        _TEAMS.clear()
    _TEAMS[me] = (n, team)
    return team


def _tasks():
    """The ids of this process's threads (None where /proc is unreadable)."""
    import os

    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except (OSError, ValueError):
        return None


def _one_per_core(cpus: list) -> list:
    """The CPUs in order, dropping each one whose core an earlier one already has (:func:`_core_of`)."""
    seen, out = set(), []
    for c in cpus:
        core = _core_of(c)
        if core not in seen:
            seen.add(core)
            out.append(c)
    return out


@functools.lru_cache(maxsize=None)
def _core_of(cpu: int):
    """The core a CPU belongs to (its package and core id in sysfs); a CPU whose topology is unreadable counts as
    a core of its own. Read once per CPU (two sysfs files a CPU were ~90 us of every ``Pinned`` entry on 2 CPUs;
    a CPU's core does not change while it exists)."""
    try:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        with open(base + "physical_package_id") as f, open(base + "core_id") as g:
            return int(f.read()), int(g.read())
    except (OSError, ValueError):
        return "cpu", cpu


#: ``ASCEND_EMU_PIN_THREADS=auto`` pins only when other threads (of other processes, and of this one outside the
#: replay's team: TensorFlow's pools between the Keras steps of ``ae.emulate``) used less than this share of the
#: allowed CPUs' time since the previous look: a pinned thread loses where another thread holds its CPU
AUTO_OTHERS_SHARE = 0.25
_LAST: list = []   # (the team, its threads' CPU seconds, {cpu: (busy, total) ticks}) at the previous look


def _team_cpu(team) -> float | None:
    """The CPU seconds the threads ``team`` of this process have run (/proc/self/task/<id>/schedstat; None where
    unreadable)."""
    total = 0
    try:
        for tid in team:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total * 1e-9


def _ticks(allowed) -> dict:
    """{cpu: (busy ticks, all ticks)} of /proc/stat for the allowed CPUs ({} where unreadable)."""
    out = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu"):
                    break   # the CPU lines come first; the rest (the interrupt counts) is long
                if line[3].isdigit():
                    v = line.split()
                    cpu = int(v[0][3:])
                    if cpu in allowed:
                        t = [int(x) for x in v[1:9]]
                        out[cpu] = (sum(t) - t[3] - t[4], sum(t))   # all but idle and iowait
    except OSError:
        return {}
    return out


def _others_idle(allowed, team) -> bool:
    """Whether threads other than ``team`` (the replay's calling thread and its Numba workers) used less than
    AUTO_OTHERS_SHARE of the allowed CPUs' time since the previous look (False at the first look of a team and
    where /proc is unreadable): the team's own CPU time is taken out of the busy ticks."""
    import os

    team = tuple(team)
    now = (team, _team_cpu(team), _ticks(set(allowed)))
    last = _LAST[0] if _LAST else None
    _LAST[:] = [now]
    if last is None or last[0] != team or now[1] is None or last[1] is None or not now[2] \
            or set(now[2]) != set(last[2]):
        return False
    busy = sum(now[2][c][0] - last[2][c][0] for c in now[2])
    total = sum(now[2][c][1] - last[2][c][1] for c in now[2])
    if total <= 0:
        return False
    ours = (now[1] - last[1]) * os.sysconf("SC_CLK_TCK")
    return busy - ours < AUTO_OTHERS_SHARE * total


_LIBC: list = []   # the C library's handle, opened on first use


def _current_cpu() -> int:
    """The CPU the calling thread runs on (glibc's sched_getcpu; -1 where unknown)."""
    import ctypes

    try:
        if not _LIBC:
            _LIBC.append(ctypes.CDLL(None))
        return int(_LIBC[0].sched_getcpu())
    except (OSError, AttributeError):
        return -1

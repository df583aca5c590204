"""The opt-in pinning of a replay's Numba threads (``ASCEND_EMU_PIN_THREADS=1``, npu/threads.py ``Pinned``): off by
default; when on, the calling thread and its OpenMP worker each on a CPU of their own during the replay and every
thread's CPU set restored after it; the replay's outputs, records and status as unpinned. The pinned case needs 2
Numba threads and 2 CPUs (skipped under ``make test``, which runs one Numba thread per worker)."""
import os
import threading

import numba
import numpy as np
import pytest

from ascend_emu import Device
from ascend_emu.kernels.parallel import thread_ids
from ascend_emu.npu import threads as _threads

from test_deferred_cast import _graph, _hostile  # a small graph and hostile data
from test_prepared_nodes import _result

needs_two = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or numba.get_num_threads() < 2
                               or len(os.sched_getaffinity(0)) < 2,
                               reason="needs 2 Numba threads and 2 CPUs (NUMBA_NUM_THREADS=2)")


def _team():
    ids = np.zeros(numba.get_num_threads(), np.int64)
    thread_ids(ids)
    return ids.tolist()


def test_thread_ids_start_with_the_calling_thread():
    ids = _team()
    assert ids[0] == threading.get_native_id() and len(set(ids)) == len(ids)


def test_off_by_default_changes_no_affinity(monkeypatch):
    monkeypatch.delenv(_threads.PIN_ENV, raising=False)
    before = {t: os.sched_getaffinity(t) for t in _team()}
    with _threads.Pinned() as p:
        assert p.saved == [] and {t: os.sched_getaffinity(t) for t in before} == before


@needs_two
def test_pinned_one_cpu_each_then_restored(monkeypatch):
    monkeypatch.setenv(_threads.PIN_ENV, "1")
    team = _team()
    before = {t: os.sched_getaffinity(t) for t in team}
    with _threads.Pinned():
        inside = [os.sched_getaffinity(t) for t in team]
        assert all(len(c) == 1 for c in inside) and len(set.union(*inside)) == len(team)
    assert {t: os.sched_getaffinity(t) for t in team} == before


@needs_two
def test_a_pinned_replay_gives_the_bits_of_an_unpinned_one_and_unpins(monkeypatch):
    g, feeds = _graph(), _hostile("special")
    dev = Device("allow_mix_precision")
    free = _result(dev.replay(g, feeds, progress=False, keep_tensors=True))
    before = {t: os.sched_getaffinity(t) for t in _team()}
    monkeypatch.setenv(_threads.PIN_ENV, "1")
    seen = []
    real = _threads.Pinned.__exit__

    def spy(self, *exc):   # what the replay had pinned, just before it lets go
        seen.append([len(os.sched_getaffinity(t)) for t, _ in self.saved])
        return real(self, *exc)

    monkeypatch.setattr(_threads.Pinned, "__exit__", spy)
    assert _result(dev.replay(g, feeds, progress=False, keep_tensors=True)) == free
    assert seen == [[1] * len(before)]
    assert {t: os.sched_getaffinity(t) for t in before} == before


def test_auto_pins_only_when_other_processes_left_the_cpus_idle(monkeypatch):
    """``auto``'s look at /proc/stat: the busy ticks since the previous look, less this process's own CPU time,
    against AUTO_OTHERS_SHARE (1/4) of all ticks; no decision to pin at the first look."""
    import time

    tick = os.sysconf("SC_CLK_TCK")   # Linux's USER_HZ
    ticks = iter([{0: (0, 0), 1: (0, 0)},
                  {0: (10, 100), 1: (20, 100)},      # 30 of 200 ticks busy, 20 of them this process's
                  {0: (110, 200), 1: (20, 200)},     # 100 of 200 busy, none ours: another process
                  {0: (150, 300), 1: (30, 300)}])    # 50 of 200 busy, none ours: just the share, not below
    cpu = iter([0.0, 20 / tick, 20 / tick, 20 / tick])
    monkeypatch.setattr(_threads, "_ticks", lambda allowed: next(ticks))
    monkeypatch.setattr(time, "process_time", lambda: next(cpu))
    monkeypatch.setattr(_threads, "_LAST", [])
    assert _threads._others_idle([0, 1]) is False   # the first look
    assert _threads._others_idle([0, 1]) is True    # others: 10 ticks < 50
    assert _threads._others_idle([0, 1]) is False   # others: 100 ticks
    assert _threads._others_idle([0, 1]) is False   # others: 50 ticks, not below 50


def test_auto_reads_real_cpu_ticks():
    got = _threads._ticks({0})
    assert set(got) == {0} and 0 <= got[0][0] <= got[0][1]

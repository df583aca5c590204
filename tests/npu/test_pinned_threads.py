"""The pinning of a replay's Numba threads (``ASCEND_EMU_PIN_THREADS``, npu/threads.py ``Pinned``): ``auto`` by
default (only when other processes left the CPUs nearly idle), ``1`` always, ``0`` never; when pinned, the calling
thread and its OpenMP worker each on a CPU of another core during the replay, every thread's CPU set restored after
it and a thread started meanwhile given the caller's former set; the replay's outputs, records and status as
unpinned. The in-process pinned cases need 2 Numba threads (skipped under ``make test``, which runs one Numba thread
per worker); one case runs in a child process with 2 Numba threads so that ``make test`` checks the pinning too."""
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


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_zero_changes_no_affinity(monkeypatch, value):
    monkeypatch.setenv(_threads.PIN_ENV, value)
    before = {t: os.sched_getaffinity(t) for t in _team()}
    with _threads.Pinned() as p:
        assert p.saved == [] and {t: os.sched_getaffinity(t) for t in before} == before


def test_auto_is_the_default_and_does_not_pin_at_its_first_look(monkeypatch):
    monkeypatch.delenv(_threads.PIN_ENV, raising=False)
    monkeypatch.setattr(_threads, "_LAST", [])
    looks = []
    monkeypatch.setattr(_threads, "_others_idle", lambda allowed, team: looks.append(allowed) or False)
    before = {t: os.sched_getaffinity(t) for t in _team()}
    with _threads.Pinned() as p:
        assert p.saved == [] and {t: os.sched_getaffinity(t) for t in before} == before
    assert looks == ([] if numba.get_num_threads() < 2 or len(os.sched_getaffinity(0)) < 2
                     else [sorted(os.sched_getaffinity(0))])


def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch):
    from ascend_emu.errors import AscendEmuError

    monkeypatch.setenv(_threads.PIN_ENV, "always")
    with pytest.raises(AscendEmuError, match=r"^ASCEND_EMU_PIN_THREADS='always' is not a thread placement: set it "
                                             r"to auto, 1 or 0$"):
        _threads.Pinned().__enter__()


def test_one_cpu_per_core_smt_siblings_dropped(monkeypatch):
    assert _threads._core_of(10 ** 6) == ("cpu", 10 ** 6)   # unreadable topology: a core of its own
    cores = {0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (1, 0), 4: ("cpu", 4)}   # 0 and 1 are siblings of one core
    monkeypatch.setattr(_threads, "_core_of", cores.__getitem__)
    assert _threads._one_per_core([1, 0, 2, 3, 4]) == [1, 2, 3, 4]
    assert _threads._one_per_core([0, 1]) == [0]   # two siblings: one core, too few for two threads


_CHILD = """
import os, threading
import numba
from ascend_emu.npu import threads as T
import test_pinned_threads as P
team = P._team()
before = {t: os.sched_getaffinity(t) for t in team}
born = {}
with T.Pinned() as p:
    inside = [os.sched_getaffinity(t) for t in team]
    def child():
        born['in'] = os.sched_getaffinity(0)
        born['tid'] = threading.get_native_id()
        gate.wait()
        born['after'] = os.sched_getaffinity(0)
    gate = threading.Event()
    th = threading.Thread(target=child)
    th.start()
    while 'tid' not in born:
        pass
assert all(len(c) == 1 for c in inside) and len(set.union(*inside)) == len(team), inside
assert {t: os.sched_getaffinity(t) for t in team} == before
gate.set(); th.join()
assert born['in'] == inside[0] and born['after'] == before[team[0]], born
from ascend_emu import Device
g, feeds = P._big()
seen = []
real = T.Pinned.__exit__
T.Pinned.__exit__ = lambda self, *exc: (seen.append(len(self.saved)), real(self, *exc))[1]
Device("allow_mix_precision").replay(g, feeds, progress=False)
assert seen == [len(team)] and {t: os.sched_getaffinity(t) for t in team} == before, seen
print("pinned", len(team))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(_threads._one_per_core(sorted(os.sched_getaffinity(0))))
                    < 2, reason="needs 2 CPUs of different cores")
def test_pinned_in_a_two_thread_child_and_a_thread_born_meanwhile_unpinned():
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_NUM_THREADS="2", ASCEND_EMU_PIN_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "pinned 2", out.stderr[-2000:]


@needs_two
def test_pinned_one_cpu_each_then_restored(monkeypatch):
    monkeypatch.setenv(_threads.PIN_ENV, "1")
    team = _team()
    before = {t: os.sched_getaffinity(t) for t in team}
    with _threads.Pinned():
        inside = [os.sched_getaffinity(t) for t in team]
        assert all(len(c) == 1 for c in inside) and len(set.union(*inside)) == len(team)
    assert {t: os.sched_getaffinity(t) for t in team} == before


def _big():
    """A product large enough to run on every Numba thread (npu/threads.py SMALL_OP_ELEMENTS, and more than
    numerics/cube_core.py SERIAL_MACS multiply-adds), then a small op."""
    from ascend_emu.graph import Graph, InputSpec, Node

    w = np.random.default_rng(3).standard_normal((512, 512)).astype(np.float32)
    f32 = {"T": "float32"}
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [512, 512]}),
             Node("w", "Const", [], {"dtype": "float32", "value": w}),
             Node("y", "MatMul", ["x", "w"], {**f32, "transpose_a": False, "transpose_b": False}),
             Node("r", "Relu", ["y"], f32)]
    feeds = {"x": np.random.default_rng(4).standard_normal((512, 512)).astype(np.float32)}
    return Graph(nodes=nodes, inputs=[InputSpec("x", "float32", [512, 512])], outputs=["r:0"]), feeds


@needs_two
@pytest.mark.parametrize("graph, pins", [(_big, True), (lambda: (_graph(), _hostile("special")), False)],
                         ids=["a product on all threads", "small ops only"])
def test_a_pinned_replay_gives_the_bits_of_an_unpinned_one_and_unpins(monkeypatch, graph, pins):
    """Pinned at the replay's first op on all threads: a replay of small ops only (one thread) is never pinned."""
    g, feeds = graph()
    dev = Device("allow_mix_precision")
    monkeypatch.setenv(_threads.PIN_ENV, "0")
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
    assert seen == [[1] * len(before) if pins else []]
    assert {t: os.sched_getaffinity(t) for t in before} == before


def test_auto_pins_only_when_other_threads_left_the_cpus_idle(monkeypatch):
    """``auto``'s look at /proc/stat: the busy ticks since the previous look, less the replay team's own CPU time
    (other threads of this process count as others: TensorFlow's between Keras steps), against AUTO_OTHERS_SHARE
    (1/4) of all ticks; no decision to pin at the first look, nor at a new team's first."""
    tick = os.sysconf("SC_CLK_TCK")   # Linux's USER_HZ
    ticks = iter([{0: (0, 0), 1: (0, 0)},
                  {0: (10, 100), 1: (20, 100)},      # 30 of 200 ticks busy, 20 of them the team's
                  {0: (110, 200), 1: (20, 200)},     # 100 of 200 busy, none the team's: another thread
                  {0: (150, 300), 1: (30, 300)},     # 50 of 200 busy, none the team's: just the share, not below
                  {0: (150, 400), 1: (30, 400)},     # idle, but another team: its first look
                  {0: (150, 500), 1: (30, 500)}])    # idle, the same team again
    cpu = iter([0.0, 20 / tick, 20 / tick, 20 / tick, 0.0, 0.0])
    monkeypatch.setattr(_threads, "_ticks", lambda allowed: next(ticks))
    monkeypatch.setattr(_threads, "_team_cpu", lambda team: next(cpu))
    monkeypatch.setattr(_threads, "_LAST", [])
    assert _threads._others_idle([0, 1], [7, 8]) is False   # the first look
    assert _threads._others_idle([0, 1], [7, 8]) is True    # others: 10 ticks < 50
    assert _threads._others_idle([0, 1], [7, 8]) is False   # others: 100 ticks
    assert _threads._others_idle([0, 1], [7, 8]) is False   # others: 50 ticks, not below 50
    assert _threads._others_idle([0, 1], [9, 8]) is False   # a new team
    assert _threads._others_idle([0, 1], [9, 8]) is True


def test_a_team_cpu_time_from_the_kernel():
    import threading
    import time

    me = threading.get_native_id()
    t0 = _threads._team_cpu([me])
    end = time.thread_time() + 0.05
    while time.thread_time() < end:
        pass
    assert t0 is not None and _threads._team_cpu([me]) - t0 >= 0.04
    assert _threads._team_cpu([2 ** 31 - 5]) is None   # no such thread


def test_auto_reads_real_cpu_ticks():
    got = _threads._ticks({0})
    assert set(got) == {0} and 0 <= got[0][0] <= got[0][1]


def test_the_team_is_asked_once_per_calling_thread(monkeypatch):
    """``_team`` runs the ``thread_ids`` parallel region once per calling thread and thread count, and again
    when the count changes or a team thread is gone (/proc/self/task): a declining ``auto`` costs no region."""
    import ascend_emu.kernels.parallel as kp

    regions = []
    real = kp.thread_ids
    monkeypatch.setattr(kp, "thread_ids", lambda ids: regions.append(ids.size) or real(ids))
    monkeypatch.setattr(_threads, "_TEAMS", {})
    n = numba.get_num_threads()
    team = _threads._team(n)
    assert list(team) == _team() and _threads._team(n) == team and regions == [n]
    assert _threads._team(n + 1) and regions == [n, n + 1]          # another thread count: asked again
    me = threading.get_native_id()
    _threads._TEAMS[me] = (n, (me, 2 ** 31 - 5))                     # a team thread gone: asked again
    assert _threads._team(n) == team and regions == [n, n + 1, n]
    other = []
    t = threading.Thread(target=lambda: other.append(_threads._team(n)))
    t.start()
    t.join()
    assert other[0][0] == t.native_id and regions == [n, n + 1, n, n]   # another calling thread: its own
    if n >= 2 and len(_threads._one_per_core(sorted(os.sched_getaffinity(0)))) >= 2:
        monkeypatch.setenv(_threads.PIN_ENV, "auto")
        monkeypatch.setattr(_threads, "_others_idle", lambda allowed, team: False)
        for _ in range(3):
            with _threads.Pinned() as p:
                assert p.saved == []
        assert regions == [n, n + 1, n, n]                           # auto declined three times, no region

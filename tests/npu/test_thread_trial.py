"""The thread trial of a training step's replays (npu/threads.py ``Trial``, ``Device.replay``): after the plan's first
replay, the replays alternate between the cube ops on one Numba thread and the size rule until each way has run
``ROUNDS`` times, then the faster way is kept; the trained weights and every step's record are the bits of training
without the trial. The in-process checks of the trial's bookkeeping need no threads; the training runs in a child
process with 2 Numba threads (``make test`` runs one Numba thread per worker, where no trial is made)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from ascend_emu.npu.threads import Trial


def test_the_first_replay_is_untimed_then_the_ways_alternate_and_the_faster_is_kept():
    t = Trial()
    assert t.pick() is None   # the first replay: the size rule, untimed
    ways = []
    one = iter([0.030, 0.020] + [0.040] * Trial.ROUNDS)
    for _ in range(2 * Trial.ROUNDS):
        w = t.pick()
        ways.append(w)
        assert t.choice is None
        t.add(w, next(one) if w == 0 else 0.025)
    assert ways == [0, 1] * Trial.ROUNDS
    assert t.choice == 0 and t.pick() == 0 and t.pick() == 0   # one thread's best 20 ms against 25 ms: kept
    t = Trial()
    t.pick()
    for _ in range(2 * Trial.ROUNDS):
        w = t.pick()
        t.add(w, 0.030 if w == 0 else 0.020)
    assert t.choice == 1 and t.pick() == 1


def test_a_tie_keeps_one_thread_and_a_way_timed_short_of_its_rounds_decides_nothing():
    t = Trial()
    t.pick()
    for _ in range(2 * Trial.ROUNDS - 1):
        w = t.pick()
        t.add(w, 0.01)
    assert t.choice is None
    t.add(t.pick(), 0.01)
    assert t.choice == 0


_CHILD = """
import numba, numpy as np, keras
from bn_models import digest   # (tests/: the variables' bytes and each step's record, hashed)
import ascend_emu as ae
from ascend_emu.npu import threads as T
from ascend_emu.npu import replay as RP
from ascend_emu.ops import CUBE

assert numba.get_num_threads() == 2
T.Trial.ROUNDS = 2
made, seen = [], {True: set(), False: set()}
init = T.Trial.__init__
T.Trial.__init__ = lambda self: (init(self), made.append(self))[0]
run = RP._Run._run

def spy(self, opdef, node, args, ctx, attrs=None):
    out = run(self, opdef, node, args, ctx, attrs)
    if opdef.kind == CUBE and max(np.size(a) for a in args) > (1 << 15):
        seen[self.serial_cube].add(numba.get_num_threads())   # the count the op's kernels ran with
    return out
RP._Run._run = spy

rng = np.random.default_rng(24)
X = rng.standard_normal((96, 16, 16, 3)).astype(np.float32)
Y = rng.integers(0, 4, 96)

def train():
    keras.backend.clear_session()
    keras.utils.set_random_seed(5)
    L = keras.layers
    m = keras.Sequential([keras.Input((16, 16, 3)), L.Conv2D(8, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
                          L.Conv2D(16, 3, padding="same"), L.ReLU(), L.GlobalAveragePooling2D(), L.Dense(4)])
    m.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with ae.emulate("allow_mix_precision", loss_scale="dynamic") as r:
        for i in range(7):
            m.train_on_batch(X[32 * (i % 3):32 * (i % 3) + 32], Y[32 * (i % 3):32 * (i % 3) + 32])
    return digest([v.numpy() for v in m.variables + m.optimizer.variables], r.steps)

tried = train()
decided = [t.choice for t in made if t.timed]
assert decided and all(c in (0, 1) for c in decided), decided
assert seen[True] == {1} and 2 in seen[False], seen
T.Trial.pick = lambda self: None   # the size rule every replay, as without the trial
assert train() == tried
print("same bits", decided)
"""


def test_a_training_with_the_trial_gives_the_bits_of_one_without_it():
    env = dict(os.environ, NUMBA_NUM_THREADS="2", ASCEND_EMU_PIN_THREADS="0",
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().startswith("same bits"), out.stderr[-3000:]


# ------------------------------------------------------------------ a small product's thread count decided once

def test_product_macs_counts_batch_m_k_n_from_the_operands():
    from ascend_emu.npu.threads import product_macs

    a, b = np.zeros((32, 256)), np.zeros((256, 512))
    assert product_macs("MatMul", [a, b], {}) == 32 * 256 * 512
    assert product_macs("_FusedMatMul", [a.T, b.T], {"transpose_a": True, "transpose_b": True}) == 32 * 256 * 512
    # a batch broadcast on either side: batch x M x K x N
    assert product_macs("BatchMatMulV2", [np.zeros((4, 32, 64)), np.zeros((64, 16))], {}) == 4 * 32 * 64 * 16
    assert product_macs("BatchMatMul", [np.zeros((32, 64)), np.zeros((4, 16, 64))], {"adj_y": True}) == 4 * 32 * 64 * 16
    assert product_macs("_FusedBatchMatMul", [np.zeros((2, 8, 4)), np.zeros((2, 8, 5))],
                        {"adj_x": True}) == 2 * 4 * 8 * 5
    # the ops it does not count: an Einsum (fused or not), a convolution, a vector
    assert product_macs("_FusedBatchMatMul", [a, b], {"base": "Einsum"}) is None
    assert product_macs("Einsum", [a, b], {}) is None
    assert product_macs("Conv2D", [np.zeros((1, 8, 8, 3)), np.zeros((3, 3, 3, 4))], {}) is None
    assert product_macs("MatMul", [np.zeros(4), b], {}) is None


@pytest.mark.parametrize("n, serial", [(256, True), (1024, False)], ids=["2^24 multiply-adds", "2^28"])
def test_a_product_of_at_most_serial_macs_fits_one_thread(monkeypatch, n, serial):
    """A MatMul whose input is past SMALL_OP_ELEMENTS but whose product has at most SERIAL_MACS multiply-adds: the
    replay fits one thread for it (no second thread woken, no replay pinned); a larger one: all threads."""
    from ascend_emu import Device
    from ascend_emu.graph import Graph, InputSpec, Node
    from ascend_emu.npu import threads as T

    rng = np.random.default_rng(7)
    w = rng.standard_normal((256, n)).astype(np.float32)
    f32 = {"T": "float32"}
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [n, 256]}),
             Node("w", "Const", [], {"dtype": "float32", "value": w}),
             Node("y", "MatMul", ["x", "w"], {**f32, "transpose_a": False, "transpose_b": False})]
    g = Graph(nodes=nodes, inputs=[InputSpec("x", "float32", [n, 256])], outputs=["y:0"])
    feeds = {"x": rng.standard_normal((n, 256)).astype(np.float32)}
    fits = []
    # a replay of 2 Numba threads, whatever this worker has (its fit recorded, not done)
    monkeypatch.setattr(T.Threads, "__init__", lambda self: self.__dict__.update(full=2, current=2, pin=None))
    monkeypatch.setattr(T.Threads, "fit", lambda self, elements, limit=T.SMALL_OP_ELEMENTS:
                        fits.append((elements, limit)))
    Device("allow_mix_precision").replay(g, feeds, progress=False)
    # the cube op's fit (the casts in front fit by the vector limit; the replay's end restores all threads)
    cube = [e for e, limit in fits if limit == T.SMALL_OP_ELEMENTS and e != T.SMALL_OP_ELEMENTS + 1]
    assert cube == [0 if serial else n * 256] and n * 256 > T.SMALL_OP_ELEMENTS

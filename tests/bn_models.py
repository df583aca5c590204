"""The small Keras CNN the training rewrites' tests train (tests/npu/test_bn_chain.py, test_eltwise_reduce_graph.py):
two Conv2D + BatchNormalization + ReLU blocks as the benchmark CNN, its data, and a run of ``train_on_batch`` steps
under ``ae.emulate("allow_mix_precision")`` with a rewrite of ``npu/training.py`` on or off, hashed."""
from __future__ import annotations

import hashlib

import numpy as np

RNG = np.random.default_rng(46)
X = RNG.standard_normal((64, 8, 8, 3)).astype(np.float32)
Y = RNG.integers(0, 4, 64)


def model():
    import keras

    keras.backend.clear_session()
    keras.utils.set_random_seed(3)
    L = keras.layers
    m = keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(8, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
                          L.Conv2D(16, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
                          L.GlobalAveragePooling2D(), L.Dense(4)], name="bn_cnn")
    m.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def digest(variables, steps) -> str:
    """sha256 of the variables' bytes and each step's loss, scale, status, skip, first overflow, gradient zeros."""
    h = hashlib.sha256()
    for v in variables:
        h.update(np.asarray(v).tobytes())
    keys = ("loss", "loss_scale", "float_status", "skipped", "first_overflow", "grad_zeros")
    h.update(repr([[s.get(k) for k in keys] for s in steps]).encode())
    return h.hexdigest()


def run_rewrite(monkeypatch, name: str, op: str, *, rewrite: bool, loss_scale="dynamic", steps=4, **options):
    """(digest, the steps' records, per step the number of ``op`` nodes the rewrite made and of one-pass ``op``
    records) of ``steps`` train_on_batch calls with ``npu.training``'s rewrite ``name`` (a function
    (device, graph) -> graph) as it is (``rewrite``) or replaced by the identity."""
    import ascend_emu as ae
    from ascend_emu.npu import device as D
    from ascend_emu.npu import training as T

    m = model()
    nodes, fast = [], []
    with monkeypatch.context() as mp:
        if rewrite:
            made = getattr(T, name)

            def counted(device, graph):
                out = made(device, graph)
                nodes.append(sum(n.op == op for n in out.nodes))
                return out
            mp.setattr(T, name, counted)
        else:
            mp.setattr(T, name, lambda device, graph: graph)
        replay = D.Device.replay

        def replayed(self, *a, **k):
            res = replay(self, *a, **k)
            fast.append(sum(r.tf_type == op for r in res.records))
            return res
        mp.setattr(D.Device, "replay", replayed)
        with ae.emulate("allow_mix_precision", loss_scale=loss_scale, **options) as run:
            for i in range(steps):
                m.train_on_batch(X[16 * i:16 * i + 16], Y[16 * i:16 * i + 16])
    variables = [v.numpy() for v in m.variables + m.optimizer.variables]
    return digest(variables, run.steps), run.steps, nodes, fast

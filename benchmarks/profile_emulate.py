"""Where a Keras ``train_on_batch`` step inside ``ae.emulate`` goes: the device's replay of the step against the
hand-over with Keras (reading and writing the model's variables, its metric reset).

    python -m benchmarks.profile_emulate cnn|mlp [--steps 24]

Not part of ``make bench``. The benchmark's CNN and MLP (``benchmarks/training.py``), three warm-up steps, then
``--steps`` steps timed without cProfile and the same number under it; prints ms per step, inclusive.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

PARTS = ("trainer.py:train_on_batch", "keras_hooks.py:train", "device.py:replay", "stateful.py:read_variables",
         "stateful.py:assign_variables", "trainer.py:reset_metrics", "constant_op.py:constant")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_emulate", description=__doc__.splitlines()[0])
    p.add_argument("model", choices=["cnn", "mlp"])
    p.add_argument("--steps", type=int, default=24)
    a = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    import ascend_emu as ae

    from .training import _cnn, _data, _mlp

    build, shape = (_mlp, (256,)) if a.model == "mlp" else (_cnn, (32, 32, 3))
    x, y = _data(shape, 32 * 8)
    m = build(keras)

    def steps():
        for i in range(a.steps):
            sl = slice((i * 32) % len(x), (i * 32) % len(x) + 32)
            m.train_on_batch(x[sl], y[sl])

    with ae.emulate("allow_mix_precision", loss_scale="dynamic"):
        for _ in range(3):
            m.train_on_batch(x[:32], y[:32])
        t = time.perf_counter()
        steps()
        wall = (time.perf_counter() - t) / a.steps
        prof = cProfile.Profile()
        prof.enable()
        steps()
        prof.disable()
    st = pstats.Stats(prof).stats
    print(f"{a.model}: {wall * 1e3:.1f} ms a step without cProfile; under it, ms a step (inclusive):")
    for part in PARTS:
        ms = sum(v[3] for k, v in st.items() if part in f"{k[0]}:{k[2]}") / a.steps * 1e3
        print(f"  {part:32s} {ms:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

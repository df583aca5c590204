"""Where a replay's (or a training step's) time goes: per op family, per kernel, interpreter overhead.

    python -m benchmarks.profile resnet50 --batch 8 --size 224
    python -m benchmarks.profile mobilenet_v2 --batch 8 --size 224
    python -m benchmarks.profile transformer --batch 8 --seq 128
    python -m benchmarks.profile train-cnn --steps 8
    python -m benchmarks.profile onnx-mobilenetv3 --runs 10     (benchmarks/onnx_replay.py's exports, fp16 910B)

Not part of ``make bench``. One warm-up run (kernel compilation, fusion, constant folding), then the
profiled run(s). Two measurements of the same runs, in one process:

- per node, with ``time.perf_counter`` around the device's node evaluation, split into the op's own
  computation (the registered implementation, outermost call only), the casts the device inserts in
  front of it, and the rest (precision decision, output checks, records: the per-op overhead);
  "replay outside nodes" is the rest of ``Device.replay`` (the interpreter loop, feeds, setup), "train loop
  outside replays" a training step's own work (loss scale, state write-back); a training run's preparation
  (tracing the step, once per run) is left out;
- per kernel, the ``tottime`` of every function under ``kernels/`` from ``cProfile`` (a separate run,
  since cProfile's own cost inflates the per-op Python overhead).
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sys
import time

import numpy as np


class _Timers:
    def __init__(self):
        self.node = collections.defaultdict(float)      # op type -> inclusive node time
        self.op = collections.defaultdict(float)        # op type -> time in the op implementation
        self.cast = collections.defaultdict(float)      # op type -> time in casts inserted for it
        self.count = collections.Counter()
        self.current = None
        self.depth = 0
        self.replay = 0.0      # wall time inside Device.replay
        self.prepare = 0.0     # wall time of a training run's preparation (tracing the step)

    def install(self):
        from ascend_emu.npu import replay as R
        from ascend_emu.ops import registry

        timers = self
        orig_eval, orig_cast, orig_call = R._Run.eval_node, R._Run._cast, registry.OpDef.__call__

        def eval_node(run, node, args):
            prev = timers.current
            timers.current = node.op
            t = time.perf_counter()
            try:
                return orig_eval(run, node, args)
            finally:
                dt = time.perf_counter() - t
                timers.current = prev
                if prev is None:      # a control-flow body's nodes count inside their parent node
                    timers.node[node.op] += dt
                    timers.count[node.op] += 1

        def cast(run, ref, value, dtype, *rest):
            t = time.perf_counter()
            try:
                return orig_cast(run, ref, value, dtype, *rest)
            finally:
                timers.cast[timers.current] += time.perf_counter() - t

        def call(opdef, *a, **k):
            if timers.depth:
                return orig_call(opdef, *a, **k)
            timers.depth += 1
            t = time.perf_counter()
            try:
                return orig_call(opdef, *a, **k)
            finally:
                timers.depth -= 1
                timers.op[timers.current] += time.perf_counter() - t

        R._Run.eval_node, R._Run._cast, registry.OpDef.__call__ = eval_node, cast, call

        from ascend_emu.npu import device as D, training as T

        def timed(fn, attr):
            def wrapper(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    setattr(timers, attr, getattr(timers, attr) + time.perf_counter() - t)
            return wrapper
        D.Device.replay = timed(D.Device.replay, "replay")
        T._prepare = timed(T._prepare, "prepare")

    def table(self, wall: float, runs: int) -> list[str]:
        ms = 1000.0 / runs
        rows = sorted(self.node, key=lambda k: -self.node[k])
        lines = [f"{'op family':<28} {'nodes':>6} {'total ms':>9} {'op ms':>9} {'casts ms':>9} {'overhead ms':>11}"]
        tot = [0.0, 0.0, 0.0]
        for k in rows:
            over = self.node[k] - self.op[k] - self.cast[k]
            tot[0] += self.op[k]
            tot[1] += self.cast[k]
            tot[2] += over
            lines.append(f"{k:<28} {self.count[k] // runs:>6} {self.node[k] * ms:>9.1f} {self.op[k] * ms:>9.1f} "
                         f"{self.cast[k] * ms:>9.1f} {over * ms:>11.1f}")
        inside = sum(self.node.values())
        lines.append(f"{'all nodes':<28} {sum(self.count.values()) // runs:>6} {inside * ms:>9.1f} "
                     f"{tot[0] * ms:>9.1f} {tot[1] * ms:>9.1f} {tot[2] * ms:>11.1f}")
        lines.append(f"{'replay outside nodes':<28} {'':>6} {(self.replay - inside) * ms:>9.1f}")
        if self.prepare:
            lines.append(f"{'train loop outside replays':<28} {'':>6} {(wall - self.prepare - self.replay) * ms:>9.1f}")
            lines.append(f"{'wall (without preparation)':<28} {'':>6} {(wall - self.prepare) * ms:>9.1f}")
        else:
            lines.append(f"{'wall':<28} {'':>6} {wall * ms:>9.1f}")
        return lines


def _kernel_table(prof: cProfile.Profile, runs: int, top: int = 20) -> list[str]:
    st = pstats.Stats(prof)
    rows = []
    total = 0.0
    for (fname, line, func), (cc, nc, tt, ct, callers) in st.stats.items():
        total += tt
        if f"{os.sep}kernels{os.sep}" in fname:
            rows.append((tt, nc, f"{fname.split(os.sep + 'kernels' + os.sep)[1]}:{func}"))
    rows.sort(reverse=True)
    lines = [f"{'kernel (cProfile tottime)':<52} {'calls':>6} {'ms':>9}"]
    for tt, nc, name in rows[:top]:
        lines.append(f"{name:<52} {nc // runs:>6} {tt * 1000 / runs:>9.1f}")
    ktot = sum(r[0] for r in rows)
    lines.append(f"{'all kernels':<52} {'':>6} {ktot * 1000 / runs:>9.1f}")
    others = sorted(((tt, nc, f"{os.path.basename(fname)}:{func}") for (fname, line, func), (cc, nc, tt, ct, callers)
                     in st.stats.items() if f"{os.sep}kernels{os.sep}" not in fname), reverse=True)
    lines.append(f"{'  of the rest, the largest (tottime):':<52}")
    for tt, nc, name in others[:8]:
        lines.append(f"  {name:<50} {nc // runs:>6} {tt * 1000 / runs:>9.1f}")
    lines.append(f"{'everything else (Python, numpy, cProfile)':<52} {'':>6} {(total - ktot) * 1000 / runs:>9.1f}")
    return lines


def _replay_job(args):
    from ascend_emu import Device
    from ascend_emu.frontend.tf import models
    from ascend_emu.frontend.tf.loader import load_graph

    if args.target == "transformer":
        model = models.transformer_encoder(seq_len=args.seq, d_model=args.d_model, num_heads=args.heads,
                                           ff_dim=4 * args.d_model)
        shape = (args.batch, args.seq, args.d_model)
    else:
        model = getattr(models, args.target)(input_shape=(args.size, args.size, 3))
        shape = (args.batch, args.size, args.size, 3)
    graph = load_graph(model)
    name = graph.inputs[0].name
    x = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    dev = Device(args.precision_mode)
    dev.replay(graph, x, None, progress=False, keep_tensors=False)   # warm-up

    def job():
        dev.replay(graph, x, None, progress=False, keep_tensors=False)
    return job, 1


#: profile target -> the first words of benchmarks/onnx_replay.py's model label
ONNX_TARGETS = {"onnx-llama": "LLaMA", "onnx-bert": "BERT", "onnx-gpt2": "GPT-2", "onnx-squeezenet": "SqueezeNet",
                "onnx-mobilenetv3": "MobileNetV3"}


def _onnx_job(args):
    import onnx

    from ascend_emu import Device
    from ascend_emu.frontend.onnx.loader import load_onnx
    from benchmarks.onnx_replay import cases

    label, raw, x = next(c for c in cases() if c[0].startswith(ONNX_TARGETS[args.target]))
    graph = load_onnx(onnx.load_from_string(raw))
    feeds = {graph.inputs[0].name: x}
    dev = Device(soc="Ascend910B")
    dev.replay(graph, feeds, None, progress=False, keep_tensors=False)   # warm-up

    def job():
        for _ in range(args.runs):
            dev.replay(graph, feeds, None, progress=False, keep_tensors=False)
    return job, args.runs


def _train_job(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import ascend_emu as ae
    from benchmarks.training import _cnn, _data, _mlp

    build, shape = (_cnn, (32, 32, 3)) if args.target == "train-cnn" else (_mlp, (256,))
    data = _data(shape, 32 * 8)
    model = build(keras)
    dev = ae.Device(args.precision_mode)
    dev.train(model, data, batch_size=32, steps=1, loss_scale="dynamic", progress=False)   # warm-up

    def job():
        dev.train(model, data, batch_size=32, steps=args.steps, loss_scale="dynamic", progress=False)
    return job, args.steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n")[0])
    p.add_argument("target", choices=["resnet50", "mobilenet_v2", "transformer", "train-cnn", "train-mlp",
                                      *ONNX_TARGETS])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--runs", type=int, default=10, help="replays per measurement (onnx-* targets)")
    p.add_argument("--precision-mode", default="allow_mix_precision")
    p.add_argument("--no-cprofile", action="store_true")
    args = p.parse_args(argv)
    job, runs = (_train_job if args.target.startswith("train") else _onnx_job if args.target in ONNX_TARGETS
                 else _replay_job)(args)
    timers = _Timers()
    timers.install()
    t = time.perf_counter()
    job()
    wall = time.perf_counter() - t
    print(f"# {args.target}: per op family, ms per {'step' if args.target.startswith('train') else 'replay'}")
    print("\n".join(timers.table(wall, runs)))
    if not args.no_cprofile:
        prof = cProfile.Profile()
        prof.enable()
        job()
        prof.disable()
        print()
        print("\n".join(_kernel_table(prof, runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Throughput benchmarks, measured side by side with their baselines in one run.

Each module in ``MODULES`` exposes ``run(quick: bool) -> list[dict]``; every row has
``group, name, ours, baseline, baseline_name, unit, ratio, target`` where ``ratio`` is
ours/baseline in the unit's "higher is better" sense and ``target`` the minimum ratio
an issue asks for (or None). ``python -m benchmarks`` prints the table and writes JSON.
"""

MODULES = ["benchmarks.cast_vector", "benchmarks.cube", "benchmarks.replay", "benchmarks.replay_nodump", "benchmarks.compare",
           "benchmarks.training", "benchmarks.sweep", "benchmarks.fit", "benchmarks.lowfloat",
           "benchmarks.demo", "benchmarks.torch_step", "benchmarks.onnx_replay"]

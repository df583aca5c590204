"""python -m benchmarks.zoo [--only A,B] [--out docs/ZOO.md]: replay the model zoo and write its table.

Every keras.applications constructor at its smallest input, the Keras LSTM/GRU classifiers and the
keras_hub BERT and GPT-2 backbones (tiny configs) and a frozen tf.compat.v1 graph with TF1 control flow,
seeded random weights: the TensorFlow float32 reference, then a must_keep_origin_dtype replay (compared with
the reference) and an allow_mix_precision replay. One row per model: graph ops, where the replayed
ops ran (AI Core / AI CPU / host), the float32 agreement, the times. A model that fails gets its error.
"""
from __future__ import annotations

import argparse
import platform
import time

import numpy as np

#: float32 agreement required, as tests/npu/test_zoo.py
COSINE, REL_MAX_ABS = 0.99999, 1e-4
HEADER = ("| model | input | graph ops | replayed ops (AI Core / AI CPU / host) | fp32: 1 - cosine | "
          "fp32: max abs diff / max abs | TF s | replay fp32 s | replay mix s | result |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def cases() -> list[tuple[str, callable]]:
    from ascend_emu.frontend.tf import models

    out = [(name, lambda n=name: models.application(n, fresh=True)) for name in models.applications()]
    out += [(f"{layer} classifier", lambda k=layer: models.rnn_classifier(k, fresh=True)) for layer in ("LSTM", "GRU")]
    # keras_hub backbones, tiny configs (needs keras-hub: pip install -e '.[hub]'; else the row says so)
    out += [(f"keras_hub {name}", lambda n=name: models.hub_backbone(n, fresh=True)) for name in models.HUB_BACKBONES]
    out.append(("TF1 frozen while_loop + cond", models.tf1_control_flow_graph))
    return out


def row(name: str, build) -> str:
    from ascend_emu import Device, reference
    from ascend_emu.frontend.tf.loader import first_line, load_graph

    size = "-"
    try:
        g = load_graph(build())
        spec = g.inputs[0].shape
        size = "x".join(str(d) for d in (spec[1:] if spec[0] is None else spec)) if spec else "-"  # batch dim unknown
        t0 = time.perf_counter()
        ref = reference(g, None, progress=False)
        t_tf = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = Device("must_keep_origin_dtype").replay(g, ref.inputs, progress=False, keep_tensors=False)
        t_fp32 = time.perf_counter() - t0
        t0 = time.perf_counter()
        Device("allow_mix_precision").replay(g, ref.inputs, progress=False, keep_tensors=False)
        t_mix = time.perf_counter() - t0
    except Exception as e:   # the table records the failure, with the op the error names
        return f"| {name} | {size} | | | | | | | | fails: {first_line(e).replace('|', '/')} |"
    engines = {k: sum(1 for r in res.records if r.engine == k) for k in ("AICORE", "AICPU", "HOST")}
    one_minus_cos = rel = 0.0
    for out in g.outputs:      # the worst output (BERT has two)
        a = np.asarray(res.outputs[out], np.float64).ravel()
        b = np.asarray(ref.outputs[out], np.float64).ravel()
        one_minus_cos = max(one_minus_cos, 1 - float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
        rel = max(rel, float(np.abs(a - b).max() / np.abs(b).max()))
    return (f"| {name} | {size} | {len(g.nodes)} | {engines['AICORE']} / {engines['AICPU']} / {engines['HOST']} | "
            f"{one_minus_cos:.1e} | {rel:.1e} | {t_tf:.1f} | {t_fp32:.1f} | {t_mix:.1f} | "
            f"{'matches' if one_minus_cos <= 1 - COSINE and rel <= REL_MAX_ABS else 'DIFFERS'} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated model names (default: all)")
    ap.add_argument("--out", help="write the markdown table here (default: print it)")
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    lines = [HEADER]
    for name, build in cases():
        if only is None or name in only:
            lines.append(row(name, build))
            print(lines[-1], flush=True)
    text = (f"Model zoo replay, measured by `python -m benchmarks.zoo` ({platform.machine()}, "
            f"{time.strftime('%Y-%m-%d')}). Times in seconds, one process, kernels already compiled.\n\n"
            + "\n".join(lines) + "\n")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

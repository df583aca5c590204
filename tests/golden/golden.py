"""Golden digests: fixed models replayed under fixed configs, hashed op by op.

A refactor must not change a single dumped bit (tinygrad's "process replay"). Each case
replays a seeded bundled model with a fixed device configuration into a dump, reads the
dump back, and hashes every dumped op: its name, TF type, engine, compute dtype, status
bits, and each output's dtype, shape and bytes. ``digests.json`` beside this file holds
the recorded hashes; regenerate it only when a change is meant to alter numerics
(``python tests/golden/golden.py --write``) and say why in the commit.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

DIGESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digests.json")

#: case name -> (model builder name, builder kwargs, Device kwargs)
CASES = {
    "demo/allow_mix_precision/Ascend910": ("demo_model", {}, {"precision_mode": "allow_mix_precision"}),
    "demo/allow_mix_precision/Ascend910B": ("demo_model", {}, {"precision_mode": "allow_mix_precision",
                                                                "soc": "Ascend910B"}),
    "demo/force_fp16/fusion_off": ("demo_model", {}, {"precision_mode": "force_fp16", "fusion_switch": "off"}),
    "demo/force_fp32": ("demo_model", {}, {"precision_mode": "force_fp32"}),
    # the float32 cube (HF32 off) with the 910's vector kernels and overflow mode: until the SoC table (issue 29)
    # this was must_keep_origin_dtype on the default Ascend910, whose cube has no float32 (its digests are those)
    "demo/must_keep_origin_dtype/float32_cube": ("demo_model", {}, {
        "precision_mode": "must_keep_origin_dtype", "soc": "Ascend910B", "allow_hf32": "none",
        "overflow_mode": "saturation", "op_model": "tbe_v100"}),
    # the A2's training default: float32 convolutions through HF32
    "demo/origin/Ascend910B": ("demo_model", {}, {"precision_mode_v2": "origin", "soc": "Ascend910B"}),
    "demo/fp16/Ascend310P3": ("demo_model", {}, {"precision_mode_v2": "fp16", "soc": "Ascend310P3"}),
    "demo/allow_mix_precision_bf16": ("demo_model", {}, {"precision_mode": "allow_mix_precision_bf16",
                                                         "soc": "Ascend910B"}),
    "demo/force_fp16/aligned_cube_flush": ("demo_model", {}, {
        "precision_mode": "force_fp16", "subnormals": "flush", "impl_mode": "high_performance",
        "cube_model": {"block_sum": "aligned", "extra_bits": 3, "normalize": "truncate"}}),
    "planted/allow_mix_precision": ("planted_overflow_model", {}, {"precision_mode": "allow_mix_precision"}),
    "transformer/allow_mix_precision": ("transformer_encoder", {"seq_len": 8, "d_model": 32, "num_heads": 2,
                                                                "ff_dim": 64},
                                        {"precision_mode": "allow_mix_precision"}),
    "transformer/force_fp16/fusion_off": ("transformer_encoder", {"seq_len": 8, "d_model": 32, "num_heads": 2,
                                                                  "ff_dim": 64},
                                          {"precision_mode": "force_fp16", "fusion_switch": "off"}),
}


def _device(kwargs):
    import ascend_emu as ae

    kwargs = dict(kwargs)
    if "cube_model" in kwargs:
        kwargs["cube_model"] = ae.CubeModel(**kwargs["cube_model"])
    return ae.Device(**kwargs)


def case_digests(case: str) -> dict:
    """Replay ``case`` into a temporary dump and hash each dumped op (op name -> hex digest)."""
    import numpy as np

    import ascend_emu as ae
    from ascend_emu.frontend.tf import models

    builder, bkw, dkw = CASES[case]
    model = getattr(models, builder)(**bkw)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dump")
        _device(dkw).replay(model, dump_dir=path, seed=0, progress=False)
        dump = ae.load_dump(path)
        out = {}
        for op in dump.ops:
            h = hashlib.sha256()
            h.update(json.dumps([op["name"], op["tf_type"], op["engine"], op["compute_dtype"],
                                 int(op.get("status", 0))]).encode())
            for i, o in enumerate(op["outputs"]):
                if o.get("file") is None:
                    h.update(b"nofile")
                    continue
                t = np.ascontiguousarray(dump.tensor(op["name"], i, mmap=False))
                h.update(f"{t.dtype.name}{list(t.shape)}".encode())
                h.update(t.tobytes())
            out[op["name"]] = h.hexdigest()[:16]
        return out


def load() -> dict:
    with open(DIGESTS) as f:
        return json.load(f)


def main(argv) -> int:
    if argv[1:] != ["--write"]:
        print("usage: python tests/golden/golden.py --write   (regenerates digests.json)")
        return 2
    data = {case: case_digests(case) for case in CASES}
    with open(DIGESTS, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {DIGESTS}: {len(data)} cases, {sum(len(v) for v in data.values())} ops")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

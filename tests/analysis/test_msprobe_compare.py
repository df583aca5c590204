"""The real ``msprobe compare`` (mindstudio-probe 26.2, installed by ``make test``) on exports in msprobe's PyTorch
layout: an emulated dump against a float32 one, msprobe's CSV checked row by row against ``ascend-emu compare``.

Skipped, with the reason, only where mindstudio-probe or torch is not installed and ASCEND_EMU_REQUIRE_MSPROBE is unset
(`make test` sets it: there a missing msprobe fails the run).
"""
import json

import pytest

from ascend_emu.analysis.compare import ERROR, compare
from ascend_emu.analysis.msprobe import SIDECAR, export_msprobe
from msprobe_real import msprobe_missing, run_msprobe_compare


def output_rows(rows, npu_root) -> list:
    """msprobe's output rows in its order (the dump's), each with the ascend-emu tensor name it is for."""
    keys = json.load(open(npu_root / "step0" / "rank0" / SIDECAR))["dump_keys"]
    out = []
    for t in rows:
        name = t["NPU Name"]
        if ".output." not in name or t["Bench Name"] in ("", "N/A"):
            continue
        key, idx = name.rsplit(".output.", 1)
        out.append((f"{keys[key]}:{idx}", t))
    return out


@pytest.mark.models
@pytest.mark.skipif(msprobe_missing() is not None, reason=msprobe_missing() or "")
def test_real_msprobe_compare_of_pytorch_layout(tmp_path):
    """The demo model on the emulated 910 (allow_mix_precision, saturation) against TF float32, both exported in
    msprobe's PyTorch layout: msprobe reads both, its metrics and Result column agree with ours row for row, its
    first error row is our first error among the tensors it pairs, and it sees the saturated `wide` MatMul
    (65504 where float32 has more) as a large MaxAbsErr, the op ascend-emu's own rules name first."""
    from ascend_emu import Device, reference
    from ascend_emu.frontend.tf import models
    from ascend_emu.frontend.tf.loader import load_graph

    g = load_graph(models.demo_model())
    ref = reference(g, None, tmp_path / "bench", progress=False)
    Device("allow_mix_precision", soc="Ascend910").replay(g, ref.inputs, tmp_path / "npu", progress=False)
    for side in ("npu", "bench"):
        export_msprobe(tmp_path / side, tmp_path / f"ms_{side}", framework="pytorch")
    [rows] = run_msprobe_compare(tmp_path / "ms_npu" / "step0", tmp_path / "ms_bench" / "step0",
                                 tmp_path / "out").values()
    rows = output_rows(rows, tmp_path / "ms_npu")
    assert len(rows) >= 15
    cmp = compare(tmp_path / "npu", tmp_path / "bench", rules="msprobe")
    ours = {r["NPU Name"]: r for r in cmp.rows if r["NPU Name"]}
    for name, t in rows:
        r = ours[name]
        assert r["Result"] == t["Result"], (name, t["Err_message"], r["Err_message"])
        assert t["NPU Dtype"] == "torch." + r["NPU Dtype"] and t["Bench Dtype"] == "torch." + r["Bench Dtype"]
        try:
            cos = float(t["Cosine"])
        except ValueError:
            continue     # msprobe's "unsupported" / "Nan"
        assert abs(r["Cosine"] - cos) <= 1e-6, (name, r["Cosine"], cos)
        assert r["MaxAbsErr"] == pytest.approx(float(t["MaxAbsErr"]), rel=1e-6, abs=1e-9), name
    # the first divergent row: msprobe's first error row is our first error (execution order) among the tensors
    # msprobe pairs (the replay's inserted Casts have no float32 counterpart by name, so msprobe leaves them out)
    paired = {name for name, _ in rows}
    first_error = next(name for name, t in rows if t["Result"] == ERROR)
    assert first_error == next(r["NPU Name"] for r in cmp.rows if r["NPU Name"] in paired and r["Result"] == ERROR)
    assert not first_error.startswith("image/")
    own = compare(tmp_path / "npu", tmp_path / "bench").first_divergent()
    assert "wide" in own.name and "MatMul" in own.op["tf_type"]    # (fused with its BiasAdd)
    [wide] = [t for name, t in rows if name == f"{own.name}:0"]
    assert float(wide["MaxAbsErr"]) > 1 and float(wide["NPU max"]) == 65504.0

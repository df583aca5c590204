"""sensitivity: the demo model's planted overflow holds under every variant of the assumed parameters; each
parameter's effect is listed; compare and report print the robustness line; a moved conclusion names its mover."""
import json
import os

import pytest

from ascend_emu.numerics import assumptions as asm


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from ascend_emu.frontend.tf.models import demo_model
    from ascend_emu.frontend.tf.reference import reference
    from ascend_emu.npu.device import Device
    from ascend_emu.tools.sensitivity import sensitivity

    d = tmp_path_factory.mktemp("sens")
    ref = reference(demo_model(), None, str(d / "bench"), progress=False)
    dev = Device("allow_mix_precision")
    dev.replay(ref.graph, ref.inputs, str(d / "npu"), progress=False)
    res = sensitivity(ref.graph, ref.inputs, device=dev, dump=str(d / "npu"), json_path=str(d / "s.json"),
                      report=str(d / "s.html"), progress=False)
    return res, d


@pytest.mark.models
def test_demo_overflow_is_robust(demo):
    res, d = demo
    c = res.conclusions
    assert c["first_overflow"]["robust"] and c["first_overflow"]["default"]["op"].endswith("wide_1/BiasAdd")
    assert c["first_overflow"]["default"]["verdict"] == "abnormal"
    assert c["first_divergent"]["robust"] and c["first_divergent"]["default"].endswith("wide_1/BiasAdd")
    labels = [v["label"] for v in res.variants]
    assert labels[0] == "default" and sum(lab.startswith("corner") for lab in labels) == 2
    # every parameter that can act on this device (HF32 off on the 910; deterministic) is varied and listed
    # (and the torch eager path's parameters, which a graph replay never reads)
    assert set(res.skipped) == {"hf32_bits", "hf32_conv_rounding", "hf32_matmul_rounding", "hif8_rounding",
                                "multicore_reduce_min_chunk", "fa_kv_block", "use_fp16_out", "compound_ops",
                                "float_status_clear"}
    varied = {a.name for a in asm.ASSUMED} - set(res.skipped)
    assert set(res.parameters) == varied
    for name in varied:
        alts = [v for v in asm.assumed(name).tried() if v != asm.current(res_device_policy())[name]]
        assert sum(v["label"].startswith(name + "=") for v in res.variants) == len(alts)
        assert res.parameters[name]["moves"] == []       # nothing moves any conclusion here
    text = res.format_text()
    assert "first_overflow   ROBUST" in text and "cube_block_sum" in text
    with open(d / "s.json") as f:
        js = json.load(f)
    assert js["conclusions"]["first_overflow"]["robust"] is True and len(js["variants"]) == len(labels)
    assert all(set(v["params"]) == {a.name for a in asm.ASSUMED} for v in js["variants"])
    html = open(d / "s.html").read()
    assert 'id="bands"' in html and "wide_1/BiasAdd" in html


def res_device_policy():
    from ascend_emu.npu.device import Device

    return Device("allow_mix_precision").numerics


@pytest.mark.models
def test_compare_and_report_print_robustness(demo, capsys, tmp_path):
    from ascend_emu.analysis.robustness import sidecar
    from ascend_emu.cli.main import main

    res, d = demo
    assert os.path.isfile(sidecar(str(d / "npu")))
    assert main(["compare", str(d / "npu"), str(d / "bench")]) == 0
    out = capsys.readouterr().out
    assert "robust: first_divergent, first_overflow, output_cosine, float_status" in out
    assert main(["report", str(d / "npu"), str(d / "bench"), "-o", str(tmp_path / "r.html")]) == 0
    assert "robust: first_divergent" in capsys.readouterr().out
    assert "robustness (ascend-emu sensitivity)" in open(tmp_path / "r.html").read()
    # a sensitivity run of other inputs is not this dump's: no line
    data = json.loads(open(sidecar(str(d / "npu"))).read())
    data["inputs_sha256"] = "0" * 64
    with open(sidecar(str(d / "npu")), "w") as f:
        json.dump(data, f)
    assert main(["compare", str(d / "npu"), str(d / "bench")]) == 0
    assert "robust:" not in capsys.readouterr().out


def test_moved_conclusion_names_its_parameter():
    from ascend_emu.tools.sensitivity import _conclusions, _per_parameter

    def row(label, varies, first, cos, ops):
        return {"label": label, "varies": varies, "first_divergent": first, "first_overflow": None,
                "output_cosine": cos, "float_status": "0x0", "op_cosine": ops}

    rows = [row("default", [], "a", 0.99, {"a": 0.99, "b": 0.98}),
            row("impl_mode=high_performance", ["impl_mode"], "a", 0.9895, {"a": 0.99, "b": 0.97}),
            row("cube_block_sum=sequential", ["cube_block_sum"], "b", 0.95, {"a": 0.99, "b": 0.98})]
    c = _conclusions(rows, 1e-3)
    assert c["first_overflow"]["robust"] and c["float_status"]["robust"]
    assert not c["first_divergent"]["robust"]
    assert [m["parameters"] for m in c["first_divergent"]["moved_by"]] == [["cube_block_sum"]]
    assert not c["output_cosine"]["robust"] and c["output_cosine"]["min"] == 0.95
    assert [m["variant"] for m in c["output_cosine"]["moved_by"]] == ["cube_block_sum=sequential"]
    p = _per_parameter(rows, c, [])
    assert p["impl_mode"] == {"moves": [], "max_op_cosine_shift": pytest.approx(0.01), "ops_changed": 1}
    assert p["cube_block_sum"]["moves"] == ["first_divergent", "output_cosine"]


def test_training_conclusions():
    """Training: the loss curve within its tolerance, the skipped steps and the first overflow across variants
    (the demo training itself runs in tools/sensitivity_train.py's train_variant: minutes per variant set here)."""
    from ascend_emu.tools.sensitivity_train import train_conclusions

    def row(label, varies, losses, skipped, first):
        return {"label": label, "varies": varies, "losses": losses, "skipped_steps": skipped, "first_overflow": first}

    ovf = {"step": 0, "op": "grad/MatMul"}
    rows = [row("default", [], [2.0, 1.5, 1.2], [0], ovf),
            row("impl_mode=high_performance", ["impl_mode"], [2.0, 1.5004, 1.2], [0], ovf),
            row("cube_block_sum=sequential", ["cube_block_sum"], [2.0, 1.6, float("nan")], [0, 2], ovf)]
    c = train_conclusions(rows, 1e-3)
    assert c["first_overflow"]["robust"]
    assert not c["skipped_steps"]["robust"] and c["skipped_steps"]["moved_by"][0]["parameters"] == ["cube_block_sum"]
    lc = c["loss_curve"]
    assert not lc["robust"] and [m["variant"] for m in lc["moved_by"]] == ["cube_block_sum=sequential"]
    assert lc["moved_by"][0]["value"] == float("inf") and lc["min"][1] == 1.5 and lc["max"][1] == 1.6
    assert rows[1]["loss_rel_shift"] == pytest.approx(0.0004 / 1.5)


def test_training_options_checked():
    from ascend_emu.errors import AscendEmuError
    from ascend_emu.npu.device import Device
    from ascend_emu.tools.sensitivity import sensitivity

    with pytest.raises(AscendEmuError, match="needs both data"):
        sensitivity("m.keras", device=Device(), data="x.npz", progress=False)
    with pytest.raises(AscendEmuError, match="unknown training option"):
        sensitivity("m.keras", device=Device(), data="x.npz", steps=2, epochs=3, progress=False)
    with pytest.raises(AscendEmuError, match="keeps no dumps"):
        sensitivity("m.keras", device=Device(), data="x.npz", steps=2, dump="npu", progress=False)


@pytest.mark.models
def test_parameters_reach_the_ops():
    """On float32 cube ops through HF32 each varied parameter changes some op's bits (the variants really run
    under their values), while no conclusion moves."""
    import numpy as np

    from ascend_emu.frontend.tf.loader import load_graph
    from ascend_emu.npu.device import Device
    from ascend_emu.tools.sensitivity import sensitivity
    from test_fit import BASE, small_model

    g = load_graph(small_model())
    x = np.random.default_rng(5).standard_normal((4, 6, 6, 3)).astype(np.float32)
    res = sensitivity(g, {"image": x}, device=Device(**BASE), progress=False,
                      params=["cube_block_sum", "hf32_bits", "hf32_matmul_rounding", "impl_mode"])
    assert [v["label"] for v in res.variants][:6] == ["default", "cube_block_sum=sequential", "cube_block_sum=aligned",
                                                      "hf32_bits=10", "hf32_matmul_rounding=rint",
                                                      "hf32_matmul_rounding=trunc"]
    for name in ("cube_block_sum", "hf32_bits", "hf32_matmul_rounding", "impl_mode"):
        p = res.parameters[name]
        assert p["ops_changed"] > 0 and 0 < p["max_op_cosine_shift"] < 1e-6 and p["moves"] == [], (name, p)
    assert all(c["robust"] for c in res.conclusions.values())


@pytest.mark.parametrize("text", ['{"conclusions": {"first_divergent": 1}}', '{"conclusions": {}, "variants": 3}',
                                  '{"conclusions": {"x": {"robust": true, "moved_by": [{"parameters": [1]}]}}}',
                                  '[1, 2]', '{"conclusions": ' * 5000])
def test_a_malformed_or_linked_sidecar_is_ignored(text, tmp_path):
    from ascend_emu.analysis.robustness import read_sidecar, sidecar

    d = tmp_path / "d"
    d.mkdir()
    with open(sidecar(str(d)), "w") as f:
        f.write(text)
    assert read_sidecar(str(d)) is None
    os.remove(sidecar(str(d)))
    good = tmp_path / "elsewhere.json"
    good.write_text('{"conclusions": {"first_divergent": {"robust": true}}, "variants": []}')
    os.symlink(good, sidecar(str(d)))
    assert read_sidecar(str(d)) is None


def test_the_sidecar_must_be_of_the_dumps_model_and_inputs(tmp_path):
    """W1 (issue 45): a sidecar was tied to its dump by the inputs hash alone, so another model's conclusions
    (run on the same inputs) were shown; it needs the dump's model fingerprint too."""
    import numpy as np

    from ascend_emu.analysis.dump import DumpWriter
    from ascend_emu.analysis.robustness import read_sidecar, sidecar

    d = str(tmp_path / "npu")
    with DumpWriter(d, kind="npu", config={}, model={"name": "m", "fingerprint": "f" * 64},
                    inputs_sha256="s" * 64) as w:
        w.add_op("x", "Placeholder", "Data", "AICORE", "float32", [], [np.ones(3, np.float32)])
        w.finish({})
    base = {"conclusions": {"first_divergent": {"robust": True}}, "variants": []}
    for tie, shown in (({"inputs_sha256": "s" * 64, "model_fingerprint": "f" * 64}, True),
                       ({"inputs_sha256": "s" * 64, "model_fingerprint": "g" * 64}, False),
                       ({"inputs_sha256": "s" * 64}, False), ({"model_fingerprint": "f" * 64}, False),
                       ({"inputs_sha256": "t" * 64, "model_fingerprint": "f" * 64}, False)):
        with open(sidecar(d), "w") as f:
            json.dump({**base, **tie}, f)
        assert (read_sidecar(d) is not None) is shown, tie


def test_sensitivity_refuses_a_dump_of_another_configuration(demo):
    from ascend_emu.errors import AscendEmuError
    from ascend_emu.frontend.tf.models import demo_model
    from ascend_emu.npu.device import Device
    from ascend_emu.tools.sensitivity import sensitivity

    _, d = demo
    with pytest.raises(AscendEmuError, match="was made with canonical_mode=allow_mix_precision_fp16"):
        sensitivity(demo_model(), None, device=Device("force_fp16"), dump=str(d / "npu"), progress=False)

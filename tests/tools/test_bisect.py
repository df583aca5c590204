"""fusion-bisect: finds the fusion rule that costs accuracy (a planted ConvBatchnormFusionPass overflow)."""
import json
import math

import numpy as np
import pytest

from ascend_emu.tools.bisect import BisectResult, _ddmin, fusion_bisect, output_metrics
from ascend_emu.npu.device import Device
from ascend_emu.errors import AscendEmuError
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)

FP16_MAX = 65504.0


def planted_model(seed=0):
    """Conv2D (no bias) -> BatchNormalization -> ReLU -> GlobalAveragePooling -> Dense.

    The conv weights are 20..400 in magnitude and the batch norm multiplies by
    gamma / sqrt(var + eps) ~ 1000: unfused, the conv output (inputs ~1e-3: ~1) and the
    batch-norm output (~1000) are fine in fp16, but ConvBatchnormFusionPass folds the scale into
    the weights first, 2e4..4e5, mostly > 65504: the folded fp16 filter overflows.
    """
    from ascend_emu.frontend.tf.loader import import_tf
    import_tf()
    import keras

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    L = keras.layers
    x = keras.Input((8, 8, 4), name="image")
    conv = L.Conv2D(8, 3, padding="same", use_bias=False, name="conv")
    bn = L.BatchNormalization(name="bn")
    h = L.ReLU(name="relu")(bn(conv(x)))
    head = L.Dense(4, name="head")
    out = head(L.GlobalAveragePooling2D(name="pool")(h))
    m = keras.Model(x, out)
    w = rng.uniform(20, 400, (3, 3, 4, 8)) * rng.choice([-1, 1], (3, 3, 4, 8))
    conv.kernel.assign(w.astype(np.float32))
    bn.gamma.assign(np.full(8, 1000, np.float32))
    bn.beta.assign(rng.normal(0, 1, 8).astype(np.float32))
    bn.moving_mean.assign(rng.normal(0, 0.01, 8).astype(np.float32))
    bn.moving_variance.assign(np.ones(8, np.float32))
    head.kernel.assign(rng.normal(0, 0.05, (8, 4)).astype(np.float32))
    return m


@pytest.fixture(scope="module")
def planted():
    from ascend_emu.frontend.tf.loader import load_graph

    m = planted_model()
    g = load_graph(m)
    x = (np.random.default_rng(1).standard_normal((2, 8, 8, 4)) * 1e-3).astype(np.float32)
    return m, g, {"image": x}


def test_planted_case_is_what_it_claims(planted):
    """Unfused fp16 is fine; the folded filter overflows fp16 and only with folding."""
    _, g, inputs = planted
    off = Device("force_fp16", soc="Ascend910B", fusion_switch="off").replay(g, inputs, progress=False)
    assert all(np.isfinite(v.astype(np.float64)).all() for v in off.outputs.values())
    bn_out = [r for r in off.records if r.tf_type == "AddV2" and "bn" in r.name]
    assert bn_out and max(float(np.abs(off.tensor(r.name).astype(np.float64)).max()) for r in bn_out) < FP16_MAX
    on = Device("force_fp16", soc="Ascend910B").replay(g, inputs, progress=False)
    casts = [r for r in on.records if r.inserted and "ConvBnFilterHost" in r.name]
    assert len(casts) == 1 and casts[0].status & 0x100          # FP32->FP16 conversion overflow
    (conv,) = [r for r in on.records if r.tf_type == "_FusedConv2D"]
    assert not np.isfinite(on.tensor(conv.name).astype(np.float64)).all()
    assert not all(np.isfinite(v.astype(np.float64)).all() for v in on.outputs.values())


# inf_nan: the output turns NaN (cosine nan); saturation: the folded weights clip to 65504 and the
# output is off by ~40 in rmse (its cosine barely moves: the 8 output values share a large offset)
@pytest.mark.parametrize("soc, metric", [("Ascend910B", "cosine"), ("Ascend910", "rmse")])
def test_bisect_names_conv_batchnorm(planted, soc, metric, tmp_path):
    m, _, inputs = planted
    res = fusion_bisect(m, inputs, device=Device("force_fp16", soc=soc), metric=metric,
                        keep_dumps=tmp_path / "dumps", progress=False)
    assert isinstance(res, BisectResult)
    assert res.fired == ["ConvBatchnormFusionPass", "MatMulBiasAddFusionPass", "TbeEltwiseFusionPass"]
    assert res.degraded and res.culprits == ["ConvBatchnormFusionPass"]
    names = [t.name for t in res.trials]
    assert names[:2] == ["all-off", "all-on"] and len(names) == len(set(names)) >= 3
    off, on = res.trial("all-off"), res.trial("all-on")
    assert off.metrics["cosine"] > 0.9999 and off.degraded is None and on.degraded
    assert off.float_status == 0 and on.float_status & 0x100
    only = res.trial("only-ConvBatchnormFusionPass")
    assert only.degraded and only.fired == {"ConvBatchnormFusionPass": 1}
    # every configuration tried that does not fold the batch norm is fine
    for t in res.trials[2:]:
        assert t.degraded == ("ConvBatchnormFusionPass" in t.enabled), t.name
    text = res.format_text()
    assert "minimal set of rules responsible: ConvBatchnormFusionPass" in text
    for t in res.trials:
        assert t.name in text
    hint = json.loads(text.rsplit("fusion switch file: ", 1)[1].splitlines()[0])
    assert hint == {"Switch": {"GraphFusion": {"ConvBatchnormFusionPass": "off"}}}
    # dumps kept per configuration, the reference's too
    kept = {p.name for p in (tmp_path / "dumps").iterdir()}
    assert kept == set(names) | {"reference"}
    from ascend_emu.analysis.dump import load_dump
    d = load_dump(tmp_path / "dumps" / "only-ConvBatchnormFusionPass")
    assert d.summary["fusion_counts"] == {"ConvBatchnormFusionPass": 1}
    # bisect's numbers are the comparison's: compare() of a kept dump with the reference's dump
    # gives, on the model output's row, exactly the trial's metrics (nan where compare says "Nan")
    from ascend_emu.analysis.compare import NAN, compare
    from ascend_emu.tools.bisect import METRIC_COLUMN
    out_names = {r["NPU Name"] for r in compare(tmp_path / "dumps" / "all-off", tmp_path / "dumps" / "reference").rows
                 if r["NPU Name"] in _graph_outputs(m)}
    assert len(out_names) == 1
    for t in res.trials:
        cmp = compare(tmp_path / "dumps" / t.name, tmp_path / "dumps" / "reference")
        (row,) = [r for r in cmp.rows if r["NPU Name"] in out_names]
        got = {k: math.nan if row[c] == NAN else row[c] for k, c in METRIC_COLUMN.items()}
        assert set(got) == set(t.metrics)
        for k in got:
            assert got[k] == t.metrics[k] or (math.isnan(got[k]) and math.isnan(t.metrics[k])), (t.name, k)


def _graph_outputs(model) -> set:
    from ascend_emu.frontend.tf.loader import load_graph

    return set(load_graph(model).outputs)


def test_output_metrics_are_the_comparisons():
    """output_metrics is tensor_metrics with the float32 reference's eps, bit for bit."""
    from ascend_emu.analysis.metrics import tensor_metrics

    r = np.random.default_rng(3)
    b = r.standard_normal(200_000).astype(np.float32)          # more than one chunk
    b[::97] = 0.0
    n = (b + r.standard_normal(b.size).astype(np.float32) * 1e-3).astype(np.float16)
    n[5], b[5] = np.inf, np.inf                                    # the same inf on both sides: masked
    m = output_metrics(n, b)
    want = tensor_metrics(n.astype(np.float64), b.astype(np.float64), bench_dtype=np.float32)
    assert m == {"cosine": want["Cosine"], "max_rel_err": want["MaxRelativeErr"],
                 "max_abs_err": want["MaxAbsErr"], "rmse": want["RMSE"]}
    assert 0.99 < m["cosine"] < 1.0 and m["max_rel_err"] > 1.0   # zeros of the bench divide by float32 eps


def test_bisect_without_degradation(planted):
    m, _, _ = planted
    x = (np.random.default_rng(2).standard_normal((1, 8, 8, 4)) * 1e-3).astype(np.float32)
    res = fusion_bisect(m, {"image": x}, device=Device(**FP32), progress=False)
    assert not res.degraded and res.culprits == [] and [t.name for t in res.trials] == ["all-off", "all-on"]
    assert "does not cost accuracy" in res.format_text()


def test_bisect_cli_call_shape(planted, capsys):
    """The CLI calls fusion_bisect(model, [], device_kwargs={"device": Device}, ...)."""
    m, _, _ = planted
    res = fusion_bisect(m, [], device_kwargs={"device": Device("force_fp16", soc="Ascend910B")}, signature=None,
                        shapes=None, seed=0, metric="max_abs_err", threshold=None, keep_dumps=None, progress=False)
    # random N(0, 1) inputs make even the unfused conv output ~500 and the batch norm ~5e5 (> fp16),
    # so both configurations overflow: fusion is not to blame by max_abs_err
    assert res.metric == "max_abs_err" and res.threshold == 0.5
    assert isinstance(res.format_text(), str)
    with pytest.raises(AscendEmuError, match="unknown metric"):
        fusion_bisect(m, metric="kl")
    with pytest.raises(AscendEmuError, match="threshold"):
        fusion_bisect(m, threshold=-1)


def test_cli_fusion_bisect(planted, tmp_path, capsys):
    from ascend_emu.cli import main

    m, _, inputs = planted
    path = tmp_path / "planted.keras"
    m.save(path)
    np.save(tmp_path / "x.npy", inputs["image"])
    rc = main(["-q", "fusion-bisect", str(path), "--input", f"image={tmp_path / 'x.npy'}", "--soc", "Ascend910B",
               "--scheduler", "none"])
    out = capsys.readouterr().out
    assert rc == 0 and "minimal set of rules responsible: ConvBatchnormFusionPass" in out


def test_output_metrics():
    b = np.array([1.0, -2.0, 0.0, 4.0])
    m = output_metrics(b.astype(np.float16), b)
    assert m == {"cosine": 1.0, "max_rel_err": 0.0, "max_abs_err": 0.0, "rmse": 0.0}
    m = output_metrics(np.array([1.0, -2.0, 1e-3, 4.5]), b)
    assert m["max_abs_err"] == 0.5 and m["max_rel_err"] == pytest.approx(1e-3 / np.finfo(np.float32).eps)
    assert m["rmse"] == pytest.approx(np.sqrt((0.25 + 1e-6) / 4))
    assert all(np.isnan(v) for v in output_metrics(np.array([1.0, np.inf, 0, 4]), b).values())
    nan = np.array([np.nan, 1.0])
    assert output_metrics(nan, nan)["cosine"] == 1.0     # same specials on both sides are masked


def test_ddmin_finds_a_minimal_set():
    calls = []

    def test(s):
        calls.append(tuple(s))
        return {"b", "e"} <= set(s)

    assert _ddmin(list("abcdefg"), test) == ["b", "e"]
    assert _ddmin(["x"], lambda s: True) == ["x"]
    assert len(calls) < 2 ** 7

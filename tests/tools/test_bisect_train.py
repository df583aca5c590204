"""fusion-bisect over a training: a planted layer whose fused epilogue (TbeEltwiseFusionPass: MatMul -> BiasAdd
-> Relu in the float32 accumulator, one rounding) keeps the loss curve near float32's under allow_mix_precision,
where the unfused path rounds the matmul output (near 4000, an fp16 ulp of 2) before the bias cancels it. The
bisection names that pass; the argument checks and the CLI's one-line errors."""
import json

import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.npu.device import Device
from ascend_emu.tools.bisect import fusion_bisect
from ascend_emu.tools.bisect_train import changed, curve_shift

TRAIN = dict(loss="mean_squared_error", optimizer="sgd", learning_rate=0.01, batch_size=4)
STEPS = 3
M = 4000.0


def planted_model(seed=0):
    """Dense(64, relu) whose pre-activations are M + O(1) with a bias of exactly -M (fp16-exact), then Dense(1)."""
    from ascend_emu.frontend.tf.loader import import_tf

    import_tf()
    import keras

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(64, activation="relu", name="cancel")(x)
    m = keras.Model(x, keras.layers.Dense(1, name="out")(h))
    k = rng.normal(0, 0.3, (8, 64)).astype(np.float32)
    k[0] = M                       # the data's first column is 1: every pre-activation is M + O(1)
    m.get_layer("cancel").kernel.assign(k)
    m.get_layer("cancel").bias.assign(np.full(64, -M, np.float32))
    return m


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 8)).astype(np.float32)
    x[:, 0] = 1.0
    return x, rng.standard_normal((8, 1)).astype(np.float32)


@pytest.fixture(scope="module")
def found(data):
    return fusion_bisect(planted_model(), data=data, steps=STEPS, device=Device("allow_mix_precision"),
                         progress=False, **TRAIN)


@pytest.mark.models
def test_names_the_planted_pass(found):
    res = found
    assert res.training and res.metric == "loss_rel_err" and len(res.reference_losses) == STEPS
    off, on = res.trial("all-off"), res.trial("all-on")
    # the planted effect is large: unfused the curve is several times further from float32
    assert off.metrics["loss_rel_err"] > 4 * on.metrics["loss_rel_err"], (off.metrics, on.metrics)
    assert "TbeEltwiseFusionPass" in res.fired and len(res.fired) >= 2
    assert res.degraded and res.culprits == ["TbeEltwiseFusionPass"]
    only = res.trial("only-TbeEltwiseFusionPass")
    assert only.degraded and only.losses == on.losses      # the other passes do not move the curve
    others = [t for t in res.trials if t.name.startswith("only-") and t is not only]
    assert others and not any(t.degraded for t in others)
    text = res.format_text()
    assert "the pass whose switch changes it most: TbeEltwiseFusionPass" in text
    assert "CHANGED" in text and '"TbeEltwiseFusionPass": "off"' in text
    j = json.loads(json.dumps(res.to_json()))
    assert j["pass"] == "TbeEltwiseFusionPass" and j["steps"] == STEPS and j["training"]
    assert [t["name"] for t in j["trials"]][:2] == ["all-off", "all-on"]
    assert all(len(t["losses"]) == STEPS for t in j["trials"])


@pytest.mark.models
def test_cli_training_bisect(found, data, tmp_path, capsys):
    from ascend_emu.cli import main

    path = tmp_path / "m.keras"
    m = planted_model()
    m.compile(loss="mean_squared_error", optimizer="sgd")
    m.save(path)
    np.savez(tmp_path / "d.npz", x=data[0], y=data[1])
    out = tmp_path / "b.json"
    code = main(["--quiet", "fusion-bisect", str(path), "--data", str(tmp_path / "d.npz"), "--steps", str(STEPS),
                 "--batch-size", "4", "--learning-rate", "0.01", "--precision-mode", "allow_mix_precision",
                 "--scheduler", "none", "--json", str(out)])
    assert code == 0
    j = json.loads(out.read_text())
    assert j["pass"] == "TbeEltwiseFusionPass"
    # the same trainings as the Python API's: the CLI's model file and data give the same curves
    assert j["reference_losses"] == pytest.approx(found.reference_losses, rel=1e-6)
    assert "TbeEltwiseFusionPass" in capsys.readouterr().out


def test_changed_and_curve_shift():
    assert changed(0.5, 0.05, 0.5) and changed(0.05, 0.5, 0.5)          # either way
    assert not changed(0.07, 0.05, 0.5) and not changed(0.0, 0.0, 0.5)
    assert changed(0.01, 0.0, 0.5)                                       # exact against not exact
    assert changed(float("nan"), 0.1, 0.5) and not changed(float("nan"), float("nan"), 0.5)
    assert curve_shift([1.0, 2.0], [1.0, 1.0]) == 1.0
    assert np.isnan(curve_shift([1.0, float("inf")], [1.0, 1.0]))


@pytest.mark.parametrize("kwargs,msg", [
    ({"steps": 2}, "apply to training only"),
    ({"data": "x.npz"}, "needs steps"),
    ({"data": "x.npz", "steps": 0}, "positive integer"),
    ({"data": "x.npz", "steps": 2, "metric": "cosine"}, "scores the loss curve"),
    ({"data": "x.npz", "steps": 2, "keep_dumps": "d"}, "keeps no dumps"),
    ({"data": "x.npz", "steps": 2, "inputs": {"x": np.ones(1)}}, "apply to a replay"),
    ({"data": "x.npz", "steps": 2, "momentum": 0.9}, "unknown option"),
    ({"loss": "mse"}, "apply to training only"),
])
def test_training_arguments_refused(kwargs, msg):
    with pytest.raises(AscendEmuError, match=msg):
        fusion_bisect("unused.keras", progress=False, **kwargs)


@pytest.mark.models
def test_inference_bisect_json():
    """The replay bisection's JSON (--json): the same fields, no loss curves; the planted layer replayed once
    is not degraded by fusion (fusion brings it closer to float32)."""
    res = fusion_bisect(planted_model(), device=Device("allow_mix_precision"), progress=False)
    j = json.loads(json.dumps(res.to_json()))
    assert not j["training"] and j["steps"] is None and j["metric"] == "cosine" and j["pass"] is None
    assert j["trials"][0]["losses"] is None and j["verdict"] == res.verdict()
    assert res.trial("all-on").metrics["cosine"] >= res.trial("all-off").metrics["cosine"]
    assert not res.degraded and "does not cost accuracy" in j["verdict"]

"""mixlist-search over a training: a planted model whose loss curve drifts from float32 under
allow_mix_precision because of one op type; the search finds exactly it, 1-minimal, and training with the
written ops_info.json meets the target."""
import json

import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.npu.device import Device
from ascend_emu.npu.training import reference_train
from ascend_emu.tools.mixlist_search import loss_metrics, mixlist_search

TARGET = "loss_rel_err<=0.01"
#: a CANN release's lists that leave ReduceSum gray (ASCEND-FACTS section 1): the sum follows its fp16 input
BASE = {"black-list": {"to-remove": ["ReduceSumD"]}}
TRAIN = dict(loss="mean_squared_error", optimizer="sgd", learning_rate=0.01, batch_size=4)
STEPS = 3


def planted_model(seed=0):
    """Dense(2048) with outputs near 40, then sum over the 2048 / 2048 - 40: the sum (8.2e4) saturates fp16
    (65504 on Ascend910), so the emulated loss is ~81 where float32's is ~1. Nothing else loses more than
    fp16 rounding."""
    from ascend_emu.frontend.tf.loader import import_tf

    import_tf()
    import keras
    from keras import ops

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(2048, name="wide")(x)
    s = keras.layers.Lambda(lambda t: ops.sum(t, axis=-1, keepdims=True) / 2048.0 - 40.0, name="long_sum")(h)
    m = keras.Model(x, s)
    w = m.get_layer("wide")
    w.kernel.assign(rng.normal(0, 0.05, (8, 2048)).astype(np.float32))
    w.bias.assign((40.0 + rng.normal(0, 1, 2048)).astype(np.float32))
    return m


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    return rng.standard_normal((8, 8)).astype(np.float32), np.ones((8, 1), np.float32)


@pytest.fixture(scope="module")
def found(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("mixtrain") / "ops_info.json"
    res = mixlist_search(planted_model(), data=data, steps=STEPS, target=TARGET, output=out, progress=False,
                         device=Device("allow_mix_precision", modify_mixlist=BASE), **TRAIN)
    return res, out


def _loss_err(device, data):
    emu = device.train(planted_model(), data, steps=STEPS, progress=False, **TRAIN)
    ref = reference_train(planted_model(), data, steps=STEPS, progress=False, **TRAIN)
    return loss_metrics([s["loss"] for s in emu.steps], [s["loss"] for s in ref.steps])["loss_rel_err"]


def test_search_finds_exactly_the_planted_type(found):
    res, out = found
    assert res.baseline_metrics["loss_rel_err"] > 0.01          # plain allow_mix_precision misses the target
    assert res.ranking[0][0] == "ReduceSumD"                     # step 0's first divergent op's type
    assert res.met and res.black == ["ReduceSumD"]
    assert res.final_metrics["loss_rel_err"] <= 0.01
    assert len(res.reference_losses) == STEPS
    assert res.replays == sum(s.replays for s in res.steps)
    assert json.loads(out.read_text()) == {"black-list": {"to-add": ["ReduceSumD"]}}
    assert "training runs:" in res.format_text() and res.to_json()["reference_losses"] == res.reference_losses


def test_written_list_meets_the_target_and_is_one_minimal(found, data):
    res, out = found
    assert _loss_err(Device("allow_mix_precision", modify_mixlist=str(out)), data) <= 0.01
    # the one type removed again: the starting lists, which miss the target
    assert _loss_err(Device("allow_mix_precision", modify_mixlist=BASE), data) > 0.01


def test_loss_metrics():
    m = loss_metrics([1.0, 2.2, 0.0], [1.0, 2.0, 0.0])
    assert m["loss_abs_err"] == pytest.approx(0.2) and m["loss_rel_err"] == pytest.approx(0.1)
    assert loss_metrics([1.0, 1e-3], [1.0, 0.0])["loss_rel_err"] == pytest.approx(1e27)
    nan = loss_metrics([1.0, float("inf")], [1.0, 2.0])
    assert np.isnan(nan["loss_rel_err"]) and np.isnan(nan["loss_abs_err"])


def test_refusals(data):
    m = planted_model()
    with pytest.raises(AscendEmuError, match="give the training data"):
        mixlist_search(m, target=TARGET, progress=False)
    with pytest.raises(AscendEmuError, match="the target is on the loss curve"):
        mixlist_search(m, data=data, steps=2, target="cosine>=0.999", progress=False)
    with pytest.raises(AscendEmuError, match="needs steps"):
        mixlist_search(m, data=data, target=TARGET, progress=False)
    with pytest.raises(AscendEmuError, match="apply to training only"):
        mixlist_search(m, steps=2, progress=False)
    with pytest.raises(AscendEmuError, match="unknown option"):
        mixlist_search(m, data=data, steps=2, target=TARGET, epochs=1, progress=False)


def test_cli_on_a_keras_file(tmp_path, capsys):
    """The command line end to end on a compiled .keras file: a tight loss target that plain
    allow_mix_precision misses (fp16 rounding of the matmuls' operands) is met by black-listing MatMulV2."""
    from ascend_emu.cli import main
    from ascend_emu.frontend.tf.loader import import_tf

    import_tf()
    import keras

    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    m.compile(loss="mse", optimizer="sgd")
    m.save(tmp_path / "m.keras")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "train.npz", x=rng.standard_normal((16, 8)).astype(np.float32),
             y=rng.standard_normal((16, 1)).astype(np.float32))
    out, js = tmp_path / "ops_info.json", tmp_path / "search.json"
    rc = main(["-q", "mixlist-search", str(tmp_path / "m.keras"), "--data", str(tmp_path / "train.npz"),
               "--steps", "3", "--batch-size", "4", "--target", "loss_rel_err<=1e-5", "--output", str(out),
               "--scheduler", "none", "--json", str(js)])
    assert rc == 0, capsys.readouterr()
    r = json.loads(js.read_text())
    assert r["baseline"]["loss_rel_err"] > 1e-5 and r["final"]["loss_rel_err"] <= 1e-5
    assert r["black_list_added"] == ["MatMulV2"] and len(r["reference_losses"]) == 3
    assert json.loads(out.read_text()) == {"black-list": {"to-add": ["MatMulV2"]}}
    assert "training runs: 5 (scheduler none)" in capsys.readouterr().out

"""Data-parallel training over emulated ranks (NUMERICS.md section 12)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

keras = pytest.importorskip("keras")

import ascend_emu as ae  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.numerics.allreduce import allreduce_mean, schedules  # noqa: E402
from fp32mode import FP32, FP32_ARGS, fp32  # noqa: F401  (the tests' fp32 mode)

pytestmark = pytest.mark.models



def mlp(seed=0, *, bn=False):
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    L = keras.layers
    layers = [keras.Input((6,)), L.Dense(16, activation="relu")]
    if bn:
        layers.append(L.BatchNormalization())
    layers.append(L.Dense(3))
    m = keras.Sequential(layers, name="mlp")
    m.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, 6)).astype(np.float32), "y": rng.integers(0, 3, n)}


def max_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)))) for k in a)


# --------------------------------------------------------------------------- the all-reduce alone

def test_allreduce_orders_follow_the_algorithms():
    # ring: chunk c starts at rank c+1 and ends at its owner c; hd: a balanced tree, the odd extra ranks folded
    assert schedules("ring", 3, 3, deterministic=True) == [((1, 2), 0), ((2, 0), 1), ((0, 1), 2)]
    assert schedules("hd", 4, 1, deterministic=True) == [((0, 1), (2, 3))]
    assert schedules("hd", 6, 1, deterministic=True) == [(((0, 1), (2, 3)), (4, 5))]
    assert schedules("mesh", 3, 2, deterministic=True) == [((0, 1), 2)] * 2
    rng = np.random.default_rng(0)
    for c, plan in enumerate(schedules("mesh", 4, 4, deterministic=False, rng=rng)):
        assert plan[0][0][0] == c            # the owner's share is in first, the peers' follow in arrival order


def test_allreduce_mean_against_a_float32_loop():
    rng = np.random.default_rng(1)
    grads = [[rng.normal(size=(5, 3)).astype(np.float32) * np.float32(10.0 ** rng.integers(-3, 3)),
              rng.normal(size=7).astype(np.float32)] for _ in range(4)]
    for algo in ("ring", "hd", "mesh"):
        out, status, plans = allreduce_mean(grads, algorithm=algo)
        flat = [np.concatenate([g.ravel() for g in gs]) for gs in grads]
        bounds = [0, 6, 12, 18, 22]          # 22 elements over 4 ranks: ceil(22 / 4) = 6 a chunk

        def value(tree, lo, hi):
            if isinstance(tree, tuple):
                return value(tree[0], lo, hi) + value(tree[1], lo, hi)     # float32 + float32
            return flat[tree][lo:hi]
        want = np.concatenate([value(p, bounds[c], bounds[c + 1]) for c, p in enumerate(plans)]) / np.float32(4)
        got = np.concatenate([g.ravel() for g in out])
        assert got.dtype == np.float32 and status == 0
        assert got.tobytes() == want.astype(np.float32).tobytes(), algo


def test_allreduce_fp16_saturates_under_saturation_mode():
    g = [[np.full(4, 40000.0, np.float32)], [np.full(4, 40000.0, np.float32)]]
    out, status, _ = allreduce_mean(g, dtype="float16", overflow_mode="saturation")
    assert status != 0 and np.all(out[0] == np.float32(65504.0) / 2)
    out, status, _ = allreduce_mean(g, dtype="float32")
    assert status == 0 and np.all(out[0] == 40000.0)


# --------------------------------------------------------------------------- training

@pytest.fixture(scope="module")
def single_and_two():
    d = data()
    dev = ae.Device(**FP32)
    one = dev.train(mlp(), d, batch_size=16, steps=8, progress=False)
    two = dev.train(mlp(), d, batch_size=16, steps=8, progress=False, ranks=2, check_rank_weights=True)
    return one, two


def test_two_ranks_match_one_device_on_the_full_batch(single_and_two):
    one, two = single_and_two
    # measured: losses 2.1e-7 (the global loss is the mean of the two shard losses), weights 3e-8
    assert np.max(np.abs(one.losses - two.losses)) < 1e-6
    assert max_diff(one.weights(), two.weights()) < 2e-7
    assert two.ranks["initial_differences"] == [] and two.ranks["final_differences"] == []
    assert two.rank_losses().shape == (8, 2)
    np.testing.assert_allclose(two.losses, two.rank_losses().mean(axis=1), rtol=0, atol=0)
    for s in two.rank_states[1:]:
        assert all(s[k].tobytes() == two.state[k].tobytes() for k in s)
    run = two.to_json()
    # the SoC's default algorithm: fullmesh on the fp32 mode's Ascend910B
    assert run["ranks"]["ranks"] == 2 and run["config"]["data_parallel"]["allreduce"] == "mesh"
    assert len(run["steps"][0]["rank_losses"]) == 2
    assert "last step's loss per rank" in two.format_text()


def test_batchnorm_keeps_per_rank_statistics():
    d = data()
    dev = ae.Device(**FP32)
    one = dev.train(mlp(bn=True), d, batch_size=16, steps=3, progress=False)
    two = dev.train(mlp(bn=True), d, batch_size=16, steps=3, progress=False, ranks=2)
    # each rank normalises with its own shard's statistics (no SyncBN): the gradients are not the full batch's
    assert np.max(np.abs(one.losses[1:] - two.losses[1:])) > 1e-5
    nt = two.ranks["final_non_trainable_differences"]
    assert {d["variable"].split("/")[-1] for d in nt} >= {"moving_mean", "moving_variance"}
    assert two.ranks["final_differences"] == []      # the trainable weights stay identical on every rank


def test_deterministic_runs_are_bit_identical_and_random_arrival_differs():
    d = data(n=32)
    kw = dict(batch_size=16, steps=1, progress=False, ranks=4, allreduce="mesh")
    det = [ae.Device(**FP32, deterministic=True, run_seed=s).train(mlp(), d, **kw) for s in (0, 1)]
    assert det[0].losses.tobytes() == det[1].losses.tobytes()
    assert all(det[0].state[k].tobytes() == det[1].state[k].tobytes() for k in det[0].state)
    rnd = [ae.Device(**FP32, deterministic=False, run_seed=s).train(mlp(), d, **kw) for s in (0, 1, 0)]
    w = [r.state for r in rnd]
    assert any(w[0][k].tobytes() != w[1][k].tobytes() for k in w[0])       # another seed, another order
    assert all(w[0][k].tobytes() == w[2][k].tobytes() for k in w[0])       # the same seed, the same bits
    # a ring has one writer per step: its order does not depend on the run seed
    ring = [ae.Device(**FP32, deterministic=False, run_seed=s).train(mlp(), d, **{**kw, "allreduce": "ring"})
            for s in (0, 1)]
    assert all(ring[0].state[k].tobytes() == ring[1].state[k].tobytes() for k in ring[0].state)


def test_check_rank_weights_catches_a_planted_rank():
    res = ae.Device(**FP32).train(mlp(), data(n=32), batch_size=16, steps=2, progress=False, ranks=2,
                                rank_init={1: 7}, check_rank_weights=True)
    diffs = res.ranks["initial_differences"]
    assert {d["rank"] for d in diffs} == {1}
    assert {d["variable"] for d in diffs} == {"mlp/dense/kernel", "mlp/dense_1/kernel"}   # biases start at 0
    assert "WARNING: 1 rank(s) start from other weights" in res.format_text()
    assert {d["variable"] for d in res.ranks["final_differences"]} >= {"mlp/dense/kernel"}
    # a state planted by hand, for any step
    key = next(k for k in res.state if k.endswith("dense_1/bias"))
    res = ae.Device(**FP32).train(mlp(), data(n=32), batch_size=16, steps=1, progress=False, ranks=2,
                                rank_init={1: {key: np.full(3, 0.5, np.float32)}}, check_rank_weights=True)
    assert [(d["rank"], d["variable"]) for d in res.ranks["initial_differences"]] == [(1, "mlp/dense_1/bias")]


def test_overflow_on_one_rank_skips_the_step_on_all():
    d = data(n=32)
    d["x"][20] = 3e4       # only rank 1's shard of step 0 (samples 16..31 of a 32 batch) holds it
    res = ae.Device("allow_fp32_to_fp16", soc="Ascend910").train(
        mlp(), d, batch_size=32, steps=2, progress=False, ranks=2, loss_scale="dynamic")
    assert res.skipped[0] and res.steps[0]["first_overflow"]["rank"] == 1
    assert res.loss_scales[1] == res.loss_scales[0] / 2
    assert res.ranks["final_differences"] == []


@pytest.mark.parametrize("kwargs, message", [
    (dict(ranks=3), "do not split evenly over 3 ranks"),
    (dict(ranks=0), "ranks must be a positive integer"),
    (dict(ranks=2, allreduce="star"), "unknown all-reduce algorithm"),
    (dict(ranks=2, allreduce_dtype="int8"), "unknown all-reduce dtype"),
    (dict(ranks=2, rank_init={2: 1}), "ranks are 0..1"),
    (dict(check_rank_weights=True), "give ranks of 2 or more"),
    (dict(ranks=2, dump_dir="x"), "dumps of data-parallel training are not supported"),
])
def test_bad_data_parallel_options(kwargs, message):
    with pytest.raises(AscendEmuError, match=message):
        ae.Device(**FP32).train(mlp(), data(n=32), batch_size=16, steps=1, progress=False, **kwargs)


def test_cli_ranks_json_and_report(tmp_path, capsys):
    import json

    from ascend_emu.cli.main import main

    mlp().save(tmp_path / "m.keras")
    np.savez(tmp_path / "d.npz", **data(n=32))
    js, rep = tmp_path / "t.json", tmp_path / "t.html"
    code = main(["train", str(tmp_path / "m.keras"), "--data", str(tmp_path / "d.npz"), "--batch-size", "16",
                 "--steps", "2", *FP32_ARGS, "--ranks", "2", "--allreduce", "tree",
                 "--check-rank-weights", "--rank-init", "1=3", "--json", str(js), "--report", str(rep), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "all-reduce hd in float32" in out and "WARNING: 1 rank(s) start from other weights" in out
    run = json.loads(js.read_text())
    assert [len(s["rank_losses"]) for s in run["steps"]] == [2, 2]
    assert {d["rank"] for d in run["ranks"]["initial_differences"]} == {1}
    html = rep.read_text()
    assert 'id="ranks"' in html and "Initial weights unlike rank 0" in html and "rank_losses" in html

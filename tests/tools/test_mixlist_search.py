"""mixlist-search and the sweep layer: a planted model whose fp16-fragile op types are known, the same result
serially and on a real Dask cluster, retries, interruption, and the CLI."""
import dataclasses
import json
import math
import os
import sys

import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.npu.device import Device
from ascend_emu.tools.mixlist_search import BY_NAME_REFUSAL, Target, _base_mixlist, merge_mixlist, mixlist_search
from ascend_emu.tools.sweep import ReplayTask, Sweep, SweepContext, raise_failures

PLANTED = ["Exp", "ReduceSumD", "Square"]
TARGET = "cosine>=0.999"
#: the starting lists of a CANN release that leaves ReduceSum gray (the shipped lists differ by release and
#: SoC, ASCEND-FACTS section 1); the search starts from the user's edits and keeps them
BASE = {"black-list": {"to-remove": ["ReduceSumD"]}}


def planted_model(seed=0):
    """Three branches, each with one op that fails in fp16 under allow_mix_precision (saturation, Ascend910).

    - ``long_sum``: a sum over 4096 values near 20 (8.2e4 > 65504), then /4096 - 20: ReduceSumD saturates;
    - ``softmax``: written as exp(z) / sum(exp(z)) of logits near 14 (exp(14) = 1.2e6): Exp saturates;
    - ``layer_norm``: written out, on activations of std ~200: (x - mean)^2 saturates above |x - mean| 256,
      so Square under-estimates the variance (the variance itself, ~4e4, fits fp16).
    Every other op is fine in fp16 (fp16 rounding alone keeps 1 - cosine below 1e-6).
    """
    from ascend_emu.frontend.tf.loader import import_tf

    import_tf()
    import keras
    from keras import ops

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    L = keras.layers
    x = keras.Input((32,), name="x")
    h = L.Dense(4096, name="wide")(x)
    s = L.Lambda(lambda t: ops.sum(t, axis=-1, keepdims=True) / 4096.0 - 20.0, name="long_sum")(h)
    z = L.Dense(16, name="logits")(x)
    e = L.Lambda(lambda t: ops.exp(t) / ops.sum(ops.exp(t), axis=-1, keepdims=True), name="softmax")(z)
    a = L.Dense(64, name="big")(x)

    def layer_norm(t):
        d = t - ops.mean(t, axis=-1, keepdims=True)
        return d * ops.rsqrt(ops.mean(ops.square(d), axis=-1, keepdims=True) + 1e-3) + 3.0

    y = L.Lambda(layer_norm, name="layer_norm")(a)
    m = keras.Model(x, [s, e, y])
    w = m.get_layer("wide")
    w.kernel.assign(rng.normal(0, 0.05, (32, 4096)).astype(np.float32))
    w.bias.assign((20.0 + rng.normal(0, 1, 4096)).astype(np.float32))
    lg = m.get_layer("logits")
    lg.kernel.assign(rng.normal(0, 0.3, (32, 16)).astype(np.float32))
    lg.bias.assign(np.full(16, 14.0, np.float32))
    m.get_layer("big").kernel.assign(rng.normal(0, 35, (32, 64)).astype(np.float32))
    return m


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from ascend_emu.frontend.tf.loader import load_graph

    d = tmp_path_factory.mktemp("planted")
    g = load_graph(planted_model())
    pb = d / "planted.pb"
    pb.write_bytes(g.graph_def)          # a frozen GraphDef: what a worker loads by path
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    np.save(d / "x.npy", x)
    return {"graph": g, "pb": str(pb), "inputs": {"x": x}, "x": str(d / "x.npy"), "dir": d}


@pytest.fixture(scope="module")
def cluster():
    """One real dask.distributed LocalCluster (2 worker processes) shared by the module, used by address."""
    distributed = pytest.importorskip("distributed")
    import cloudpickle

    # the workers cannot import this test module: its helpers travel by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    c = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                 silence_logs=40, env={"NUMBA_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        yield c.scheduler_address
    finally:
        c.close()


@pytest.fixture(scope="module")
def serial_result(planted):
    dev = Device("allow_mix_precision", modify_mixlist=BASE)
    out = planted["dir"] / "ops_info.json"
    return mixlist_search(planted["pb"], planted["inputs"], target=TARGET, device=dev, output=out,
                          scheduler="none", progress=False), out


def _cosine(device, planted):
    from ascend_emu.frontend.tf.reference import reference
    from ascend_emu.tools.sweep import output_metrics
    from ascend_emu.tools.sweep import flat_outputs

    g = planted["graph"]
    res = device.replay(g, planted["inputs"], progress=False)
    ref = reference(g, planted["inputs"], progress=False)
    return output_metrics(flat_outputs(res.outputs[t] for t in g.outputs),
                          flat_outputs(ref.outputs[t] for t in g.outputs))["cosine"]


def test_search_finds_exactly_the_planted_types(serial_result, planted):
    res, out = serial_result
    assert res.met and res.black == PLANTED
    assert res.baseline_metrics["cosine"] < 0.5 and res.final_metrics["cosine"] >= 0.999
    # the ranking starts where the error enters: the first divergent op is the saturating sum
    assert res.ranking[0][0] == "ReduceSumD" and {t for t, _s, _o in res.ranking[:4]} >= set(PLANTED)
    # the metric after each step, and the replays each took, add up
    assert [s.action for s in res.steps][:4] == ["baseline", "add Exp", "add ReduceSumD", "add Square"]
    assert res.replays == sum(s.replays for s in res.steps)
    cos = [s.metrics["cosine"] for s in res.steps[:4]]
    assert cos == sorted(cos)
    # cost: few ops, a small share of the FLOPs (the MatMuls stay in fp16)
    assert 0 < res.cost["ops_moved"] < res.cost["ops_fp16"] and 0 < res.cost["flops_share"] < 0.05
    text = res.format_text()
    assert "black-list: Exp, ReduceSumD, Square (1-minimal" in text and f"replays: {res.replays}" in text
    # the file keeps the user's edits minus the found types, as CANN's modify_mixlist
    assert json.loads(out.read_text()) == {"black-list": {"to-add": PLANTED}}


def test_written_list_is_one_minimal_and_meets_the_target(serial_result, planted):
    """Independently of the search: the file meets the target; dropping any one type misses it."""
    _, out = serial_result
    assert _cosine(Device("allow_mix_precision", modify_mixlist=str(out)), planted) >= 0.999
    for t in PLANTED:
        rest = merge_mixlist(BASE, [x for x in PLANTED if x != t])
        assert _cosine(Device("allow_mix_precision", modify_mixlist=rest), planted) < 0.999, t


def test_cli_replay_accepts_the_written_file(serial_result, planted, capsys):
    from ascend_emu.cli import main

    _, out = serial_result
    rc = main(["-q", "replay", planted["pb"], "--input", f"x={planted['x']}", "--precision-mode",
               "allow_mix_precision", "--modify-mixlist", str(out)])
    assert rc == 0 and "overflowing ops: 0" in capsys.readouterr().out


def test_cli_on_a_cluster_by_address(serial_result, planted, cluster, tmp_path, capsys):
    """The command line, run on the module's cluster by its address (as a remote cluster): the serial result."""
    from ascend_emu.cli import main

    serial, _ = serial_result
    base = tmp_path / "base.json"
    base.write_text(json.dumps(BASE))
    out, rep = tmp_path / "ops_info.json", tmp_path / "search.json"
    rc = main(["-q", "mixlist-search", planted["pb"], "--input", f"x={planted['x']}", "--modify-mixlist", str(base),
               "--target", TARGET, "--output", str(out), "--json", str(rep), "--scheduler", cluster])
    text = capsys.readouterr().out
    assert rc == 0 and "black-list: Exp, ReduceSumD, Square" in text and f"wrote {out}" in text
    got = json.loads(rep.read_text())
    assert got.pop("scheduler") == cluster
    want = json.loads(json.dumps(serial.to_json()))
    want.pop("scheduler")
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)   # nan-safe: every number equal
    assert json.loads(out.read_text()) == {"black-list": {"to-add": PLANTED}}


def test_fusion_bisect_same_result_serial_local_and_address(cluster):
    """fusion-bisect in this process, on its own LocalCluster (scheduler local) and on a cluster by address."""
    from ascend_emu.frontend.tf.loader import load_graph
    from ascend_emu.tools.bisect import fusion_bisect
    from tools.test_bisect import planted_model as bisect_model

    g = load_graph(bisect_model())
    x = (np.random.default_rng(1).standard_normal((2, 8, 8, 4)) * 1e-3).astype(np.float32)
    # local: a LocalCluster of its own (one worker process: the module's cluster already runs two)
    runs = [fusion_bisect(g, {"image": x}, device=Device("force_fp16", soc="Ascend910B"), scheduler=s,
                          progress=False, n_workers=1) for s in ("none", "local", cluster)]
    assert runs[0].culprits == ["ConvBatchnormFusionPass"] and len(runs[0].trials) >= 3
    same = [json.dumps(dataclasses.asdict(r), sort_keys=True) for r in runs]   # nan-safe
    assert same[0] == same[1] == same[2]


class Flaky:
    """An analysis that fails on its first call for a given marker path (in any process), then works."""

    def __init__(self, marker, always=False):
        self.marker, self.always = str(marker), always

    def __call__(self, res, ctx):
        if self.always or not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError(f"planted failure ({os.path.basename(self.marker)})")
        return {"ok": 1}


@pytest.mark.parametrize("where", ["none", "cluster"])
def test_failed_task_is_retried_once_then_reported(planted, cluster, tmp_path, where):
    from ascend_emu.frontend.tf.reference import reference
    from ascend_emu.tools.sweep import flat_outputs

    g = planted["graph"]
    ref = reference(g, planted["inputs"], progress=False)
    ctx = SweepContext(g, g.fingerprint, planted["inputs"], flat_outputs(ref.outputs[t] for t in g.outputs))
    dev = Device("allow_mix_precision")
    tasks = [ReplayTask("flaky", dev, dump=str(tmp_path / "flaky"), analyze=Flaky(tmp_path / "m1")),
             ReplayTask("broken", dev, dump=str(tmp_path / "broken"), analyze=Flaky(tmp_path / "m2", always=True)),
             ReplayTask("plain", dev)]
    with Sweep("none" if where == "none" else cluster, progress=False) as sw:
        flaky, broken, plain = sw.run(ctx, tasks)
    assert flaky.ok and flaky.attempts == 2 and flaky.analysis == {"ok": 1}
    assert not broken.ok and broken.attempts == 2 and "planted failure (m2)" in broken.error
    assert plain.ok and plain.attempts == 1 and plain.metrics["cosine"] < 0.5
    assert sw.replays == 5
    # the flaky task's dump is complete and in place; the broken one left nothing, not even its staging dir
    from ascend_emu.analysis.dump import load_dump

    assert load_dump(tmp_path / "flaky").summary["ops"] > 0
    assert sorted(os.listdir(tmp_path)) == ["flaky", "m1", "m2"]
    with pytest.raises(AscendEmuError, match=r"1 replay\(s\) of the sweep failed after 2 attempts: broken: RuntimeError: planted failure"):
        raise_failures([flaky, broken, plain])


def _interrupt(res, ctx):
    raise KeyboardInterrupt


def test_ctrl_c_leaves_no_half_written_dump(planted, tmp_path):
    """Ctrl-C during a task (here: in its analysis, after the dump is written to its staging directory)."""
    from ascend_emu.frontend.tf.reference import reference
    from ascend_emu.tools.sweep import flat_outputs

    g = planted["graph"]
    ref = reference(g, planted["inputs"], progress=False)
    ctx = SweepContext(g, g.fingerprint, planted["inputs"], flat_outputs(ref.outputs[t] for t in g.outputs))
    with pytest.raises(KeyboardInterrupt):
        with Sweep("none", progress=False) as sw:
            sw.run(ctx, [ReplayTask("a", Device("allow_mix_precision"), dump=str(tmp_path / "a"), analyze=_interrupt)])
    assert os.listdir(tmp_path) == []


def test_targets():
    assert Target.parse("cosine>=0.999") == Target("cosine", ">=", 0.999)
    assert Target.parse(" max_rel_err <= 1e-2 ") == Target("max_rel_err", "<=", 0.01)
    t = Target.parse("rmse<0.5")
    assert t.met({"rmse": 0.4}) and not t.met({"rmse": 0.5}) and not t.met({"rmse": math.nan})
    assert t.better({"rmse": 0.1}, {"rmse": math.nan}) and not t.better({"rmse": math.nan}, {"rmse": 9.0})
    for bad, msg in [("cosine=0.9", "METRIC>=VALUE"), ("cosine<=0.9", "higher when better"),
                     ("max_abs_err>=1", "lower when better"), ("kl>=1", "unknown metric"),
                     ("cosine>=2", "out of range"), ("rmse<=-1", "out of range"), ("cosine>=1e999", "out of range")]:
        with pytest.raises(AscendEmuError, match=msg):
            Target.parse(bad)


def test_mixlist_edits_round_trip():
    """The device's lists give back the user's edits; merging adds the found types to black-list only."""
    edits = {"black-list": {"to-remove": ["ReduceSumD"], "to-add": ["Gelu"]}, "white-list": {"to-add": ["Tanh"]}}
    base = _base_mixlist(Device("allow_mix_precision", modify_mixlist=edits))
    assert base == {"black-list": {"to-add": ["Gelu"], "to-remove": ["ReduceSumD"]}, "white-list": {"to-add": ["Tanh"]}}
    assert _base_mixlist(Device("allow_mix_precision")) == {}
    merged = merge_mixlist(base, ["ReduceSumD", "Tanh"])
    assert merged == {"black-list": {"to-add": ["Gelu", "ReduceSumD", "Tanh"]}}
    lists = Device("allow_mix_precision", modify_mixlist=merged).precision.lists
    assert {"Gelu", "ReduceSumD", "Tanh"} <= lists.black


def test_api_refusals(planted):
    with pytest.raises(AscendEmuError, match="op types only"):
        mixlist_search(planted["graph"], by="name")
    with pytest.raises(AscendEmuError, match="allow_mix_precision"):
        mixlist_search(planted["graph"], device=Device("force_fp16"))
    assert "keep_dtype" in BY_NAME_REFUSAL



def test_target_not_met_writes_nothing(planted, tmp_path):
    """A target out of reach within max_steps: reported as not met, no ops_info.json written."""
    out = tmp_path / "ops_info.json"
    res = mixlist_search(planted["graph"], planted["inputs"], target="cosine>=0.9999999999",
                         device=Device("allow_mix_precision", modify_mixlist=BASE), output=out, max_steps=1,
                         scheduler="none", progress=False)
    assert not res.met and not out.exists() and len(res.steps) == 2 and res.replays == 5
    assert "not met: best cosine" in res.format_text()


def test_scheduler_names():
    from ascend_emu.tools.sweep import check_scheduler, dask_available, default_scheduler, default_workers

    assert check_scheduler("none") == "none"
    assert check_scheduler(None) == ("local" if dask_available() and default_workers() >= 3 else "none")
    # the default: serial on 1 or 2 cores (a cluster's start outweighs the second core), local from 3 with Dask
    assert default_scheduler(1) == default_scheduler(2) == "none"
    assert default_scheduler(3) == default_scheduler(16) == ("local" if dask_available() else "none")
    if dask_available():
        assert check_scheduler("tcp://10.0.0.1:8786") == "tcp://10.0.0.1:8786"
    for bad in ("", "loc", "tcp://", "tcp://h", "tcp://h:x", "http://h:1"):
        with pytest.raises(AscendEmuError, match="scheduler"):
            check_scheduler(bad)


def test_default_scheduler_is_serial_on_two_cores(planted, monkeypatch):
    """scheduler=None (the CLI's default) on a 2-core machine runs in this process: no LocalCluster is started."""
    from ascend_emu.tools import sweep

    monkeypatch.setattr(sweep, "default_workers", lambda: 2)
    monkeypatch.setattr(sweep.Sweep, "_connect", lambda self: pytest.fail("a Dask cluster was started"))
    res = mixlist_search(planted["graph"], planted["inputs"], target="cosine>=0.9999999999",
                         device=Device("allow_mix_precision", modify_mixlist=BASE), max_steps=1, scheduler=None,
                         progress=False)
    assert res.scheduler == "none" and res.replays == 5

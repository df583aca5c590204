"""fit on the sweep layer (issue 46): its candidates on a real Dask LocalCluster give the bytes of the serial fit
(JSON and text), the dump read once and shipped once; a scheduler that cannot be used and a candidate that fails
on a worker end the command with one line and exit status 2."""
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError

sys.path.insert(0, os.path.dirname(__file__))
from test_fit import BASE, small_model  # noqa: E402

#: what the dump is made with (the other assumed parameters at the 910B's defaults)
PLANTED = {"cube_block_sum": "sequential", "hf32_bits": 10}

OPTS = ["--soc", "Ascend910B", "--precision-mode", "must_keep_origin_dtype", "--allow-hf32", "conv,matmul"]


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
def planted(tmp_path_factory):
    """The model as a .keras file and its dump made under non-default assumed parameters (what fit must find)."""
    from ascend_emu.frontend.tf.loader import load_graph
    from ascend_emu.npu.device import Device
    from ascend_emu.tools.fit import variant

    d = tmp_path_factory.mktemp("fitsweep")
    model = small_model()
    path = str(d / "m.keras")
    model.save(path)
    g = load_graph(path)
    x = np.random.default_rng(5).standard_normal((4, 6, 6, 3)).astype(np.float32)
    variant(Device(**BASE), PLANTED).replay(g, {"image": x}, str(d / "planted"), progress=False)
    return {"dir": d, "model": path, "graph": g, "dump": str(d / "planted")}


def _cli(argv, capsys):
    from ascend_emu.cli.main import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.models
def test_fit_on_a_cluster_is_the_serial_fit(planted, cluster, capsys):
    """The CLI's fit serially (--serial) and on the cluster (--scheduler ADDRESS: the workers load the model by its
    path) print the same text and write the same JSON bytes; the API's fit with an in-memory graph (shipped with
    the dump's tensors) gives the same result."""
    from ascend_emu.npu.device import Device
    from ascend_emu.tools.fit import fit

    d = planted["dir"]
    params = [*PLANTED, "cube_conv_k_order", "impl_mode"]
    base = ["fit", planted["dump"], planted["model"], "-q", *OPTS] + [a for p in params for a in ("--param", p)]
    rc, serial_out, err = _cli(base + ["--serial", "--json", str(d / "serial.json")], capsys)
    assert rc == 0, err
    rc, dask_out, err = _cli(base + ["--scheduler", cluster, "--json", str(d / "dask.json")], capsys)
    assert rc == 0, err
    assert dask_out.replace("dask.json", "serial.json") == serial_out
    serial = (d / "serial.json").read_bytes()
    assert (d / "dask.json").read_bytes() == serial
    js = json.loads(serial)
    # the planted values are found, on every scheduler
    for p in PLANTED:
        assert js["parameters"][p]["verdict"] == "decided" and js["best"]["params"][p] == PLANTED[p], p
    assert js["candidates"] > 8
    res = fit(planted["dump"], planted["graph"], device=Device(**BASE), progress=False, scheduler=cluster,
              params=params)
    ser = fit(planted["dump"], planted["graph"], device=Device(**BASE), progress=False, scheduler="none",
              params=params)
    assert json.dumps(res.to_json(), sort_keys=True) == json.dumps(ser.to_json(), sort_keys=True)


def test_a_scheduler_fit_cannot_use_is_one_line(planted, capsys, monkeypatch):
    """An address where nothing listens, a malformed one, and --serial with an address: one line, exit 2,
    before any candidate runs."""
    import ascend_emu.tools.sweep as sweep

    pytest.importorskip("distributed")
    monkeypatch.setattr(sweep, "CONNECT_TIMEOUT", "1s")
    base = ["fit", planted["dump"], planted["model"], "-q", "--param", "cube_block_sum", *OPTS]
    for extra, msg in ((["--scheduler", "tcp://127.0.0.1:9"], "cannot reach the Dask scheduler at tcp://127.0.0.1:9"),
                       (["--scheduler", "tcp://nowhere"], "scheduler 'tcp://nowhere'"),
                       (["--serial", "--scheduler", "tcp://127.0.0.1:9"], "--serial runs in this process")):
        rc, out, err = _cli(base + extra, capsys)
        assert rc == 2 and err.count("\n") == 1 and msg in err and "Traceback" not in err, (extra, err)


def test_a_candidate_failing_on_a_worker_is_one_line(planted, cluster, capsys):
    """A dump whose conv filter has lost a channel (manifest and file agree, so it reads back): the conv fails on
    the worker that reruns it, and the command stops with that error in one line, exit 2."""
    d = planted["dir"]
    bad = d / "bad"
    if not bad.exists():
        shutil.copytree(planted["dump"], bad)
        m = json.loads((bad / "manifest.json").read_text())
        for op in m["ops"]:
            if op["name"].endswith("convolution/ReadVariableOp"):
                out = op["outputs"][0]
                w = np.load(bad / out["file"])[:, :, :2]
                np.save(bad / out["file"], w)
                out["shape"] = list(w.shape)
        (bad / "manifest.json").write_text(json.dumps(m))
    rc, out, err = _cli(["fit", str(bad), planted["model"], "-q", "--param", "cube_block_sum", "--scheduler",
                         cluster, *OPTS], capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(r"op functional\w*/conv_1/\S+ does not rerun", err) and "the input's 3 channels" in err


def _fails(shared, item):
    """A call that raises on the worker with a message of several lines."""
    if item == 1:
        raise RuntimeError(f"boom\n  in item {item}\n  shared {shared['n']}")
    return item + shared["n"]


def test_map_shares_once_and_names_a_failure_in_one_line(cluster):
    """Sweep.map with ``shared``: every call reads it (scattered once, the same future for every batch), the
    results in item order; a call failing twice is named in one line, its message's lines joined."""
    from ascend_emu.tools.sweep import Sweep

    shared = {"n": 10}
    with Sweep(cluster, progress=False) as sw:
        assert sw.map(_fails, [0, 2, 3], shared=shared) == [10, 12, 13]
        fut = sw._shared[1]
        assert sw.map(_fails, [4], shared=shared) == [14] and sw._shared[1] is fut
        with pytest.raises(AscendEmuError) as e:
            sw.map(_fails, [0, 1], names=["first", "second"], shared=shared)
    assert str(e.value) == "second failed twice: RuntimeError: boom in item 1 shared 10"
    with Sweep("none", progress=False) as sw:
        assert sw.map(_fails, [0, 2], shared=shared) == [10, 12]
        with pytest.raises(AscendEmuError, match="^task 0 failed twice: RuntimeError: boom in item 1 shared 10$"):
            sw.map(_fails, [1], shared=shared)


def test_conv_k_order_cannot_act_where_fit_reruns_once():
    """k_order_acts (what fit's one rerun for both orders rests on): where it says the order cannot act (C a whole
    number of 16-channel blocks, and a 1x1 filter or one block), Conv2D gives the same bits in both orders under
    every block sum; where it can act, the orders part (a sequential sum of 3x3x32 terms in another order)."""
    from ascend_emu.numerics.conv import conv2d, k_order_acts
    from ascend_emu.numerics.policy import BLOCK_SUMS, CubeModel

    rng = np.random.default_rng(11)
    for kh, kw, c, acts in ((1, 1, 32, False), (1, 1, 48, False), (3, 3, 16, False), (1, 1, 16, False),
                            (3, 3, 32, True), (1, 1, 24, True), (3, 3, 3, True)):
        assert k_order_acts(kh, kw, c) is acts
        x = rng.standard_normal((2, 7, 9, c)).astype(np.float16)
        w = rng.standard_normal((kh, kw, c, 40)).astype(np.float16)
        parted = False
        for bs in BLOCK_SUMS:
            a, b = (conv2d(x, w, padding="SAME", model=CubeModel(block_sum=bs, conv_k_order=o))
                    for o in ("hwc", "c1hwc0"))
            same = a[0].tobytes() == b[0].tobytes() and a[1] == b[1]     # (output, status)
            assert same or acts, (kh, kw, c, bs)
            parted |= not same
        if (kh, kw, c) == (3, 3, 32):
            assert parted

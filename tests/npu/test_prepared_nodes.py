"""What the device works out per node from its input dtypes (npu/replay.py ``_Prepared``) is kept between
replays of the same fused graph on the same device (training replays its step graph every step). A replay
that reuses it must give the outputs, records and float status of the first replay and of a fresh device;
an entry whose input dtypes no longer match is worked out again, and a device whose precision policy is
replaced decides afresh."""
import dataclasses

import numpy as np
import pytest

from ascend_emu import Device
from ascend_emu.npu.precision import PrecisionPolicy

from test_deferred_cast import _graph, _hostile  # the same graph and hostile data
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)


def _result(res):
    outs = {k: (v.dtype.str, v.shape, np.ascontiguousarray(v).view(np.uint8).tobytes()) for k, v in res.outputs.items()}
    return outs, [dataclasses.asdict(r) for r in res.records], res.summary["float_status"]


def _prepared(dev):
    """The kept entries of the device's (only) plan."""
    (entry,) = dev._plan_cache.values()
    return {k: v for k, v in entry[3][2].items() if v is not None}


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("keep", [True, False])
def test_replays_reusing_the_nodes_work_match_the_first_and_a_fresh_device(mode, keep):
    g = _graph()
    feeds = _hostile("special")
    dev = Device("allow_mix_precision", overflow_mode=mode)
    first = _result(dev.replay(g, feeds, progress=False, keep_tensors=keep))
    kept = _prepared(dev)
    # the float ops of the graph (the convolution, the reductions, Log, Relu, BiasAddGrad) are kept
    assert {p.node.op for p in kept.values()} >= {"Conv2D", "Sum", "Mean", "Log", "Relu", "BiasAddGrad"}
    for _ in range(2):
        assert _result(dev.replay(g, feeds, progress=False, keep_tensors=keep)) == first
    fresh = Device("allow_mix_precision", overflow_mode=mode)
    assert _result(fresh.replay(g, feeds, progress=False, keep_tensors=keep)) == first
    # other data through the same kept entries: as on a fresh device
    other = _hostile("overflow", seed=9)
    assert (_result(dev.replay(g, other, progress=False, keep_tensors=keep))
            == _result(Device("allow_mix_precision", overflow_mode=mode).replay(g, other, progress=False,
                                                                                 keep_tensors=keep)))


def test_an_entry_whose_input_dtypes_differ_is_worked_out_again():
    g = _graph()
    feeds = _hostile("overflow")
    dev = Device("allow_mix_precision")
    first = _result(dev.replay(g, feeds, progress=False))
    kept = _prepared(dev)
    conv = next(p for p in kept.values() if p.node.op == "Conv2D")
    # as if the convolution had met other dtypes: its entry must not be used as it stands
    conv.sig = (np.dtype(np.float16), np.dtype(np.float16))
    conv.casts = ()
    assert _result(dev.replay(g, feeds, progress=False)) == first
    again = next(p for p in _prepared(dev).values() if p.node.op == "Conv2D")
    assert again is not conv and again.casts and again.sig == (np.dtype(np.float32), np.dtype(np.float32))


def test_a_replaced_precision_policy_decides_afresh():
    g = _graph()
    feeds = _hostile("plain")
    dev = Device(**{**FP32, "precision_mode": "allow_mix_precision"})
    mixed = _result(dev.replay(g, feeds, progress=False))
    dev.precision = PrecisionPolicy("must_keep_origin_dtype")
    kept = _result(dev.replay(g, feeds, progress=False))
    assert kept == _result(Device(**FP32).replay(g, feeds, progress=False))
    assert kept != mixed
    assert all(r["compute_dtype"] in ("float32", "int32", "") for r in kept[1])


def test_a_replaced_precision_policy_or_fusion_config_fuses_afresh():
    """The mix lists decide which elementwise ops join a UB chain: a device whose policy is replaced by one
    that black-lists Mul replays the graph as a fresh device with those lists does (Mul no longer in the
    chain), and a replaced fusion config (the chain switched off) likewise."""
    import keras

    from ascend_emu.frontend.tf.loader import load_graph
    from ascend_emu.npu.fusion import FusionConfig

    keras.utils.set_random_seed(0)
    x = keras.Input((64,), name="x")
    h = keras.layers.Dense(64)(x)
    g = load_graph(keras.Model(x, keras.layers.Activation("tanh")(h * 2.0 + 1.0)))
    feeds = {"x": np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)}
    black = {"black-list": {"to-add": ["Mul"]}}
    dev = Device("allow_mix_precision")
    first = _result(dev.replay(g, feeds, progress=False))
    assert "Mul" not in {r["tf_type"] for r in first[1]}
    dev.precision = PrecisionPolicy("allow_mix_precision", modify_mixlist=black)
    again = _result(dev.replay(g, feeds, progress=False))
    assert again == _result(Device("allow_mix_precision", modify_mixlist=black).replay(g, feeds, progress=False))
    assert "Mul" in {r["tf_type"] for r in again[1]}
    dev.fusion = FusionConfig.load("off")
    off = _result(dev.replay(g, feeds, progress=False))
    assert off == _result(Device("allow_mix_precision", modify_mixlist=black, fusion_switch="off")
                          .replay(g, feeds, progress=False))
    assert not {r["tf_type"] for r in off[1]} & {"_FusedMatMul", "_EltwiseChain"}

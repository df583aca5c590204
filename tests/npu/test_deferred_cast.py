"""The widening casts the device defers (npu/replay.py ``_Run._cast``'s ``defer``): in front of an op that
reads fp16 as its widening (``OpDef.reads_half``: the reductions, BiasAddGrad) the cast is recorded but
computed only if another consumer needs it. A replay that defers (no dump, no kept tensors) must give the
outputs, records and float status of the same replay that computes every cast, on hostile data (NaN, Inf,
fp16 overflow, subnormals, signed zeros), in both overflow modes and both subnormal modes."""
import dataclasses

import numpy as np
import pytest

from ascend_emu import Device
from ascend_emu.graph import Graph, InputSpec, Node
from ascend_emu.kernels import scale16
from ascend_emu.npu import replay as R

SHAPE = [4, 8, 8, 16]


def _graph():
    # a float32 model: the 1x1 convolution (white) computes in fp16 under allow_mix_precision, so its
    # black-list consumers get a cast to float32 in front of them, as in a training step's backward pass
    w = np.eye(SHAPE[3], dtype=np.float32).reshape(1, 1, SHAPE[3], SHAPE[3]) * np.float32(0.5)
    f32 = {"T": "float32"}
    red = {"T": "float32", "Tidx": "int32"}
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": SHAPE}),
             Node("w", "Const", [], {"dtype": "float32", "value": w}),
             Node("h", "Conv2D", ["x", "w"], {**f32, "strides": [1, 1, 1, 1], "padding": "SAME"}),
             Node("lead", "Const", [], {"dtype": "int32", "value": np.array([0, 1, 2], np.int32)}),
             Node("mid", "Const", [], {"dtype": "int32", "value": np.array([1, 2], np.int32)}),
             # the first consumer defers the cast of h; Log (black, not reading fp16) then needs it;
             # BiasAddGrad reads it again; Mean over non-leading axes casts for itself
             Node("s", "Sum", ["h", "lead"], {**red, "keep_dims": True}),
             Node("m", "Mean", ["h", "mid"], {**red, "keep_dims": False}),
             Node("l", "Log", ["h"], f32),
             Node("bg", "BiasAddGrad", ["h"], {**f32, "data_format": "NHWC"}),
             # a second fp16 tensor whose only consumers read fp16: its cast is never computed
             Node("h2", "Relu", ["h"], f32),
             Node("s2", "Sum", ["h2", "lead"], {**red, "keep_dims": False}),
             Node("p2", "Prod", ["h2", "lead"], {**red, "keep_dims": False})]
    return Graph(nodes=nodes, inputs=[InputSpec("x", "float32", SHAPE)],
                 outputs=["s:0", "m:0", "l:0", "bg:0", "s2:0", "p2:0"])


def _hostile(kind, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SHAPE) * 4
    pick = rng.integers(0, 12, SHAPE)
    x = np.where(pick == 1, rng.choice([0.0, -0.0], SHAPE), x)
    x = np.where(pick == 2, rng.choice([-1.0, 1.0], SHAPE) * np.exp2(rng.uniform(-25, -14, SHAPE)), x)
    if kind in ("overflow", "special"):
        x = np.where(pick == 3, rng.choice([1.4e5, -2e6, 131038.0, 131040.0], SHAPE), x)   # fp16 overflow (x / 2)
    if kind == "special":
        x = np.where(pick == 4, rng.choice([np.inf, -np.inf, np.nan], SHAPE), x)
    return {"x": x.astype(np.float32)}


def _replay(dev, feeds, keep):
    res = dev.replay(_graph(), feeds, progress=False, keep_tensors=keep)
    outs = {k: (v.dtype.str, v.shape, np.ascontiguousarray(v).view(np.uint8).tobytes()) for k, v in res.outputs.items()}
    recs = [dataclasses.asdict(r) for r in res.records]
    return outs, recs, res.summary["float_status"]


@pytest.mark.parametrize("kind", ["finite", "overflow", "special"])
@pytest.mark.parametrize("overflow_mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("subnormals", ["keep", "flush"])
def test_deferred_casts_change_nothing(kind, overflow_mode, subnormals, monkeypatch):
    deferred = []
    real = R._Deferred.__init__

    def spy(self, *a):
        deferred.append(1)
        real(self, *a)
    monkeypatch.setattr(R._Deferred, "__init__", spy)
    dev = Device("allow_mix_precision", overflow_mode=overflow_mode, subnormals=subnormals, fusion_switch="off")
    feeds = _hostile(kind)
    fast = _replay(dev, feeds, keep=False)
    assert len(deferred) == 2          # h (computed later for Log) and h2 (never computed)
    deferred.clear()
    full = _replay(dev, feeds, keep=True)   # kept tensors: every cast computed, as before
    assert not deferred
    assert fast[0] == full[0]
    assert fast[1] == full[1]
    assert fast[2] == full[2]
    casts = [r for r in fast[1] if r["inserted"]]
    assert {r["inputs"][0] for r in casts} >= {"h:0", "h2:0"}
    if kind == "special" and overflow_mode == "inf_nan":
        # an overflowing reduction: its float32 check reruns it on the cast, computed then
        sums = [r for r in fast[1] if r["status"] and r["tf_type"] == "Sum"]
        assert sums and all(r["fp32_check"] is not None for r in sums)


def _mul_graph():
    # Mul reads fp16 too (its one pass for an fp16 tensor times a float32 value: kernels/scale16.py): h times a
    # scalar (the loss scale's unscaling), times a large scalar (overflow), h times h (both deferred), h times a
    # float32 tensor, and Log needing the cast afterwards
    w = np.eye(SHAPE[3], dtype=np.float32).reshape(1, 1, SHAPE[3], SHAPE[3]) * np.float32(0.5)
    f32 = {"T": "float32"}
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": SHAPE}),
             Node("w", "Const", [], {"dtype": "float32", "value": w}),
             Node("h", "Conv2D", ["x", "w"], {**f32, "strides": [1, 1, 1, 1], "padding": "SAME"}),
             Node("c", "Const", [], {"dtype": "float32", "value": np.array(1 / 1024, np.float32)}),
             Node("big", "Const", [], {"dtype": "float32", "value": np.array(2.0 ** 125, np.float32)}),
             Node("m1", "Mul", ["h", "c"], f32),
             Node("m2", "Mul", ["h", "big"], f32),
             Node("m3", "Mul", ["h", "h"], f32),
             Node("m4", "Mul", ["x", "h"], f32),
             Node("l", "Log", ["h"], f32)]
    return Graph(nodes=nodes, inputs=[InputSpec("x", "float32", SHAPE)],
                 outputs=["m1:0", "m2:0", "m3:0", "m4:0", "l:0"])


@pytest.mark.parametrize("kind", ["finite", "overflow", "special"])
@pytest.mark.parametrize("overflow_mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("subnormals", ["keep", "flush"])
def test_deferred_casts_mul(kind, overflow_mode, subnormals, monkeypatch):
    # Mul on the black list: float32 on the device, its fp16 inputs cast (as the MLP's loss scale unscaling runs)
    dev = Device("allow_mix_precision", overflow_mode=overflow_mode, subnormals=subnormals, fusion_switch="off",
                 modify_mixlist={"black-list": {"to-add": ["Mul"]}})
    feeds = _hostile(kind)
    deferred, kernel = [], []
    real, real_k = R._Deferred.__init__, scale16.widen_mul

    def spy(self, *a, **k):
        deferred.append(1)
        real(self, *a, **k)
    monkeypatch.setattr(R._Deferred, "__init__", spy)
    monkeypatch.setattr(scale16, "widen_mul", lambda *a: kernel.append(1) or real_k(*a))
    runs = []
    for keep in (False, True):
        deferred.clear()
        res = dev.replay(_mul_graph(), feeds, progress=False, keep_tensors=keep)
        # the Muls' casts deferred without kept tensors (none with them)
        assert (len(deferred) > 0) != keep
        runs.append(({k: (v.dtype.str, v.shape, np.ascontiguousarray(v).view(np.uint8).tobytes())
                      for k, v in res.outputs.items()}, [dataclasses.asdict(r) for r in res.records],
                     res.summary["float_status"]))
    assert runs[0] == runs[1]
    assert bool(kernel) == (subnormals == "keep")   # the one pass only with subnormals kept
    assert [r["tf_type"] for r in runs[0][1]].count("Mul") == 4

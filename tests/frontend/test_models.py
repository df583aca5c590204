"""The seeded models: deterministic weights, meaningful batch norm, and the planted numerics."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.frontend.tf import models
from ascend_emu.frontend.tf.loader import import_tf, load_graph
from ascend_emu.frontend.tf.reference import reference

tf = import_tf()
import keras  # noqa: E402

FP16_MAX = 65504.0
MATMUL_OPS = ("MatMul", "BatchMatMulV2", "Einsum", "Conv2D", "DepthwiseConv2dNative")


def weights(m):
    return [np.asarray(w) for w in m.weights]


def same_weights(a, b) -> bool:
    wa, wb = weights(a), weights(b)
    return len(wa) == len(wb) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(wa, wb))


def matmul_outputs(res, graph):
    return {n.name: res.tensor(n.name) for n in graph.nodes if n.op in MATMUL_OPS}


@pytest.mark.parametrize("name", ["transformer_encoder", "demo_model", "planted_overflow_model",
                                  "float32_overflow_model"])
def test_seeded_and_cached(name):
    build = getattr(models, name)
    a = build(fresh=True)
    b = build(fresh=True)
    assert a is not b and same_weights(a, b)
    c = build(seed=1, fresh=True)
    assert not same_weights(a, c)
    assert build() is build()


@pytest.mark.models
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_applications_seeded_no_download_meaningful_bn(monkeypatch, name):
    from keras.src.utils import file_utils

    def no_download(*a, **k):
        raise AssertionError("models must never download anything")

    monkeypatch.setattr(file_utils, "get_file", no_download)
    a = getattr(models, name)(fresh=True)
    b = getattr(models, name)(fresh=True)
    assert same_weights(a, b)
    bns = [layer for layer in a.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(bns) > 10
    for layer in bns:
        var = np.asarray(layer.moving_variance)
        mean = np.asarray(layer.moving_mean)
        gamma = np.asarray(layer.gamma)
        assert np.all((var >= 0.5) & (var <= 2.0)) and var.std() > 0.1
        assert mean.std() > 0.01 and gamma.std() > 0.05
    assert a.inputs[0].shape == (None, 64, 64, 3) and a.layers[0].name == "image"
    # a seeded input gives a finite, non-degenerate softmax
    res = reference(a, None, progress=False)
    p = res.output_list[0]
    assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-4 and p.max() < 0.5 and p.std() > 0


def test_transformer_block_structure():
    m = models.transformer_encoder()
    g = load_graph(m)
    ops = {n.op for n in g.nodes}
    # attention (Einsum scores, Softmax), exact gelu (Erfc), LayerNormalization, residual adds
    assert {"Einsum", "Softmax", "BatchMatMulV2", "MatMul", "Erfc", "SquaredDifference", "Rsqrt",
            "Mean", "AddV2"} <= ops
    assert g.inputs[0].name == "tokens" and g.inputs[0].shape == [None, 16, 64]
    eqs = sorted(n.attrs["equation"] for n in g.nodes if n.op == "Einsum")
    assert eqs == ["BNTS,BSNH->BTNH", "BTNH,BSNH->BNTS"]
    res = reference(m, None, progress=False)
    y = res.output_list[0]
    # post-norm output: every token normalised
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(y.std(-1), 1, rtol=1e-3)


def test_demo_model_overflows_fp16_and_loses_accuracy():
    m = models.demo_model()
    g = load_graph(m)
    res = reference(g, None, progress=False)
    mm = matmul_outputs(res, g)
    wide = [v for k, v in mm.items() if "/wide" in k and "MatMul" in k]
    assert len(wide) == 1
    w = np.abs(wide[0])
    assert np.isfinite(w).all() and w.max() > FP16_MAX and w.max() < 1e7    # fp16 only
    with np.errstate(over="ignore"):
        assert np.isinf(wide[0].astype(np.float16)).any()
    # the rest of the network stays in fp16 range: the LayerNormalization brings values back
    for k, v in mm.items():
        if "/wide" not in k:
            assert np.abs(v).max() < FP16_MAX, k
    logits = next(res.tensor(n.name) for n in g.nodes if n.op == "BiasAdd" and "/logits" in n.name)
    assert 250 < logits.min() and logits.max() < 350 and np.ptp(logits) > 1
    p32 = res.output_list[0].astype(np.float64)

    def softmax(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    np.testing.assert_allclose(softmax(logits.astype(np.float64)), p32, rtol=1e-5)
    p16 = softmax(logits.astype(np.float16).astype(np.float64))
    assert np.max(np.abs(p16 - p32) / p32) > 0.01      # fp16 logits: visible error in probabilities


def test_planted_overflow_is_the_only_fp16_overflow():
    m = models.planted_overflow_model()
    g = load_graph(m)
    res = reference(g, None, progress=False)
    mm = matmul_outputs(res, g)
    assert len(mm) == 3
    over = {k for k, v in mm.items() if np.abs(v).max() > FP16_MAX}
    assert len(over) == 1 and "planted_overflow" in next(iter(over))
    v = mm[next(iter(over))]
    assert np.isfinite(v).all() and (np.abs(v) > FP16_MAX).mean() > 0.3
    assert all(np.isfinite(t).all() for t in res.tensors.values() if t.dtype.kind == "f")


def test_float32_overflow_model_overflows_in_float32():
    m = models.float32_overflow_model()
    g = load_graph(m)
    res = reference(g, None, progress=False)
    mm = matmul_outputs(res, g)
    h1 = next(v for k, v in mm.items() if "huge1" in k)
    h2 = next(v for k, v in mm.items() if "huge2" in k)
    bf16_max = 3.3895314e38
    assert np.isfinite(h1).all() and FP16_MAX < np.abs(h1).max() < bf16_max
    # every product of huge2 is ~1e60: a GEMM that multiplies and adds separately meets +inf and -inf (NaN),
    # one that fuses them (FMA) saturates its accumulator (inf); which one TF runs depends on the host's CPU
    assert not np.isfinite(h2).any()
    assert not np.isfinite(res.output_list[0]).all()

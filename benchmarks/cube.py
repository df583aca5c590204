"""Cube unit throughput: fp16 matmul against numpy, conv2d on ResNet50 layer shapes against TensorFlow.

GFLOP/s counts 2*M*N*K per product (one multiply and one add per term), for ours and the
baseline alike. Ours is the public API end to end: operand conversion, the block-model
accumulation (default CubeModel) and the fp16 output conversion with status.
"""
from __future__ import annotations

import numpy as np

from .common import best_time, row, side_by_side

# (name, batch, H, W, Cin, KH, KW, Cout, stride): ResNet50 layers
RESNET50_LAYERS = [
    ("conv2_x 3x3 56x56x64->64", 56, 56, 64, 3, 3, 64, 1),
    ("conv3_x 3x3 28x28x128->128", 28, 28, 128, 3, 3, 128, 1),
    ("conv5_x 3x3 7x7x512->512", 7, 7, 512, 3, 3, 512, 1),
    ("conv2_x 1x1 56x56x64->256", 56, 56, 64, 1, 1, 256, 1),
]


def _gflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e9


#: (name, batch, M, K, N): the products of the zoo's Transformer encoder at the replay benchmark's size (batch 8,
#: seq 128, d_model 256, 4 heads, ff 1024): the Dense/Einsum projections over 8 x 128 tokens and one head's
#: attention products (batched over 8 x 4 heads)
TRANSFORMER_GEMMS = [
    ("Transformer QKV/out projection 1024x256x256", 1, 1024, 256, 256),
    ("Transformer FFN up 1024x256x1024", 1, 1024, 256, 1024),
    ("Transformer FFN down 1024x1024x256", 1, 1024, 1024, 256),
    ("Transformer attention scores 32 x 128x64x128", 32, 128, 64, 128),
    ("Transformer attention values 32 x 128x128x64", 32, 128, 128, 64),
]


def matmul_rows(quick: bool) -> list[dict]:
    from ascend_emu.numerics.cube import batch_matmul, matmul

    n = 512 if quick else 1024
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float16)
    b = rng.standard_normal((n, n)).astype(np.float16)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    flops = 2.0 * n ** 3
    # alternating rounds, best of each, with a pause for the BLAS threads to park
    t_ours, t_np32 = side_by_side(lambda: matmul(a, b), lambda: a32 @ b32, rounds=5 if quick else 20, pause=0.25)
    ours, np32 = _gflops(flops, t_ours), _gflops(flops, t_np32)
    # numpy has no fp16 BLAS: its fp16 matmul takes seconds at this size, so one timed run
    np16 = _gflops(flops, best_time(lambda: a @ b, repeat=1, warmup=0))
    name = f"matmul {n}x{n}x{n} fp16 in, fp32 acc"
    note = "default CubeModel (16-term adder tree), fp16 out, end to end; issue 34's target >= 0.5x sgemm"
    rows = [
        row("cube", name, ours, np32, "numpy float32 matmul (BLAS)", "GFLOP/s", target=0.5, note=note),
        row("cube", name, ours, np16, "numpy float16 matmul", "GFLOP/s", target=100.0, note=note),
    ]
    for label, batch, m, k, nn in TRANSFORMER_GEMMS[:2] if quick else TRANSFORMER_GEMMS:
        shape_a, shape_b = ((batch, m, k), (batch, k, nn)) if batch > 1 else ((m, k), (k, nn))
        a = rng.standard_normal(shape_a).astype(np.float16)
        b = (rng.standard_normal(shape_b) / np.sqrt(k)).astype(np.float16)
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        ours_fn = (lambda: batch_matmul(a, b)) if batch > 1 else (lambda: matmul(a, b))
        t_ours, t_np32 = side_by_side(ours_fn, lambda: np.matmul(a32, b32),
                                      rounds=5 if quick else 20, pause=0.25)
        f = 2.0 * batch * m * k * nn
        rows.append(row("cube", f"matmul {label}", _gflops(f, t_ours), _gflops(f, t_np32),
                        "numpy float32 matmul (BLAS)", "GFLOP/s", target=0.5,
                        note="fp16 in, fp32 acc, fp16 out, default CubeModel; issue 34's target >= 0.5x sgemm"))
    return rows


def _conv_row(name, ours_fn, tf_fn, flops, baseline_name, note, *, quick) -> dict:
    """One row: ours against TensorFlow, alternating rounds with a pause for the other side's threads."""
    t_ours, t_base = side_by_side(ours_fn, tf_fn, rounds=2 if quick else 8, pause=0.25)
    target = 1.0 if name.startswith("depthwise") else 0.5     # issue 34: conv rows >= 0.5x oneDNN, depthwise >= 1x
    return row("cube", name, _gflops(flops, t_ours), _gflops(flops, t_base), baseline_name, "GFLOP/s",
               target=target, note=note)


def _against_tf(quick: bool, seed: int, cases, case_row) -> list[dict]:
    """The rows of ``cases`` (none without TensorFlow): ``case_row(tf, rng, batch, case)`` gives one row's
    :func:`_conv_row` arguments but ``quick``."""
    try:
        import tensorflow as tf
    except ImportError:
        return []
    rng = np.random.default_rng(seed)
    return [_conv_row(*case_row(tf, rng, 1 if quick else 8, case), quick=quick) for case in cases]


def _conv_case(tf, rng, batch, case):
    from ascend_emu.numerics.cube import conv2d

    name, H, W, C, KH, KW, CO, s = case
    x = rng.standard_normal((batch, H, W, C)).astype(np.float16)
    w = (rng.standard_normal((KH, KW, C, CO)) / np.sqrt(KH * KW * C)).astype(np.float16)
    xt, wt = tf.constant(x.astype(np.float32)), tf.constant(w.astype(np.float32))
    return (f"conv2d N={batch} {name}", lambda: conv2d(x, w, strides=(s, s), padding="SAME"),
            lambda: tf.nn.conv2d(xt, wt, strides=s, padding="SAME").numpy(),
            2.0 * batch * -(-H // s) * -(-W // s) * CO * KH * KW * C,
            "TensorFlow float32 Conv2D (CPU)", "SAME padding, fp16 in/out, default CubeModel")


def conv_rows(quick: bool) -> list[dict]:
    return _against_tf(quick, 1, RESNET50_LAYERS, _conv_case)


# (name, H, W, C, stride): MobileNetV2 3x3 depthwise layers (multiplier 1)
MOBILENET_DEPTHWISE = [
    ("block 2 3x3 dw 112x112x96 s2", 112, 112, 96, 2),
    ("block 4 3x3 dw 28x28x192", 28, 28, 192, 1),
]


def _depthwise_case(tf, rng, batch, case):
    from ascend_emu.numerics.cube import depthwise_conv2d

    name, H, W, C, s = case
    x = rng.standard_normal((batch, H, W, C)).astype(np.float16)
    w = (rng.standard_normal((3, 3, C, 1)) / 3).astype(np.float16)
    xt, wt = tf.constant(x.astype(np.float32)), tf.constant(w.astype(np.float32))
    return (f"depthwise N={batch} {name}", lambda: depthwise_conv2d(x, w, strides=(s, s), padding="SAME"),
            lambda: tf.nn.depthwise_conv2d(xt, wt, strides=[1, s, s, 1], padding="SAME").numpy(),
            2.0 * batch * -(-H // s) * -(-W // s) * C * 9, "TensorFlow float32 DepthwiseConv2dNative (CPU)",
            "SAME padding, fp16 in/out, default CubeModel (one partial 9-tap block per output)")


def depthwise_rows(quick: bool) -> list[dict]:
    return _against_tf(quick, 2, MOBILENET_DEPTHWISE, _depthwise_case)


def run(quick: bool = False) -> list[dict]:
    return matmul_rows(quick) + conv_rows(quick) + depthwise_rows(quick)

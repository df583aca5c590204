"""Issue 42 part 3: the bf16 output of the fused LayerNorm in a TF graph rounds as its kernel does. A Keras
Dense + LayerNormalization (2^18 outputs) replayed on the Ascend950 under allow_mix_precision_bf16: LayerNormFusionPass makes
one ``_LayerNorm`` computing in bf16, whose output is the float32 steps of the Ascend C kernel (tests/naive.py)
cast once with CAST_ROUND (ties away from zero, LayerNormV4: ASCEND-FACTS 13.4 item 2), bit for bit."""
from __future__ import annotations

import numpy as np

import naive
from ascend_emu import Device, reference
from ascend_emu.frontend.tf.loader import load_graph


def test_fused_layer_norm_in_a_tf_graph_rounds_bf16_ties_away():
    import keras

    keras.utils.set_random_seed(4)
    m = keras.Sequential([keras.Input((1024, 8)), keras.layers.Dense(256),
                          keras.layers.LayerNormalization(gamma_initializer="random_normal",
                                                          beta_initializer="random_normal"),
                          keras.layers.Dense(8)])
    g = load_graph(m)
    ref = reference(g, None, progress=False)
    res = Device("allow_mix_precision_bf16", soc="Ascend950").replay(g, ref.inputs, progress=False)
    ((rec,),) = [[r for r in res.records if r.tf_type == "_LayerNorm"]]
    assert rec.compute_dtype == "bfloat16" and rec.engine == "AICORE"
    # the op's inputs as it received them: gamma and beta through the casts the device inserts (to bf16)
    x, gamma, beta = (np.asarray(res.tensors.get(i.rsplit(":", 1)[0] + "/ascend_cast_0_to_bf16:0", res.tensors[i]))
                      for i in rec.inputs)
    assert x.dtype == gamma.dtype == beta.dtype and x.dtype.name == "bfloat16"
    y = np.asarray(res.tensors[rec.name + ":0"])
    y32 = naive.layer_norm_steps(x, gamma, beta, 1e-3, (x.ndim - 1,), "ascendc")   # Keras's epsilon
    want, _ = naive.cast_bits(y32, "bfloat16", "round")
    np.testing.assert_array_equal(y.view(np.uint16), want)
    rint, _ = naive.cast_bits(y32, "bfloat16", "rint")
    ties = int(((y32.view(np.uint32) & 0xFFFF) == 0x8000).sum())
    # 2^18 outputs: some lie halfway; there (and only there) ties-away differs from RINT, where RINT's even
    # neighbour is the one towards zero
    assert 0 < int((want != rint).sum()) < ties

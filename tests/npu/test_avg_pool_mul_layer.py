"""A SAME fp16 AvgPool as a real NPU dump holds it: AvgPoolFusionPass (canndev avg_pool_pass.cc) makes the AvgPool
the depthwise convolution of ones (the window sum) and adds a Mul node ``<name>_mul_layer`` by fp16(1/area) per
output position. The replay records the two ops one by one; compare never pairs the sum with the reference's mean,
it compares the Mul with the reference AvgPool. The oracle is tests/naive_cube.py's depthwise convolution, then the
exact product of two fp16 values rounded once."""
import numpy as np
import pytest

import naive_cube
from ascend_emu.analysis.compare import compare
from ascend_emu.analysis.dump import load_dump
from ascend_emu.frontend.tf.reference import reference
from ascend_emu.npu.device import Device

tf = pytest.importorskip("tensorflow")


def _model():
    keras = tf.keras
    L = keras.layers
    tf.keras.utils.set_random_seed(3)
    x = keras.Input((9, 7, 3), batch_size=2, name="image")
    h = L.Conv2D(4, 3, padding="same", name="conv")(x)
    h = L.AveragePooling2D(3, strides=2, padding="same", name="pool")(h)
    h = L.Conv2D(2, 1, name="head")(L.ReLU(name="relu")(h))
    return keras.Model(x, L.Flatten(name="flat")(h))


def _area16(a):
    return np.float16(np.float32(1.0 / a))


def test_same_fp16_avg_pool_dumps_the_window_sum_and_its_mul_layer(tmp_path):
    model = _model()
    ref = reference(model, None, tmp_path / "bench", progress=False)
    res = Device("force_fp16", soc="Ascend910B").replay(model, ref.inputs, tmp_path / "npu", progress=False)
    npu = load_dump(tmp_path / "npu")
    pool = next(op for op in npu.ops if op["tf_type"] == "AvgPool")
    name = pool["name"]
    mul = npu.op(name + "_mul_layer")
    assert mul["tf_type"] == "Mul" and mul["index"] == pool["index"] + 1 and mul["inputs"] == [f"{name}:0"]
    assert (pool["compute_dtype"], mul["compute_dtype"]) == ("float16", "float16")

    # the oracle: the window sum of the dumped input (a depthwise convolution of ones), then fp16(1/area) per position
    src, idx = pool["inputs"][0].rsplit(":", 1)
    x = npu.tensor(src, int(idx))
    assert x.dtype == np.float16
    s = naive_cube.conv2d(np.asarray(x), np.ones((3, 3, 4, 1), np.float16), (2, 2), "SAME", (1, 1),
                          model=Device("force_fp16", soc="Ascend910B").numerics.cube_model, depthwise=True)[0]
    (pt, _), (pl, _) = naive_cube.conv_pads("SAME", 9, 7, 3, 3, (2, 2), (1, 1))
    area = np.array([[(min(i * 2 - pt + 3, 9) - max(i * 2 - pt, 0)) * (min(j * 2 - pl + 3, 7) - max(j * 2 - pl, 0))
                      for j in range(s.shape[2])] for i in range(s.shape[1])])
    coffe = np.vectorize(_area16, otypes=[np.float16])(area)[None, :, :, None]
    mean = (s.astype(np.float64) * coffe.astype(np.float64)).astype(np.float16)
    np.testing.assert_array_equal(npu.tensor(name).view(np.uint16), s.view(np.uint16))
    np.testing.assert_array_equal(npu.tensor(name + "_mul_layer").view(np.uint16), mean.view(np.uint16))
    # the graph's consumers (and the kept tensor <name>:0) read the mean, as TensorFlow's AvgPool gives it
    np.testing.assert_array_equal(np.asarray(res.tensors[f"{name}:0"]).view(np.uint16), mean.view(np.uint16))
    np.testing.assert_array_equal(np.asarray(res.tensors[f"{name}_mul_layer:0"]).view(np.uint16),
                                  mean.view(np.uint16))
    assert res.summary["inserted_casts"] == sum(1 for r in res.records if r.tf_type == "Cast" and r.inserted)

    rows = {(r["NPU Name"] or "").split(":")[0]: r for r in compare(tmp_path / "npu", tmp_path / "bench").rows}
    assert rows[name]["Bench Name"] is None and rows[name]["Result"] == "N/A", rows[name]
    assert "window sum" in rows[name]["Err_message"] and "not compared" in rows[name]["Err_message"]
    m = rows[name + "_mul_layer"]
    assert m["Bench Name"] == f"{name}:0" and m["Result"] == "pass" and m["Cosine"] > 0.999, m
    assert "AvgPoolFusionPass" in m["Err_message"]

    # fit reruns every op on the dump's tensors: the AvgPool's consumers read <name>_mul_layer's mean (not the
    # AvgPool's own sum), and the device that made the dump reproduces all of it
    from ascend_emu.tools.fit import fit

    res = fit(str(tmp_path / "npu"), model, device=Device("force_fp16", soc="Ascend910B"), progress=False,
              params=["cube_block_sum"])
    assert res.identical == 1.0 and res.tensors >= 5 and not res.notes, res.format_text()


def test_valid_and_float32_avg_pool_keep_one_record():
    """VALID (the filter holds fp16(1/(kh kw)), no Mul) and a float32 AvgPool (the pass needs fp16): one record."""
    keras = tf.keras
    L = keras.layers
    x = keras.Input((8, 8, 2), batch_size=1)
    model = keras.Model(x, L.AveragePooling2D(2, padding="valid")(L.AveragePooling2D(3, 1, padding="same")(x)))
    fp16 = Device("force_fp16", soc="Ascend910B").replay(model, progress=False)
    fp32 = Device("must_keep_origin_dtype", soc="Ascend910B").replay(model, progress=False)
    assert [r.tf_type for r in fp16.records if r.tf_type in ("AvgPool", "Mul")] == ["AvgPool", "Mul", "AvgPool"]
    assert [r.tf_type for r in fp32.records if r.tf_type in ("AvgPool", "Mul")] == ["AvgPool", "AvgPool"]

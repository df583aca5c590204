"""precision_mode_v2 cube_hif8 and mixed_hif8 on the Ascend950 (NUMERICS.md section 13): the dtype decisions after
GE's tables, the inserted Casts to HiFloat8 dumped as hifloat8 codes, the cube on their values, compare against the
float32 reference, training with loss scaling, and the refusals elsewhere."""
from __future__ import annotations

import numpy as np
import pytest

import ascend_emu as ae
from ascend_emu.analysis.dump import load_dump
from ascend_emu.cli.main import main
from ascend_emu.errors import AscendEmuError
from ascend_emu.npu.precision import PrecisionPolicy, resolve_mode


def _hif8_values() -> np.ndarray:
    """Every finite HiFloat8 value, from the format's definition (ASCEND-FACTS section 12), independently of the
    kernels: sign, a prefix-coded dot field (11: 4 exponent bits + 1 mantissa bit; 10: 3 + 2; 01: 2 + 3; 001: 1 + 3;
    0001: exponent 0, 3 mantissa bits), the exponent sign-magnitude with an implicit leading 1; 0000: denormal."""
    vals = {0.0}
    for code in range(128):
        bits = f"{code:07b}"
        if bits.startswith("11"):
            e_bits, m_bits = bits[2:6], bits[6:]
        elif bits.startswith("10"):
            e_bits, m_bits = bits[2:5], bits[5:]
        elif bits.startswith("01"):
            e_bits, m_bits = bits[2:4], bits[4:]
        elif bits.startswith("001"):
            e_bits, m_bits = bits[3:4], bits[4:]
        elif bits.startswith("0001"):
            e_bits, m_bits = "", bits[4:]
        else:                                   # 0000mmm: denormal 2^(m - 23)
            m = int(bits[4:], 2)
            if m:
                vals.add(2.0 ** (m - 23))
            continue
        if e_bits:
            sign, mag = e_bits[0], "1" + e_bits[1:]
            e = int(mag, 2) * (-1 if sign == "1" else 1)
        else:
            e = 0
        v = 2.0 ** e * (1 + int(m_bits, 2) / 2 ** len(m_bits))
        if code == 0x6F:                        # +Inf
            continue
        vals.add(v)
    pos = np.array(sorted(vals))
    return np.concatenate([-pos[::-1], pos[1:]])


HIF8 = _hif8_values()


def _round_away(x: np.ndarray) -> np.ndarray:
    """x (float64) to the nearest HiFloat8 value, ties away from zero, clamped to +-2^15 (saturation): the oracle."""
    x = np.clip(x, HIF8[0], HIF8[-1])
    i = np.clip(np.searchsorted(HIF8, x), 1, len(HIF8) - 1)
    lo, hi = HIF8[i - 1], HIF8[i]
    dl, dh = x - lo, hi - x
    pick_hi = (dh < dl) | ((dh == dl) & (x > 0))
    return np.where(pick_hi, hi, lo)


# --------------------------------------------------------------------------- which SoC, which option

def test_modes_run_on_the_950_only():
    for soc in ("Ascend950", "Ascend950PR", "Ascend950DT"):
        for v2 in ("cube_hif8", "mixed_hif8"):
            assert resolve_mode(None, v2, soc) == (v2, "precision_mode_v2", v2)
    for soc in ("Ascend910", "Ascend910B", "Ascend910_93", "Ascend310P3"):
        with pytest.raises(AscendEmuError, match="has no HiFloat8"):
            resolve_mode(None, "cube_hif8", soc)
    with pytest.raises(AscendEmuError, match="precision_mode_v2 value"):
        resolve_mode("mixed_hif8", None, "Ascend950")


@pytest.mark.parametrize("v2", ["cube_hif8", "mixed_hif8"])
def test_cli_refuses_the_modes_on_the_910b(v2, capsys, tmp_path):
    code = main(["replay", "demo", "--soc", "Ascend910B", "--precision-mode-v2", v2, "--dump", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert code == 2 and "HiFloat8" in err and err.count("\n") == 1 and "Traceback" not in err


# --------------------------------------------------------------------------- the decisions (GE's tables)

def test_cube_hif8_decisions():
    p = PrecisionPolicy("cube_hif8")
    d = p.decide("cube", "MatMulV2", "float32", [])
    assert (d.dtype, d.cube_out, d.list) == ("hifloat8", "float16", None)
    assert p.decide("cube", "MatMulV2", "bfloat16", []).cube_out == "bfloat16"
    for kind in ("vector", "move"):
        assert p.decide(kind, "Softmax", "float32", ["float16"]).dtype == "float32"
    assert PrecisionPolicy("cube_hif8", hif8_cube_out="float32").decide("cube", "Conv2D", "float32", []).cube_out \
        == "float32"
    with pytest.raises(AscendEmuError, match="hif8_cube_out"):
        PrecisionPolicy("cube_hif8", hif8_cube_out="hifloat8")


def test_mixed_hif8_decisions():
    p = PrecisionPolicy("mixed_hif8", {"white-list": {"to-add": ["Relu"]}})
    white_cube, white_vec = "MatMulV2", "Relu"
    assert p.lists.classify(white_cube) == "white" and p.lists.classify(white_vec) == "white"
    assert p.decide("cube", white_cube, "float32", []).dtype == "hifloat8"
    assert p.decide("vector", white_vec, "float32", []).dtype == "float16"
    assert p.decide("vector", white_vec, "bfloat16", []).dtype == "bfloat16"
    black = next(iter(sorted(p.lists.black)))
    assert p.decide("vector", black, "float32", ["float16"]).dtype == "float32"
    gray = "Reshape"
    assert p.lists.classify(gray) == "gray"
    # gray: no producer -> the black table (original dtype, unlike mixed_float16's cube rule); else the producer's
    assert p.decide("vector", gray, "float32", []).dtype == "float32"
    assert p.decide("cube", "SomeGrayCube", "float32", []).dtype == "float32"
    assert p.decide("vector", gray, "float32", ["float16"]).dtype == "float16"
    assert p.decide("vector", gray, "float32", ["float32"]).dtype == "float32"


# --------------------------------------------------------------------------- replays

def _replay(model, x, mode, path, **kw):
    dev = ae.Device(precision_mode_v2=mode, soc="Ascend950", **kw)
    res = dev.replay(model, x, str(path), progress=False)
    return res, load_dump(str(path))


@pytest.fixture(scope="module")
def cnn():
    import keras

    keras.utils.set_random_seed(3)
    L = keras.layers
    m = keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(6, 3, activation="relu"), L.Flatten(), L.Dense(5),
                          L.Softmax()], name="hif8_cnn")
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 3)).astype(np.float32) * 3
    return m, x


@pytest.mark.parametrize("mode,rounding", [("cube_hif8", "round"), ("mixed_hif8", "round"),
                                           ("cube_hif8", "hybrid")])
def test_casts_dump_hifloat8_codes_and_the_cube_uses_their_values(cnn, mode, rounding, tmp_path):
    m, x = cnn
    res, dump = _replay(m, x, mode, tmp_path / "d", hif8_rounding=rounding)
    casts = [op for op in dump.ops if op["tf_type"] == "Cast" and op["compute_dtype"] == "hifloat8"]
    cubes = [op for op in dump.ops if op["compute_dtype"] == "hifloat8" and op["tf_type"] != "Cast"]
    assert len(casts) == 4 and len(cubes) == 2       # conv: input + kernel; dense: activations + kernel
    assert all(op["name"].rsplit("/", 1)[1].startswith("ascend_cast_") and op["name"].endswith("_to_hif8")
               for op in casts)
    assert dump.config["precision_mode_v2"] == mode and dump.config["hif8_rounding"] == rounding
    for op in casts:
        out = op["outputs"][0]
        assert out["dtype"] == "hifloat8"
        # stored as uint8 codes, widened exactly
        raw = np.load(str(tmp_path / "d" / out["file"]))
        assert raw.dtype == np.uint8
        v = dump.tensor(op["name"])
        assert v.dtype == np.float32 and v.shape == tuple(out["shape"])
        assert np.isin(v, HIF8).all()
        src = op["inputs"][0]
        node, idx = src.rsplit(":", 1)
        if dump.has_tensor(node, int(idx)):
            s = np.asarray(dump.tensor(node, int(idx)), np.float64)
            if rounding == "round":
                np.testing.assert_array_equal(v, _round_away(s))
            else:   # hybrid: one of the two neighbours
                lo_hi = np.abs(v - s) <= np.abs(HIF8[np.clip(np.searchsorted(HIF8, s), 1, len(HIF8) - 1)]
                                                 - HIF8[np.clip(np.searchsorted(HIF8, s), 1, len(HIF8) - 1) - 1])
                assert lo_hi.all()
    # the dense layer's cube: float32 accumulation of exact products of the HiFloat8 values, one fp16 rounding
    dense = next(op for op in cubes if "dense" in op["name"])
    a, b = (np.asarray(dump.tensor(c["name"]), np.float64) for c in casts if c["name"].startswith(
        tuple(r.rsplit(":", 1)[0] + "/" for r in dense["inputs"][:2])))
    y = np.asarray(dump.tensor(dense["name"]), np.float64)
    ref = a @ b
    bias = np.asarray(m.layers[2].bias.numpy(), np.float64)
    if dense["tf_type"].startswith("_Fused"):
        ref = ref + bias
    np.testing.assert_allclose(y, ref, rtol=2e-3, atol=2e-3)


def test_compare_shows_the_hif8_accuracy(cnn, tmp_path):
    from ascend_emu.analysis.compare import compare as compare_dumps
    from ascend_emu.frontend.tf.reference import reference

    m, x = cnn
    reference(m, x, str(tmp_path / "bench"), progress=False)
    _, fp16 = _replay(m, x, "fp16", tmp_path / "fp16")
    res = {}
    for mode in ("cube_hif8", "mixed_hif8"):
        _replay(m, x, mode, tmp_path / mode)
        cmp = compare_dumps(str(tmp_path / mode), str(tmp_path / "bench"))
        rows = {r["NPU Name"]: r for r in cmp.rows}
        assert any(r["NPU Dtype"] == "hifloat8" for r in rows.values())
        res[mode] = min(r["Cosine"] for r in rows.values() if isinstance(r["Cosine"], float))
    cmp16 = compare_dumps(str(tmp_path / "fp16"), str(tmp_path / "bench"))
    worst16 = min(r["Cosine"] for r in cmp16.rows if isinstance(r["Cosine"], float))
    # HiFloat8's 4 significant bits lose far more than fp16's 11
    assert 0.9 < res["cube_hif8"] < worst16 and 0.9 < res["mixed_hif8"] < worst16


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """The zoo's CNN (MobileNetV2, 32x32) and Transformer encoder, each with its float32 reference dump."""
    from ascend_emu.frontend.tf.models import mobilenet_v2, transformer_encoder
    from ascend_emu.frontend.tf.reference import reference

    root = tmp_path_factory.mktemp("zoo")
    out = {}
    for name, model, shape in (("cnn", mobilenet_v2(input_shape=(32, 32, 3)), (1, 32, 32, 3)),
                               ("transformer", transformer_encoder(), (2, 16, 64))):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        reference(model, x, str(root / f"{name}-bench"), progress=False)
        out[name] = (model, x, root / f"{name}-bench")
    return out


@pytest.mark.models
@pytest.mark.parametrize("mode", ["cube_hif8", "mixed_hif8"])
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_the_zoo_cnn_and_transformer_replay_in_hif8(zoo, name, mode, tmp_path):
    """The Done-when's replays: each zoo model in each mode dumps hifloat8 tensors, and compare against the
    float32 reference shows what HiFloat8 costs (every compared op still close, the worst far from fp32's 1.0)."""
    from ascend_emu.analysis.compare import compare

    model, x, bench = zoo[name]
    _, dump = _replay(model, x, mode, tmp_path / "npu")
    hif = [op for op in dump.ops if op["outputs"] and op["outputs"][0]["dtype"] == "hifloat8"]
    cubes = [op for op in dump.ops if op["compute_dtype"] == "hifloat8" and op["tf_type"] != "Cast"]
    assert len(hif) >= len(cubes) >= 4      # (a tensor several cube ops read is rounded once)
    rows = [r for r in compare(dump, str(bench)).rows if isinstance(r["Cosine"], float)]
    assert any(r["NPU Dtype"] == "hifloat8" for r in rows)
    worst = min(r["Cosine"] for r in rows)
    assert 0.5 < worst < 0.9999


@pytest.mark.models
def test_cli_replays_a_saved_model_in_cube_hif8(zoo, tmp_path, capsys):
    model, x, bench = zoo["transformer"]
    model.save(str(tmp_path / "t.keras"))
    np.save(str(tmp_path / "x.npy"), x)
    assert main(["replay", str(tmp_path / "t.keras"), "--input", str(tmp_path / "x.npy"), "--soc", "Ascend950",
                 "--precision-mode-v2", "cube_hif8", "--hif8-rounding", "hybrid", "--dump", str(tmp_path / "npu")]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "npu"), str(bench), "--limit", "3"]) == 0
    assert "hifloat8" in capsys.readouterr().out


def test_hif8_training_step_with_loss_scaling(tmp_path):
    """The case users ask first: a mixed_hif8 training run on the 950 with dynamic loss scaling; the backward
    pass's cube ops (gradients) take HiFloat8 operands too, and the loss follows the float32 reference."""
    import keras

    keras.utils.set_random_seed(0)
    L = keras.layers
    m = keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(8, 3, activation="relu"), L.Flatten(), L.Dense(5)])
    m.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(64, 8, 8, 3)).astype(np.float32), "y": rng.integers(0, 5, 64).astype(np.int64)}
    dev = ae.Device(precision_mode_v2="mixed_hif8", soc="Ascend950")
    res = dev.train(m, data, batch_size=32, steps=4, loss_scale="dynamic", reference=True, progress=False,
                    dump_dir=str(tmp_path / "t"), dump_steps=[0])
    steps = res.steps
    assert len(steps) == 4 and not all(s["skipped"] for s in steps)
    assert steps[0]["loss_scale"] == 2.0 ** 15
    for s in steps:
        if not s["skipped"]:
            assert np.isfinite(s["loss"]) and abs(s["loss"] - s["reference_loss"]) < 0.25 * abs(s["reference_loss"])
    dump = load_dump(str(tmp_path / "t" / "step-0"))
    assert dump.config["precision_mode_v2"] == "mixed_hif8"
    hif = {op.get("phase") for op in dump.ops if op["compute_dtype"] == "hifloat8" and op["tf_type"] != "Cast"}
    assert {"forward", "backward"} <= hif


# --------------------------------------------------------------------------- the cube_mx what-if

def _mx_oracle(x: np.ndarray, axis: int, fmt_values: np.ndarray, emax: int) -> np.ndarray:
    """OCP MX v1.0 from its definition, in float64: per block of 32 along ``axis`` the scale
    2^(floor(log2(amax)) - emax) and each element x / scale rounded to the nearest element value (ties to even
    code: the fp8 formats' rint), saturating at the largest; the result scale * element."""
    xm = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    k = xm.shape[-1]
    pad = (-k) % 32
    xp = np.concatenate([xm, np.zeros(xm.shape[:-1] + (pad,))], axis=-1)
    blocks = xp.reshape(xp.shape[:-1] + (-1, 32))
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax, -127)
    scale = 2.0 ** np.clip(e, -127, 127)
    q = np.clip(blocks / scale, fmt_values[0], fmt_values[-1])
    i = np.clip(np.searchsorted(fmt_values, q), 1, len(fmt_values) - 1)
    lo, hi = fmt_values[i - 1], fmt_values[i]
    dl, dh = q - lo, hi - q
    lo_even = (i - 1) % 2 == 0      # ml_dtypes' value table lists codes in order: an even index has an even code
    out = np.where((dh < dl) | ((dh == dl) & ~lo_even), hi, lo) * scale
    out = out.reshape(xp.shape)[..., :k]
    return np.moveaxis(out, -1, axis)


def test_cube_mx_what_if_quantizes_matmul_operands_along_k(tmp_path):
    import ml_dtypes
    import tensorflow as tf

    v = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    vals = np.unique(v[np.isfinite(v)])
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((4, 40)) * np.exp(rng.standard_normal((4, 40)) * 2)).astype(np.float32)
    w = rng.standard_normal((40, 6)).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec([4, 40], tf.float32)])
    def f(x):
        return tf.matmul(x, tf.constant(w))

    dev = ae.Device(precision_mode_v2="origin", soc="Ascend950", allow_hf32="none", cube_mx="float8_e4m3fn")
    dev.replay(f, {"x": a}, str(tmp_path / "d"), progress=False)
    dump = load_dump(str(tmp_path / "d"))
    casts = [op for op in dump.ops if "_to_mx" in op["name"]]
    assert len(casts) == 2 and all(op["compute_dtype"] == "mx_float8_e4m3fn" for op in casts)
    by_src = {op["inputs"][0]: np.asarray(dump.tensor(op["name"]), np.float64) for op in casts}
    qa = next(t for r, t in by_src.items() if t.shape == a.shape)
    qw = next(t for r, t in by_src.items() if t.shape == w.shape)
    np.testing.assert_array_equal(qa, _mx_oracle(a, 1, vals, 8))       # K = axis 1 of x, axis 0 of w
    np.testing.assert_array_equal(qw, _mx_oracle(w, 0, vals, 8))
    mm = next(op for op in dump.ops if op["compute_dtype"] == "mx_float8_e4m3fn" and op["tf_type"] != "Cast")
    np.testing.assert_allclose(np.asarray(dump.tensor(mm["name"]), np.float64), qa @ qw, rtol=1e-5, atol=1e-5)
    with pytest.raises(AscendEmuError, match="MX block scaling"):
        ae.Device(soc="Ascend910B", cube_mx="float8_e4m3fn")
    with pytest.raises(AscendEmuError, match="MX element format"):
        ae.Device(soc="Ascend950", cube_mx="hifloat8")


def test_fit_decides_the_hif8_rounding_of_a_dump(cnn, tmp_path):
    """A cube_hif8 dump made with the hybrid rounding fits back to it (the HiFloat8 casts tell the two apart), and a
    replay with the fitted value reproduces the casts bit for bit."""
    m, x = cnn
    dev_kw = dict(precision_mode_v2="cube_hif8", soc="Ascend950")
    _replay(m, x, "cube_hif8", tmp_path / "d", hif8_rounding="hybrid")
    res = ae.fit(str(tmp_path / "d"), m, device_kwargs=dev_kw, progress=False, params=["hif8_rounding"])
    p = res.parameters["hif8_rounding"]
    assert p["verdict"] == "decided" and p["value"] == "hybrid" and res.best["hif8_rounding"] == "hybrid"


def test_an_overflowing_hif8_operand_keeps_its_inf_in_the_dump(tmp_path):
    """Under inf_nan (the 950's default) a value past HiFloat8's range becomes Inf in the cast, and the dump's
    codes keep it (they are written in inf_nan, whatever the device's mode: they only store values)."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([2, 32], tf.float32)])
    def f(x):
        return tf.matmul(x, tf.ones([32, 3]))

    x = np.ones((2, 32), np.float32)
    x[0, 0] = 60000.0
    ae.Device(precision_mode_v2="cube_hif8", soc="Ascend950").replay(f, {"x": x}, str(tmp_path / "d"), progress=False)
    dump = load_dump(str(tmp_path / "d"))
    cast = next(op for op in dump.ops if op["name"].endswith("_to_hif8") and op["outputs"][0]["shape"] == [2, 32])
    v = dump.tensor(cast["name"])
    assert cast["outputs"][0]["inf"] == 1 and np.isposinf(v[0, 0]) and cast["status"]


def test_cube_mx_training_step_with_a_dump(tmp_path):
    """A weight meets a forward and a backward matmul with different K axes: two MX casts, two names."""
    import keras

    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)])
    m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(32, 64)).astype(np.float32), "y": rng.integers(0, 3, 32).astype(np.int64)}
    dev = ae.Device(precision_mode_v2="origin", soc="Ascend950", cube_mx="float8_e4m3fn")
    res = dev.train(m, data, batch_size=32, steps=1, progress=False, dump_dir=str(tmp_path / "t"), dump_steps=[0])
    assert np.isfinite(res.steps[0]["loss"])
    dump = load_dump(str(tmp_path / "t" / "step-0"))
    names = [op["name"] for op in dump.ops if "_to_mxfp8e4m3fn_k" in op["name"]]
    assert len(names) == len(set(names)) and {n[-2:] for n in names} >= {"k0", "k1"}


def test_fit_leaves_hif8_rounding_alone_outside_the_hif8_modes(cnn, tmp_path):
    m, x = cnn
    _replay(m, x, "fp16", tmp_path / "d")
    res = ae.fit(str(tmp_path / "d"), m, device_kwargs=dict(soc="Ascend950", precision_mode_v2="fp16"),
                 progress=False, params=["hif8_rounding"])
    assert res.parameters["hif8_rounding"]["verdict"] != "contradicted"
    assert "not in cube_hif8" in res.parameters["hif8_rounding"]["why"]
    # a cube_hif8 dump fitted with no mode given takes the dump's own (issue 45 item 9): hif8_rounding is fitted
    _replay(m, x, "cube_hif8", tmp_path / "h")
    res = ae.fit(str(tmp_path / "h"), m, device_kwargs=dict(soc="Ascend950"), progress=False,
                 params=["hif8_rounding"])
    assert "not in cube_hif8" not in res.parameters["hif8_rounding"]["why"]
    assert res.parameters["hif8_rounding"]["verdict"] != "contradicted"
    # fitted outside the hif8 modes when the user asks for another mode: another configuration, refused
    with pytest.raises(AscendEmuError, match="was made with canonical_mode=cube_hif8"):
        ae.fit(str(tmp_path / "h"), m, device_kwargs=dict(soc="Ascend950", precision_mode_v2="fp16"), progress=False,
               params=["hif8_rounding"])


def test_export_msprobe_of_a_hif8_dump_writes_float32(cnn, tmp_path):
    from ascend_emu.analysis.msprobe import export_msprobe

    m, x = cnn
    _, dump = _replay(m, x, "cube_hif8", tmp_path / "d")
    export_msprobe(str(tmp_path / "d"), str(tmp_path / "ms"), tensor_format="npy")
    import json

    data = json.load(open(tmp_path / "ms" / "step0" / "rank0" / "dump.json"))["data"]
    dts = {leaf["dtype"] for v in data.values() for leaf in v.get("output", []) if isinstance(leaf, dict)}
    assert "torch.float32" in dts and not any("hif" in d for d in dts)

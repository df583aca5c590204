"""fit: a dump made under non-default assumed parameters fits back to them (and a replay with the fitted values
reproduces it bit for bit); a default dump fits the defaults; what no op can tell apart stays undecided; an
msprobe round trip fits the same; the registry's table in NUMERICS.md is the generated one."""
import json
import os

import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.numerics import assumptions as asm

PLANTED = {"cube_block_sum": "aligned", "cube_extra_bits": 2, "cube_normalize": "rne", "cube_conv_k_order": "c1hwc0",
           "hf32_bits": 10, "hf32_conv_rounding": "round", "hf32_matmul_rounding": "trunc",
           "impl_mode": "high_performance"}
BASE = dict(precision_mode="must_keep_origin_dtype", soc="Ascend910B", allow_hf32="conv,matmul")


def small_model():
    """Conv2D (3 input channels: the K order matters) -> tanh -> mean -> Dense -> LayerNorm -> Dense softmax:
    float32 cube ops through HF32 (their fp32 outputs show the accumulation), LayerNorm's rstd (impl_mode)."""
    from ascend_emu.frontend.tf.loader import import_tf
    import_tf()
    import keras

    keras.utils.set_random_seed(3)
    L = keras.layers
    x = keras.Input((6, 6, 3), name="image")
    h = L.Conv2D(8, 3, padding="same", activation="tanh", name="conv")(x)
    h = L.GlobalAveragePooling2D(name="pool")(h)
    h = L.Dense(16, name="dense")(h)
    h = L.LayerNormalization(name="norm")(h)
    out = L.Dense(4, activation="softmax", name="head")(h)
    return keras.Model(x, out)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from ascend_emu.frontend.tf.loader import load_graph
    from ascend_emu.npu.device import Device
    from ascend_emu.tools.fit import variant

    g = load_graph(small_model())
    x = np.random.default_rng(5).standard_normal((4, 6, 6, 3)).astype(np.float32)
    base = Device(**BASE)
    d = tmp_path_factory.mktemp("fit")
    planted = variant(base, PLANTED)
    planted.replay(g, {"image": x}, str(d / "planted"), progress=False)
    base.replay(g, {"image": x}, str(d / "default"), progress=False)
    return g, x, base, d


def _same_dumps(a, b):
    from ascend_emu.analysis.dump import load_dump

    da, db = load_dump(a), load_dump(b)
    n = 0
    for op in da.ops:
        for o in op["outputs"]:
            if o.get("file"):
                ta, tb = da.tensor(op["name"], o["index"]), db.tensor(op["name"], o["index"])
                assert ta.dtype == tb.dtype and ta.tobytes() == tb.tobytes(), op["name"]
                n += 1
    assert n > 10


@pytest.mark.models
def test_planted_values_fit_back_and_replay_bit_for_bit(setup, tmp_path):
    from ascend_emu.tools.fit import fit, variant

    g, x, base, d = setup
    res = fit(str(d / "planted"), g, device=base, progress=False)
    p = res.parameters
    # what this dump can decide: every planted value that acts here
    for name in ("cube_block_sum", "cube_extra_bits", "cube_normalize", "cube_conv_k_order", "hf32_bits",
                 "hf32_conv_rounding", "hf32_matmul_rounding"):
        assert p[name]["verdict"] == "decided", (name, p[name])
    # LayerNorm's rstd is exp(-0.5 log(v)) under high_performance on tbe_v220 and under either mode on tbe_v100:
    # (high_performance, tbe_v220) and (high_precision, tbe_v100) give the same bits, so neither is decided
    assert p["impl_mode"]["verdict"] == p["op_model"]["verdict"] == "undecided"
    assert "tbe_v100, tbe_v220 reproduce" in p["op_model"]["why"]
    for name, v in PLANTED.items():
        if p[name]["verdict"] == "decided":
            assert p[name]["value"] == v and res.best[name] == v, name
        assert p[name]["verdict"] != "contradicted", name
    assert res.identical == 1.0
    # the multi-core split cannot reach the bits of a deterministic run: undecided, not guessed
    assert p["multicore_reduce_min_chunk"]["verdict"] == "undecided"
    assert p["reduce_accumulate"]["verdict"] == "undecided"      # no fp16 reduction in a float32 run
    variant(base, res.best).replay(g, {"image": x}, str(tmp_path / "again"), progress=False)
    _same_dumps(d / "planted", tmp_path / "again")
    js = res.to_json()
    assert set(js) >= {"best", "parameters", "ops"} and js["best"]["params"] == res.best
    assert set(js["best"]) >= {"params", "identical"}
    json.dumps(js)
    assert all(o["reproduced"] for o in js["ops"])


@pytest.mark.models
def test_default_dump_fits_defaults(setup):
    from ascend_emu.tools.fit import fit

    g, x, base, d = setup
    res = fit(str(d / "default"), g, device=base, progress=False)
    defaults = asm.defaults(base.numerics)
    for name, p in res.parameters.items():
        assert p["verdict"] in ("decided", "undecided"), (name, p)
        if p["verdict"] == "decided":
            assert p["value"] == defaults[name], name
    assert res.parameters["cube_block_sum"]["verdict"] == "decided"
    # tree sums use neither extra bits nor a normalisation: no op can tell their values apart
    assert res.parameters["cube_extra_bits"]["verdict"] == "undecided"
    assert res.parameters["cube_normalize"]["verdict"] == "undecided"
    assert res.best == defaults and res.identical == 1.0


@pytest.mark.models
def test_fit_of_msprobe_round_trip(setup, tmp_path):
    from ascend_emu.analysis.msprobe import export_msprobe, import_msprobe
    from ascend_emu.tools.fit import fit

    g, x, base, d = setup
    root = export_msprobe(str(d / "planted"), str(tmp_path / "ms"))
    import_msprobe(os.path.dirname(root), str(tmp_path / "back"), against=str(d / "planted"))
    res = fit(str(tmp_path / "back"), g, device=base, progress=False, params=list(PLANTED))
    # with op_model held at the SoC's (not fitted), LayerNorm decides impl_mode
    for name, value in PLANTED.items():
        assert res.parameters[name]["verdict"] == "decided" and res.parameters[name]["value"] == value, name
    assert set(res.parameters) == set(PLANTED) and res.identical == 1.0
    # held at its base value, the planted extra bits contradict the aligned sum: no candidate reproduces the cube ops
    part = fit(str(tmp_path / "back"), g, device=base, progress=False, params=["cube_block_sum"])
    assert part.parameters["cube_block_sum"]["verdict"] == "contradicted"


def test_registry_table_in_numerics_md():
    from ascend_emu.tools.assumptions_table import NUMERICS_MD, block, table_in

    with open(NUMERICS_MD, encoding="utf-8") as f:
        assert table_in(f.read()) == block()
    # every parameter is a real Device option, and the CLI has its option
    from ascend_emu.cli.main import build_parser
    from ascend_emu.numerics.policy import NumericsPolicy

    pol = NumericsPolicy(soc="Ascend910B")      # a SoC with HF32: its width is a parameter there
    opts = set()
    for act in build_parser()._subparsers._group_actions[0].choices["replay"]._actions:
        opts.update(act.option_strings)
    for a in asm.ASSUMED:
        assert a.option in opts, a.name
        for v in a.tried():
            assert asm.value_of(asm.with_params(pol, {a.name: v}), a.name) == v


def _hf32_graph():
    """A Conv2D and a MatMul on float32 placeholders, with values carrying bits below both HF32 widths."""
    from ascend_emu.graph import Graph, InputSpec, Node

    spec = {"x": (2, 5, 5, 16), "w": (3, 3, 16, 4), "a": (6, 32), "b": (32, 5)}
    ph = [Node(n, "Placeholder", [], {"dtype": "float32", "shape": list(s)}) for n, s in spec.items()]
    conv = Node("conv", "Conv2D", ["x", "w"], {"T": "float32", "strides": [1, 1, 1, 1], "padding": "SAME",
                                             "dilations": [1, 1, 1, 1], "data_format": "NHWC"})
    mm = Node("mm", "MatMul", ["a", "b"], {"T": "float32", "transpose_a": False, "transpose_b": False})
    g = Graph(ph + [conv, mm], [InputSpec(n, "float32", list(s)) for n, s in spec.items()], ["conv:0", "mm:0"],
              name="hf32fit")
    rng = np.random.default_rng(7)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in spec.items()}
    # ties of both widths, where the three tie rules part
    for n in feeds:
        feeds[n].reshape(-1)[:32] = 1 + (2 * np.arange(32) + 1) * 2.0 ** -12
        feeds[n].reshape(-1)[32:64] = 1 + (2 * np.arange(32) + 1) * 2.0 ** -11
    return g, feeds


def _drop_inserted_casts(src, dst):
    """A copy of dump ``src`` without its inserted HF32 casts, as a real NPU's dump would be."""
    import shutil

    shutil.copytree(src, dst)
    with open(dst / "manifest.json") as f:
        m = json.load(f)
    keep = []
    for op in m["ops"]:
        if op["compute_dtype"] == "hfloat32":
            for o in op["outputs"]:
                os.remove(dst / o["file"])
        else:
            keep.append(dict(op, index=len(keep)))
    m["ops"] = keep
    with open(dst / "manifest.json", "w") as f:
        json.dump(m, f)


@pytest.mark.parametrize("planted", [{"hf32_bits": 10, "hf32_conv_rounding": "round", "hf32_matmul_rounding": "rint"},
                                     {"hf32_bits": 11, "hf32_conv_rounding": "trunc", "hf32_matmul_rounding": "round"}])
def test_fit_names_the_hf32_width_and_tie_rules(planted, tmp_path):
    """A 910B dump made with non-default HF32 values (10 bits; the conv ties away, the matmul nearest even) fits
    back to them from the full registry, starting from the SoC's defaults (11 bits, conv rint, matmul round)."""
    from ascend_emu.npu.device import Device
    from ascend_emu.tools.fit import fit, variant

    g, feeds = _hf32_graph()
    base = Device(precision_mode_v2="origin", soc="Ascend910B", allow_hf32="conv,matmul")
    variant(base, planted).replay(g, feeds, str(tmp_path / "d"), progress=False)
    res = fit(str(tmp_path / "d"), g, device=base, progress=False)
    for name, value in planted.items():
        p = res.parameters[name]
        assert p["verdict"] == "decided" and p["value"] == value, (name, p)
    assert res.identical == 1.0
    text = res.format_text()
    assert f"--hf32-bits {planted['hf32_bits']}" in text
    # a real NPU's dump has no inserted casts: the cube ops' float32 outputs decide the same values
    _drop_inserted_casts(tmp_path / "d", tmp_path / "npu")
    res = fit(str(tmp_path / "npu"), g, device=base, progress=False, params=list(planted))
    for name, value in planted.items():
        p = res.parameters[name]
        assert p["verdict"] == "decided" and p["value"] == value, (name, p)
    assert {o["type"] for o in res.ops} == {"Conv2D", "MatMul"}
    # the override leaves no family rule to fit: both undecided, with the reason
    over = fit(str(tmp_path / "d"), g, device=Device(precision_mode_v2="origin", soc="Ascend910B",
                                                     allow_hf32="conv,matmul", hf32_rounding="rint"),
               progress=False, params=["hf32_conv_rounding", "hf32_matmul_rounding"])
    assert all(p["verdict"] == "undecided" and "overrides" in p["why"] for p in over.parameters.values())


def test_with_params_refuses_unknown():
    from ascend_emu.numerics.policy import NumericsPolicy

    with pytest.raises(AscendEmuError, match="unknown assumed parameter"):
        asm.with_params(NumericsPolicy(), {"cube_magic": 1})
    with pytest.raises(AscendEmuError, match="not one of"):
        asm.with_params(NumericsPolicy(), {"cube_block_sum": "random"})


def test_cli_errors_one_line(tmp_path, capsys):
    from ascend_emu.cli.main import main

    rc = main(["fit", str(tmp_path / "nodump"), str(tmp_path / "m.keras"), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "error" in err
    rc = main(["sensitivity", str(tmp_path / "m.keras"), "--data", "x.npz", "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "needs both data" in err


@pytest.mark.models
def test_cli_fit_json(setup, tmp_path, capsys):
    """The command line: a .keras file, the run's options, --json with the issue's keys."""
    from ascend_emu.cli.main import main

    path = str(tmp_path / "m.keras")
    small_model().save(path)
    np.save(tmp_path / "x.npy", setup[1])
    dump = str(tmp_path / "d")
    opts = ["--soc", "Ascend910B", "--precision-mode", "must_keep_origin_dtype", "--allow-hf32", "conv,matmul"]
    assert main(["replay", path, "--input", f"image={tmp_path / 'x.npy'}", "--dump", dump, "-q",
                 "--cube-block-sum", "sequential", *opts]) == 0
    capsys.readouterr()
    assert main(["fit", dump, path, "--scheduler", "none", "-q", "--json", str(tmp_path / "f.json"),
                 "--param", "cube_block_sum", *opts]) == 0
    out = capsys.readouterr().out
    assert "cube_block_sum               decided       sequential" in out
    js = json.loads(open(tmp_path / "f.json").read())
    assert js["best"]["params"]["cube_block_sum"] == "sequential" and js["best"]["identical"] == 1.0
    assert js["parameters"]["cube_block_sum"]["verdict"] == "decided" and js["ops"]
    assert main(["fit", dump, path, "--param", "cube_magic", "-q", "--scheduler", "none", *opts]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    np.save(tmp_path / "y.npy", setup[1] + 1)
    assert main(["fit", dump, path, "--input", f"image={tmp_path / 'y.npy'}", "-q", "--scheduler", "none", *opts]) == 2
    assert "other inputs" in capsys.readouterr().err
    assert main(["fit", dump, path, "--input", f"image={tmp_path / 'x.npy'}", "-q", "--scheduler", "none",
                 "--param", "cube_conv_k_order", *opts]) == 0


@pytest.mark.models
def test_partial_dump_fits_what_it_holds(setup, tmp_path):
    """A dump holding only some tensors (--select): the weights come from the graph, ops without their inputs
    are not rerun."""
    from ascend_emu.tools.fit import fit, variant

    g, x, base, d = setup
    variant(base, {"cube_conv_k_order": "c1hwc0"}).replay(g, {"image": x}, str(tmp_path / "p"), progress=False,
                                                           select="image|conv")
    res = fit(str(tmp_path / "p"), g, device=base, progress=False, params=["cube_conv_k_order"])
    assert res.parameters["cube_conv_k_order"]["verdict"] == "decided"
    assert res.parameters["cube_conv_k_order"]["value"] == "c1hwc0"
    assert not any("dense" in o["name"] for o in res.ops)


def test_fit_refuses_dumps_it_cannot_fit(tmp_path):
    """W3 and item 9 (issue 45): a float32 reference dump, a dump of another model (no op in common: "100% of 0
    tensors") and a dump made in another configuration than the run's (every parameter "contradicted") are
    refused in one line, before any candidate runs."""
    import keras

    from ascend_emu.analysis.dump import DumpWriter
    from ascend_emu.frontend.tf.loader import load_graph
    from ascend_emu.frontend.tf.reference import reference
    from ascend_emu.npu.device import Device
    from ascend_emu.tools.fit import fit

    keras.utils.set_random_seed(1)
    x = keras.Input((8,), name="x")
    g = load_graph(keras.Model(x, keras.layers.Dense(4, activation="relu", name="dense")(x)))
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    reference(g, feeds, str(tmp_path / "bench"), progress=False)
    Device(soc="Ascend910B", precision_mode="force_fp32").replay(g, feeds, str(tmp_path / "npu"), progress=False)
    with DumpWriter(str(tmp_path / "other"), kind="npu", config={}, model={"name": "m", "fingerprint": "f"},
                    inputs_sha256="s") as w:
        w.add_op("elsewhere", "Relu", "Relu", "AICORE", "float16", [], [np.ones(3, np.float16)])
        w.finish({})
    for dump, device, msg in (("bench", Device(soc="Ascend910B", precision_mode="force_fp32"), "not an NPU run's"),
                              ("other", Device(), "no name in common"),
                              ("npu", Device(), "was made with canonical_mode=cube_fp16in_fp32out, soc=Ascend910B"),
                              ("npu", Device(soc="Ascend310P3", precision_mode="force_fp32"), "soc=Ascend910B")):
        with pytest.raises(AscendEmuError, match=msg) as e:
            fit(str(tmp_path / dump), g, device=device, progress=False)
        assert "\n" not in str(e.value)
    # with the dump's options the fit runs
    res = fit(str(tmp_path / "npu"), g, device=Device(soc="Ascend910B", precision_mode="force_fp32"), progress=False,
              params=["impl_mode"])
    assert res.ops


def test_fit_reproduces_the_emulators_own_dump_of_an_onnx_model(tmp_path):
    """W2 (issue 45): fit took the model's inputs for constants, so the NCHW->NHWC Transpose of an ONNX model's
    input was folded (no cast) in the rerun and three parameters came out "contradicted"; the emulator's own dump
    is reproduced bit for bit."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "frontend"))
    import onnx_models

    from ascend_emu.npu.device import Device
    from ascend_emu.tools.fit import fit

    shapes = {"x": [2, 3, 16, 16]}
    Device().replay(onnx_models.resnet_cnn(), None, str(tmp_path / "npu"), shapes=shapes, progress=False)
    res = fit(str(tmp_path / "npu"), onnx_models.resnet_cnn(), device=Device(), shapes=shapes, progress=False,
              params=["impl_mode", "reduce_accumulate"])
    assert res.identical == 1.0 and res.tensors > 20
    assert all(p["verdict"] != "contradicted" for p in res.parameters.values())

"""Exported PyTorch programs (``torch.export``, ``.pt2``): ``replay`` with the eager door's per-op semantics,
``reference`` in torch float32, ``compare``, ``mixlist-search`` and ``fit`` on them, and hostile files."""
import io
import json
import random
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ascend_emu as ae  # noqa: E402
from ascend_emu.cli.main import main  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.frontend.torch.pt2.loader import load_pt2  # noqa: E402
from ascend_emu.npu.device import Device  # noqa: E402

from fp32mode import fp32  # noqa: E402
from torch_models import LlamaBlock, cnn_batch, llama_batch, small_cnn  # noqa: E402


def _save(module, x, path, dtype=None):
    module = module.eval()
    if dtype is not None:
        module, x = module.to(dtype), x.to(dtype)
    torch.export.save(torch.export.export(module, (x,)), str(path))
    return path


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pt2")
    return {"cnn": (_save(small_cnn(), cnn_batch()[0], d / "cnn.pt2"), small_cnn().eval(), cnn_batch()[0]),
            "llama": (_save(LlamaBlock(), llama_batch(), d / "llama.pt2"), LlamaBlock().eval(), llama_batch())}


@pytest.mark.parametrize("name", ["cnn", "llama"])
def test_fp32_replay_is_torch_float32(programs, name):
    """must_keep_origin_dtype on the 910B (HF32 off): the replay's output is torch's float32 output, to the
    tolerance the ONNX door's tests hold against onnxruntime."""
    path, module, x = programs[name]
    g = load_pt2(path)
    res = Device(**fp32()).replay(g, {g.inputs[0].name: x.numpy()}, progress=False)
    got = res.outputs[g.outputs[0]]
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    ops = {n.op for n in g.nodes}
    if name == "cnn":
        # aten.convolution, the BN, relu and addmm through aten.py's lowerings; the max pool exact on the AI Core
        assert {"Conv2D", "FusedBatchNormV3", "Relu", "MatMul"} <= ops
        assert not [n for n in g.nodes if n.meta.get("aten_engine") == "AICPU"]
        # (each convolution's Relu fuses into it through the lowering's Transpose back to NCHW, as ATC fuses it)
        assert res.summary["fusion_counts"] == {"ConvBatchnormFusionPass": 1, "TbeEltwiseFusionPass": 2}
    else:
        # SDPA as the CPU dispatcher runs it: FlashAttentionScore; cos/sin have no lowering: the AI CPU, recorded
        assert {"_FlashAttentionScore", "MatMul", "Rsqrt", "Sigmoid"} <= ops
        aicpu = {n.op for n in g.nodes if n.meta.get("aten_engine") == "AICPU"}
        assert aicpu == {"AtenCos", "AtenSin", "AtenPow"}
        assert res.summary["per_engine_dtype"]["AICPU"] == {"float32": 10}


@pytest.mark.parametrize("name,soc", [("cnn", "Ascend910B"), ("llama", "Ascend910B"), ("llama", "Ascend910")])
def test_fp16_replay_is_the_eager_door(tmp_path, name, soc):
    """A float16 program replayed with must_keep_origin_dtype (fusion off: torch_npu's eager mode fuses nothing)
    gives the eager door's ae.torch.emulate output of the same module bit for bit: the same lowerings on the same
    kernels. On the 910 (no FlashAttentionScore) the SDPA call runs on the AI CPU in both."""
    module, x = (small_cnn(), cnn_batch()[0]) if name == "cnn" else (LlamaBlock(), llama_batch())
    path = _save(module, x, tmp_path / f"{name}16.pt2", torch.float16)
    x16 = x.half()
    g = load_pt2(path)
    dev = Device(soc=soc, precision_mode="must_keep_origin_dtype", fusion_switch="off")
    res = dev.replay(g, {g.inputs[0].name: x16.numpy()}, progress=False)
    got = res.outputs[g.outputs[0]]
    with ae.torch.emulate(soc), torch.no_grad():
        eager = module(x16).numpy()
    if name == "llama":
        sdpa = next(r for r in res.records if r.name == "_scaled_dot_product_flash_attention_for_cpu")
        assert (sdpa.engine, sdpa.tf_type) == (("AICORE", "_FlashAttentionScore") if soc == "Ascend910B" else
                                               ("AICPU", "AtenScaledDotProductFlashAttentionForCpu"))
    assert got.dtype == np.float16
    # (the LLaMA block's cos, sin and pow.Scalar run in torch float32 on the AI CPU in both doors, rounded to fp16)
    np.testing.assert_array_equal(got.view(np.uint16), eager.view(np.uint16))


def test_a_lowering_that_reads_its_inputs_values_runs_on_the_ai_cpu(tmp_path, monkeypatch):
    """The safety net of the trace: a lowering that computes from its input outside the registry ops (here a
    torch op) would freeze the example's values into the graph; the two traces differ, so the call runs as itself
    on the AI CPU, and the replay still equals torch."""
    from ascend_emu.frontend.torch import aten as A

    def leaky(k, x):
        (y,) = k.op("Neg", A.to_numpy(x.detach() * 1.0))     # x * 1.0 by torch: not a graph tensor
        return A.from_numpy(y)

    monkeypatch.setitem(A.ATEN, "aten.neg.default", leaky)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(-x) + 1.0

    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(4))
    g = load_pt2(_save(M(), x, tmp_path / "leak.pt2"))
    neg = next(n for n in g.nodes if n.name == "neg")
    assert neg.op == "AtenNeg" and neg.meta["aten_engine"] == "AICPU" and "reads its inputs' values" in \
        neg.meta["aten_reason"]
    y = torch.randn(3, 5, generator=torch.Generator().manual_seed(5))
    got = Device(**fp32()).replay(g, {"x": y.numpy()}, progress=False).outputs[g.outputs[0]]
    np.testing.assert_array_equal(got, (torch.relu(-y) + 1.0).numpy())


def test_reference_and_compare_name_the_first_divergent_op(tmp_path, capsys):
    """A planted fp16 overflow: compare of the replay dump against the torch reference dump names the op."""
    class Planted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc1, self.fc2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            big = h * 4.0 * 40000.0          # the second product past fp16's 65504 under force_fp16
            return self.fc2(big / 160000.0)

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)) + 2.0
    path = _save(Planted(), x, tmp_path / "planted.pt2")
    npu, bench = tmp_path / "npu", tmp_path / "bench"
    assert main(["replay", str(path), "--soc", "Ascend910B", "--precision-mode", "force_fp16", "--dump", str(npu),
                 "--fusion-off", "-q"]) == 0
    assert main(["reference", str(path), "--dump", str(bench), "-q"]) == 0
    out = capsys.readouterr().out
    assert "in torch " in out and "float32 on the CPU" in out
    assert main(["compare", str(npu), str(bench)]) in (0, 1)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("first divergent op:"))
    assert "mul_1" in line, out
    assert main(["report", str(npu), str(bench), "-o", str(tmp_path / "r.html")]) == 0
    assert 'data-op="mul_1"' in (tmp_path / "r.html").read_text()
    manifest = json.loads((bench / "dump.json").read_text()) if (bench / "dump.json").exists() else None
    if manifest is not None:
        assert manifest["config"]["framework"] == "pytorch"


def test_graph_tools_run_on_a_program(programs, tmp_path, capsys, monkeypatch):
    """fusion-bisect (ConvBatchnormFusionPass applies), mixlist-search and fit on the CNN's .pt2, each naming
    torch as the float32 reference."""
    path = programs["cnn"][0]
    monkeypatch.chdir(tmp_path)         # (mixlist-search writes ops_info.json here)
    assert main(["-q", "fusion-bisect", str(path), "--soc", "Ascend910B", "--scheduler", "none"]) in (0, 1)
    out = capsys.readouterr().out
    assert "PyTorch float32 reference" in out and "rules that fired: ConvBatchnormFusionPass" in out
    assert main(["-q", "mixlist-search", str(path), "--soc", "Ascend910B", "--scheduler", "none",
                 "--target", "cosine>=0.9999999"]) in (0, 1)
    out = capsys.readouterr().out
    assert "PyTorch float32 reference" in out and "TensorFlow" not in out
    dump = str(tmp_path / "d")
    opts = ["--soc", "Ascend910B", "--precision-mode", "must_keep_origin_dtype", "--allow-hf32", "conv,matmul"]
    assert main(["replay", str(path), "--dump", dump, "-q", "--cube-block-sum", "sequential", *opts]) == 0
    capsys.readouterr()
    assert main(["fit", dump, str(path), "--scheduler", "none", "-q", "--param", "cube_block_sum", *opts]) == 0
    assert "cube_block_sum               decided       sequential" in capsys.readouterr().out


# -- hostile files ---------------------------------------------------------------------------------------------
def _one_line_exit_2(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    for n in needles:
        assert n in err[0], err
    return err[0]


def _rewrite(src, dst, edit):
    """A copy of archive ``src`` with ``edit(relative name, bytes) -> bytes`` applied to each member."""
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as w:
        for i in z.infolist():
            rel = i.filename.split("/", 1)[1]
            w.writestr(i.filename, edit(rel, z.read(i.filename)))
    return dst


def test_malformed_files_give_one_line_and_exit_2(programs, tmp_path, capsys):
    good = programs["cnn"][0]
    raw = good.read_bytes()
    (tmp_path / "trunc.pt2").write_bytes(raw[: len(raw) // 2])
    _one_line_exit_2(capsys, ["replay", str(tmp_path / "trunc.pt2"), "-q"], "not a torch.export program")
    (tmp_path / "rand.pt2").write_bytes(np.random.default_rng(0).bytes(4096))
    _one_line_exit_2(capsys, ["reference", str(tmp_path / "rand.pt2"), "-q"], "not a zip archive")
    _one_line_exit_2(capsys, ["replay", str(tmp_path / "missing.pt2"), "-q"], "does not exist")
    # a zip holding a pickle (torch.save's format): never unpickled
    torch.save({"weights": torch.ones(2)}, tmp_path / "pickle.pt2")
    _one_line_exit_2(capsys, ["replay", str(tmp_path / "pickle.pt2"), "-q"], "a torch.save file, a pickle")
    # a real archive whose weights config asks for a pickled weight
    _rewrite(good, tmp_path / "pickled_weight.pt2",
             lambda rel, b: b.replace(b'"use_pickle": false', b'"use_pickle": true', 1)
             if rel == "data/weights/model_weights_config.json" else b)
    _one_line_exit_2(capsys, ["replay", str(tmp_path / "pickled_weight.pt2"), "-q"], "stored as a pickle")
    # the old format (serialized_exported_program.json + pickled state dict)
    with zipfile.ZipFile(tmp_path / "old.pt2", "w") as w:
        w.writestr("old/version", "1.0")
        w.writestr("old/serialized_exported_program.json", "{}")
        w.writestr("old/serialized_state_dict.pt", b"\x80\x04N.")
    _one_line_exit_2(capsys, ["replay", str(tmp_path / "old.pt2"), "-q"], "old torch.export format")

    # a program of another torch: its schema's major version bumped
    def bump(rel, b):
        if rel == "models/model.json":
            js = json.loads(b)
            js["schema_version"]["major"] += 100
            return json.dumps(js).encode()
        return b
    _rewrite(good, tmp_path / "future.pt2", bump)
    _one_line_exit_2(capsys, ["replay", str(tmp_path / "future.pt2"), "-q"], "another torch version")


def test_fuzzed_archives_load_or_fail_in_one_line(programs, tmp_path):
    """Random byte flips of a real .pt2 (in its JSON and weights, past the zip's checksums: the members are
    rewritten with the flips): each either loads or raises AscendEmuError with one line."""
    good = programs["cnn"][0]
    rng = random.Random(43)
    with zipfile.ZipFile(good) as z:
        members = {i.filename: z.read(i.filename) for i in z.infolist()}
    names = [n for n in members if n.endswith((".json", "weight_0", "weight_3", "archive_format"))]
    loaded = refused = 0
    for k in range(16):
        target = names[k % len(names)]
        b = bytearray(members[target])
        for _ in range(rng.randint(1, 4)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as w:
            for n, v in members.items():
                w.writestr(n, bytes(b) if n == target else v)
        p = tmp_path / f"fuzz{k}.pt2"
        p.write_bytes(buf.getvalue())
        try:
            load_pt2(p)
            loaded += 1
        except AscendEmuError as e:
            assert "\n" not in str(e) and str(e), repr(e)
            refused += 1
    # and raw flips of the file itself (zip structure, compressed data)
    raw = bytearray(good.read_bytes())
    for k in range(8):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        p = tmp_path / f"flip{k}.pt2"
        p.write_bytes(bytes(b))
        try:
            load_pt2(p)
            loaded += 1
        except AscendEmuError as e:
            assert "\n" not in str(e) and str(e), repr(e)
            refused += 1
    assert loaded + refused == 24 and refused > 0


def test_an_exported_program_object_replays_and_dynamic_shapes_are_refused(tmp_path, capsys):
    """Device.replay takes an ExportedProgram as it is; a program exported with dynamic dims: one line, exit 2."""
    m, x = small_cnn().eval(), cnn_batch()[0]
    ep = torch.export.export(m, (x,))
    got = Device(**fp32(allow_hf32="none")).replay(ep, {"input": x.numpy()}, progress=False)
    with torch.no_grad():
        np.testing.assert_allclose(next(iter(got.outputs.values())), m(x).numpy(), rtol=2e-5, atol=2e-6)
    dyn = torch.export.export(m, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(dyn, str(tmp_path / "dyn.pt2"))
    _one_line_exit_2(capsys, ["replay", str(tmp_path / "dyn.pt2"), "-q"], "dynamic dimensions", "static shapes")


def test_keep_dtype_names_an_fx_node(programs, tmp_path):
    """--keep-dtype with an FX node's name keeps every registry op its call became (as an ONNX node's name does)."""
    keep = tmp_path / "keep.txt"
    keep.write_text("convolution\n")
    g = load_pt2(programs["cnn"][0])
    res = Device(soc="Ascend910B", keep_dtype=str(keep), fusion_switch="off").replay(g, progress=False)
    conv = {r.name: r.compute_dtype for r in res.records if r.tf_type == "Conv2D"}
    assert conv == {"convolution/Conv2D_4": "float32", "convolution_1/Conv2D_4": "float16"}, conv


def test_size_limits_and_shapes(programs, tmp_path, capsys, monkeypatch):
    """A file past the size limit, a zip that unpacks past it (a bomb), and a --shape the program was not exported
    with: one line, exit 2; the exported shape itself is accepted."""
    from ascend_emu.frontend.torch.pt2 import archive

    good = programs["cnn"][0]
    assert main(["replay", str(good), "-q", "--shape", "input=8,3,16,16"]) == 0
    _one_line_exit_2(capsys, ["replay", str(good), "-q", "--shape", "input=4,3,16,16"], "exported with shape")
    monkeypatch.setattr(archive, "MAX_FILE_BYTES", 10_000)
    _one_line_exit_2(capsys, ["replay", str(good), "-q"], "more than ascend-emu reads")
    with zipfile.ZipFile(tmp_path / "bomb.pt2", "w", zipfile.ZIP_DEFLATED) as w:
        w.writestr("bomb/archive_format", "pt2")
        w.writestr("bomb/models/model.json", b" " * 1_000_000)
    assert (tmp_path / "bomb.pt2").stat().st_size < 10_000
    _one_line_exit_2(capsys, ["replay", str(tmp_path / "bomb.pt2"), "-q"], "unpacks to more than")

"""Defects a new PyTorch user met walking the README's torch doors (torch-run, .pt2 replay, the graph tools),
each pinned by a test that fails without its fix."""
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.frontend.torch import npu_shim  # noqa: E402
from ascend_emu.frontend.torch.options import NpuOptions, activate  # noqa: E402
from ascend_emu.frontend.torch.pt2.loader import load_pt2  # noqa: E402
from ascend_emu.npu.device import Device  # noqa: E402

from torch_models import cnn_batch, small_cnn  # noqa: E402


def test_a_device_that_replayed_a_program_pickles_for_a_sweep_worker(tmp_path):
    """`fit dump model.pt2` with its default scheduler (a Dask LocalCluster) ships the device after fitting
    has fused the graph on it: the device's fusion cache then held the graph and its torch.export program,
    which does not unpickle ("Error during deserialization of the task graph"). The caches stay home."""
    path = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(small_cnn().eval(), (cnn_batch()[0],)), str(path))
    g = load_pt2(path)
    dev = Device(soc="Ascend910B")
    feeds = {g.inputs[0].name: cnn_batch()[0].numpy()}
    want = dev.replay(g, feeds, progress=False).outputs[g.outputs[0]]
    assert dev._fusion_cache                      # what the worker must not get
    back = pickle.loads(pickle.dumps(dev))
    assert back._fusion_cache == {} and back._plan_cache == {}
    assert dev._fusion_cache                      # the sender keeps its own
    got = back.replay(g, feeds, progress=False).outputs[g.outputs[0]]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_npu_1_is_refused_wherever_the_script_names_it():
    """README: npu:1 is refused in one line (exit 2). `.npu(1)` and `set_device(1)` were; `device="npu:1"` and
    `.to("npu:1")` ran silently on npu:0, so a script written for rank 1 seemed to work."""
    with activate(NpuOptions(soc="Ascend910B")), npu_shim.installed():
        import torch_npu  # noqa: F401

        x = torch.zeros(2, device="npu:0").to("npu").to(torch.device("npu", 0))
        assert x.device.type == "npu"
        attempts = [lambda: torch.ones(2, device="npu:1"), lambda: torch.zeros(2, device=torch.device("npu", 1)),
                    lambda: x.to("npu:1"), lambda: x.to(torch.device("npu:1"), torch.float16),
                    lambda: torch.nn.Linear(2, 2).to("npu:1"), lambda: x.new_ones(2, device="npu:1")]
        for f in attempts:
            with pytest.raises(AscendEmuError, match="npu:1 does not exist; the emulated NPU is one device"):
                f()


def test_a_torch_save_file_or_unknown_suffix_names_the_pt2_door(tmp_path, capsys):
    """`replay model.pt` (torch.save's usual name) said only "use .keras, .pb, .pbtxt, .onnx": the .pt2 door the
    README offers a PyTorch user was missing from the list, and nothing said how to make one."""
    from ascend_emu.cli.main import main

    torch.save(small_cnn().state_dict(), tmp_path / "model.pt")
    (tmp_path / "model.tflite").write_bytes(b"x")
    for name, needles in (("model.pt", ("torch.save's pickle", "torch.export.save(", "model.pt2")),
                          ("model.tflite", ("cannot tell the format", ".onnx (ONNX model), .pt2 (exported PyTorch"))):
        assert main(["-q", "replay", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and all(n in err[0] for n in needles), err


TWO_STEPS = """
import torch, torch_npu
torch.manual_seed(0)
m = torch.nn.Linear(4, 2).npu()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad()
    m(torch.randn(3, 4, device="npu")).square().mean().backward()
    opt.step()
"""


def test_torch_run_says_which_dump_steps_were_never_reached(tmp_path, capsys):
    """`torch-run --dump D --dump-steps 1,7` of a two-step script dumped step 1 and said nothing of step 7; and a
    --soc given on the command line was reported as "set by emulate(...)", a call the user never wrote."""
    from ascend_emu.cli.main import main

    (tmp_path / "two.py").write_text(TWO_STEPS)
    assert main(["-q", "torch-run", "--soc", "Ascend910", "--dump", str(tmp_path / "d"), "--dump-steps", "1,7",
                 "--json", str(tmp_path / "r.json"), str(tmp_path / "two.py")]) == 0
    out = capsys.readouterr().out
    assert "  dump of step 1:" in out and "  dump of step 7" not in out
    assert "no dump of step 7: the script ran 2 training step(s)" in out
    assert "(set by --soc)" in out and "emulate(...)" not in out
    assert f"wrote {tmp_path / 'r.json'}" in out       # as train, overflow and fit say it; torch-run was silent
    assert (tmp_path / "d" / "step-1").is_dir() and not (tmp_path / "d" / "step-7").exists()


def test_overflow_of_an_eager_run_suggests_autocast_not_modify_mixlist(tmp_path, capsys):
    """`overflow DUMP --ops-info oi.json` of a torch_npu eager run wrote a modify_mixlist black-list and told the
    user to pass it: torch_npu's eager mode reads no modify_mixlist (a GE graph option); its precision is
    torch.autocast's. The verdict now says to run the layer outside autocast, and no ops_info is written."""
    import ascend_emu as ae
    from ascend_emu.cli.main import main

    m = torch.nn.Linear(16, 4)
    with torch.no_grad():
        m.weight.fill_(2.0)
        m.bias.zero_()
    x = torch.full((8, 16), 3000.0)               # 16 * 3000 * 2 = 96000: finite in float32, past fp16's 65504
    with ae.torch.emulate("Ascend910", dump=tmp_path / "d") as run, torch.no_grad():
        with run.autocast():
            m(x)
    oi = tmp_path / "oi.json"
    assert main(["-q", "overflow", run.dumps[0], "--ops-info", str(oi)]) == 0
    out = capsys.readouterr().out
    assert "verdict: abnormal" in out and "outside torch.autocast('npu')" in out, out
    assert "reads no modify_mixlist" in out and "black-list" not in out and not oi.exists()
    assert ae.overflow_report(run.dumps[0]).suggestion() is None


def test_common_torch_npu_calls_of_a_training_script_exist():
    """Calls a ported script makes around its numerics raised AttributeError under torch-run (the script's own
    traceback, as if the script were wrong): torch.npu.memory_reserved / max_memory_reserved, get_rng_state /
    set_rng_state, seed, torch.npu.device(0), Tensor.is_npu."""
    with activate(NpuOptions(soc="Ascend910B")), npu_shim.installed():
        import torch_npu  # noqa: F401

        assert torch.npu.memory_reserved() == 0 and torch.npu.max_memory_reserved() == 0
        torch.npu.reset_max_memory_allocated()
        torch.npu.manual_seed(3)
        state = torch.npu.get_rng_state()
        a = torch.randn(4, device="npu")
        torch.npu.set_rng_state(state)
        assert torch.equal(a, torch.randn(4, device="npu"))      # the npu generator is the CPU's
        assert torch.npu.seed() is None and torch.npu.seed_all() is None
        with torch.npu.device(0):
            x = torch.ones(2).npu()
        assert x.is_npu and not x.cpu().is_npu
        with pytest.raises(AscendEmuError, match="npu:1 does not exist"):
            torch.npu.device(1)
    assert not hasattr(torch.Tensor, "is_npu")                   # gone with the shim


def test_torch_npu_memory_summary_utilization_and_format_cast():
    """torch.npu.memory_summary / utilization and torch_npu.npu_format_cast (a storage format: the same values)
    raised AttributeError in a ported script."""
    with activate(NpuOptions(soc="Ascend910B")), npu_shim.installed():
        import torch_npu

        assert "no memory of its own" in torch.npu.memory_summary() and torch.npu.utilization() == 0
        x = torch.randn(2, 3, 4, 4)
        y = torch_npu.npu_format_cast(x, 29)            # ACL_FORMAT_FRACTAL_NZ
        assert torch.equal(y, x) and torch_npu.npu_format_cast_(x, 2) is x


def test_a_dataloader_with_workers_or_pinned_memory_feeds_the_script():
    """Every tensor reports npu:0 under the shim, so a DataLoader worker collating a batch into shared memory on
    elem.device asked torch for npu storage ("PyTorch is not linked with support for npu devices"), and
    pin_memory=True asked the npu backend's hooks: both failed on the first batch of a common training loop. With
    both, the pin-memory thread asked torch.accelerator for the npu's device index (the C++ device guard the
    shim has not) and pinned outside the shim's mode (thread-local): the loader failed before its first batch."""
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.arange(24, dtype=torch.float32).reshape(12, 2), torch.arange(12))
    with activate(NpuOptions(soc="Ascend910B")), npu_shim.installed():
        import torch_npu  # noqa: F401

        for kw in ({"num_workers": 2}, {"num_workers": 0, "pin_memory": True}, {"num_workers": 2, "pin_memory": True}):
            got = [(x.npu(non_blocking=True), y.npu()) for x, y in DataLoader(ds, batch_size=4, **kw)]
            assert len(got) == 3 and torch.equal(torch.cat([x for x, _ in got]), ds.tensors[0]), kw
            assert all(x.device.type == "npu" for x, _ in got)
    assert "_new_shared" not in torch.UntypedStorage.__dict__          # the storage class as it was
    assert "pin_memory" not in torch.Tensor.__dict__ and torch.accelerator.current_device_index.__module__ == \
        "torch.accelerator"


def test_a_long_batch_norm_run_keeps_no_past_steps_variance():
    """BatchNorm's batch variance for its backward was kept in the run keyed by id(save_invstd), with the tensor
    itself, and never dropped: a long `ae.torch.emulate` run grew by one entry (and one tensor) per step. The
    entry now lives as long as the tensor autograd saves; the backward still runs on the AI core every step."""
    import ascend_emu as ae

    bn = torch.nn.BatchNorm2d(3)
    opt = torch.optim.SGD(bn.parameters(), lr=0.1)
    x = torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    sizes = []
    with ae.torch.emulate(keep_records=False) as run:
        for _ in range(100):
            opt.zero_grad()
            (bn(x) * x).sum().backward()
            opt.step()
            sizes.append(sum(len(v) if hasattr(v, "__len__") else 1 for v in run._stash.values()))
        bn(x).sum()                         # a forward whose graph is dropped unused leaves nothing either
    assert max(sizes) == 0 and sum(len(v) for v in run._stash.values()) == 0
    with ae.torch.emulate() as run:          # and the variance is found: the backward is not the AI CPU's
        (bn(x) * x).sum().backward()
    back = [r for r in run.records if r.aten.startswith("aten.native_batch_norm_backward")]
    assert back and all(r.engine != "AICPU" for r in back), [(r.aten, r.engine, r.reason) for r in back]


class _Terminal:
    """A standard error that says it is a terminal (what tqdm asks before drawing)."""

    def __init__(self, tty: bool):
        import io

        self.buf, self.tty = io.StringIO(), tty

    def write(self, s):
        return self.buf.write(s)

    def flush(self):
        pass

    def isatty(self):
        return self.tty


def test_torch_run_has_a_progress_bar_and_a_dtype_for_every_host_call(tmp_path, monkeypatch, capsys):
    """torch-run showed nothing while a long script ran (replay, fit and train draw a bar), and its summary put
    the host's `.item()` / `float(loss)` calls under dtype "-": they read a float32 tensor."""
    import re

    from ascend_emu.cli.main import main

    script = tmp_path / "train.py"
    script.write_text("import torch, torch_npu\n"
                      "m = torch.nn.Linear(4, 1).npu()\n"
                      "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "x = torch.ones(8, 4).npu()\n"
                      "for _ in range(2):\n"
                      "    opt.zero_grad(); loss = (m(x) ** 2).mean(); loss.backward(); opt.step()\n"
                      "    print(float(loss), loss.item())\n")
    for tty, quiet in ((True, False), (False, False), (True, True)):
        err = _Terminal(tty)
        monkeypatch.setattr("sys.stderr", err)
        assert main(["-q"] * quiet + ["torch-run", str(script)]) == 0
        out, drawn = capsys.readouterr().out, err.buf.getvalue()
        assert ("HOST float32" in out and " -:" not in out), out
        if tty and not quiet:
            ops = [int(n) for n in re.findall(r"torch-run: (\d+)op [^\r]*step=2", drawn)]
            assert ops and ops[-1] > 10, drawn
        else:
            assert "torch-run:" not in drawn, drawn


def test_compare_of_a_pt2_replay_counts_the_programs_tensors_only(tmp_path, capsys):
    """compare of a .pt2 replay listed the lowerings' own steps (NHWC transposes, their permutation constants, the
    NHWC convolution, what fusion made of them) as "npu only" rows: 13 of the small CNN's 31 rows were not tensors
    of the program. They are left out (named in `internal`); every row left is a tensor the reference has."""
    from ascend_emu.analysis.compare import compare
    from ascend_emu.cli.main import main

    path = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(small_cnn().eval(), (cnn_batch()[0],)), str(path))
    npu, bench = tmp_path / "npu", tmp_path / "bench"
    assert main(["-q", "replay", str(path), "--precision-mode", "force_fp16", "--dump", str(npu)]) == 0
    assert main(["-q", "reference", str(path), "--dump", str(bench)]) == 0
    capsys.readouterr()
    c = compare(npu, bench)
    kinds = {c.info(i)["kind"] for i in range(len(c.rows))}
    # (fused: the tensor each Relu reads, the first conv's BN and the second conv, fused with the Relu through the
    # lowering's Transpose back to NCHW by TbeEltwiseFusionPass, as ATC fuses them)
    assert kinds <= {"matched", "cast", "fused"}, kinds
    fused = {c.info(i)["bench_op"] for i in range(len(c.rows)) if c.info(i)["kind"] == "fused"}
    assert fused == {"_native_batch_norm_legit_no_training", "convolution_1"}, fused
    bench_names = {op["name"] for op in c.bench.ops}
    assert {c.info(i)["bench_op"] for i in range(len(c.rows))} == bench_names     # each program tensor, once
    g = load_pt2(path)
    fx = {n.meta.get("torch_name") for n in g.nodes}
    assert c.internal and all(name.split("/")[0] in fx and name not in bench_names for name in c.internal)
    assert {op["name"] for op in c.npu.ops} <= {c.info(i)["npu_op"] for i in range(len(c.rows))} | set(c.internal)
    assert main(["compare", str(npu), str(bench)]) in (0, 1)
    out = capsys.readouterr().out
    assert f"compared {len(c.rows) - len(fused)} of {len(c.rows)} tensors" in out and "npu only" not in out, out
    assert f"{len(fused)} fused" in out
    assert f"{len(c.internal)} op(s) inside the lowerings left out" in out


def test_device_properties_are_the_sourced_fields_and_the_rest_is_named(tmp_path, capsys):
    """torch.npu.get_device_properties(0) and torch.npu.mem_get_info() raised AttributeError in a ported script.
    torch_npu's object ([PT] torch_npu/csrc/npu/Module.cpp) gives the SoC name, HBM total_memory, cube_core_num and
    vector_core_num (AI Core / vector core counts), L2_cache_size. The core counts are CANN platform_config's
    (ASCEND-FACTS.md 10 and 12: Ascend910A 32 and 0, Ascend910B2C 24 and 48, Ascend310P3 8 and 7); no source
    gives an HBM or L2 size, nor the A3's or the 950's core counts: those are one-line errors, not numbers."""
    from ascend_emu.cli.main import main

    facts = {"Ascend910": (32, 0), "Ascend910B": (24, 48), "Ascend310P3": (8, 7)}
    for soc, (cube, vector) in facts.items():
        with activate(NpuOptions(soc=soc)), npu_shim.installed():
            p = torch.npu.get_device_properties(0)
            assert (p.name, p.cube_core_num, p.vector_core_num, p.major) == (soc, cube, vector, None)
            assert torch.npu.get_device_properties("npu:0").name == torch.npu.get_device_name() == soc
            for field in ("total_memory", "L2_cache_size"):
                with pytest.raises(AscendEmuError, match=f"get_device_properties\\(0\\).{field}: the {soc}'s"):
                    getattr(p, field)
            assert "total_memory=unknown" in repr(p) and f"cube_core_num={cube}" in repr(p)
            with pytest.raises(AscendEmuError, match="mem_get_info\\(\\): the .* device memory \\(HBM\\) size"):
                torch.npu.mem_get_info()
            with pytest.raises(AscendEmuError, match="npu:1 does not exist"):
                torch.npu.get_device_properties(1)
    for soc in ("Ascend910_93", "Ascend950"):
        with activate(NpuOptions(soc=soc)), npu_shim.installed():
            with pytest.raises(AscendEmuError, match=f"cube_core_num: the {soc}'s AI Core count is not published"):
                torch.npu.get_device_properties(0).cube_core_num
    script = tmp_path / "mem.py"
    script.write_text("import torch, torch_npu\nfree, total = torch.npu.mem_get_info()\n")
    assert main(["-q", "torch-run", str(script)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "HBM" in err and "Traceback" not in err, err

"""``ascend-emu torch-run``: a script written for torch_npu runs unchanged on the emulated NPU, the options it sets
are the ones the run records (with the torch_npu spelling that set each), failures are the script's or one line."""
import contextlib
import io
import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from ascend_emu.cli import main  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.tools.torch_script import torch_run  # noqa: E402

TRAIN = textwrap.dedent('''
    import sys
    import torch
    import torch_npu
    import torch.nn as nn

    torch.manual_seed(0)
    torch.npu.set_device(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).npu()
    model = model.to("npu")
    torch.npu.conv.allow_hf32 = False
    torch_npu.npu.set_option({"ACL_PRECISION_MODE": "allow_fp32_to_fp16"})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("npu")
    x = torch.randn(8, 1, 8, 8).to("npu")
    y = torch.randint(0, 3, (8,), device="npu")
    losses = []
    for step in range(3):
        opt.zero_grad()
        with torch.autocast("npu"):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.npu.synchronize()
        losses.append(loss.item())
    assert __name__ == "__main__"
    print("losses", len(losses), all(l == l for l in losses), sys.argv[1:])
''')


def script(tmp_path, text, name="train.py"):
    p = tmp_path / name
    p.write_text(text)
    return p


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_torch_npu_script_runs_unchanged_and_its_options_are_recorded(tmp_path, capsys):
    rec = torch_run(script(tmp_path, TRAIN), ["--epochs", "1"], soc="Ascend910B")
    assert "losses 3 True ['--epochs', '1']" in capsys.readouterr().out
    assert rec["exit_status"] == 0 and rec["error"] is None and len(rec["steps"]) == 3
    src = rec["options"]["sources"]
    assert rec["options"]["allow_hf32_conv"] is False and src["allow_hf32_conv"] == "torch.npu.conv.allow_hf32"
    assert rec["options"]["precision_mode"] == "allow_fp32_to_fp16"
    assert src["precision_mode"] == "torch_npu.npu.set_option(ACL_PRECISION_MODE)"
    assert src["allow_hf32_matmul"] == "default" and rec["options"]["autocast_enabled"] is False   # region over
    assert {"call": "torch.npu.set_device", "args": {"device": 0}} in rec["torch_npu_calls"]
    assert rec["aten_calls"] > 30 and "float16" in rec["per_engine_dtype"].get("AICORE", {})   # autocast ran
    assert not rec["skipped_steps"]


def test_cli_record_steps_and_dump(tmp_path):
    s = script(tmp_path, TRAIN)
    code, out, err = run_cli(["torch-run", "--steps", "2", "--dump", str(tmp_path / "d"), "--json",
                              str(tmp_path / "r.json"), str(s), "--lr", "0.1"])
    assert code == 0, err
    rec = json.loads((tmp_path / "r.json").read_text())
    assert rec["stopped_after_steps"] == 2 and len(rec["steps"]) == 2 and rec["argv"] == ["--lr", "0.1"]
    assert "conv allow_hf32 False" in out and "(set by torch.npu.conv.allow_hf32)" in out
    assert "stopped after 2 step(s)" in out and "dump of step 0" in out
    from ascend_emu.analysis.dump import load_dump

    d = load_dump(rec["dumps"]["0"])
    assert any(op["name"].startswith("Aten.") and op["name"].endswith(".backward") for op in d.ops)


def test_script_failing_on_its_own_keeps_its_traceback_and_status(tmp_path):
    bad = script(tmp_path, "import torch_npu\n\ndef f():\n    raise RuntimeError('boom in the script')\n\nf()\n",
                 "bad.py")
    code, out, err = run_cli(["torch-run", str(bad)])
    assert code == 1 and "Traceback (most recent call last)" in err and "RuntimeError: boom in the script" in err
    assert 'bad.py", line 4, in f' in err and "runpy" not in err and "ascend_emu" not in err
    assert run_cli(["torch-run", str(script(tmp_path, "import sys\nsys.exit(3)\n", "exit3.py"))])[0] == 3
    # the script's own warnings print as Python prints them (pytest records warnings: a process of its own)
    w = script(tmp_path, "import warnings\nwarnings.warn('mine')\n", "w.py")
    res = subprocess.run([sys.executable, "-m", "ascend_emu.cli", "torch-run", str(w)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0 and "w.py:2: UserWarning: mine" in res.stderr, res.stderr
    assert "ascend-emu: warning: mine" not in res.stderr


@pytest.mark.parametrize("text,expect", [
    ("import torch_npu\ntorch_npu.npu.set_option({'ACL_PRECISION_MODE': 'allow_mix_precision'})\n",
     "value of ACL_PRECISION_MODE should be in allow_fp32_to_fp16, must_keep_origin_dtype"),
    ("import torch, torch_npu\nwith torch_npu.npu.amp.autocast(dtype=torch.bfloat16):\n    pass\n",
     "bf16 autocast is not supported on Ascend910"),
    ("import torch, torch_npu\ntorch.npu.set_device(3)\n", "npu:3 does not exist"),
])
def test_refusals_are_one_line(tmp_path, text, expect):
    code, out, err = run_cli(["torch-run", "--soc", "Ascend910", str(script(tmp_path, text, "s.py"))])
    assert code == 2 and err.startswith("ascend-emu: error: ") and err.count("\n") == 1 and expect in err


def test_missing_script_and_missing_torch(tmp_path):
    code, out, err = run_cli(["torch-run", str(tmp_path / "nope.py")])
    assert code == 2 and "does not exist" in err and err.count("\n") == 1
    for name, body, expect in (("weights.pt", b"PK\x03\x04\x00\x00binary", "is not Python source"),
                               ("broken.py", b"def f(:\n", "is not Python source (invalid syntax at line 1)")):
        (tmp_path / name).write_bytes(body)
        code, out, err = run_cli(["torch-run", str(tmp_path / name)])
        assert code == 2 and expect in err and err.count("\n") == 1 and "Traceback" not in err
    s = script(tmp_path, "pass\n", "same.py")
    code, out, err = run_cli(["torch-run", "--json", str(s), str(s)])        # the record over the script itself
    assert code == 2 and err.count("\n") == 1 and s.read_text() == "pass\n"
    with pytest.raises(AscendEmuError, match="steps must be a positive number"):
        torch_run(script(tmp_path, "pass\n", "p.py"), steps=0)
    s = script(tmp_path, "import torch_npu\n", "p2.py")
    res = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n"
                          "from ascend_emu.cli import main; sys.exit(main(['torch-run', sys.argv[1]]))", str(s)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "PyTorch is not installed" in res.stderr


OVERFLOW = textwrap.dedent('''
    import torch
    import torch_npu
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("npu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch_npu.npu.amp.GradScaler()
    x, y = torch.randn(8, 16, device="npu"), torch.randint(0, 4, (8,)).npu()
    before = [p.detach().clone() for p in model.parameters()]
    for step in range(2):
        opt.zero_grad()
        with torch_npu.npu.amp.autocast():
            out = model(x)
            if step == 0:
                out.register_hook(lambda g: g * 1e4)     # planted: the backward overflows fp16 at scale 2^16
            loss = nn.functional.cross_entropy(out, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if step == 0:
            assert all(torch.equal(a, p) for a, p in zip(before, model.parameters())), "a skipped step moved weights"
            assert scaler.get_scale() == 2.0 ** 15, scaler.get_scale()
    print("scale", scaler.get_scale())
''')


@pytest.mark.parametrize("soc", ["Ascend910B", "Ascend910"])
def test_planted_backward_overflow_skips_the_step(tmp_path, soc, capsys):
    """torch_npu's own autocast and GradScaler through the shim: the emulated run's overflow rule skips step 0 (the
    weights stay, the scale halves) and names the first overflowing aten op in the backward phase; step 1 trains."""
    rec = torch_run(script(tmp_path, OVERFLOW), soc=soc)
    assert rec["exit_status"] == 0, capsys.readouterr().err
    assert "scale 32768.0" in capsys.readouterr().out
    assert rec["skipped_steps"] == [0] and len(rec["steps"]) == 2 and not rec["steps"][1]["skipped"]
    assert rec["first_overflow"]["phase"] == "backward" and rec["first_overflow"]["step"] == 0
    assert rec["options"]["sources"]["autocast_enabled"] == "default"      # the regions closed
    assert any(c["call"] == "torch_npu.npu.amp.GradScaler" for c in rec["torch_npu_calls"])


LLAMA_NPU = 'import math\nimport torch\nimport torch_npu\nimport torch.nn as nn\n\n\nclass Block(nn.Module):\n    """A LLaMA block written for torch_npu: its fused RMSNorm, RoPE, FlashAttention and SwiGLU."""\n\n    def __init__(self, d=64, heads=4, hidden=128):\n        super().__init__()\n        self.h, self.d = heads, d\n        self.g1, self.g2 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))\n        self.qkv = nn.Linear(d, 3 * d, bias=False)\n        self.o = nn.Linear(d, d, bias=False)\n        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)\n        self.down = nn.Linear(hidden, d, bias=False)\n\n    def forward(self, x, cos, sin, mask):\n        B, T, D = x.shape\n        h = torch_npu.npu_rms_norm(x, self.g1, epsilon=1e-6)[0]\n        q, k, v = self.qkv(h).split(D, -1)\n        q, k, v = [t.view(B, T, self.h, D // self.h) for t in (q, k, v)]\n        q, k = torch_npu.npu_rotary_mul(q, cos, sin), torch_npu.npu_rotary_mul(k, cos, sin)\n        a = torch_npu.npu_fusion_attention(q.reshape(B, T, D), k.reshape(B, T, D), v.reshape(B, T, D), self.h, "BSH",\n                                           atten_mask=mask, scale=1.0 / math.sqrt(D // self.h))[0]\n        x = x + self.o(a)\n        return x + self.down(torch_npu.npu_swiglu(self.gate_up(torch_npu.npu_rms_norm(x, self.g2)[0]), dim=-1))\n\n\ntorch.manual_seed(0)\nB, T, D = 2, 16, 64\nmodel = Block().npu()\nx = torch.randn(B, T, D).npu()\nang = torch.arange(T)[:, None] * (1.0 / 10000 ** (torch.arange(0, 16, 2) / 16))[None]\ncos = torch.cat((ang.cos(), ang.cos()), -1)[None, :, None, :].npu()\nsin = torch.cat((ang.sin(), ang.sin()), -1)[None, :, None, :].npu()\nmask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1).npu()     # True = masked out (torch_npu\'s convention)\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3)\nscaler = torch.amp.GradScaler("npu")\nfor step in range(2):\n    opt.zero_grad()\n    with torch.autocast("npu", dtype=torch.bfloat16):\n        loss = model(x, cos, sin, mask).float().pow(2).mean()\n    scaler.scale(loss).backward()\n    scaler.step(opt)\n    scaler.update()\n    print("step", step, float(loss))\n'


def test_llama_script_with_torch_npu_fused_ops(tmp_path, capsys):
    """A LLaMA block written with torch_npu's fused ops (npu_rms_norm, npu_rotary_mul, npu_fusion_attention in BSH
    with torch_npu's mask, npu_swiglu) under bf16 autocast and AdamW: each fused op is one AI Core kernel of the run,
    and against the float32 reference of step 1 the fused ops' outputs pass."""
    from ascend_emu.analysis.compare import compare

    rec = torch_run(script(tmp_path, LLAMA_NPU), dump=tmp_path / "d", dump_steps=[1], reference=True)
    assert rec["exit_status"] == 0, capsys.readouterr().err
    assert len(rec["steps"]) == 2 and not rec["skipped_steps"]
    rows = {r["NPU Name"]: r for r in compare(rec["dumps"][1], rec["reference_dumps"][1]).rows}
    from ascend_emu.analysis.dump import load_dump

    d = load_dump(rec["dumps"][1])
    fused = {op["name"]: op for op in d.ops if op["name"].startswith("NPU.")}
    assert {n.split(".")[1] for n in fused} == {"npu_rms_norm", "npu_rotary_mul", "npu_fusion_attention",
                                                "npu_swiglu"}
    assert all(op["engine"] == "AICORE" for op in fused.values())
    assert fused["NPU.npu_fusion_attention.0.forward"]["tf_type"] == "_FlashAttentionScore"
    for name, op in fused.items():
        for o in op["outputs"]:
            assert rows[f"{name}:{o['index']}"]["Result"] == "pass", (name, rows[f"{name}:{o['index']}"])

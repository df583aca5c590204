"""The rest of torch_npu's API a script meets early, under ``ascend-emu torch-run``: ``torch.ops.npu.npu_*`` (the
same kernels as ``torch_npu.npu_*``), ``x.device.type == "npu"`` after ``.npu()``, ``torch.npu.Event`` / ``Stream``
(one synchronous stream), ``torch.Generator(device="npu")`` (the CPU's generator)."""
import textwrap

import pytest

torch = pytest.importorskip("torch")

from ascend_emu.tools.torch_script import torch_run  # noqa: E402

SCRIPT = textwrap.dedent('''
    import torch
    import torch_npu
    import torch.nn.functional as F

    torch.npu.set_device("npu:0")
    g = torch.Generator(device="npu")
    g.manual_seed(0)
    assert isinstance(g, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    x = torch.randn(2, 8, 64, generator=g, device="npu").half().npu()
    assert x.device.type == "npu" and x.device == torch.device("npu:0"), x.device
    w = torch.ones(64, dtype=torch.float16, device="npu")
    assert w.device.type == "npu" and (x + 1).device.type == "npu"

    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    s = torch.npu.Stream()
    start.record()
    with torch.npu.stream(s):
        y1, rstd = torch.ops.npu.npu_rms_norm(x, w, 1e-6)
        y2, _ = torch_npu.npu_rms_norm(x, w, 1e-6)
        sw = torch.ops.npu.npu_swiglu(x, -1)
        q = x.reshape(2, 8, 1, 64).transpose(1, 2)          # BNSD
        out = torch.ops.npu.npu_fusion_attention(q, q, q, 1, "BNSD", scale=0.125)
    s.synchronize()
    end.record()
    torch.npu.current_stream().wait_stream(s)
    torch.npu.synchronize()
    assert torch.equal(y1, y2) and sw.shape == (2, 8, 32) and out[0].shape == q.shape and len(out) == 7
    assert start.elapsed_time(end) >= 0 and end.query()
    print("npu api ok", y1.device, x.cpu().device)
''')


def test_torch_npu_api_under_torch_run(tmp_path, capsys):
    p = tmp_path / "api.py"
    p.write_text(SCRIPT)
    rec = torch_run(p, soc="Ascend910B")
    out = capsys.readouterr().out
    assert rec["exit_status"] == 0, rec["error"]
    assert "npu api ok npu:0 cpu" in out
    # both spellings of each fused kernel reach the run as the kernel itself
    assert rec["per_engine_dtype"]["AICORE"]["float16"] > 0
    # the process is as it was: torch's own Generator and Tensor.device back
    assert torch.Generator is torch._C.Generator and torch.randn(1).device.type == "cpu"
    assert "device" not in torch.Tensor.__dict__ and "cpu" not in torch.Tensor.__dict__


def test_npu_ops_outside_a_run_compute_the_kernels_definition(tmp_path):
    """Once registered, torch.ops.npu.npu_rms_norm is torch.ops.ascend_emu.npu_rms_norm (float32 inside, one
    rounding), with its autograd."""
    from ascend_emu.frontend.torch import npu_shim

    npu_shim._register_npu_ops()
    x = torch.randn(3, 16, requires_grad=True)
    w = torch.randn(16)
    a, _ = torch.ops.npu.npu_rms_norm(x, w)
    b, _ = torch.ops.ascend_emu.npu_rms_norm(x, w, 1e-6)
    assert torch.equal(a, b)
    a.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_torch_run_takes_the_assumed_parameters(tmp_path):
    import contextlib
    import io
    import json

    from ascend_emu.cli import main

    p = tmp_path / "s.py"
    p.write_text("import torch, torch_npu\nprint(torch.addcmul(torch.ones(2).half(), torch.ones(2).half(), "
                 "torch.ones(2).half()))\n")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["torch-run", "--compound-ops", "float32", "--fa-kv-block", "256", "--json",
                     str(tmp_path / "r.json"), str(p)])
    assert code == 0, err.getvalue()
    rec = json.loads((tmp_path / "r.json").read_text())
    assert rec["assumed_parameters"] == {"fa_kv_block": 256, "use_fp16_out": "float16", "compound_ops": "float32",
                                         "float_status_clear": "update"}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with pytest.raises(SystemExit) as e:
            main(["torch-run", "--fa-kv-block", "100", str(p)])
    assert e.value.code == 2

"""PyTorch eager training step: one step of a script under ``ae.torch.emulate`` (every aten op on the emulated
910B: forward, autograd's backward, the optimizer's update) against the same step in plain torch float32 on the
CPU, same model, same batch, alternating. Two models: the small CNN (Conv2d, BatchNorm, ReLU, MaxPool, Linear;
SGD with momentum) and the LLaMA-style block (RMSNorm, RoPE, SDPA, SwiGLU; AdamW) of tests/torch/torch_models.py, in
float32 (torch_npu's defaults: HF32 convolutions, float32 matmuls) and under fp16 autocast with GradScaler.
"""
from __future__ import annotations

import os
import sys

from .common import row, side_by_side

TARGET = 0.2    # issue 43: the emulated step within 5x of torch's


def _models():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "torch"))
    import torch_models as models

    return models


def _cases(quick):
    import torch
    import torch.nn.functional as F

    m = _models()
    n = 16 if quick else 32
    g = torch.Generator().manual_seed(0)
    x_img = torch.randn(n, 3, 32, 32, generator=g)
    y_img = torch.randint(0, 10, (n,), generator=g)
    x_seq = torch.randn(4 if not quick else 2, 128, 256, generator=g)

    def cnn():
        net = m.small_cnn()
        net[-1] = torch.nn.Linear(16 * 8 * 8, 10)
        return net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), x_img, \
            (lambda o: F.cross_entropy(o, y_img))

    def llama():
        net = m.LlamaBlock(d=256, heads=4, hidden=688)
        return net, torch.optim.AdamW(net.parameters(), lr=1e-3), x_seq, (lambda o: o.square().mean())

    return [("small CNN 32x32, batch %d, SGD" % n, cnn), ("LLaMA block d=256 T=128, AdamW", llama)]


def _step(net, opt, x, loss_fn, amp=None, scaler=None):
    opt.zero_grad()
    if amp is None:
        loss_fn(net(x)).backward()
        opt.step()
        return
    with amp():
        loss = loss_fn(net(x))
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def run(quick: bool = False) -> list[dict]:
    import torch

    import ascend_emu as ae

    torch.set_num_threads(max(1, int(os.environ.get("NUMBA_NUM_THREADS", os.cpu_count() or 1))))
    rows = []
    rounds = 3 if quick else 7
    for name, make in _cases(quick):
        for amp in (False, True):
            net, opt, x, loss_fn = make()
            ref, ropt, _, _ = make()
            run_ = ae.torch.emulate("Ascend910B", keep_records=False)
            scaler = torch.amp.GradScaler("cpu")

            def ours():
                with run_:
                    _step(net, opt, x, loss_fn, run_.autocast if amp else None, scaler)

            def base():
                # the baseline is always the float32 step: what the user runs on the CPU instead of the NPU
                _step(ref, ropt, x, loss_fn)

            t_ours, t_base = side_by_side(ours, base, rounds, warmup=2)
            label = name + (", fp16 autocast + GradScaler" if amp else ", float32")
            rows.append(row("torch", label, t_ours * 1e3, t_base * 1e3, "torch float32 eager step (CPU)", "ms/step",
                            target=TARGET, higher_is_better=False))
    return rows

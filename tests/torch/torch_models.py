"""Small real torch models for the torch path's tests and benchmark: a CNN and a LLaMA-style block."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def small_cnn(seed: int = 0) -> nn.Module:
    """Conv2d, BatchNorm, ReLU, MaxPool, Linear: 3x16x16 images, 10 classes."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(16 * 4 * 4, 10))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(t, T):
    """Rotary position embedding (rotate-half form) of t (B, H, T, D)."""
    d = t.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1).to(t.dtype), torch.cat((ang.sin(), ang.sin()), -1).to(t.dtype)
    a, b = t.chunk(2, -1)
    return t * cos + torch.cat((-b, a), -1) * sin


class LlamaBlock(nn.Module):
    """RMSNorm, RoPE, causal SDPA, SwiGLU MLP, residuals."""

    def __init__(self, d=64, heads=4, hidden=128, seed=0):
        torch.manual_seed(seed)
        super().__init__()
        self.h = heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.n1(x)).split(D, -1)
        q, k, v = [t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in (q, k, v)]
        q, k = rope(q, T), rope(k, T)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.o(a)
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def cnn_batch(seed: int = 1, n: int = 8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


def llama_batch(seed: int = 1, b: int = 2, t: int = 16, d: int = 64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, d, generator=g)

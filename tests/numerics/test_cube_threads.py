"""The cube's thread count (numerics/cube_core.py ``SERIAL_MACS``): a product of at most 2^25 multiply-adds runs all its
kernels on one Numba thread, a larger one on all of them, the caller's thread count restored after either; the bits
are those of the product forced onto one thread. ``make test`` runs one Numba thread per worker, so the checks run in
a child process with two."""
import os
import subprocess
import sys

_CHILD = r"""
import numba, numpy as np
from ascend_emu.numerics import cube, cube_core

seen = []
real = cube_core._product

def spy(*args, **kw):
    seen.append(numba.get_num_threads())
    return real(*args, **kw)

cube_core._product = spy
rng = np.random.default_rng(0)

def operands(stacks, M, K, N):
    a = rng.standard_normal((stacks, M, K)).astype(np.float16)
    b = rng.standard_normal((stacks, K, N)).astype(np.float16)
    a.flat[::97] = np.inf
    b.flat[5::89] = -0.0
    return a, b

same = []
for stacks, M, K, N in [(1, 128, 512, 512), (1, 129, 512, 512), (32, 128, 64, 128), (33, 128, 64, 128)]:
    a, b = operands(stacks, M, K, N)
    out, st = cube.batch_matmul(a, b, out_dtype="float32")
    same.append(numba.get_num_threads())     # the caller's count restored
    numba.set_num_threads(1)
    one, st1 = real(a, b, np.arange(stacks), np.arange(stacks), None, cube_core._policy("float16", "float32",
                    "inf_nan", "keep", None), (stacks, M, N))
    numba.set_num_threads(2)
    same.append(out.tobytes() == one.tobytes() and st == st1)
try:   # a product that fails (a bias of the wrong length) restores the count too
    cube.matmul(np.ones((4, 8), np.float16), np.ones((8, 4), np.float16), bias=np.ones(5, np.float32))
except Exception:
    pass
print(seen, same, numba.get_num_threads())
"""


def test_products_up_to_serial_macs_run_on_one_thread_in_a_two_thread_child():
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    # 128 x 512 x 512 and 32 x 128 x 64 x 128 are 2^25 multiply-adds: one thread; one row or one stack more: two
    assert out.stdout.strip() == "[1, 2, 1, 2, 1] [2, True, 2, True, 2, True, 2, True] 2", out.stdout + out.stderr[-2000:]

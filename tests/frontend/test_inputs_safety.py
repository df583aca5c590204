"""Bad inputs are one-line errors (issue 12): pickles, repeated names, bad seeds, oversized shapes, damaged files."""
import random

import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.frontend.inputs import make_inputs
from ascend_emu.graph.core import Graph, InputSpec


def graph(*specs):
    return Graph([], [InputSpec(n, "float32", s) for n, s in specs] or [InputSpec("x", "float32", [None, 4])],
                 ["x:0"])


def one_line(e):
    assert "\n" not in str(e.value)
    return str(e.value)


def test_object_arrays_are_never_unpickled(tmp_path):
    g = graph(("x", [None, 4]))
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "o.npz", x=np.array([{"a": 1}], dtype=object))
    for item in (f"x={tmp_path / 'o.npy'}", f"x={tmp_path / 'o.npz'}", str(tmp_path / "o.npz")):
        with pytest.raises(AscendEmuError) as e:
            make_inputs(g, [item])
        assert "object array" in one_line(e) and "never loads" in one_line(e)


def test_repeated_input_name_is_an_error(tmp_path):
    g = graph(("x", [None, 4]))
    np.save(tmp_path / "a.npy", np.zeros((1, 4), np.float32))
    np.save(tmp_path / "b.npy", np.ones((1, 4), np.float32))
    with pytest.raises(AscendEmuError, match="given twice") as e:
        make_inputs(g, [f"x={tmp_path / 'a.npy'}", f"x={tmp_path / 'b.npy'}"])
    assert "a.npy" in one_line(e) and "b.npy" in one_line(e)
    np.savez(tmp_path / "all.npz", x=np.ones((1, 4), np.float32))
    with pytest.raises(AscendEmuError, match="given twice"):
        make_inputs(g, [str(tmp_path / "all.npz"), f"x={tmp_path / 'a.npy'}"])
    assert make_inputs(g, [f"x={tmp_path / 'b.npy'}"])["x"].sum() == 4


@pytest.mark.parametrize("seed", [-1, -(2 ** 70), 1.5, "3", True, None])
def test_bad_seed(seed):
    with pytest.raises(AscendEmuError, match="--seed") as e:
        make_inputs(graph(("x", [2, 4])), None, seed=seed)
    one_line(e)
    assert make_inputs(graph(("x", [2, 4])), None, seed=2 ** 70)["x"].shape == (2, 4)


@pytest.mark.parametrize("shape", ["x=100000,100000,100000", "x=99999999999999999999,4", "x=" + ",".join(["2"] * 300),
                                   "x=4294967296,1"])
def test_huge_shapes(shape):
    g = Graph([], [InputSpec("x", "float32", None)], ["x:0"])
    with pytest.raises(AscendEmuError) as e:
        make_inputs(g, None, shapes=[shape])
    assert "--shape" in one_line(e) or "memory" in one_line(e)


def test_damaged_npy_files(tmp_path):
    """Truncated or corrupted .npy/.npz input files: one line, never a traceback (seeded fuzz)."""
    g = graph(("x", [None, 4]))
    good = tmp_path / "g.npy"
    np.save(good, np.arange(8, dtype=np.float32).reshape(2, 4))
    np.savez(tmp_path / "g.npz", x=np.arange(8, dtype=np.float32).reshape(2, 4))
    rng = random.Random("inputs")
    for src in (good, tmp_path / "g.npz"):
        data = src.read_bytes()
        for case in range(150):
            b = bytearray(data[:rng.randint(0, len(data))] if rng.random() < 0.4 else data)
            for _ in range(rng.randint(0, 6)):
                if b:
                    b[rng.randrange(len(b))] = rng.randrange(256)
            bad = tmp_path / ("bad" + src.suffix)
            bad.write_bytes(bytes(b))
            for item in (f"x={bad}", str(bad)):
                try:
                    make_inputs(g, [item])
                except AscendEmuError as e:
                    assert "\n" not in str(e)
                except Exception as e:  # noqa: BLE001
                    raise AssertionError(f"{src.name} case {case}: {type(e).__name__}: {e}") from e


def test_a_npy_header_claiming_more_than_the_file_holds(tmp_path):
    """F4 (issue 45): a 144-byte .npy whose header claims 256 GiB ran out of memory and was told to "use a
    smaller --batch-size"; it is a truncated or corrupt file, said before anything is allocated."""
    import io

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False, "shape": (1 << 18, 1 << 18)})
    (tmp_path / "huge.npy").write_bytes(head.getvalue() + bytes(16))
    with pytest.raises(AscendEmuError) as e:
        make_inputs(graph(("x", [None, 4])), [f"x={tmp_path / 'huge.npy'}"])
    assert "is truncated or corrupt" in one_line(e) and "(262144, 262144)" in one_line(e)

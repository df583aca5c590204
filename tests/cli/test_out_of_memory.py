"""Issue 35: under a memory limit the CLI's one line blamed the model ("cannot freeze function 'call': Resource
temporarily unavailable") or printed a traceback (TensorFlow's libraries failing to map). It says memory ran
out, under which limit, and what to do."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from ascend_emu.cli import main
from ascend_emu.errors import AscendEmuError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ascend-emu: error: "), err
    return lines[0]


def test_a_library_that_cannot_be_mapped_under_ulimit_v_is_out_of_memory(tmp_path):
    """A real RLIMIT_AS in the child: 1 GiB lets Python, NumPy and ascend_emu start but not TensorFlow's
    libraries (about 1.5 GiB of address space), which fail with "failed to map segment" (an ImportError)."""
    lim = 1 << 30

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    import zipfile

    with zipfile.ZipFile(tmp_path / "m.keras", "w") as z:    # a .keras archive: loading it imports TensorFlow
        z.writestr("config.json", "{}")
        z.writestr("metadata.json", "{}")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "NUMBA_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "ascend_emu.cli", "-q", "replay", "m.keras"], capture_output=True,
                       text=True, preexec_fn=limit, cwd=tmp_path, env=env, timeout=120)
    line = _one_error_line(p.stderr)
    assert p.returncode == 2
    assert line.startswith("ascend-emu: error: out of memory: the process may use 1.00 GiB of address space "
                           "(ulimit -v)"), line
    assert "--batch-size" in line and "--stats-only" in line and "not a .keras" not in line


def test_a_freeze_without_threads_under_a_limit_is_out_of_memory_not_the_models_fault(tmp_path, monkeypatch, capsys):
    """Between the limit TensorFlow needs to import and the one a small model needs to load, freezing fails
    with EAGAIN (a thread without room for its stack); that window is a few hundred MB wide and moves with the
    machine, so the loader's own error (frontend/graphdef.py: "cannot freeze function ...: <strerror>") is raised
    at Device.replay, the seam, with a 1.9 GiB limit reported by memory_limit. Without a limit the same text is
    the loader's error, told as it is."""
    import ascend_emu.cli.memory as memory
    from ascend_emu.npu.device import Device

    def freeze_fails(self, *a, **k):
        raise AscendEmuError("cannot freeze function 'call': Resource temporarily unavailable")

    monkeypatch.setattr(Device, "replay", freeze_fails)
    (tmp_path / "m.keras").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    hook = sys.unraisablehook
    try:
        monkeypatch.setattr(memory, "memory_limit", lambda: int(1.9 * 2 ** 30))
        assert main(["replay", "m.keras"]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert line.startswith("ascend-emu: error: out of memory: the process may use 1.90 GiB of address space"), line
        assert "Resource temporarily unavailable" in line and "--stats-only" in line
        monkeypatch.setattr(memory, "memory_limit", lambda: None)
        assert main(["replay", "m.keras"]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert line == "ascend-emu: error: cannot freeze function 'call': Resource temporarily unavailable"
    finally:
        sys.unraisablehook = hook


@pytest.mark.parametrize("exc", [MemoryError(), MemoryError("Unable to allocate 74.5 GiB for an array"),
                                 RuntimeError("std::bad_alloc")])
def test_memory_errors_of_any_kind_are_one_line(exc, tmp_path, monkeypatch, capsys):
    """A MemoryError (NumPy's names the size) or an allocator's bad_alloc: one line, exit 2; another exception
    stays a bug (raised)."""
    from ascend_emu.npu.device import Device

    def fails(self, *a, **k):
        raise exc

    monkeypatch.setattr(Device, "replay", fails)
    (tmp_path / "m.keras").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    hook = sys.unraisablehook
    try:
        assert main(["replay", "m.keras"]) == 2
    finally:
        sys.unraisablehook = hook
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("ascend-emu: error: out of memory: ") and "--batch-size" in line, line
    if str(exc):
        assert str(exc) in line
    monkeypatch.setattr(Device, "replay", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        main(["replay", "m.keras"])

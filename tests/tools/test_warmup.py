"""``ascend-emu warmup``: the demo's workloads in parallel processes, compiling the kernels into Numba's cache.

The success path runs in every ``make test`` and ``make demo`` (the Makefile calls it after installing); these
tests cover what a user sees when it goes wrong, without compiling anything.
"""
from __future__ import annotations

import io

import pytest

from ascend_emu.cli.main import main
from ascend_emu.errors import AscendEmuError
from ascend_emu.tools import warmup as wu


def test_unknown_part_is_one_line():
    with pytest.raises(AscendEmuError, match=r"unknown warm-up part 'nope'; choose one of: replay, train"):
        wu.run_part("nope")


def test_a_failing_part_names_itself_and_its_last_line(monkeypatch):
    # a part the child process does not know: it exits non-zero with AscendEmuError's line last
    monkeypatch.setattr(wu, "PARTS", ("replay-typo",))
    out = io.StringIO()
    with pytest.raises(AscendEmuError) as e:
        wu.warmup(jobs=1, stream=out)
    msg = str(e.value)
    assert msg.startswith("warm-up part 'replay-typo' failed (exit 1): ")
    assert "unknown warm-up part 'replay-typo'" in msg
    assert "python -m ascend_emu.tools.warmup replay-typo" in msg
    assert "compiling the kernels" in out.getvalue()


def test_jobs_below_one_is_refused(capsys):
    assert main(["warmup", "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["ascend-emu: error: --jobs must be at least 1, got 0"]

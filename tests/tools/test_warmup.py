"""``ascend-emu warmup``: the kernels' type signatures from ``ascend_emu/data/kernel_signatures.json`` compiled
into Numba's cache by parallel processes (``make test`` runs it after installing).

The manifest is a file the warm-up reads: its signatures are parsed from text by a restricted evaluator, so
hostile text is refused, and a malformed manifest is one line. The end-to-end test compiles one small kernel
into a temporary cache, and records a manifest back from that cache.
"""
from __future__ import annotations

import glob
import io
import json
import os

import pytest

from ascend_emu.cli.main import main
from ascend_emu.errors import AscendEmuError
from ascend_emu.tools import warmup as wu


@pytest.mark.parametrize("text", ["__import__('os')", "().__class__", "int64.__class__", "open('x')",
                                  "(int64,) if 1 else 2", "x" * 5000, "lambda: 1", "[int64]", "int64", "(1;2)"])
def test_hostile_signature_text_is_refused(text):
    with pytest.raises((ValueError, NameError, SyntaxError, TypeError)):
        wu.parse_signature(text)


def test_signatures_parse_back_to_numba_types():
    from numba.core import types

    sig = wu.parse_signature("(Array(uint16, 1, 'C', False, aligned=True), UniTuple(int64, 2), bool, "
                             "omitted(default=0), Tuple((bool, float32)))")
    assert sig == (types.Array(types.uint16, 1, "C"), types.UniTuple(types.int64, 2), types.boolean,
                   types.Omitted(0), types.Tuple((types.boolean, types.float32)))


@pytest.mark.parametrize("content,msg", [
    (None, "not found; make it with"),
    ("{", "not a signature list"),
    ('{"format": 1, "entries": [{"module": "os", "qualname": "system", "closure": "", "signature": "()", '
     '"bytes": 1}]}', "not a signature list of format 1"),
    ('{"format": 2, "entries": []}', "not a signature list of format 1"),
    ('{"format": 1, "entries": [{"module": "ascend_emu.kernels.cast"}]}', "not a signature list of format 1"),
])
def test_malformed_manifests_are_one_line(tmp_path, content, msg):
    p = tmp_path / "sigs.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(AscendEmuError, match=msg):
        wu.load_manifest(str(p))


def test_the_shipped_manifest_fits_the_kernels():
    """Every entry parses and nearly all name a kernel as it is now (a kernel changed since the manifest was made
    loses its entries until ``--record`` runs again: they compile on first use)."""
    rows = wu.load_manifest()
    assert len(rows) > 100
    found = wu.dispatchers()
    ns = wu._types_namespace()
    for r in rows:
        assert isinstance(wu.parse_signature(r["signature"], ns), tuple)
    resolved = sum((r["module"], r["qualname"], r["closure"]) in found for r in rows)
    assert resolved >= 0.8 * len(rows), (resolved, len(rows))


def test_shares_split_whole_modules_and_cover_every_entry():
    rows = wu.load_manifest()
    parts = wu.shares(rows, 3)
    assert sorted(map(json.dumps, (r for p in parts for r in p))) == sorted(map(json.dumps, rows))
    owner = {}
    for i, p in enumerate(parts):
        for r in p:
            assert owner.setdefault(r["module"], i) == i
    sizes = [sum(r["bytes"] for r in p) for p in parts]
    biggest_module = max(sum(r["bytes"] for r in rows if r["module"] == m) for m in owner)
    assert max(sizes) - min(sizes) <= biggest_module


def test_warmup_compiles_into_the_cache_and_record_reads_it_back(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    manifest = tmp_path / "one.json"
    row = {"module": "ascend_emu.kernels.cube.blocked", "qualname": "_bit_length", "closure": "", "signature":
           "(int64,)", "bytes": 1}
    row["closure"] = next(k[2] for k in wu.dispatchers() if k[:2] == (row["module"], row["qualname"]))
    manifest.write_text(json.dumps({"format": 1, "entries": [row]}))
    out = io.StringIO()
    res = wu.warmup(jobs=2, stream=out, path=str(manifest))
    assert (res["compiled"], res["skipped"], res["jobs"]) == (1, 0, 2)
    assert "compiling 1 kernel signatures" in out.getvalue()
    nbi = glob.glob(os.path.join(str(cache), "**", "blocked._bit_length-*.nbi"), recursive=True)
    assert len(nbi) == 1
    again = tmp_path / "again.json"
    assert wu.record([os.path.dirname(nbi[0])], str(again), stream=io.StringIO()) == 1
    assert wu.load_manifest(str(again))[0] == {**row, "bytes": wu.load_manifest(str(again))[0]["bytes"]}


def test_a_signature_that_no_longer_fits_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    manifest = tmp_path / "stale.json"
    rows = [{"module": "ascend_emu.kernels.cube.blocked", "qualname": "_no_such_kernel", "closure": "",
             "signature": "(int64,)", "bytes": 1}]
    manifest.write_text(json.dumps({"format": 1, "entries": rows}))
    res = wu.warmup(jobs=1, stream=io.StringIO(), path=str(manifest))
    assert (res["compiled"], res["skipped"]) == (0, 1)


def test_jobs_below_one_is_refused(capsys):
    assert main(["warmup", "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["ascend-emu: error: --jobs must be at least 1, got 0"]


@pytest.mark.parametrize("argv,msg", [(["--share", "5/2"], "--share takes I/N with 0 <= I < N"),
                                      (["--share", "x"], "--share takes I/N"),
                                      (["--jobs", "0"], "--jobs must be at least 1"),
                                      (["--manifest", "/nonexistent/sigs.json"], "not found; make it with")])
def test_the_module_entry_point_says_one_line(argv, msg, capsys):
    assert wu.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m ascend_emu.tools.warmup: error: ") and msg in err[0]

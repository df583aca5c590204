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
    ("{", "is corrupt: not valid JSON"),
    ("[" * 100000 + "]" * 100000, "nested deeper than"),
    ('{"format": 1, "entries": [{"module": "os", "qualname": "system", "closure": "", "signature": "()", '
     '"bytes": 1}]}', "not a signature list of format 1"),
    ('{"format": 2, "entries": []}', "not a signature list of format 1"),
    ('{"format": 1, "entries": [{"module": "ascend_emu.kernels.cast"}]}', "not a signature list of format 1"),
    ('{"format": 1, "entries": [{"module": "ascend_emu.kernels.x\\nos", "qualname": "q", "closure": "", '
     '"signature": "()", "bytes": 1}]}', "not a signature list of format 1"),
])
def test_malformed_manifests_are_one_line(tmp_path, content, msg):
    p = tmp_path / "sigs.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(AscendEmuError, match=msg):
        wu.load_manifest(str(p))


@pytest.mark.parametrize("kind,msg", [("zero", "not a regular file"), ("fifo", "not a regular file"),
                                      ("link", "is a symbolic link"), ("big", "bytes, more than")])
def test_a_manifest_that_is_no_regular_file_is_one_line(tmp_path, kind, msg):
    """S4 (issue 45): /dev/zero grew without end, a FIFO hung, a link was followed."""
    p = str(tmp_path / "sigs.json")
    if kind == "zero":
        p = "/dev/zero"
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "link":
        with open(tmp_path / "real.json", "w") as f:
            json.dump({"format": 1, "entries": []}, f)
        os.symlink(tmp_path / "real.json", p)
    else:
        with open(p, "wb") as f:
            f.truncate(wu._MAX_MANIFEST_BYTES + 1)
    with pytest.raises(AscendEmuError, match=msg):
        wu.load_manifest(p)


@pytest.mark.parametrize("path,least", [(wu.MANIFEST, 300), (wu.DEMO_MANIFEST, 100)])
def test_the_shipped_manifests_fit_the_kernels(path, least):
    """Every entry parses and nearly all name a kernel as it is now (a kernel changed since the manifest was made
    loses its entries until ``--record`` / ``--record-demo`` runs again: they compile on first use)."""
    rows = wu.load_manifest(path)
    assert len(rows) >= least
    found = wu.dispatchers()
    ns = wu._types_namespace()
    for r in rows:
        assert isinstance(wu.parse_signature(r["signature"], ns), tuple)
    resolved = sum((r["module"], r["qualname"], r["closure"]) in found for r in rows)
    assert resolved >= 0.8 * len(rows), (resolved, len(rows))


def test_modules_are_handed_out_largest_first_and_each_served_whole(tmp_path, monkeypatch):
    rows = wu.load_manifest()
    mods = wu.modules_by_size(rows)
    assert sorted(mods) == sorted({r["module"] for r in rows})
    size = [sum(r["bytes"] for r in rows if r["module"] == m) for m in mods]
    assert size == sorted(size, reverse=True)
    # a serving process answers one line per request; a module not in the list compiles nothing
    small = [{"module": "ascend_emu.kernels.cube.blocked", "qualname": "_bit_length", "closure": "",
              "signature": "(int64,)", "bytes": 1}, {"module": "ascend_emu.kernels.cube.blocked",
              "qualname": "_no_such_kernel", "closure": "", "signature": "(int64,)", "bytes": 1}]
    small[0]["closure"] = next(k[2] for k in wu.dispatchers() if k[:2] == (small[0]["module"], small[0]["qualname"]))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"format": 1, "entries": small}))
    out = io.StringIO()
    wu.serve(str(path), requests=io.StringIO("ascend_emu.kernels.cube.blocked\nascend_emu.kernels.nothing\n"),
             replies=out)
    assert out.getvalue().splitlines() == ["1 1", "0 0"]


def test_warmup_compiles_into_the_cache_and_record_reads_it_back(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    manifest = tmp_path / "two.json"
    rows = [{"module": "ascend_emu.kernels.cube.blocked", "qualname": "_bit_length", "closure": "", "signature":
             "(int64,)", "bytes": 1},
            {"module": "ascend_emu.kernels.cast", "qualname": "bf16_bits_to_f32", "closure": "", "signature":
             "(uint16,)", "bytes": 2}]
    for row in rows:
        row["closure"] = next(k[2] for k in wu.dispatchers() if k[:2] == (row["module"], row["qualname"]))
    manifest.write_text(json.dumps({"format": 1, "entries": rows}))
    out = io.StringIO()
    res = wu.warmup(jobs=3, stream=out, path=str(manifest))
    assert (res["compiled"], res["skipped"], res["jobs"]) == (2, 0, 2)   # no more processes than modules
    assert "compiling 2 kernel signatures into Numba's cache in 2 process(es)" in out.getvalue()
    nbi = [glob.glob(os.path.join(str(cache), "**", f"{name}-*.nbi"), recursive=True)
           for name in ("blocked._bit_length", "cast.bf16_bits_to_f32")]
    assert [len(n) for n in nbi] == [1, 1]
    again = tmp_path / "again.json"
    assert wu.record([os.path.dirname(n[0]) for n in nbi], str(again), stream=io.StringIO()) == 2
    back = wu.load_manifest(str(again))
    assert sorted((r["module"], r["qualname"], r["closure"], r["signature"]) for r in back) == sorted(
        (r["module"], r["qualname"], r["closure"], r["signature"]) for r in rows)


def test_a_signature_that_no_longer_fits_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    manifest = tmp_path / "stale.json"
    rows = [{"module": "ascend_emu.kernels.cube.blocked", "qualname": "_no_such_kernel", "closure": "",
             "signature": "(int64,)", "bytes": 1}]
    manifest.write_text(json.dumps({"format": 1, "entries": rows}))
    res = wu.warmup(jobs=1, stream=io.StringIO(), path=str(manifest))
    assert (res["compiled"], res["skipped"]) == (0, 1)


def test_warmup_leaves_no_pipe_open(tmp_path, monkeypatch):
    """`ascend-emu warmup --demo` (make demo's first step) printed two "unclosed file" warnings: the worker
    processes' stdout pipes."""
    import gc
    import warnings

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    manifest = tmp_path / "stale.json"
    manifest.write_text(json.dumps({"format": 1, "entries": [
        {"module": "ascend_emu.kernels.cube.blocked", "qualname": "_no_such_kernel", "closure": "",
         "signature": "(int64,)", "bytes": 1}]}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wu.warmup(jobs=1, stream=io.StringIO(), path=str(manifest))
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


def test_demo_flag_picks_the_demo_manifest(monkeypatch):
    seen = []
    monkeypatch.setattr(wu, "warmup", lambda jobs=None, stream=None, path=wu.MANIFEST: seen.append((jobs, path)))
    assert main(["warmup", "--demo", "-j", "1"]) == 0
    assert main(["warmup"]) == 0
    assert wu.main(["--demo", "--jobs", "2"]) == 0
    assert seen == [(1, wu.DEMO_MANIFEST), (None, wu.MANIFEST), (2, wu.DEMO_MANIFEST)]


def test_record_demo_of_a_failing_demo_writes_nothing(tmp_path, monkeypatch, capsys):
    import subprocess

    class Failed:
        returncode = 2
        stderr = "Traceback ...\nascend-emu: error: no space left on device\n"

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Failed())
    out = tmp_path / "demo.json"
    assert wu.main(["--record-demo", "--manifest", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m ascend_emu.tools.warmup: error: the demo failed, nothing recorded "
                   "(ascend-emu: error: no space left on device)"]
    assert not out.exists()


def test_jobs_below_one_is_refused(capsys):
    assert main(["warmup", "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["ascend-emu: error: --jobs must be at least 1, got 0"]


@pytest.mark.parametrize("argv,msg", [(["--jobs", "0"], "--jobs must be at least 1"),
                                      (["--serve", "--manifest", "/nonexistent/sigs.json"], "not found; make it with"),
                                      (["--record-demo", "--manifest", "/nonexistent/dir/d.json"],
                                       "its directory does not exist; nothing recorded"),
                                      (["--manifest", "/nonexistent/sigs.json"], "not found; make it with")])
def test_the_module_entry_point_says_one_line(argv, msg, capsys):
    assert wu.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m ascend_emu.tools.warmup: error: ") and msg in err[0]

"""fileio (issue 12): atomic writes refuse links and read-only targets; JSON reads are capped and one line."""
import os

import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.fileio import MAX_JSON_DEPTH, atomic_write_text, check_output_dir, make_output_dir, read_json


def test_atomic_write_refuses_symlinks_and_read_only_files(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    link = tmp_path / "out.csv"
    os.symlink(victim, link)
    with pytest.raises(AscendEmuError, match="symbolic link"):
        atomic_write_text(link, "new")
    assert victim.read_text() == "keep" and os.path.islink(link)
    ro = tmp_path / "ro.csv"
    ro.write_text("keep")
    ro.chmod(0o444)
    with pytest.raises(AscendEmuError, match="read-only"):
        atomic_write_text(ro, "new")
    assert ro.read_text() == "keep"
    ok = tmp_path / "ok.csv"
    atomic_write_text(ok, "new")
    assert ok.read_text() == "new" and sorted(os.listdir(tmp_path)) == ["ok.csv", "out.csv", "ro.csv", "victim.txt"]


def test_atomic_write_file_size_limit_is_one_line(tmp_path):
    import subprocess
    import sys
    code = ("import resource, sys\nfrom ascend_emu.fileio import atomic_write_text\n"
            "from ascend_emu.errors import AscendEmuError\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
            f"try:\n    atomic_write_text({str(tmp_path / 'big.csv')!r}, 'x' * 100000)\n"
            "except AscendEmuError as e:\n    print(e)\n    sys.exit(2)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2 and "File too large" in r.stdout and "Traceback" not in r.stderr
    assert os.listdir(tmp_path) == []   # no temporary file left, no half-written target


def test_read_json_caps_depth_and_names_the_file(tmp_path):
    p = tmp_path / "deep.json"
    for depth in (MAX_JSON_DEPTH + 1, 5000, 200000):
        p.write_text("[" * depth + "]" * depth)
        with pytest.raises(AscendEmuError, match="nested deeper") as e:
            read_json(p, "config")
        assert str(p) in str(e.value) and "\n" not in str(e.value)
    p.write_text("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    assert read_json(p, "config") == eval("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    for bad, expect in ((tmp_path / "missing.json", "not found"), (tmp_path, "directory")):
        with pytest.raises(AscendEmuError, match=expect):
            read_json(bad, "config")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(AscendEmuError, match="UTF-8"):
        read_json(tmp_path / "bin.json", "config")
    os.symlink(p, tmp_path / "link.json")
    with pytest.raises(AscendEmuError, match="symbolic link"):
        read_json(tmp_path / "link.json", "config")


def test_make_output_dir_onto_a_file(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(AscendEmuError, match="not a directory"):
        make_output_dir(f, "--keep-dumps")
    assert make_output_dir(tmp_path / "a" / "b", "--out") and (tmp_path / "a" / "b").is_dir()


def test_output_dirs_are_never_written_through_a_link(tmp_path):
    """Issue 35: a link as the directory named, or between it and a part below (DUMP/reference/step-3,
    OUT/step0/rank0), is refused; nothing is created in the link's target."""
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(target, tmp_path / "link")
    with pytest.raises(AscendEmuError, match="--out .*link is a symbolic link"):
        make_output_dir(tmp_path / "link", "--out")
    (tmp_path / "d").mkdir()
    os.symlink(target, tmp_path / "d" / "reference")
    for root, below in ((tmp_path / "link", "step-0"), (tmp_path / "d", "reference/step-0")):
        with pytest.raises(AscendEmuError, match="symbolic link") as e:
            make_output_dir(root / below, "--dump", root=root)
        assert "\n" not in str(e.value)
        with pytest.raises(AscendEmuError, match="symbolic link"):
            check_output_dir(root / below, "--dump", root=root)
    assert os.listdir(target) == []
    # the directory given may sit under a link of the user's (only what ascend-emu creates is checked)
    assert make_output_dir(tmp_path / "link" / "mine", "--out") and (target / "mine").is_dir()


def test_nul_bytes_in_paths(tmp_path):
    """Found by the long fuzz run: a NUL byte in a path raised ValueError from the OS layer."""
    from ascend_emu.analysis.dump import DumpWriter, load_dump
    from ascend_emu.npu.precision import MixLists

    bad = str(tmp_path / "a\x00b")
    for call in (lambda: read_json(bad, "config"), lambda: atomic_write_text(bad, "x"),
                 lambda: make_output_dir(bad, "--out"), lambda: MixLists.default().modify(bad),
                 lambda: load_dump(bad),
                 lambda: DumpWriter(bad, kind="npu", config={}, model={}, inputs_sha256="")):
        with pytest.raises(AscendEmuError) as e:
            call()
        assert "\n" not in str(e.value) and "\x00" not in str(e.value)


def test_output_dir_check_on_a_name_starting_with_dots(tmp_path):
    """A directory named ``..x`` below the root is below it (not outside): a link there is refused."""
    (tmp_path / "root").mkdir()
    os.symlink(tmp_path, tmp_path / "root" / "..x")
    with pytest.raises(AscendEmuError, match="symbolic link"):
        check_output_dir(tmp_path / "root" / "..x" / "step-0", "--dump", root=tmp_path / "root")

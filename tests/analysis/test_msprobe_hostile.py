"""msprobe interchange against hostile files: an import reads only inside the dump (no ../, absolute path or link
followed, and its errors never tell whether an outside path exists), a hostile record is a one-line error, an export
never writes through a link and two exports never mix, and a dump.json no reader would accept is refused at import.

Split from test_msprobe.py (the layout, round trip and rules), whose writers these tests use.
"""
import contextlib
import io
import json
import os

import numpy as np
import pytest

from ascend_emu.analysis.msprobe import SIDECAR, export_msprobe, import_msprobe
from ascend_emu.cli import main
from ascend_emu.errors import AscendEmuError

from test_msprobe import assert_same_dump, write, write_msprobe_fixture


# --------------------------------------------------------------------------- reads confined to the dump

SECRET = np.array([7.0, 7.0, 7.0], np.float32)


def _msprobe_dump(tmp_path, exported):
    """The rank directory and dump.json of an msprobe dump whose first output is a float32 [3]: written as
    msprobe lays it out, or exported by ascend-emu (with its ascend_emu.json)."""
    a = np.arange(3, dtype=np.float32)
    if exported:
        rdir = export_msprobe(write(tmp_path / "d", "npu", [("relu", "Relu", [], [a])]), tmp_path / "ms")
    else:
        write_msprobe_fixture(tmp_path / "ms", {"Functional.relu.0.forward": ([], [a])})
        rdir = str(tmp_path / "ms" / "step0" / "rank0")
    return rdir, os.path.join(rdir, "dump.json")


def _set_data_name(dj_path, name):
    dj = json.load(open(dj_path))
    leaf = next(iter(dj["data"].values()))["output"][0]
    old, leaf["data_name"] = leaf["data_name"], name
    json.dump(dj, open(dj_path, "w"))
    return old


@pytest.mark.parametrize("exported", [False, True], ids=["msprobe", "exported"])
@pytest.mark.parametrize("attack", ["dotdot", "absolute", "missing-outside", "link-npy", "link-dangling",
                                    "link-data-dir", "link-rank-dir"])
def test_import_reads_only_inside_the_dump(tmp_path, exported, attack):
    """Issue 35: a data_name of ../... or an absolute path, a symlinked .npy, dump_tensor_data or rank
    directory were followed (the exported layout imported any file; both told whether a path exists).
    Every one is now a one-line refusal naming only what dump.json says, the outside file never read."""
    outside = tmp_path / "outside"
    outside.mkdir()
    np.save(outside / "secret.npy", SECRET)
    rdir, dj = _msprobe_dump(tmp_path, exported)
    data = os.path.join(rdir, "dump_tensor_data")
    name = json.load(open(dj))["data"]
    name = next(iter(name.values()))["output"][0]["data_name"]
    if attack == "dotdot":
        _set_data_name(dj, "../../../../outside/secret.npy")
    elif attack == "absolute":
        _set_data_name(dj, str(outside / "secret.npy"))
    elif attack == "missing-outside":
        _set_data_name(dj, "../../../../outside/nothing.npy")
    elif attack in ("link-npy", "link-dangling"):
        os.remove(os.path.join(data, name))
        os.symlink(outside / ("secret.npy" if attack == "link-npy" else "nothing.npy"), os.path.join(data, name))
    elif attack == "link-data-dir":
        os.rename(data, outside / "data")
        np.save(outside / "data" / name, SECRET)
        os.symlink(outside / "data", data)
    else:
        os.rename(rdir, outside / "rank0")
        os.symlink(outside / "rank0", rdir)
    with pytest.raises(AscendEmuError) as e:
        import_msprobe(tmp_path / "ms", tmp_path / "out")
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert str(outside) not in msg or attack == "absolute"
    assert not os.path.exists(tmp_path / "out" / "manifest.json")
    if attack in ("dotdot", "missing-outside", "absolute"):
        assert "not a plain file name" in msg
    elif attack != "link-rank-dir":
        assert "symbolic link" in msg


@pytest.mark.parametrize("exported", [False, True], ids=["msprobe", "exported"])
def test_import_error_never_tells_whether_an_outside_path_exists(tmp_path, exported):
    """The refusal of a path out of the dump is the same whether its target exists or not."""
    (tmp_path / "outside").mkdir()
    np.save(tmp_path / "outside" / "tgtA.npy", SECRET)
    msgs = []
    for i, target in enumerate(("tgtA", "tgtB")):
        sub = tmp_path / str(i)
        sub.mkdir()
        rdir, dj = _msprobe_dump(sub, exported)
        name = _set_data_name(dj, f"../../../../../outside/{target}.npy")
        for how in ("dotdot", "link"):
            if how == "link":
                _set_data_name(dj, name)
                os.remove(os.path.join(rdir, "dump_tensor_data", name))
                os.symlink(tmp_path / "outside" / f"{target}.npy", os.path.join(rdir, "dump_tensor_data", name))
            with pytest.raises(AscendEmuError) as e:
                import_msprobe(sub / "ms", sub / f"out-{how}")
            msgs.append(str(e.value).replace(str(sub), "SUB").replace(target, "T"))
    assert msgs[:2] == msgs[2:]


@pytest.mark.parametrize("edit,expect", [
    (lambda s: s["manifest"]["ops"][0]["outputs"][0].update(nan="lots"), r"ops\[0\]\.outputs\[0\]\.nan"),
    (lambda s: s.update(manifest=[1]), "expected a JSON object"),
    (lambda s: s["manifest"]["ops"][0].pop("name"), r"ops\[0\]\.name"),
    (lambda s: s["manifest"].update(ops=[1]), r"ops\[0\]"),
    (lambda s: s.update(keys=[1]), "'keys' is not an object"),
    (lambda s: s.pop("manifest"), "expected a JSON object"),
], ids=["nan-lots", "manifest-list", "op-without-name", "op-not-object", "keys-list", "no-manifest"])
def test_hostile_export_record_is_one_line(tmp_path, edit, expect):
    """Issue 35: an altered ascend_emu.json gave a ValueError, AttributeError or KeyError traceback; its
    manifest is now validated by the dump schema (the field named), the command line exits 2 in one line."""
    rdir, _ = _msprobe_dump(tmp_path, exported=True)
    side = json.load(open(os.path.join(rdir, SIDECAR)))
    edit(side)
    json.dump(side, open(os.path.join(rdir, SIDECAR), "w"))
    with pytest.raises(AscendEmuError, match=expect) as e:
        import_msprobe(tmp_path / "ms", tmp_path / "out")
    assert "\n" not in str(e.value) and "re-export" in str(e.value)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["import-msprobe", str(tmp_path / "ms"), str(tmp_path / "out2")]) == 2
    assert err.getvalue().count("\n") == 1 and err.getvalue().startswith("ascend-emu: error: ")


@pytest.mark.parametrize("exported", [False, True], ids=["msprobe", "exported"])
@pytest.mark.parametrize("name", ["", 7, ["x.npy"], None])
def test_a_data_name_that_is_no_file_name_is_refused(tmp_path, exported, name):
    """M1 (issue 45): an empty, numeric or list data_name dropped the tensor silently (statistics only)."""
    rdir, dj = _msprobe_dump(tmp_path, exported)
    _set_data_name(dj, name)
    with pytest.raises(AscendEmuError, match="data_name") as e:
        import_msprobe(tmp_path / "ms", tmp_path / "out")
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- writes: links and a second export

@pytest.mark.parametrize("where", ["out", "step", "rank", "data"])
def test_export_never_writes_through_a_link(tmp_path, where):
    """Issue 35: export-msprobe NPU LINK, or OUT/step0, OUT/step0/rank0 or (with --overwrite) its
    dump_tensor_data as a link, wrote (and cleared) through it; each is refused, the target untouched."""
    src = write(tmp_path / "d", "npu", [("relu", "Relu", [], [np.arange(3, dtype=np.float32)])])
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.npy").write_bytes(b"mine")
    out = tmp_path / "ms"
    if where == "out":
        os.symlink(target, out)
    elif where in ("step", "rank"):
        (out / "step0" if where == "rank" else out).mkdir(parents=True)
        os.symlink(target, out / "step0" / "rank0" if where == "rank" else out / "step0")
    else:
        export_msprobe(src, out)
        data = out / "step0" / "rank0" / "dump_tensor_data"
        for f in os.listdir(data):
            os.remove(data / f)
        os.rmdir(data)
        os.symlink(target, data)
    with pytest.raises(AscendEmuError, match="symbolic link") as e:
        export_msprobe(src, out, overwrite=True)
    assert "\n" not in str(e.value)
    assert os.listdir(target) == ["keep.npy"] and (target / "keep.npy").read_bytes() == b"mine"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["export-msprobe", str(src), str(out), "--overwrite"]) == 2
    assert err.getvalue().startswith("ascend-emu: error: ") and err.getvalue().count("\n") == 1


def test_two_exports_into_one_directory_never_mix(tmp_path, monkeypatch):
    """Issue 35: a second export-msprobe into the OUT another is writing cleared and mixed its files
    (and both said OK); it now fails at once on the dump lock, and the first export is whole."""
    import ascend_emu.analysis.msprobe.export as ex

    a = write(tmp_path / "a", "npu", [(f"a{i}", "Relu", [], [np.full(3, i, np.float32)]) for i in range(3)])
    b = write(tmp_path / "b", "npu", [(f"b{i}", "Relu", [], [np.full(3, -i, np.float32)]) for i in range(3)])
    write_tensor, seen = ex._write_tensor, []

    def racing(path, arr, fmt):      # the second export starts while the first writes its tensors
        write_tensor(path, arr, fmt)
        if not seen:
            with pytest.raises(AscendEmuError, match="being written by another ascend-emu run") as e:
                export_msprobe(b, tmp_path / "ms", overwrite=True)
            seen.append(str(e.value))

    monkeypatch.setattr(ex, "_write_tensor", racing)
    export_msprobe(a, tmp_path / "ms", overwrite=True)
    assert seen and "\n" not in seen[0]
    back = import_msprobe(tmp_path / "ms", tmp_path / "back")
    assert_same_dump(a, back)
    assert not os.path.exists(tmp_path / "ms" / "step0" / "rank0" / ".ascend-emu.lock")
    monkeypatch.undo()
    export_msprobe(b, tmp_path / "ms", overwrite=True)    # the lock is gone once the first finished
    assert_same_dump(b, import_msprobe(tmp_path / "ms", tmp_path / "back2"))


@pytest.mark.parametrize("edit,expect", [
    (lambda dj: dj["data"]["Functional.relu.0.forward"]["output"][0].update(shape=[10 ** 12, 10 ** 12]),
     "more than any tensor holds"),
    (lambda dj: dj.update(data={}), "holds no tensor output"),
    (lambda dj: dj["data"]["Functional.relu.0.forward"].update(output=[{"type": "int", "value": 3}]),
     "holds no tensor output"),
])
def test_import_refuses_what_would_be_a_dump_no_reader_accepts(tmp_path, edit, expect):
    """A statistics leaf is written by its shape alone: a shape past any tensor's bound, or a dump.json without
    any tensor, is a one-line error at import, with nothing written (not a dump whose every read fails)."""
    a = np.arange(6, dtype=np.float16).reshape(2, 3)
    write_msprobe_fixture(tmp_path / "s", {"Functional.relu.0.forward": ([a], [a])}, task="statistics")
    path = tmp_path / "s" / "step0" / "rank0" / "dump.json"
    dj = json.loads(path.read_text())
    edit(dj)
    path.write_text(json.dumps(dj))
    with pytest.raises(AscendEmuError, match=expect) as e:
        import_msprobe(tmp_path / "s", tmp_path / "o")
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()

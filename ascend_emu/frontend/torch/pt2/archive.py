"""Reading a ``.pt2`` file (``torch.export.save``'s archive) as a hostile input.

``torch.export.load`` unpickles parts of an archive with ``weights_only=False``: a weight or constant whose
config says ``use_pickle``, a custom or opaque object, the sample inputs when the safe unpickler refuses them,
and everything of the old (pre-archive) format. So the file is checked first and handed to torch as a
sanitised copy: a zip of bounded size and entry count; the current archive format (``archive_format`` pt2,
one model under ``models/``); no pickled weight or constant, no custom or opaque object; the sample inputs
dropped (the replay makes its own). Whatever torch still rejects is said in one line.
"""
from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

from ....errors import AscendEmuError

#: the largest .pt2 file read, and the largest sum of its entries' uncompressed sizes
MAX_FILE_BYTES = 8 << 30
MAX_ENTRIES = 100_000
#: what an archive may hold beside weights and constants (the rest is ignored: AOTInductor, ExecuTorch, MTIA)
_KEEP_DIRS = ("models/", "data/weights/", "data/constants/", "extra/")
_TOP_FILES = ("archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id",
              "version")


def _memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def _line(e) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]


def _bad(path, why: str) -> AscendEmuError:
    return AscendEmuError(f"{str(path)!r} is not a torch.export program ({why}); save one with "
                          "torch.export.save(torch.export.export(model.eval(), example_inputs), 'model.pt2')")


def sanitised_archive(path) -> bytes:
    """The bytes of a copy of the .pt2 at ``path`` that ``torch.export.load`` reads without unpickling anything
    (module docstring); raises :class:`AscendEmuError` with one line for anything else."""
    path = Path(path)
    if not path.is_file():
        raise AscendEmuError(f"model path {str(path)!r} does not exist or is not a file")
    size = path.stat().st_size
    limit = min(MAX_FILE_BYTES, _memory() // 4)
    if size > limit:
        raise AscendEmuError(f"{str(path)!r} is {size / 2 ** 30:.3g} GiB, more than ascend-emu reads "
                             f"({limit / 2 ** 30:.3g} GiB); replay a smaller model")
    try:
        zf = zipfile.ZipFile(path)
        infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
        raise _bad(path, f"not a zip archive: {_line(e)}") from None
    with zf:
        if len(infos) > MAX_ENTRIES:
            raise _bad(path, f"{len(infos)} entries")
        if sum(i.file_size for i in infos) > limit:
            raise AscendEmuError(f"{str(path)!r} unpacks to more than {limit / 2 ** 30:.3g} GiB; replay a smaller "
                                 "model")
        names = [i.filename for i in infos]
        roots = {n.split("/", 1)[0] for n in names}
        if len(roots) != 1 or any("/" not in n for n in names):
            raise _bad(path, "not one archive folder")
        root = roots.pop() + "/"
        rel = {n[len(root):]: n for n in names}
        if "data.pkl" in rel:
            raise _bad(path, "a torch.save file, a pickle, which ascend-emu does not unpickle")
        if "serialized_exported_program.json" in rel and "archive_format" not in rel:
            raise AscendEmuError(f"{str(path)!r} is in the old torch.export format (before the pt2 archive), which "
                                 "torch loads with pickle; save it again with torch.export.save of torch 2.6 or "
                                 "later")
        try:
            fmt = zf.read(rel["archive_format"]).decode("ascii", "replace").strip() if "archive_format" in rel \
                else None
            if fmt != "pt2":
                raise _bad(path, "no archive_format pt2")
            models = [r for r in rel if r.startswith("models/") and r.endswith(".json")]
            if len(models) != 1:
                raise _bad(path, f"{len(models)} programs under models/; ascend-emu replays an archive of one")
            model = models[0][len("models/"):-len(".json")]
            _check_schema(path, zf.read(rel[models[0]]))
            for kind in ("weights", "constants"):
                cfg_name = f"data/{kind}/model_{kind}_config.json" if model == "model" else \
                    f"data/{kind}/{model}_{kind}_config.json"
                if cfg_name in rel:
                    _check_config(path, kind, zf.read(rel[cfg_name]))
            out = io.BytesIO()
            with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as w:
                for r, n in rel.items():
                    if r in _TOP_FILES or r.startswith(_KEEP_DIRS):
                        w.writestr(n, zf.read(n))
                # the sample inputs are dropped: torch falls back to an unsafe unpickler on them
                w.writestr(f"{root}data/sample_inputs/{model}.pt", b"")
        except AscendEmuError:
            raise
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError, RuntimeError, NotImplementedError,
                zipfile.LargeZipFile) as e:
            raise _bad(path, f"a damaged archive: {_line(e)}") from None
        except Exception as e:  # zlib.error and what else a damaged member raises
            raise _bad(path, f"a damaged archive: {_line(e)}") from None
    return out.getvalue()


def _check_schema(path, raw: bytes) -> None:
    """Refuse a program written with another major version of torch.export's schema (torch then retries the file
    as the old, pickled format)."""
    from torch._export.serde.schema import SCHEMA_VERSION

    try:
        js = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise _bad(path, f"its program is not JSON: {_line(e)}") from None
    v = js.get("schema_version") if isinstance(js, dict) else None
    major = v.get("major") if isinstance(v, dict) else None
    if not isinstance(major, int):
        raise _bad(path, "its program has no schema version")
    if major != SCHEMA_VERSION[0]:
        import torch

        raise AscendEmuError(f"{str(path)!r} was saved by another torch version (torch.export schema {major}."
                             f"{v.get('minor')}, this torch {torch.__version__} reads {SCHEMA_VERSION[0]}.x); "
                             f"export it again with torch {torch.__version__}")


def _check_config(path, kind: str, raw: bytes) -> None:
    """Refuse a weights or constants config that makes torch unpickle: ``use_pickle``, custom/opaque objects."""
    try:
        cfg = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise _bad(path, f"its {kind} config is not JSON: {_line(e)}") from None
    entries = cfg.get("config") if isinstance(cfg, dict) else None
    if not isinstance(entries, dict):
        raise _bad(path, f"its {kind} config has no entries")
    for fqn, meta in entries.items():
        if not isinstance(meta, dict):
            raise _bad(path, f"its {kind} config entry {str(fqn)[:80]!r} is not an object")
        p = str(meta.get("path_name", ""))
        if meta.get("use_pickle") or p.startswith(("custom_obj", "opaque_obj")):
            raise AscendEmuError(f"{str(path)!r}: {kind[:-1]} {str(fqn)[:80]!r} is stored as a pickle (a tensor "
                                 "subclass or a custom object), which ascend-emu does not unpickle from a file; "
                                 "export a model whose weights are plain tensors")


def load_exported_program(path):
    """``torch.export.load`` of the sanitised copy of ``path``: an ``ExportedProgram``, or one line of error."""
    import torch

    raw = sanitised_archive(path)
    import logging
    import warnings

    # torch logs a traceback of what it fails on before raising: the user gets our one line instead
    logs = [logging.getLogger(n) for n in ("torch._export.serde.serialize", "torch.export")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.load(io.BytesIO(raw))
    except AscendEmuError:
        raise
    except (MemoryError, RecursionError) as e:
        raise _bad(path, f"{type(e).__name__} while reading it") from None
    except Exception as e:
        text = _line(e)
        if "version" in text.lower() and ("schema" in text.lower() or "opset" in text.lower()):
            raise AscendEmuError(f"{str(path)!r} was saved by another torch version ({text}); export it again "
                                 f"with torch {torch.__version__}") from None
        raise _bad(path, f"torch cannot read it: {text}") from None
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)
    if type(ep).__name__ != "ExportedProgram":
        raise _bad(path, f"it holds a {type(ep).__name__}")
    return ep

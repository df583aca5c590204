"""Compile the kernels ahead of a first run, in parallel processes, into Numba's cache (``ascend-emu warmup``).

Every kernel is ``@njit(cache=True)``: compiled on its first call with a new type signature, then loaded from
the on-disk cache (next to the kernel's source, or ``NUMBA_CACHE_DIR``). On a fresh install the first runs pay
the compilation: most of a first ``ascend-emu demo`` (benchmarks/RESULTS.md, session 11), and in ``make test``
every pytest worker compiles what it needs, the same kernels on each worker at about the same time.

``ascend_emu/data/kernel_signatures.json`` lists the type signatures the test suite and the demo compile (made by
``python -m ascend_emu.tools.warmup --record`` from a cache those runs filled). The warm-up compiles each of them
once: the list split by kernel module over ``jobs`` processes, balanced by the size of the compiled code. No
model is built and no TensorFlow is imported. A signature that no longer fits its kernel (the kernel changed
since the list was made) is skipped and counted; it is compiled on first use, as without the warm-up.
"""
from __future__ import annotations

import glob
import importlib
import json
import os
import pickle
import pkgutil
import re
import subprocess
import sys
import time

from ..errors import AscendEmuError

MANIFEST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                        "kernel_signatures.json")
FORMAT = 1
_MAX_MANIFEST_BYTES = 8 << 20


# ------------------------------------------------------------------------------------------- the kernels

def _kernel_modules() -> list:
    import ascend_emu.kernels as pkg

    mods = [pkg]
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        mods.append(importlib.import_module(info.name))
    return mods


def dispatchers() -> dict:
    """Every Numba dispatcher the kernel modules hold (module globals, and dicts, lists and tuples of them),
    keyed by ``(module, qualname, closure hash)``, the key Numba's cache index tells them apart by."""
    from numba.core.dispatcher import Dispatcher

    found: dict = {}

    def walk(obj, module, depth):
        if isinstance(obj, Dispatcher):
            key = _key(obj, module)
            if key is not None:
                found.setdefault(key, obj)
        elif depth < 2 and isinstance(obj, dict):
            for v in list(obj.values()):
                walk(v, module, depth + 1)
        elif depth < 2 and isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, module, depth + 1)

    for mod in _kernel_modules():
        for v in list(vars(mod).values()):
            walk(v, mod.__name__, 0)
    return found


def _hashes(disp) -> tuple[str, str] | None:
    """(bytecode hash, closure hash) as Numba's cache index computes them; None where this Numba differs."""
    try:
        cache = disp._cache
        return tuple(cache._index_key(None, disp.targetctx.codegen())[2])
    except Exception:
        return None


def _key(disp, module: str):
    h = _hashes(disp)
    if h is None or disp.py_func.__module__ != module:
        return None
    return (module, disp.py_func.__qualname__, h[1])


# ------------------------------------------------------------------------------------------- signatures

def _types_namespace() -> dict:
    from numba.core import types

    ns = {k: v for k, v in vars(types).items() if not k.startswith("_")}
    ns.update({"bool": types.boolean, "omitted": lambda default: types.Omitted(default), "none": types.none, "True": True,
               "False": False, "None": None})
    return ns


def parse_signature(text: str, ns: dict | None = None) -> tuple:
    """A signature from its ``repr``: a tuple of numba type constructors, names and constants only (the syntax
    tree is checked node by node before anything is evaluated)."""
    import ast

    ns = ns or _types_namespace()
    if not isinstance(text, str) or len(text) > 4000:
        raise ValueError("not a signature")
    tree = ast.parse(text, mode="eval")
    if not isinstance(tree.body, ast.Tuple):
        raise ValueError("not a signature: a tuple of types")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in ns:
                raise NameError(f"{node.id!r} is not a numba type")
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name):
                raise ValueError("not a signature: calls of type names only")
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, str, bool, type(None))):
                raise ValueError("not a signature: a constant of another kind")
        elif not isinstance(node, (ast.Expression, ast.Tuple, ast.keyword, ast.Load)):
            raise ValueError(f"not a signature: {type(node).__name__}")
    return eval(compile(tree, "<signature>", "eval"), {"__builtins__": {}}, ns)   # noqa: S307 - checked above


def record(cache_dirs=None, path: str = MANIFEST, stream=None) -> int:
    """Write the manifest from the signatures in Numba's cache index files (``*.nbi``) of the kernels: every
    signature some run compiled with the kernels as they are now. Returns the number of entries."""
    import numba

    stream = stream or sys.stdout
    import ascend_emu.kernels as pkg

    if cache_dirs is None:
        cache_dirs = sorted({os.path.join(root, "__pycache__") for p in pkg.__path__
                             for root, _, _ in os.walk(p) if "__pycache__" not in root})
    by_hash = {}
    for (module, qualname, cvars), disp in dispatchers().items():
        h = _hashes(disp)
        by_hash[h] = (module, qualname, cvars)
    ns = _types_namespace()
    entries, skipped = {}, 0
    for d in cache_dirs:
        for nbi in sorted(glob.glob(os.path.join(d, "*.nbi"))):
            with open(nbi, "rb") as f:
                version = pickle.load(f)      # our own cache files, written by this Numba
                data = f.read()
            if version != numba.__version__:
                continue
            _, overloads = pickle.loads(data)
            for key, fname in overloads.items():
                sig, _, hashes = key
                owner = by_hash.get(tuple(hashes))
                text = repr(tuple(sig))
                try:
                    ok = owner is not None and parse_signature(text, ns) == tuple(sig)
                except Exception:
                    ok = False
                if not ok:
                    skipped += 1
                    continue
                size = os.path.getsize(os.path.join(d, fname)) if os.path.exists(os.path.join(d, fname)) else 0
                module, qualname, cvars = owner
                entries[(module, qualname, cvars, text)] = size
    rows = [{"module": m, "qualname": q, "closure": c, "signature": s, "bytes": b}
            for (m, q, c, s), b in sorted(entries.items())]
    doc = {"format": FORMAT, "numba": numba.__version__, "entries": rows}
    from ..fileio import atomic_write_text

    atomic_write_text(path, json.dumps(doc, indent=0, sort_keys=True) + "\n")
    print(f"{path}: {len(rows)} signatures of {len({(r['module'], r['qualname']) for r in rows})} kernels "
          f"({skipped} cache entries of older code or other types left out)", file=stream)
    return len(rows)


def load_manifest(path: str = MANIFEST) -> list[dict]:
    """The manifest's entries, validated (it is a file: read as hostile)."""
    try:
        if os.path.getsize(path) > _MAX_MANIFEST_BYTES:
            raise AscendEmuError(f"{path}: larger than {_MAX_MANIFEST_BYTES} bytes; not a signature list")
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise AscendEmuError(f"{path} not found; make it with `python -m ascend_emu.tools.warmup --record`") from None
    except (OSError, ValueError) as e:
        raise AscendEmuError(f"{path}: not a signature list ({e}); make it again with --record") from None
    rows = doc.get("entries") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("module", "qualname", "closure",
                                                                             "signature"))
            and isinstance(r.get("bytes"), int) and r["module"].startswith("ascend_emu.kernels") for r in rows):
        raise AscendEmuError(f"{path}: not a signature list of format {FORMAT}; make it again with --record")
    return rows


def shares(rows: list[dict], jobs: int) -> list[list[dict]]:
    """The entries split into ``jobs`` lists, whole kernel modules each (a kernel and the helpers it compiles
    inside it are in one module: one process compiles them once), balanced by compiled size, largest first."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(r["module"], []).append(r)
    out = [[] for _ in range(jobs)]
    load = [0] * jobs
    for mod in sorted(groups, key=lambda m: (-sum(r["bytes"] for r in groups[m]), m)):
        i = load.index(min(load))
        out[i].extend(groups[mod])
        load[i] += sum(r["bytes"] for r in groups[mod])
    return out


def compile_share(index: int, jobs: int, path: str = MANIFEST) -> tuple[int, int]:
    """Compile share ``index`` of ``jobs`` in this process; returns (compiled or loaded, skipped)."""
    rows = shares(load_manifest(path), jobs)[index]
    found = dispatchers()
    ns = _types_namespace()
    done = skipped = 0
    for r in rows:
        disp = found.get((r["module"], r["qualname"], r["closure"]))
        try:
            if disp is None:
                raise LookupError(r["qualname"])
            disp.compile(parse_signature(r["signature"], ns))
            done += 1
        except Exception:   # a kernel changed since the list was made: compiled on first use instead
            skipped += 1
    return done, skipped


def warmup(jobs: int | None = None, stream=None, path: str = MANIFEST) -> dict:
    """Compile the manifest's signatures in ``jobs`` processes at once (default: the cores); returns the
    seconds and the counts."""
    stream = stream or sys.stdout
    if jobs is not None and jobs < 1:
        raise AscendEmuError(f"--jobs must be at least 1, got {jobs}")
    rows = load_manifest(path)
    jobs = min(jobs or os.cpu_count() or 1, 16)
    t0 = time.perf_counter()
    print(f"compiling {len(rows)} kernel signatures into Numba's cache in {jobs} process(es) "
          "(once per install; later runs load them)", file=stream, flush=True)
    procs = [subprocess.Popen([sys.executable, "-m", "ascend_emu.tools.warmup", "--share", f"{i}/{jobs}",
                               "--manifest", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(jobs)]
    done = skipped = 0
    failed = []
    for i, p in enumerate(procs):
        out, err = p.communicate()
        if p.returncode != 0:
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            failed.append(f"process {i}: {lines[-1] if lines else 'exit ' + str(p.returncode)}")
            continue
        d, s = (int(v) for v in out.split()[-2:])
        done += d
        skipped += s
    took = time.perf_counter() - t0
    if failed:
        raise AscendEmuError(f"warm-up failed ({'; '.join(failed)}); the kernels compile on first use instead")
    print(f"{done} compiled or loaded, {skipped} skipped (changed kernels), in {took:.1f} s", file=stream,
          flush=True)
    return {"seconds": took, "compiled": done, "skipped": skipped, "jobs": jobs}


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ascend_emu.tools.warmup", description=__doc__.splitlines()[0])
    p.add_argument("--record", action="store_true", help="write the manifest from this checkout's Numba cache")
    p.add_argument("--share", help="I/N: compile share I of N here (what each warm-up process runs)")
    p.add_argument("--manifest", default=MANIFEST)
    p.add_argument("--jobs", type=int, default=None)
    a = p.parse_args(argv)
    try:
        if a.record:
            record(path=a.manifest)
        elif a.share:
            m = re.fullmatch(r"(\d{1,3})/(\d{1,3})", a.share)
            if not m or not int(m[1]) < int(m[2]):
                raise AscendEmuError(f"--share takes I/N with 0 <= I < N, got {a.share!r}")
            done, skipped = compile_share(int(m[1]), int(m[2]), a.manifest)
            print(done, skipped)
        else:
            warmup(a.jobs, path=a.manifest)
    except AscendEmuError as e:
        print(f"python -m ascend_emu.tools.warmup: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

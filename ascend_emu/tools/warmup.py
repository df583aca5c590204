"""Compile the kernels ahead of a first run, in parallel processes, into Numba's cache (``ascend-emu warmup``).

Every kernel is ``@njit(cache=True)``: compiled on its first call with a new type signature, then loaded from
the on-disk cache (next to the kernel's source, or ``NUMBA_CACHE_DIR``). On a fresh install the first runs pay
the compilation: most of a first ``ascend-emu demo`` (benchmarks/RESULTS.md, session 11), and in ``make test``
every pytest worker compiles what it needs, the same kernels on each worker at about the same time.

``ascend_emu/data/kernel_signatures.json`` lists the type signatures the test suite and the demo compile (made by
``python -m ascend_emu.tools.warmup --record`` from a cache those runs filled); ``demo_signatures.json`` those of
``ascend-emu demo`` alone (``--record-demo`` runs the demo with an empty cache of its own and lists what it
compiled), which ``make demo`` compiles first (``--demo``). The warm-up compiles each of them
once: whole kernel modules handed out to ``jobs`` processes, each module to the next free one. No
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
import tempfile
import time

from ..errors import AscendEmuError

MANIFEST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                        "kernel_signatures.json")
DEMO_MANIFEST = os.path.join(os.path.dirname(MANIFEST), "demo_signatures.json")
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


def record_demo(path: str = DEMO_MANIFEST, stream=None) -> int:
    """Write the demo's manifest: ``ascend-emu demo`` run in a fresh process with an empty Numba cache of its own
    (a temporary directory, removed after), then :func:`record` of that cache. Returns the number of entries."""
    with tempfile.TemporaryDirectory(prefix="ae-demo-sigs-") as tmp:
        cache = os.path.join(tmp, "cache")
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, TF_CPP_MIN_LOG_LEVEL="2")
        r = subprocess.run([sys.executable, "-m", "ascend_emu.cli", "demo", "--out", os.path.join(tmp, "out")],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
            raise AscendEmuError(f"the demo failed, nothing recorded ({lines[-1] if lines else 'exit ' + str(r.returncode)})")
        dirs = sorted({os.path.dirname(f) for f in glob.glob(os.path.join(cache, "**", "*.nbi"), recursive=True)})
        return record(dirs, path, stream)


def load_manifest(path: str = MANIFEST) -> list[dict]:
    """The manifest's entries, validated (it is a file: read as hostile)."""
    from ..fileio import read_json

    # a regular file, never through a link, size and nesting capped: /dev/zero, a FIFO, deep JSON are one line
    doc = read_json(path, "the signature list", max_bytes=_MAX_MANIFEST_BYTES, max_depth=8,
                    hint="make it with `python -m ascend_emu.tools.warmup --record`",
                    fix="make it again with --record")
    rows = doc.get("entries") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("module", "qualname", "closure",
                                                                             "signature"))
            and isinstance(r.get("bytes"), int) and re.fullmatch(r"ascend_emu\.kernels(\.\w+)*", r["module"])
            for r in rows):
        raise AscendEmuError(f"{path}: not a signature list of format {FORMAT}; make it again with --record")
    return rows


def modules_by_size(rows: list[dict]) -> list[str]:
    """The manifest's kernel modules, largest compiled code first: the order the warm-up hands them out (a kernel
    and the helpers it compiles inside it are in one module: one process compiles a module whole, once)."""
    size: dict = {}
    for r in rows:
        size[r["module"]] = size.get(r["module"], 0) + r["bytes"]
    return sorted(size, key=lambda m: (-size[m], m))


def compile_module(module: str, rows: list[dict], found: dict, ns: dict) -> tuple[int, int]:
    """Compile the entries of ``module`` in this process; returns (compiled or loaded, skipped)."""
    done = skipped = 0
    for r in rows:
        if r["module"] != module:
            continue
        disp = found.get((r["module"], r["qualname"], r["closure"]))
        try:
            if disp is None:
                raise LookupError(r["qualname"])
            disp.compile(parse_signature(r["signature"], ns))
            done += 1
        except Exception:   # a kernel changed since the list was made: compiled on first use instead
            skipped += 1
    return done, skipped


def serve(path: str = MANIFEST, requests=None, replies=None) -> None:
    """One warm-up process: for each module named on a line of ``requests`` (stdin), compile its entries and
    answer ``compiled skipped`` on a line of ``replies`` (stdout)."""
    requests = requests or sys.stdin
    replies = replies or sys.stdout
    rows = load_manifest(path)
    known = set(modules_by_size(rows))
    found = dispatchers()
    ns = _types_namespace()
    for line in requests:
        module = line.strip()
        d, s = compile_module(module, rows, found, ns) if module in known else (0, 0)
        print(d, s, file=replies, flush=True)


def warmup(jobs: int | None = None, stream=None, path: str = MANIFEST) -> dict:
    """Compile the manifest's signatures in ``jobs`` processes at once (default: the cores); returns the
    seconds and the counts. Whole modules are handed out one at a time, largest first, each to the next
    process that is free (compile times differ too much from the code sizes for a split made up front: the
    demo's list split by size took 149 s, its larger share's time; handed out this way, 106-111 s)."""
    import threading

    stream = stream or sys.stdout
    if jobs is not None and jobs < 1:
        raise AscendEmuError(f"--jobs must be at least 1, got {jobs}")
    rows = load_manifest(path)
    todo = modules_by_size(rows)
    jobs = max(1, min(jobs or os.cpu_count() or 1, 16, len(todo)))
    t0 = time.perf_counter()
    print(f"compiling {len(rows)} kernel signatures into Numba's cache in {jobs} process(es) "
          "(once per install; later runs load them)", file=stream, flush=True)
    lock = threading.Lock()
    totals = [0, 0]
    failed = []
    with tempfile.TemporaryDirectory(prefix="ae-warmup-") as tmp:
        errs = [open(os.path.join(tmp, f"{i}.err"), "w+", encoding="utf-8") for i in range(jobs)]
        procs = [subprocess.Popen([sys.executable, "-m", "ascend_emu.tools.warmup", "--serve", "--manifest", path],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errs[i], text=True)
                 for i in range(jobs)]

        def drive(p):
            try:
                while True:
                    with lock:
                        if not todo:
                            return
                        module = todo.pop(0)
                    p.stdin.write(module + "\n")
                    p.stdin.flush()
                    reply = p.stdout.readline().split()
                    if len(reply) != 2:
                        return          # the process died: its stderr says why, below
                    with lock:
                        totals[0] += int(reply[0])
                        totals[1] += int(reply[1])
            except (OSError, ValueError):
                return
            finally:
                try:
                    p.stdin.close()
                except OSError:
                    pass

        threads = [threading.Thread(target=drive, args=(p,), daemon=True) for p in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, p in enumerate(procs):
            p.wait()
            p.stdout.close()    # else its pipe is "unclosed file" on collection: a warning line in make demo
            if p.returncode != 0:
                errs[i].seek(0)
                lines = [ln for ln in errs[i].read().strip().splitlines() if ln.strip()]
                failed.append(f"process {i}: {lines[-1] if lines else 'exit ' + str(p.returncode)}")
            errs[i].close()
    took = time.perf_counter() - t0
    if failed:
        raise AscendEmuError(f"warm-up failed ({'; '.join(failed)}); the kernels compile on first use instead")
    done, skipped = totals
    print(f"{done} compiled or loaded, {skipped} skipped (changed kernels), in {took:.1f} s", file=stream,
          flush=True)
    return {"seconds": took, "compiled": done, "skipped": skipped, "jobs": jobs}


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ascend_emu.tools.warmup", description=__doc__.splitlines()[0])
    p.add_argument("--record", action="store_true", help="write the manifest from this checkout's Numba cache")
    p.add_argument("--record-demo", action="store_true",
                   help="run the demo with an empty cache of its own and write the demo's manifest from it")
    p.add_argument("--demo", action="store_true", help="compile the demo's signatures only (what make demo runs)")
    p.add_argument("--serve", action="store_true",
                   help="compile the modules named on stdin's lines, one reply line each (what each warm-up process runs)")
    p.add_argument("--manifest", default=None, help="the signature list (default: the test suite's, or the "
                   "demo's with --demo / --record-demo)")
    p.add_argument("--jobs", type=int, default=None)
    a = p.parse_args(argv)
    manifest = a.manifest or (DEMO_MANIFEST if a.demo or a.record_demo else MANIFEST)
    try:
        if (a.record or a.record_demo) and not os.path.isdir(os.path.dirname(os.path.abspath(manifest))):
            raise AscendEmuError(f"{manifest}: its directory does not exist; nothing recorded")
        if a.record:
            record(path=manifest)
        elif a.record_demo:
            record_demo(path=manifest)
        elif a.serve:
            serve(manifest)
        else:
            warmup(a.jobs, path=manifest)
    except (AscendEmuError, OSError) as e:
        print(f"python -m ascend_emu.tools.warmup: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

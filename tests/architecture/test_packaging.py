"""Every subpackage of the library is installed: pyproject.toml lists its packages by hand (the kernels folder is
mapped to ``ascend_emu.kernels``), and the editable install ``make`` does would hide a missing entry, which a
``pip install ascend-emu`` then lacks (``npu.torch_run`` and ``tools.check`` once were)."""
from __future__ import annotations

import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _packages_on_disk() -> set:
    found = set()
    for top, name in (("ascend_emu", "ascend_emu"), ("kernels", "ascend_emu.kernels")):
        base = os.path.join(ROOT, top)
        for root, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if "__init__.py" in files:
                rel = os.path.relpath(root, base)
                found.add(name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}")
    return found


def test_every_subpackage_is_listed_or_shipped_as_data():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        tool = tomllib.load(f)["tool"]["setuptools"]
    listed = set(tool["packages"])
    data = tool.get("package-data", {})

    def as_data(pkg: str) -> bool:
        # a directory shipped as files of a listed package (the shims ascend-emu run / torch-run put on sys.path)
        for owner, globs in data.items():
            if pkg.startswith(owner + "."):
                sub = pkg[len(owner) + 1:].replace(".", "/")
                if any(g.split("*")[0].rstrip("/").startswith(sub.split("/")[0]) for g in globs):
                    return True
        return False

    missing = sorted(p for p in _packages_on_disk() - listed if not as_data(p))
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"
    stale = sorted(listed - _packages_on_disk())
    assert not stale, f"pyproject.toml lists packages that do not exist: {stale}"

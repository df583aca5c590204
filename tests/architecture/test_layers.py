"""The folder tree is the architecture: every import points down a layer, none forms a cycle.

Reads every module's imports with ``ast`` (module-level and inside functions, relative and
absolute), maps each to its layer, and fails on an upward import, on an import cycle
between modules, and on TensorFlow imported outside the layers allowed to. ARCHITECTURE.md
draws the same table.
"""
from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "ascend_emu"
KERNELS = ROOT / "kernels"

#: layer name -> rank; a module may import modules of its own rank or lower, never higher
LAYERS = {
    "errors": 0, "fileio": 0, "version": 0, "_compat": 0, "data": 0, "generated": 0,
    "kernels": 1,
    "numerics": 2, "graph": 2,
    "ops": 3, "analysis": 3,
    "frontend": 4,
    "npu": 5,
    "tools": 6,
    "cli": 7,
}
#: same-rank layers that must not import each other (siblings)
SIBLINGS = [("numerics", "graph"), ("ops", "analysis")]
#: the only places TensorFlow (or Keras) may be imported
TF_ALLOWED = ("ascend_emu.frontend", "ascend_emu.npu.aicpu")
#: the only places onnx / onnxruntime may be imported: the frontend and the ONNX models' AI CPU
ONNX_ALLOWED = ("ascend_emu.frontend", "ascend_emu.npu.aicpu_onnx")
#: the only places torch may be imported: its front end, the eager run on the device, and msprobe's .pt files
#: (read and written lazily, inside the functions that need them)
TORCH_ALLOWED = ("ascend_emu.frontend.torch", "ascend_emu.npu.torch_run", "ascend_emu.analysis.msprobe.format")


def _allowed(mod: str, allowed: tuple) -> bool:
    """``mod`` is one of ``allowed`` or inside one (a package); a prefix of a name is not enough."""
    return any(mod == a or mod.startswith(a + ".") for a in allowed)


def _modules():
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(["ascend_emu", *parts])] = path
    for path in sorted(KERNELS.rglob("*.py")):
        parts = list(path.relative_to(KERNELS).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(["ascend_emu", "kernels", *parts])] = path
    return out


MODULES = _modules()


def _is_pkg(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


def _imports(mod: str):
    """(imported module, line) pairs of ``mod``; ``from X import name`` counts name when it is a module."""
    tree = ast.parse(MODULES[mod].read_text())
    base = mod.split(".") if _is_pkg(mod) else mod.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                yield (sub if sub in MODULES else target), node.lineno


def _layer(mod: str) -> str | None:
    parts = mod.split(".")
    if parts[0] != "ascend_emu":
        return None
    if len(parts) == 1:
        return "api"   # the package facade (lazy public API) sits on top of everything
    return parts[1]


def test_every_module_has_a_layer():
    unknown = sorted({_layer(m) for m in MODULES} - set(LAYERS) - {"api"})
    assert not unknown, f"modules outside every layer: {unknown}; add the layer to LAYERS and ARCHITECTURE.md"


def test_no_upward_or_sibling_imports():
    bad = []
    for mod in MODULES:
        lo = _layer(mod)
        if lo == "api":
            continue
        for imp, line in _imports(mod):
            li = _layer(imp)
            if li is None or li == lo:
                continue
            if li == "api":
                bad.append(f"{mod}:{line} imports the package facade ascend_emu (import the module itself)")
            elif LAYERS[li] > LAYERS[lo]:
                bad.append(f"{mod}:{line} ({lo}) imports {imp} ({li}): upward")
            elif (lo, li) in SIBLINGS or (li, lo) in SIBLINGS:
                bad.append(f"{mod}:{line} ({lo}) imports {imp} ({li}): sibling layers stay apart")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = {m: sorted({i for i, _ in _imports(m) if i in MODULES and i != m}) for m in MODULES}
    # a package's __init__ re-exporting its own submodules is not a cycle with them
    for m in graph:
        graph[m] = [i for i in graph[m] if not (_is_pkg(m) and i.startswith(m + "."))]
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in graph[m]:
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_tensorflow_only_in_frontend_and_aicpu():
    bad = []
    for mod in MODULES:
        if _allowed(mod, TF_ALLOWED):
            continue
        for imp, line in _imports(mod):
            if imp.split(".")[0] in ("tensorflow", "keras", "tf_keras"):
                bad.append(f"{mod}:{line} imports {imp}")
    assert not bad, "TensorFlow outside frontend/ and npu/aicpu: " + "; ".join(bad)


def test_onnx_only_in_frontend_and_aicpu_onnx():
    bad = []
    for mod in MODULES:
        if _allowed(mod, ONNX_ALLOWED):
            continue
        for imp, line in _imports(mod):
            if imp.split(".")[0] in ("onnx", "onnxruntime", "onnxscript"):
                bad.append(f"{mod}:{line} imports {imp}")
    assert not bad, "onnx/onnxruntime outside frontend/ and npu/aicpu_onnx: " + "; ".join(bad)
    # the rule itself: a sibling module named like an allowed one is not allowed
    assert not _allowed("ascend_emu.npu.aicpu_onnx", TF_ALLOWED) and _allowed("ascend_emu.frontend.x", ONNX_ALLOWED)


def test_torch_only_in_its_front_end_and_run():
    bad = []
    for mod in MODULES:
        if _allowed(mod, TORCH_ALLOWED):
            continue
        for imp, line in _imports(mod):
            if imp.split(".")[0] in ("torch", "torch_npu", "torchvision"):
                bad.append(f"{mod}:{line} imports {imp}")
    assert not bad, "torch outside frontend/torch and npu/torch_run: " + "; ".join(bad)


def test_import_ascend_emu_does_not_import_torch():
    import subprocess
    import sys

    code = "import ascend_emu, sys; ascend_emu.__all__; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_kernels_import_no_policy():
    bad = [f"{m}: {i}" for m in MODULES if m.startswith("ascend_emu.kernels")
           for i, _ in _imports(m) if i.startswith("ascend_emu") and not i.startswith("ascend_emu.kernels")]
    assert not bad, f"kernels must not import the library (they take integer codes): {bad}"


def test_public_api_resolves():
    import ascend_emu

    for name in ascend_emu.__all__:
        assert getattr(ascend_emu, name) is not None, name


@pytest.mark.parametrize("old", sorted(__import__("ascend_emu._compat", fromlist=["MOVED"]).MOVED))
def test_deprecated_module_names_still_import(old):
    from ascend_emu._compat import MOVED

    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        import sys
        sys.modules.pop(old, None)
        mod = importlib.import_module(old)
    assert mod is importlib.import_module(MOVED[old])


def test_public_submodules_import_as_modules():
    """`ae.torch.emulate` and `ae.tf1.wrap` are the README's spellings; `import ascend_emu.torch` and
    `from ascend_emu.tf1 import wrap` are what a user writes next, and raised ModuleNotFoundError."""
    import subprocess
    import sys

    code = ("import sys, ascend_emu as ae; import ascend_emu.torch, ascend_emu.tf1; "
            "from ascend_emu.torch import emulate; from ascend_emu.tf1 import wrap; "
            "assert ascend_emu.torch is ae.torch is sys.modules['ascend_emu.npu.torch_run']; "
            "assert ascend_emu.tf1 is sys.modules['ascend_emu.npu.tf1'] and emulate is ae.torch.emulate; "
            # a module inside the alias is the real module, not a second copy of its file
            "import ascend_emu.torch.launch, ascend_emu.npu.torch_run.launch as real; "
            "assert ascend_emu.torch.launch is real and real.__name__ == 'ascend_emu.npu.torch_run.launch'")
    subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], check=True, cwd=ROOT,
                   timeout=120)

"""The op coverage table of the README, generated from the registry: every TF op type the registry knows (and
the ones the model zoo meets without an AI Core kernel), the engine it runs on and its precision-list default.

    python -m ascend_emu.ops.coverage README.md     # rewrite the table between the README's markers

``tests/ops/test_coverage.py`` checks that the README's table is the generated one.
"""
from __future__ import annotations

import sys

from ..graph.control_flow import CONTROL_FLOW
from ..graph.dataflow import DATAFLOW_OPS
from .ascend_types import ascend_type, data_file
from .registry import CUBE, HOST, MOVE, OPS, VECTOR

#: op types the model zoo and the issue-36 models meet that have no AI Core kernel here: they run through the AI
#: CPU fallback (TensorFlow, original dtype). Keras's dilated Conv1D / Conv2D lowering; a Conv2D between them is
#: folded into one dilated convolution by SpaceToBatchConv2dBatchToSpacePass (tests/npu/test_dilated_conv.py).
#: The one-input Where (the positions of true values: a data-dependent output shape) of the zoo's LLM blocks
#: (tests/npu/test_zoo_llm.py): no AI Core kernel in hicann/ops-math or among canndev's TBE kernels.
AICPU_MET = ("SpaceToBatchND", "BatchToSpaceND", "Where")

BEGIN, END = "<!-- op-coverage:begin -->", "<!-- op-coverage:end -->"
_ENGINE = {CUBE: "AI Core (cube)", VECTOR: "AI Core (vector)", MOVE: "AI Core (data movement)", HOST: "host"}


def list_default(ascend_op: str) -> str:
    """white / black / gray in the built-in lists (``data/mixlist_default.json``; absent: gray, CANN's rule)."""
    lists = data_file("mixlist_default.json")
    if ascend_op in lists["white"]:
        return "white"
    if ascend_op in lists["black"]:
        return "black"
    return "gray"


def coverage_rows() -> list[tuple[str, str, str, str]]:
    """(TF type, Ascend type, engine, list default) for every public registered type, the control-flow ops and
    :data:`AICPU_MET`, sorted by TF type."""
    rows = {}
    for t, d in OPS.items():
        if t.startswith("_"):
            continue     # the fused ops the fusion passes make: not TF types
        a = ascend_type(t)
        rows[t] = (t, a, _ENGINE[d.kind], "-" if d.kind == HOST else list_default(a))
    for t in (*CONTROL_FLOW, *DATAFLOW_OPS):
        if not t.startswith("_"):
            rows.setdefault(t, (t, ascend_type(t), "host (control flow)", "-"))
    rows.setdefault("Placeholder", ("Placeholder", ascend_type("Placeholder"), "host", "-"))
    for t in AICPU_MET:
        assert t not in OPS, f"{t} has an AI Core kernel now: drop it from AICPU_MET"
        rows[t] = (t, ascend_type(t), "AI CPU (TensorFlow, original dtype)", "-")
    return [rows[t] for t in sorted(rows, key=str.lower)]


def coverage_table() -> str:
    """The markdown table of :func:`coverage_rows`."""
    lines = ["| TF op type | Ascend type | engine | list default |", "|---|---|---|---|"]
    lines += [f"| {t} | {a} | {e} | {lst} |" for t, a, e, lst in coverage_rows()]
    return "\n".join(lines)


def readme_table(text: str) -> str | None:
    """The table between the README's markers, or None when they are missing."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write_readme(path: str) -> None:
    text = open(path, encoding="utf-8").read()
    if readme_table(text) is None:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{BEGIN}\n{coverage_table()}\n{END}{tail}")


if __name__ == "__main__":
    write_readme(sys.argv[1] if len(sys.argv) > 1 else "README.md")

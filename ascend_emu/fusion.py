"""Fusion: CANN's graph and UB fusion passes as graph rewrites, switchable per rule.

A rule matches a pattern of plain nodes and replaces it by one fused node. The fused
node takes the name of the last original op (so ``compare`` aligns it with the
unfused TensorFlow reference), carries ``attrs["_fusion"] = {"rule", "replaces"}``,
and runs a fused implementation whose numerics are those of the fused CANN operator:
intermediates are not rounded to the output dtype (NUMERICS.md section 6). The
swallowed ops are reported as ``fused_away``.

Switches use CANN's ``fusion_switch.cfg`` format::

    {"Switch": {"GraphFusion": {"ConvBatchnormFusionPass": "off", "ALL": "on"},
                "UBFusion": {"ALL": "off"}}}
"""
from __future__ import annotations

import difflib
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable

from .errors import AscendEmuError

GRAPH, UB = "GraphFusion", "UBFusion"


@dataclass
class FusionRule:
    name: str                 # CANN pass name
    kind: str                 # GraphFusion or UBFusion
    pattern: str              # the TF-graph pattern it matches
    numerics: str             # what the fused op does differently
    apply: Callable           # apply(rewriter) -> number of matches rewritten


#: registry of rules in the order the graph engine applies them (graph passes, then UB)
RULES: dict[str, FusionRule] = {}

#: CANN pass names that exist but are not emulated (they do not occur in inference graphs)
OTHER_CANN_PASSES = ("SoftmaxGradFusionPass", "TbeMultiOutputFusionPass", "TbeReduceElemwiseFusionPass",
                     "ATbeMatMulElemwiseFusionPass", "TbeConv2DBackpropElemwiseFusionPass")


def fusion_rule(name: str, kind: str, pattern: str, numerics: str):
    def deco(fn):
        if name in RULES:
            raise RuntimeError(f"fusion rule {name} registered twice")
        RULES[name] = FusionRule(name, kind, pattern, numerics, fn)
        return fn
    return deco


@dataclass
class FusionConfig:
    """Which fusion rules are on. Default: all on, as on the NPU."""

    graph: dict = field(default_factory=dict)   # pass name or "ALL" -> bool
    ub: dict = field(default_factory=dict)
    source: str = "default (all on)"

    @classmethod
    def load(cls, spec=None) -> "FusionConfig":
        """From None (all on), "off" (precision_tool's fusion-off: ALL off in both), a dict or a JSON path."""
        if spec is None:
            return cls()
        if isinstance(spec, FusionConfig):
            return spec
        if isinstance(spec, str) and spec in ("off", "on"):
            v = spec == "on"
            return cls({"ALL": v}, {"ALL": v}, f"fusion {spec}")
        label = "fusion_switch"
        if isinstance(spec, (str, os.PathLike)):
            label = str(spec)
            try:
                with open(spec, encoding="utf-8") as f:
                    spec = json.load(f)
            except FileNotFoundError:
                raise AscendEmuError(f"fusion switch file {label} not found; pass a JSON file like "
                                     '{"Switch": {"GraphFusion": {"ALL": "off"}}}') from None
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise AscendEmuError(f"fusion switch file {label} is not valid JSON ({e}); fix the file") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("Switch"), dict):
            raise AscendEmuError(f"{label}: expected {{\"Switch\": {{\"GraphFusion\": {{...}}, \"UBFusion\": {{...}}}}}}")
        out = {GRAPH: {}, UB: {}}
        for kind, passes in spec["Switch"].items():
            if kind not in out:
                raise AscendEmuError(f"{label}: unknown section {kind!r} under Switch; use GraphFusion or UBFusion")
            if not isinstance(passes, dict):
                raise AscendEmuError(f"{label}: Switch.{kind} must map pass names to \"on\" or \"off\"")
            for name, val in passes.items():
                if val not in ("on", "off"):
                    raise AscendEmuError(f"{label}: {kind}.{name} is {val!r}; use \"on\" or \"off\"")
                if name != "ALL" and name not in RULES:
                    known = list(RULES) + list(OTHER_CANN_PASSES)
                    if name not in known:
                        close = difflib.get_close_matches(name, known, n=3)
                        warnings.warn(f"{label}: unknown fusion pass {name!r}"
                                      + (f"; closest: {', '.join(close)}" if close else ""), stacklevel=2)
                elif name in RULES and RULES[name].kind != kind:
                    warnings.warn(f"{label}: {name} is a {RULES[name].kind} pass, listed under {kind}", stacklevel=2)
                out[kind][name] = val == "on"
        return cls(out[GRAPH], out[UB], label)

    def enabled(self, rule: str) -> bool:
        r = RULES[rule]
        table = self.graph if r.kind == GRAPH else self.ub
        if rule in table:
            return table[rule]
        return table.get("ALL", True)

    def to_dict(self) -> dict:
        return {"source": self.source, "enabled": {name: self.enabled(name) for name in RULES}}


@dataclass
class Fused:
    nodes: list
    fused_away: list
    counts: dict


def apply_fusion(graph, config: FusionConfig) -> Fused:
    """Rewrite ``graph.nodes`` with every enabled rule, in registry order."""
    from .fusion_rules import Rewriter

    rw = Rewriter(graph)
    counts = {}
    for name, rule in RULES.items():
        if config.enabled(name):
            n = rule.apply(rw)
            if n:
                counts[name] = n
    return Fused(rw.nodes(), rw.fused_away, counts)

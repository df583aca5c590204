"""The package's JSON data files and the TF -> Ascend (CANN) op type table read from them.

Rank 0 (ARCHITECTURE.md): the op layer, the precision lists and the dump analysis all speak CANN's op
type names, so the table lives below all of them.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


def data_file(name: str) -> dict:
    """One of the package's JSON data files (``ascend_emu/data``)."""
    return json.loads(resources.files("ascend_emu.data").joinpath(name).read_text())


@lru_cache(maxsize=None)
def optype_map() -> dict:
    return dict(data_file("optype_map.json")["map"])


def ascend_type(tf_type: str) -> str:
    """The Ascend (CANN) op type for a TF op type (documented mapping, else unchanged)."""
    return optype_map().get(tf_type, tf_type)

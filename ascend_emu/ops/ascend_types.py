"""TF op type -> Ascend (CANN) op type, from the documented table ``data/optype_map.json``.

Op metadata, below both the precision lists (which speak CANN's names) and the reference
dump (which records them). The table is read in ``ascend_emu.data`` (rank 0, so the dump analysis
reads it too); re-exported here for the op layer.
"""
from __future__ import annotations

from ..data import ascend_type, data_file, optype_map  # noqa: F401  (re-exported)

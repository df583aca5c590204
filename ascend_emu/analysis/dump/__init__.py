"""Dumps: one directory per run, ``manifest.json`` plus one ``.npy`` per output tensor.

The replay (kind ``"npu"``) and the TensorFlow reference (kind ``"bench"``) both
write through :class:`DumpWriter`; comparison, overflow analysis and reports read
through :func:`load_dump`. Nothing here imports TensorFlow.

Completeness protocol: while a dump is being written the directory holds a marker
file ``INCOMPLETE`` and no ``manifest.json``. :meth:`DumpWriter.finish` writes the
manifest atomically (temporary file + ``os.replace``) and only then removes the
marker, so a run killed at any point, or stopped by a full disk, leaves a directory
every reader rejects. The marker lists every file the writer creates (the name goes
in before the file), so ``overwrite`` deletes only files an ascend-emu dump made: the
ones its manifest or its marker names. A writer holds an exclusive ``flock`` on the
lock file ``.ascend-emu.lock`` inside the directory from start to finish; a second
writer fails at once. No file of a dump is written, cleared or read through a
symbolic link.

Dumps are data, never paths to follow: every manifest is checked against the schema of
its version (:mod:`ascend_emu.analysis.schema`), and every tensor file it names must be
a plain file name (no directory part) of a regular file inside the dump directory.

Tensors are stored in their own dtype (fp16 stays fp16). ``np.save`` cannot
describe ml_dtypes types such as bfloat16 (it writes an anonymous ``|V2``), so
those are stored as the unsigned integer of the same width and the manifest's
``dtype`` field names the real type; :meth:`Dump.tensor` views them back.

Non-finite floats in the manifest (a statistic, an attribute) are written as the
strings ``"nan"``, ``"inf"`` and ``"-inf"`` so the file stays valid JSON; the
numeric fields of outputs and ``fp32_check`` are parsed back to floats on load.
The manifest holds no timestamps: the same run gives the same bytes.

- :mod:`.format`: file names, constants, dtype storage, JSON encoding;
- :mod:`.stats`: the statistics recorded for every tensor, the size of a dump;
- :mod:`.writer`: :class:`DumpWriter`, the marker, the lock, ``overwrite``;
- :mod:`.reader`: :func:`load_dump` and :class:`Dump`.
"""
from __future__ import annotations

from .format import CODED_FORMATS, Coded  # noqa: F401
from .format import (CHUNK, FORMAT, KINDS, LOCK, MANIFEST, MARKER, MAX_MANIFEST_BYTES, VARIANT,  # noqa: F401
                     VERSION, _dtype_from_name, json_safe)
from .stats import (ANNOUNCE_BYTES, STATS_OUTPUT_BYTES, check_disk_space, dump_bytes, fmt_bytes,  # noqa: F401
                    graph_dump_bytes, tensor_stats)
from .writer import DumpWriter, StatsOnly, check_dump_dir, op_selector  # noqa: F401
from .reader import Dump, load_dump  # noqa: F401

"""Speak msprobe: write ascend-emu dumps in msprobe's dump layout, read msprobe dumps back.

msprobe (the ``mindstudio-probe`` package, version 26.2 read for this module) is the
accuracy tool Ascend users run on their hardware. Its dump of one step on one device is a
directory ``step{N}/rank{R}/`` with

* ``dump.json``: ``{"task": "tensor"|"statistics", "level", "framework", "dump_data_dir",
  "data": {key: {"input_args": [leaf, ...], "input_kwargs": {...}, "output": [leaf, ...]}}}``,
  a key per API call such as ``Functional.conv2d.0.forward`` (``.backward`` for gradients), a
  tensor leaf ``{"type": "torch.Tensor", "dtype": "torch.float16", "shape": [...], "Max", "Min",
  "Mean", "Norm", "requires_grad", "data_name": "{key}.output.{i}.pt"}``;
* ``stack.json``: ``{"0": [[key, ...], [stack line, ...]], ...}``;
* ``construct.json``: ``{key: parent module key or null}``;
* ``dump_tensor_data/``: one file per tensor (``.pt`` from PyTorch, ``.npy`` from MindSpore),
  at the ``tensor`` task only.

Sources: msprobe 26.2's ``core/dump/data_dump/json_writer.py`` (file layout, stack.json),
``core/dump/data_dump/data_processor/pytorch_processor.py`` (leaf fields and how Max/Min/Mean/Norm
are computed), ``core/compare/utils.py`` (``compare_distributed_inner``: the step/rank layout it
reads; ``get_relative_err``) and ``core/compare/indicator_analysis/`` (the Result checkers,
implemented here as :func:`apply_msprobe_rules`). NUMERICS.md section 7 states every difference.

:func:`export_msprobe` writes one ascend-emu dump as such a directory (``framework="graph"``: each op
one ``Functional.<name>.0.forward`` key, its outputs under ``output`` and the producer tensors it
reads under ``input_args``; ``framework="pytorch"``: msprobe's PyTorch dump of a torch run, its
``Aten.*`` keys kept, ``.backward`` entries with ``input``/``output``, ``.pt`` tensors); :func:`import_msprobe` reads one back into an ascend-emu dump so
that ``compare``, ``overflow`` and ``report`` run on a real NPU's dump. Nothing here imports
TensorFlow; PyTorch is imported only to read or write ``.pt`` files.

- :mod:`.format`: names, dtype spellings, statistics and tensor files as msprobe writes them;
- :mod:`.export`: :func:`export_msprobe`;
- :mod:`.reader`: :func:`find_rank_dir`, :func:`read_mapping`, :func:`import_msprobe`;
- :mod:`.rules`: :func:`apply_msprobe_rules`.
"""
from __future__ import annotations

from ..metrics import ERROR, NA, PASS, WARNING  # noqa: F401  (the Result levels the rules decide)
from .format import (API_KEY, API_PREFIXES, DATA_DIR, FRAMEWORKS, NAME_PATTERN, PREFIX, RULES, SIDECAR,  # noqa: F401
                     SIDECAR_FORMAT, TENSOR_FORMATS, TORCH_DTYPES, dump_key, pytorch_keys, msprobe_name, msprobe_names, msprobe_stats, numpy_dtype_name,
                     stats_from_msprobe, torch_dtype)
from .export import export_msprobe  # noqa: F401
from .reader import find_rank_dir, import_msprobe, read_mapping  # noqa: F401
from .rules import (COSINE_DROP, COSINE_INPUT, NORM_REL_FROM_ZERO, NORM_REL_GROWTH, NORM_REL_INPUT,  # noqa: F401
                    NORM_REL_OUTPUT, ONE_THOUSANDTH_INPUT, ONE_THOUSANDTH_OUTPUT, apply_msprobe_rules)

"""The emulated NPU: precision decisions, inserted casts, op dispatch, status and dumps.

``Device(...).replay(model)`` loads a TF model (``loader``), rewrites it with the
enabled fusion rules (``fusion``), walks it with the interpreter, and for every node
decides the compute dtype (``precision``), inserts Cast ops at precision boundaries,
runs the op (``ops``) in the emulated units, ORs its status bits into the float status
register, and records it in the dump. The per-op execution of one replay is
:class:`ascend_emu.npu.replay._Run`; this module holds the device, its configuration and
the results.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..numerics.multicore import Launch, MultiCoreModel
from ..numerics.policy import HF32_FAMILY_ROUNDING, CubeModel, NumericsPolicy
from ..ops.multicore import MULTICORE_OPS
from ..analysis.dump import dump_bytes, fmt_bytes
from ..errors import AscendEmuError, UnsupportedOpError
from ..graph.core import Graph, tensor_name
from ..graph.dataflow import check_live, has_dataflow_control_flow, run_dataflow, sibling_name
from ..graph.interpreter import interpret, schedule
from ..ops import CUBE, OPS, OpContext
from .fusion import FusionConfig, apply_fusion
from .layout import nhwc_plan
from .precision import HF32_FAMILY, PrecisionPolicy, ascend_type, resolve_mode
from ..numerics.status import FloatStatus

from .replay import OpRecord, _Run  # noqa: F401  (OpRecord is part of this module's API)
from .threads import Pinned, Trial


@dataclass
class ReplayResult:
    """The outcome of :meth:`Device.replay`.

    ``outputs``: the model outputs by tensor name; ``tensors``: every op output by
    tensor name (in its emulated dtype; fp16 stays fp16); ``records``: one
    :class:`OpRecord` per executed op (inserted casts included) in execution order;
    ``float_status``: the sticky float status register after the run.
    """

    graph: Graph
    outputs: dict
    tensors: dict
    records: list
    float_status: FloatStatus
    summary: dict
    dump: str | None = None
    inputs: dict = field(default_factory=dict)

    def tensor(self, name: str) -> np.ndarray:
        return self.tensors[tensor_name(name)]

    def format_summary(self) -> str:
        """The replay summary as the CLI prints it (ops per engine and dtype, fusion, overflow, status)."""
        return format_replay_summary(self.summary, self.dump)

    def record(self, name: str) -> OpRecord:
        for r in self.records:
            if r.name == name:
                return r
        raise KeyError(name)


class Device:
    """An emulated Ascend NPU.

    Parameters
    ----------
    precision_mode : str
        CANN ``precision_mode`` (see :data:`ascend_emu.npu.precision.PRECISION_MODES`); the
        default ``force_fp16`` is the TF adapter's default for inference.
    precision_mode_v2 : str
        CANN's ``precision_mode_v2`` instead (``fp16``, ``origin``, ``cube_fp16in_fp32out``, ``mixed_float16``,
        ``mixed_bfloat16``; :data:`ascend_emu.npu.precision.PRECISION_MODES_V2`): the same modes under their
        new names, with the same results; giving both is an error, as in CANN.
    modify_mixlist : path or dict, optional
        CANN mixlist edits (``black-list``/``white-list``/``gray-list`` with ``to-add``/``to-remove``).
    fusion_switch : path, dict or None
        CANN fusion_switch.cfg content; fusion is on by default, as on the NPU.
    aicpu_fallback : bool
        Run ops without an emulated AI Core kernel through TensorFlow (engine AICPU);
        if False, such ops are an error listing all of them.
    soc, overflow_mode, subnormals, impl_mode, reduce_accumulate, op_model, cube_model, deterministic,
    deterministic_level, run_seed, multicore
        The device's numerics, held and validated by :class:`ascend_emu.numerics.policy.NumericsPolicy`
        (``Device.numerics``), whose docstring describes each; NUMERICS.md gives the sources. The SoC
        (a row of :data:`ascend_emu.numerics.policy.SOCS`: ``ascend-emu socs``) sets the defaults of
        ``overflow_mode``, ``op_model`` and ``allow_hf32`` and refuses the precision modes it cannot run; the
        device is deterministic unless ``deterministic=False`` or ``deterministic_level=0`` is given.
    keep_dtype : path or list of str, optional
        ATC's ``--keep_dtype`` file (node names, ``OpType::<type>`` lines): those ops keep their original
        dtype (float32) whatever the precision mode.
    allow_hf32, hf32_bits, hf32_conv_rounding, hf32_matmul_rounding, hf32_rounding
        Which cube op families (``"conv"``, ``"matmul"``, ``"conv,matmul"``, ``"none"``; default the SoC's:
        conv on Ascend910B, Ascend910_93, Ascend950) round float32 operands to HF32, to how many stored
        significand bits (default the SoC's: 11 on the A2 and A3, 10 on the 950), with which tie rule per
        family (conv ``rint``, matmul ``round``: ties away), and ``hf32_rounding``, an override of both
        families' rule (NUMERICS.md section 13).
    cce_ftz : bool or None
        Whether Exp, Ln, Reciprocal, Sqrt, Rsqrt and Div flush subnormals (the 950's ``--cce-ftz``; None: the
        SoC's default, on for Ascend950 only; NUMERICS.md section 13).
    hif8_rounding, hif8_cube_out
        Under precision_mode_v2 cube_hif8 / mixed_hif8 (Ascend950): the rounding of the inserted Casts to
        HiFloat8 (``"round"``, half away from zero, or ``"hybrid"``) and a HiFloat8 cube op's output dtype
        (``"16bit"``: float16, bfloat16 for a bfloat16 op; or ``"float32"``); both assumptions (NUMERICS.md
        section 13).
    cube_mx : str or None
        A what-if: MatMul / BatchMatMul operands MX block-quantized along K to this element format
        (``"float8_e4m3fn"``, ``"float8_e5m2"``, ``"float4_e2m1fn"``, ``"float4_e1m2"``), multiplied in float32 as the
        950's MmadMx (NUMERICS.md section 14).
    fa_kv_block, use_fp16_out, compound_ops, float_status_clear
        The torch eager path's assumed parameters (``ae.torch.emulate``; NUMERICS.md section 16): FlashAttentionScore's
        key block (128), the output dtype of a float32 cube op run on fp16 operands (``"float16"``), silu / addcmul /
        addcdiv / lerp as vector ops in sequence (``"sequence"``) or in float32 with one rounding, and where the 910's
        float status register is cleared under upstream's GradScaler (``"update"`` or ``"scale"``).
    """

    def __init__(self, precision_mode: str | None = None, *, precision_mode_v2: str | None = None,
                 overflow_mode: str | None = None,
                 modify_mixlist=None, soc: str = "Ascend910", cube_model: CubeModel | None = None,
                 subnormals: str = "keep", impl_mode: str = "high_precision", reduce_accumulate: str = "float32",
                 op_model: str | None = None, fusion_switch=None, aicpu_fallback: bool = True,
                 deterministic: bool | None = None, deterministic_level: int | None = None, run_seed: int = 0,
                 multicore: MultiCoreModel | None = None, allow_hf32=None, hf32_rounding: str | None = None,
                 cce_ftz: bool | None = None, hif8_rounding: str = "round", hif8_cube_out: str = "16bit",
                 cube_mx: str | None = None, keep_dtype=None, hf32_bits: int | None = None,
                 hf32_conv_rounding: str = HF32_FAMILY_ROUNDING["conv"],
                 hf32_matmul_rounding: str = HF32_FAMILY_ROUNDING["matmul"], fa_kv_block: int = 128,
                 use_fp16_out: str = "float16", compound_ops: str = "sequence", float_status_clear: str = "update"):
        self.numerics = NumericsPolicy(soc=soc, overflow_mode=overflow_mode, subnormals=subnormals,
                                       impl_mode=impl_mode, reduce_accumulate=reduce_accumulate,
                                       cube_model=cube_model, op_model=op_model, deterministic=deterministic,
                                       deterministic_level=deterministic_level, run_seed=run_seed,
                                       multicore=multicore, allow_hf32=allow_hf32, hf32_rounding=hf32_rounding,
                                       cce_ftz=cce_ftz, hif8_rounding=hif8_rounding,
                                       cube_mx=cube_mx, hf32_bits=hf32_bits,
                                       hf32_conv_rounding=hf32_conv_rounding,
                                       hf32_matmul_rounding=hf32_matmul_rounding, fa_kv_block=fa_kv_block,
                                       use_fp16_out=use_fp16_out, compound_ops=compound_ops,
                                       float_status_clear=float_status_clear)
        mode, option, v2 = resolve_mode(precision_mode, precision_mode_v2, self.numerics.soc)
        self.precision = PrecisionPolicy(mode, modify_mixlist, option=option, precision_mode_v2=v2,
                                         hif8_cube_out=hif8_cube_out, keep_dtype=keep_dtype)
        self.aicpu_fallback = bool(aicpu_fallback)
        self.fusion = FusionConfig.load(fusion_switch)
        self._fusion_cache: dict = {}
        self._plan_cache: dict = {}

    def __getstate__(self):
        # the caches are keyed by id(graph), which means nothing in another process, and hold the graphs: a
        # sweep shipping a device that already replayed a .pt2 would ship its torch.export program, which a
        # Dask worker cannot unpickle (fit's "Error during deserialization of the task graph")
        state = dict(self.__dict__)
        state["_fusion_cache"] = {}
        state["_plan_cache"] = {}
        return state

    # the numerics choices, by their user-facing names
    soc = property(lambda self: self.numerics.soc)
    overflow_mode = property(lambda self: self.numerics.overflow_mode)
    subnormals = property(lambda self: self.numerics.subnormals)
    impl_mode = property(lambda self: self.numerics.impl_mode)
    reduce_accumulate = property(lambda self: self.numerics.reduce_accumulate)
    op_model = property(lambda self: self.numerics.op_model)
    cube_model = property(lambda self: self.numerics.cube_model)
    deterministic = property(lambda self: self.numerics.deterministic)
    deterministic_level = property(lambda self: self.numerics.deterministic_level)
    run_seed = property(lambda self: self.numerics.run_seed)
    allow_hf32 = property(lambda self: self.numerics.allow_hf32)
    hf32_rounding = property(lambda self: self.numerics.hf32_rounding)
    hf32_bits = property(lambda self: self.numerics.hf32_bits)
    cce_ftz = property(lambda self: self.numerics.cce_ftz)
    hif8_rounding = property(lambda self: self.numerics.hif8_rounding)
    cube_mx = property(lambda self: self.numerics.cube_mx)

    # -- configuration -------------------------------------------------------------------
    def config(self) -> dict:
        n = self.numerics.to_dict()
        return {
            **self.precision.to_dict(), "overflow_mode": n["overflow_mode"], "soc": n["soc"],
            "cube_model": n["cube_model"], "subnormals": n["subnormals"], "impl_mode": n["impl_mode"],
            "reduce_accumulate": n["reduce_accumulate"], "op_model": n["op_model"],
            "aicpu_fallback": self.aicpu_fallback,
            "fusion_switch": self.fusion.to_dict(),
            "deterministic": n["deterministic"], "deterministic_level": n["deterministic_level"],
            # the run seed only matters with determinism off: deterministic runs write identical manifests
            "run_seed": n["run_seed"] if n["deterministic_level"] == 0 else None, "multicore": n["multicore"],
            "allow_hf32": n["allow_hf32"], "hf32_rounding": n["hf32_rounding"], "hf32_bits": n["hf32_bits"],
            "hf32_conv_rounding": n["hf32_conv_rounding"], "hf32_matmul_rounding": n["hf32_matmul_rounding"],
            "cce_ftz": n["cce_ftz"],
            "hif8_rounding": n["hif8_rounding"], "cube_mx": n["cube_mx"],
        }

    # -- what the SoC's cube does with float32 --------------------------------------------------
    def hf32_family(self, node) -> str | None:
        """The allow_hf32 family (conv, matmul) of cube op ``node`` when this device rounds its float32
        operands to HF32, else None."""
        fam = HF32_FAMILY.get(node.attrs.get("base", node.op) if node.op.startswith("_Fused") else node.op)
        return fam if fam in self.numerics.allow_hf32 else None

    def mx_axes(self, node) -> dict | None:
        """{input index: its K axis} of matmul ``node`` when the ``cube_mx`` what-if rounds its operands to MX;
        else None (conv and Einsum are not modelled: they keep their precision decision)."""
        if self.numerics.cube_mx is None:
            return None
        base = node.attrs.get("base", node.op) if node.op.startswith("_Fused") else node.op
        if base == "MatMul":
            return {0: 0 if node.attrs.get("transpose_a") else 1, 1: 1 if node.attrs.get("transpose_b") else 0}
        if base in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
            return {0: -2 if node.attrs.get("adj_x") else -1, 1: -1 if node.attrs.get("adj_y") else -2}
        return None

    def cube_elsewhere(self, node) -> bool:
        """Whether GE places cube op ``node`` off the AI Core: its type (float32, bf16) stays under the precision
        mode (must_keep_origin_dtype, a black list) on a SoC whose cube lacks it (Ascend910, Ascend310P3). The
        fusion passes leave such an op alone; the replay runs it on the AI CPU."""
        opdef = OPS.get(node.op)
        t = node.attrs.get("T")
        if (opdef is None or opdef.kind != CUBE or t not in ("float32", "bfloat16")
                or t in self.numerics.chip.cube_dtypes):
            return False
        p = self.precision
        if (p.keep_names or p.keep_types) and p.keeps(node.name, ascend_type(node.op), node.meta.get("fusion"),
                                                     node.meta.get("onnx_name")):
            return True     # --keep-dtype keeps it (the replay decides it so)
        return self.precision.decide(CUBE, ascend_type(node.op), t, []).dtype == t

    def context(self, dtype="float32", cube_out=None, *, op: str | None = None, tf_type: str | None = None,
                launch: int = 0) -> OpContext:
        """The context of one op; with determinism off, an op ``op`` of a type in ``MULTICORE_OPS`` gets
        its non-deterministic :class:`~ascend_emu.numerics.multicore.Launch` (``launch``: a training step)."""
        mc = None
        if self.numerics.deterministic_level == 0 and op is not None and tf_type in MULTICORE_OPS:
            cube, vec = self.numerics.cores
            mc = Launch(MULTICORE_OPS[tf_type].kind, op, self.numerics.run_seed, launch, cube, vec,
                        self.numerics.multicore)
        return OpContext.from_policy(self.numerics, dtype=dtype, cube_out=cube_out, multicore=mc)

    # -- replay ------------------------------------------------------------------------------
    def replay(self, model, inputs=None, dump_dir=None, *, signature=None, shapes=None, seed: int = 0,
               overwrite: bool = False, stats_only: bool = False, select=None, progress: bool = True,
               keep_tensors: bool = True, phases=None, launch: int = 0, digest: bool = False,
               disk_check: bool = True) -> ReplayResult:
        """Run ``model`` op by op on the emulated NPU.

        Parameters
        ----------
        model : Keras model, path (.keras, SavedModel dir, .pb/.pbtxt), tf.function,
            ConcreteFunction or :class:`ascend_emu.graph.Graph`. A model object or function replayed before is
            not traced and frozen again while its variables hold the same values
            (:mod:`ascend_emu.frontend.tf.graph_cache`).
        inputs : None (seeded random), dict name -> array, or CLI strings ``name=file.npy`` / ``file.npz``.
        dump_dir : where to write the dump (None: no dump).
        select : None, a regular expression on op names, or a callable ``(name, tf_type) -> bool``
            choosing the ops whose tensors are saved (:func:`ascend_emu.analysis.dump.op_selector`).
        digest : record every output's sha256 in the dump (bit-for-bit comparison without tensors).
        disk_check : estimate the dump from the graph's output shapes first (an unknown dimension counts as
            the inputs' batch): told on stderr over about 1 GB, refused (one line, nothing written) past the free
            space. A training checks its whole dump once instead.
        phases : None, or callable ``op name -> str`` naming each op's phase (training steps:
            forward, backward, update), recorded in the dump.
        launch : which launch of the model this is (a training step): with determinism off, seeds the
            arrival orders with ``run_seed`` and the op names, so each step draws afresh.
        keep_tensors : keep every op's output in ``ReplayResult.tensors`` (False: only the outputs, each tensor
            dropped after its last use). False without a dump also lets the walk cancel the transposes an ONNX
            model's elementwise ops sit between (:mod:`ascend_emu.npu.layout`: the same outputs and status, fewer
            Transpose records).

        Returns
        -------
        ReplayResult
        """
        from ..frontend.tf.graph_cache import load_graph_cached
        from ..frontend.inputs import inputs_sha256, make_inputs

        # a Keras model or tf.function seen before, with the same variable values: its loaded graph again
        graph = model if isinstance(model, Graph) else load_graph_cached(model, signature=signature,
                                                                         input_shapes=shapes)
        feeds = make_inputs(graph, inputs, seed=seed, shapes=shapes)
        fused = self._fused(graph)
        self._check_supported(fused.nodes)
        self._warn_unmatched_keep_dtype(graph, fused.nodes)
        # ASCEND_EMU_PIN_THREADS: auto (the default), 1 or 0 (npu/threads.py); entered at the first op on all threads
        pinned = Pinned()
        writer = None
        if dump_dir is not None and disk_check:
            from ..analysis.dump import graph_dump_bytes, op_selector
            from .training import _disk_check

            batch = max([int(np.shape(v)[0]) for v in feeds.values() if np.ndim(v)] or [1])
            keep = op_selector(select) if isinstance(select, str) else select
            _disk_check(graph_dump_bytes(fused.nodes, batch, stats_only=stats_only, select=keep), dump_dir,
                        "the dump", fix="dump statistics only (--stats-only), fewer tensors (--select) or free space")
        if dump_dir is not None:
            from ..analysis.dump import DumpWriter

            writer = DumpWriter(dump_dir, kind="npu", config=self.config(),
                                model=graph.dump_model(), inputs_sha256=inputs_sha256(feeds), overwrite=overwrite, stats_only=stats_only,
                                select=select, digest=digest, sources=graph.sources())
        run = _Run(self, graph, feeds, writer, keep_tensors, phases, launch)
        t0 = time.perf_counter()
        nodes = fused.nodes
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(nodes), desc="replay", unit="op", leave=False, dynamic_ncols=True, disable=None)
        # nobody sees a tensor but the outputs (no dump, no kept tensors): layouts planned once (npu/layout.py)
        tf1, plan, run.prepared, trial = self._plan(nodes, None if keep_tensors else tuple(graph.outputs),
                                                    layout=writer is None and not keep_tensors)
        # a training step's cube ops on one thread or as the size rule says: timed over the plan's first replays
        way = None
        if trial is not None and phases is not None and run.threads.full > 1:
            way = trial.pick() if writer is None else trial.choice   # (a dump's writes are not timed)
        run.serial_cube = way == 0
        run.threads.pin = pinned
        try:
            if writer is not None:
                writer.__enter__()
                if not tf1:    # (with TF1 control flow, recorded as each execution of the fused op runs)
                    for f in fused.fused_away:
                        writer.add_fused(f["name"], f["tf_type"], f["rule"], f["into"])

            def on_node(node, args, outs):
                if bar is not None:
                    bar.update(1)

            if tf1:
                # TF1 control flow: dead branches, loop frames; every op of every iteration under its own name
                swallowed: dict = {}
                for f in fused.fused_away:
                    swallowed.setdefault(f["into"], []).append(f)

                def on_executed(node, args, outs):
                    on_node(node, args, outs)
                    orig = node.meta.get("executes", node.name)
                    if writer is not None:
                        # a fusion inside a loop swallows the op in every iteration, under that iteration's name
                        for f in swallowed.get(orig, ()):
                            writer.add_fused(sibling_name(node.name, orig, f["name"]), f["tf_type"], f["rule"],
                                             node.name)
                env = run_dataflow(nodes, {}, run.eval_node, on_control=run.record_control, on_node=on_executed)
                check_live(env, graph.outputs)
            else:
                # the casts of a tensor die with it (bounded memory on large models)
                env = interpret(nodes, {}, run.eval_node, on_node=on_node if bar is not None else None,
                                on_release=run.forget, plan=plan)
            elapsed = time.perf_counter() - t0
            if way is not None and writer is None and trial.choice is None:
                trial.add(way, elapsed)
            summary = run.summary(elapsed, fused)
            if writer is not None:
                # wall time and dump size are not part of the dump: same inputs and config, same bytes
                writer.finish({k: v for k, v in summary.items() if k != "seconds"})
                writer.__exit__(None, None, None)
                summary["dump_bytes"] = dump_bytes(dump_dir)
        except BaseException as e:
            if writer is not None:
                writer.__exit__(type(e), e, e.__traceback__)
            raise
        finally:
            run.threads.restore()
            pinned.__exit__(None, None, None)
            if bar is not None:
                bar.close()
        outputs = {t: env[t] for t in graph.outputs}
        if keep_tensors:
            env.update(run.cast_outputs)
            env.update(run.added_outputs)
            env.update(run.scoped_outputs)
        return ReplayResult(graph, outputs, env, run.records, run.status, summary,
                            dump=str(dump_dir) if dump_dir is not None else None, inputs=feeds)

    def _plan(self, nodes: list, keep, layout: bool = False) -> tuple:
        """(whether ``nodes`` hold TF1 control flow, the interpreter's walk over them releasing every tensor
        after its last use except the ``keep`` tensors (None: nothing released), the device's work per node
        kept between replays: ``replay._Run.prepared``, the thread trial of its training steps: ``threads.Trial``),
        worked out once per node list (training replays the same fused graph every step). The precision decisions
        in it are this device's: a device whose precision policy is replaced starts afresh. ``layout``: only ``keep`` is observed, so the walk may run
        elementwise ops in NHWC between cancelled transposes (:func:`ascend_emu.npu.layout.nhwc_plan`)."""
        key = (id(nodes), keep, id(self.precision), layout)
        cached = self._plan_cache.get(key)
        if (cached is not None and cached[0] is nodes and cached[1] == len(nodes)
                and cached[2] is self.precision):
            return cached[3]
        tf1 = has_dataflow_control_flow(nodes)
        # TF1 control flow runs nodes once per frame under new names: nothing kept per node there
        walk = nhwc_plan(nodes, keep) if layout and keep is not None and not tf1 else nodes
        made = (tf1, None if tf1 else schedule(walk, keep=keep), None if tf1 else dict.fromkeys(map(id, walk)),
                None if tf1 else Trial())
        if len(self._plan_cache) >= 8:
            self._plan_cache = {}
        self._plan_cache[key] = (nodes, len(nodes), self.precision, made)
        return made

    def _warn_unmatched_keep_dtype(self, graph: Graph, fused_nodes) -> None:
        """Say which --keep-dtype lines match no op of the model (a typo keeps nothing, silently otherwise)."""
        names, types = self.precision.keep_names, self.precision.keep_types
        if not names and not types:
            return
        have = {n.name for n in graph.nodes} | {n.name for n in fused_nodes}
        if graph.onnx is not None:
            have |= set(graph.onnx.nodes)
        if graph.pt2 is not None:       # an exported program's FX node names (a call's ops all keep its name)
            have |= {n.meta["torch_name"] for n in graph.nodes if "torch_name" in n.meta}
        have_types = {n.meta.get("ascend_type") or ascend_type(n.op) for n in fused_nodes}
        lost = sorted(n for n in names if n not in have) + sorted(f"OpType::{t}" for t in types if t not in have_types)
        if lost:
            import warnings

            warnings.warn(f"--keep-dtype line(s) matching no op of model {graph.name!r}, which keep nothing: "
                          + ", ".join(repr(x) for x in lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5
                                                                     else ""), stacklevel=3)

    def _fused(self, graph: Graph):
        """The graph after the enabled fusion passes, cached per graph (training replays the same graphs each
        step); a replaced fusion config or precision policy (whose lists decide which ops join a UB chain)
        fuses afresh."""
        cached = self._fusion_cache.get(id(graph))
        if (cached is not None and cached[0] is graph and cached[2] is self.fusion
                and cached[3] is self.precision and cached[4] is self.numerics):
            return cached[1]
        skip = None if self.numerics.chip.fp32_cube else self.cube_elsewhere
        fused = apply_fusion(graph, self.fusion, self.precision.lists, skip=skip)
        if len(self._fusion_cache) >= 4:     # data-parallel training alternates two graphs per step
            self._fusion_cache = {}
        self._fusion_cache[id(graph)] = (graph, fused, self.fusion, self.precision, self.numerics)
        return fused

    def train(self, model, data, *, loss=None, optimizer=None, learning_rate=None, optimizer_options=None,
              batch_size: int = 32, steps=None, epochs=None, loss_scale=None, shuffle: bool = False,
              seed: int = 0, dump_dir=None, dump_steps=None, reference: bool = False, reference_dump_dir=None,
              overflow_check: str = "status", overwrite: bool = False, progress: bool = True, ranks: int = 1,
              allreduce=None, allreduce_dtype=None, rank_init=None, check_rank_weights: bool = False,
              dump_options: dict | None = None):
        """Train a Keras model for whole steps (forward, backward, optimizer update) on the emulated NPU.

        Parameters
        ----------
        model : Keras 3 model (compiled, or with ``loss`` and ``optimizer`` given) or a ``.keras`` path; or a
            ``TrainStep`` of a stateful step (``train_step_from_tf_function``, ``train_step_from_tf1_graph``),
            which carries its loss, update and initial state.
        data : ``.npz`` path with arrays ``x`` and ``y``, a dict with them, or a pair ``(x, y)``.
        loss : Keras loss name or object (default: the compiled one); ``*_from_logits`` names work.
        optimizer : ``"sgd"``, ``"adam"``, ``"adamw"``, ``"rmsprop"`` or a Keras optimizer (default: the
            compiled one); ``learning_rate`` and ``optimizer_options`` (momentum, nesterov, beta_1, ...)
            override its settings.
        batch_size, steps, epochs : batches are taken in order (``shuffle=True``: a permutation per
            epoch from ``seed``); ``steps`` defaults to one epoch.
        loss_scale : None/``"none"``, ``"fixed:1024"``, ``"dynamic"`` (Keras' LossScaleOptimizer defaults) or
            ``"exponential:init=..,incr_every=..,decr_every=..,incr_ratio=..,decr_ratio=.."`` (the TF
            adapter's ExponentialUpdateLossScaleManager), or a manager object.
        overflow_check : ``"status"`` (the float status register, as the NPU) or ``"isfinite"``.
        dump_dir, dump_steps : a dump per listed step in ``dump_dir/step-N`` (forward, backward and update
            ops, each with its phase); with ``reference`` the float32 reference of the same step in
            ``reference_dump_dir/step-N`` (default ``dump_dir/reference``). Their size is estimated from the
            traced step first: told on stderr over about 1 GB, refused (nothing written) past the free space.
        dump_options : what each step's dump records, as :meth:`replay` takes it: ``stats_only``, ``select``,
            ``digest`` (random-error detection dumps statistics and digests; default every tensor).
        reference : also train in TensorFlow float32 from the same weights on the same batches (with
            ``ranks``, one device on the whole global batch).
        ranks : data-parallel training over this many emulated ranks (NUMERICS.md section 12): each batch
            splits into contiguous shards (``batch_size`` must divide by ``ranks``), each rank runs forward
            and backward on its shard with its own weights, the gradients are all-reduced (their mean),
            and every rank applies the update; an overflow on any rank skips the step on all.
        allreduce : ``"ring"``, ``"hd"`` (recursive halving-doubling; ``"tree"`` is the same) or ``"mesh"``;
            default the SoC's (Ascend910: ring, Ascend910B: mesh). With the device's determinism off,
            ``mesh`` adds in an arrival order drawn from ``run_seed``.
        allreduce_dtype : ``"float32"`` (default) or ``"float16"`` (gradients cast to fp16 and summed in it).
        rank_init : ``{rank: seed}`` (a Keras model re-initialised under that seed) or ``{rank: {state key:
            array}}``: plant another initialisation on a rank (what ``check_rank_weights`` finds).
        check_rank_weights : compare every rank's initial weights with rank 0's before training (seed 003's
            check); the result's ``ranks["initial_differences"]`` lists each differing rank and variable.

        Returns
        -------
        ascend_emu.npu.training.TrainResult
        """
        from .data_parallel import check_options, train_data_parallel
        from .training import train

        n, plant = check_options(ranks, allreduce, allreduce_dtype, rank_init, check_rank_weights, dump_dir)
        if n > 1:
            if dump_options:
                raise AscendEmuError("dump_options apply to single-rank training (ranks=1)")
            return train_data_parallel(self, model, data, ranks=n, plant=plant, allreduce=allreduce,
                                       allreduce_dtype=allreduce_dtype, check_rank_weights=check_rank_weights,
                                       overflow_check=overflow_check, reference=reference, progress=progress,
                                       dump_steps=dump_steps, loss=loss, optimizer=optimizer,
                                       learning_rate=learning_rate, optimizer_options=optimizer_options,
                                       batch_size=batch_size, steps=steps, epochs=epochs, loss_scale=loss_scale,
                                       shuffle=shuffle, seed=seed, overwrite=overwrite)
        return train(self, model, data, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
                     optimizer_options=optimizer_options, batch_size=batch_size, steps=steps, epochs=epochs,
                     loss_scale=loss_scale, shuffle=shuffle, seed=seed, dump_dir=dump_dir, dump_steps=dump_steps,
                     reference=reference, reference_dump_dir=reference_dump_dir, overflow_check=overflow_check,
                     overwrite=overwrite, progress=progress, dump_options=dump_options)

    def _check_supported(self, nodes):
        missing = {n.op for n in nodes if n.op not in OPS and n.op != "Placeholder"
                   and n.meta.get("aten_engine", "AICPU") == "AICPU"}
        if missing and not self.aicpu_fallback:
            raise UnsupportedOpError(missing)


def format_replay_summary(summary: dict, dump=None) -> str:
    """Lines for a replay's ``summary`` dict: ops per engine and dtype, fusion counts, overflow, status."""
    lines = [f"ops executed: {summary['ops']} (inserted casts: {summary['inserted_casts']}, "
             f"fused away: {summary.get('fused_away', 0)})"]
    for engine, per in summary["per_engine_dtype"].items():
        lines.append(f"  {engine:<7} " + ", ".join(f"{dt}: {n}" for dt, n in per.items()))
    if summary.get("fusion_counts"):
        lines.append("fusion: " + ", ".join(f"{k} x{v}" for k, v in summary["fusion_counts"].items()))
    lines.append(f"overflowing ops: {summary['overflowing_ops']}"
                 + (f" (first: {summary['first_overflow']})" if summary["first_overflow"] else ""))
    lines.append(f"float status register: 0x{summary['float_status']:x}"
                 + (" = " + "; ".join(summary["float_status_names"]) if summary["float_status"] else ""))
    line = f"time: {summary.get('seconds', 0):.2f} s"
    if dump:
        line += f"; dump: {dump} ({fmt_bytes(summary.get('dump_bytes', 0))})"
    lines.append(line)
    return "\n".join(lines)

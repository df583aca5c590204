"""npu_bridge.estimator.npu.npu_config (stand-in; H TF1/estimator/npu/npu_config.py): NPURunConfig and its
option objects. tf.estimator is gone from TensorFlow >= 2.16, so NPURunConfig keeps its options (checked as
the adapter checks them) for NPUEstimator, which says so in one line."""
from ascend_emu.frontend.tf.shim.options import read_parameter_map
from ascend_emu.frontend.tf.shim.adapter import AdapterOptionError, where


class DumpConfig:
    def __init__(self, enable_dump=False, dump_path=None, dump_step=None, dump_mode="output",
                 enable_dump_debug=False, dump_debug_mode="all", dump_data="tensor", dump_layer=None):
        self._enable_dump, self._dump_path, self._dump_step = enable_dump, dump_path, dump_step
        self._dump_mode, self._enable_dump_debug, self._dump_debug_mode = dump_mode, enable_dump_debug, dump_debug_mode
        self.dump_data, self.dump_layer = dump_data, dump_layer

    def parameter_map(self) -> dict:
        p = {"enable_dump": bool(self._enable_dump), "enable_dump_debug": bool(self._enable_dump_debug),
             "dump_mode": self._dump_mode, "dump_debug_mode": self._dump_debug_mode, "dump_data": self.dump_data}
        for k, v in (("dump_path", self._dump_path), ("dump_step", self._dump_step), ("dump_layer", self.dump_layer)):
            if v is not None:
                p[k] = v
        return p


class ProfilingConfig:
    def __init__(self, enable_profiling=False, profiling_options=None):
        self._enable_profiling, self._profiling_options = enable_profiling, profiling_options


class MemoryConfig:
    def __init__(self, atomic_clean_policy=0, static_memory_policy=0, memory_optimization_policy=None,
                 variable_use_1g_huge_page=0):
        self.atomic_clean_policy = atomic_clean_policy


class DynamicInputConfig:
    def __init__(self, input_shape, dynamic_dims, dynamic_node_type, compile_hybrid_mode=None):
        self._input_shape, self._dynamic_dims = input_shape, dynamic_dims


class ExperimentalConfig:
    def __init__(self, **kwargs):
        self.options = kwargs


#: NPURunConfig keywords that are RunConfig's or option objects, not parameter_map keys
_RUN_CONFIG = ("model_dir", "tf_random_seed", "save_summary_steps", "save_checkpoints_steps", "save_checkpoints_secs",
               "session_config", "keep_checkpoint_max", "keep_checkpoint_every_n_hours", "log_step_count_steps",
               "distribute", "train_distribute", "eval_distribute", "profiling_config", "memory_config",
               "dynamic_input_config", "experimental_config", "horovod_mode", "job_start_file")


class NPURunConfig:
    """The adapter's RunConfig: its NPU keywords become the session's parameter_map (checked now)."""

    def __init__(self, iterations_per_loop=1, mix_compile_mode=False, graph_run_mode=1, enable_data_pre_proc=True,
                 dump_config=None, precision_mode=None, precision_mode_v2=None, **kwargs):
        if dump_config is not None and not isinstance(dump_config, DumpConfig):
            raise AdapterOptionError("dump_config must be a class of DumpConfig")
        self.dump_config = dump_config
        self.run_config = {k: v for k, v in kwargs.items() if k in _RUN_CONFIG}
        p = {"iterations_per_loop": iterations_per_loop, "mix_compile_mode": mix_compile_mode,
             "graph_run_mode": graph_run_mode, "enable_data_pre_proc": enable_data_pre_proc, "use_off_line": True}
        for k, v in (("precision_mode", precision_mode), ("precision_mode_v2", precision_mode_v2)):
            if v is not None:
                p[k] = v
        p.update({k: v for k, v in kwargs.items() if k not in _RUN_CONFIG and v is not None})
        p.update(dump_config.parameter_map() if dump_config is not None else
                 {"enable_dump": False, "enable_dump_debug": False})
        self.source = f"NPURunConfig at {where()}"
        try:
            read_parameter_map(p)
        except AdapterOptionError as e:
            raise AdapterOptionError(f"{self.source}: {e}") from None
        self.parameter_map = p
        self.iterations_per_loop = iterations_per_loop
        self.model_dir = kwargs.get("model_dir")
        self.session_config = kwargs.get("session_config")

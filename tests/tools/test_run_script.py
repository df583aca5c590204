"""``ascend-emu run``: scripts ported to Ascend (``npu_bridge`` / ``npu_device``) run unchanged on the emulated NPU.

The scripts are written in the three forms the TF adapter documents (ASCEND-FACTS.md section 14.8): a TF1
``sess.run`` loop with an ``NpuOptimizer`` session config and ``NPULossScaleOptimizer``; TF1 Keras with
``set_keras_session_npu_config``; TF2 Keras with ``npu_device`` and ``NpuLossScaleOptimizer``. Each runs in its
own process (``disable_eager_execution`` and the adapter's session patch are process-wide), as a user runs it;
the option errors and the script's own failures run in this process through ``main``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from ascend_emu.analysis.dump import load_dump  # noqa: E402
from ascend_emu.cli.main import main  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402

MIXLIST = '{"black-list": {"to-add": ["MatMul"]}}'
#: the TF1 script's: Square kept in float32, off the path of the planted overflow (the loss gradient's Cast)
MIXLIST_SQUARE = '{"black-list": {"to-add": ["Square"]}}'

TF1_SCRIPT = """
import argparse
import numpy as np
import tensorflow as tf
from npu_bridge.npu_init import *

tf.compat.v1.disable_eager_execution()
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--mixlist")
p.add_argument("--dump")
p.add_argument("--debug")
args = p.parse_args()

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.normal(size=(64, 2)).astype("float32")
xp = tf.compat.v1.placeholder(tf.float32, (None, 8), name="x")
yp = tf.compat.v1.placeholder(tf.float32, (None, 2), name="y")
w = tf.compat.v1.get_variable("w", (8, 2), initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
with npu_scope.keep_dtype_scope():
    h = tf.matmul(xp, w, name="kept")
loss = tf.reduce_mean(tf.square(h - yp))
# 2**17 times the loss's gradient is beyond float16's 65504: the planted overflow
manager = ExponentialUpdateLossScaleManager(init_loss_scale=2 ** 17, incr_every_n_steps=1000)
opt = NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.01), manager)
train = opt.minimize(loss)

config = tf.compat.v1.ConfigProto()
custom_op = config.graph_options.rewrite_options.custom_optimizers.add()
custom_op.name = "NpuOptimizer"
custom_op.parameter_map["use_off_line"].b = True
custom_op.parameter_map["precision_mode"].s = tf.compat.as_bytes("allow_mix_precision")
custom_op.parameter_map["auto_tune_mode"].s = tf.compat.as_bytes("RL,GA")
if args.mixlist:
    custom_op.parameter_map["modify_mixlist"].s = tf.compat.as_bytes(args.mixlist)
if args.dump:
    custom_op.parameter_map["enable_dump"].b = True
    custom_op.parameter_map["dump_path"].s = tf.compat.as_bytes(args.dump)
    custom_op.parameter_map["dump_step"].s = tf.compat.as_bytes("0|2")
if args.debug:
    custom_op.parameter_map["enable_dump_debug"].b = True
    custom_op.parameter_map["dump_path"].s = tf.compat.as_bytes(args.debug)
    custom_op.parameter_map["dump_debug_mode"].s = tf.compat.as_bytes("all")
config.graph_options.rewrite_options.remapping = RewriterConfig.OFF
sess = tf.compat.v1.Session(config=config)
sess.run(tf.compat.v1.global_variables_initializer())
w0 = sess.run(w)
for i in range(args.steps):
    _, lv = sess.run([train, loss], feed_dict={xp: x[16 * (i % 4):][:16], yp: y[16 * (i % 4):][:16]})
print("UNCHANGED", bool((sess.run(w) == w0).all()))
sess.close()
"""

TF1_KERAS_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf
from npu_bridge.npu_init import *
import keras

config = tf.compat.v1.ConfigProto()
custom_op = config.graph_options.rewrite_options.custom_optimizers.add()
custom_op.name = "NpuOptimizer"
custom_op.parameter_map["use_off_line"].b = True
custom_op.parameter_map["precision_mode"].s = tf.compat.as_bytes("allow_mix_precision")
custom_op.parameter_map["modify_mixlist"].s = tf.compat.as_bytes(sys.argv[1])
custom_op.parameter_map["enable_dump"].b = True
custom_op.parameter_map["dump_path"].s = tf.compat.as_bytes(sys.argv[2])
custom_op.parameter_map["dump_step"].s = tf.compat.as_bytes("1")
config.graph_options.rewrite_options.remapping = RewriterConfig.OFF
npu_keras_sess = set_keras_session_npu_config(config=config)

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.normal(size=(64, 2)).astype("float32")
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
h = model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[NPUBroadcastGlobalVariablesCallback(0)])
print("LOSS", repr(h.history["loss"][0]))
close_session(npu_keras_sess)
"""

TF2_KERAS_SCRIPT = """
import sys
import npu_device as npu
npu.global_options().precision_mode = "allow_mix_precision"
npu.global_options().modify_mixlist = sys.argv[1]
npu.global_options().dump_config.enable_dump = True
npu.global_options().dump_config.dump_path = sys.argv[2]
npu.global_options().dump_config.dump_step = "0"
npu.global_options().auto_tune_mode = "RL,GA"
npu.open().as_default()

import numpy as np
import keras

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.normal(size=(64, 2)).astype("float32")
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
opt = npu.train.optimizer.NpuLossScaleOptimizer(keras.optimizers.SGD(0.01), dynamic=True, initial_scale=2 ** 10,
                                                dynamic_growth_steps=2)
model.compile(optimizer=opt, loss="mse")
model.fit(x, y, batch_size=16, epochs=1, verbose=0)
print("SCALE", float(opt.dynamic_scale.numpy()))
"""


def _run(tmp_path, source: str, *args, soc=None, flags=()):
    """``ascend-emu run`` of ``source`` in a fresh process: (process, record or None)."""
    script = tmp_path / "train_npu.py"
    script.write_text(source)
    record = tmp_path / "run.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = [sys.executable, "-m", "ascend_emu.cli", "run", "--json", str(record)]
    cmd += (["--soc", soc] if soc else []) + list(flags)
    proc = subprocess.run(cmd + [str(script), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=600)
    return proc, (json.loads(record.read_text()) if record.exists() else None)


def _options(record) -> dict:
    return {o["name"]: o for o in record["options"]}


def _manager_scales(init, steps, finite):
    """The adapter's ExponentialUpdateLossScaleManager with its defaults (decr_every_n_nan_or_inf=2,
    decr_ratio=0.8; ASCEND-FACTS.md section 5): the scale each step runs with."""
    scale, good, bad, out = float(init), 0, 0, []
    for ok in finite[:steps]:
        out.append(scale)
        if ok:
            good, bad = good + 1, 0
        elif bad + 1 >= 2:
            scale, good, bad = max(1.0, scale * 0.8), 0, 0
        else:
            bad, good = bad + 1, 0
    return out


@pytest.mark.models
def test_tf1_session_script_with_npu_optimizer_config_and_loss_scale_manager(tmp_path):
    """The planted overflow (scale 2**17 under allow_mix_precision) skips every step, the manager lowers the scale
    by its defaults (0.8 after two bad steps), the variables stay; the options, mixlist and dumps are recorded."""
    (tmp_path / "mixlist.json").write_text(MIXLIST_SQUARE)
    (tmp_path / "dump").mkdir()
    proc, rec = _run(tmp_path, TF1_SCRIPT, "--steps", 5, "--mixlist", tmp_path / "mixlist.json",
                     "--dump", tmp_path / "dump")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "UNCHANGED True" in proc.stdout
    seg, = rec["segments"]
    steps = seg["steps"]
    assert [s["skipped"] for s in steps] == [True] * 5 and all(s["float_status"] for s in steps)
    assert [s["loss_scale"] for s in steps] == _manager_scales(2 ** 17, 5, [False] * 5)
    assert seg["config"]["loss_scale"]["kind"] == "exponential" and seg["config"]["loss_scale"]["decr_ratio"] == 0.8
    assert seg["config"]["overflow_check"] == "status"           # the 910 saturates: the float status decides
    opts = _options(rec)
    assert opts["precision_mode"]["value"] == "allow_mix_precision" and opts["precision_mode"]["status"] == "honoured"
    assert opts["precision_mode"]["from"] == "tf.compat.v1.Session(config=...) NpuOptimizer parameter_map at train_npu.py:46"
    assert opts["modify_mixlist"]["status"] == "honoured" and opts["auto_tune_mode"]["status"] == "noted"
    assert "noted: auto_tune_mode (tf.compat.v1.Session(config=...) NpuOptimizer parameter_map at train_npu.py:46): " \
           "changes nothing here: a legacy name" in proc.stdout
    assert seg["config"]["device"]["precision_mode"] == "allow_mix_precision"
    assert "modified by" in seg["config"]["device"]["mixlist_source"]
    assert sorted(seg["dumps"]) == ["0", "2"]
    dump = load_dump(seg["dumps"]["0"])
    assert dump.config["precision_mode"] == "allow_mix_precision"
    dtypes = {o["name"]: o["compute_dtype"] for o in dump.ops if o["tf_type"] in ("Square", "MatMul")}
    # Square black-listed by the script's mixlist, the forward MatMul kept by its keep_dtype_scope
    assert dtypes == {"Square": "float32", "kept": "float32", "gradients/kept_grad/MatMul_1": "float16"}
    assert opts["keep_dtype_scope"]["from"] == "keep_dtype_scope at train_npu.py:21"
    assert "kept" in opts["keep_dtype_scope"]["value"]


@pytest.mark.models
def test_tf1_overflow_dump_names_the_op(tmp_path):
    """enable_dump_debug: the steps whose float status was set keep their dump and its overflow analysis."""
    (tmp_path / "dbg").mkdir()
    proc, rec = _run(tmp_path, TF1_SCRIPT, "--steps", 2, "--debug", tmp_path / "dbg")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(rec["overflow_dumps"]) == ["0", "1"]
    first = rec["overflow_dumps"]["0"]["first"]
    # the forward MatMul is kept in float32 (keep_dtype_scope): its weight gradient's float16 output saturates
    assert first == {"name": "gradients/kept_grad/MatMul_1", "tf_type": "MatMul"}
    assert "first overflow: gradients/kept_grad/MatMul_1 (MatMul)" in proc.stdout
    report = json.loads((tmp_path / "dbg" / "step-0.overflow.json").read_text())
    assert report["first"]["name"] == first["name"] and report["register"]["bits"]
    assert os.path.isdir(rec["overflow_dumps"]["0"]["dump"])


@pytest.mark.models
def test_tf1_keras_script_with_set_keras_session_npu_config(tmp_path):
    (tmp_path / "mixlist.json").write_text(MIXLIST)
    (tmp_path / "dump").mkdir()
    proc, rec = _run(tmp_path, TF1_KERAS_SCRIPT, tmp_path / "mixlist.json", tmp_path / "dump")
    assert proc.returncode == 0, proc.stderr[-3000:]
    seg, = rec["segments"]
    assert len(seg["steps"]) == 4 and not any(s["skipped"] for s in seg["steps"])
    # what the script's History says is the emulated run's mean loss
    loss = float(proc.stdout.split("LOSS")[1].split()[0])
    assert abs(loss - np.mean([s["loss"] for s in seg["steps"]])) < 1e-6
    opts = _options(rec)
    assert opts["precision_mode"]["value"] == "allow_mix_precision"
    assert opts["modify_mixlist"]["value"] == str(tmp_path / "mixlist.json")
    assert opts["precision_mode"]["from"] == ("set_keras_session_npu_config(config=...) NpuOptimizer parameter_map "
                                              "at train_npu.py:18")
    assert seg["config"]["device"]["precision_mode"] == "allow_mix_precision"
    assert list(seg["dumps"]) == ["1"]
    dump = load_dump(seg["dumps"]["1"])
    assert dump.config["precision_mode"] == "allow_mix_precision"
    assert {o["compute_dtype"] for o in dump.ops if o["tf_type"] == "MatMul"} == {"float32"}
    assert any(n["call"].startswith("NPUBroadcastGlobalVariablesCallback") for n in rec["notes"])


@pytest.mark.models
def test_tf2_keras_script_with_npu_device_and_npu_loss_scale_optimizer(tmp_path):
    """global_options() before open().as_default(); NpuLossScaleOptimizer grows its scale every 2 finite steps;
    on the Ascend910B (INF/NaN mode) the overflow check is Keras' own (the gradients' finiteness)."""
    (tmp_path / "mixlist.json").write_text(MIXLIST)
    (tmp_path / "dump").mkdir()
    proc, rec = _run(tmp_path, TF2_KERAS_SCRIPT, tmp_path / "mixlist.json", tmp_path / "dump", soc="Ascend910B",
                     flags=["--msprobe"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    seg, = rec["segments"]
    assert [s["loss_scale"] for s in seg["steps"]] == [1024.0, 1024.0, 2048.0, 2048.0]
    assert "SCALE 4096.0" in proc.stdout                           # written back into the script's optimizer
    assert seg["config"]["loss_scale"]["init"] == 1024.0 and seg["config"]["loss_scale"]["incr_every"] == 2
    assert seg["config"]["overflow_check"] == "isfinite" and seg["config"]["device"]["overflow_mode"] == "inf_nan"
    opts = _options(rec)
    assert opts["precision_mode"]["from"].startswith("npu.global_options() at npu.open().as_default()")
    assert opts["auto_tune_mode"]["status"] == "noted" and opts["enable_dump"]["status"] == "honoured"
    dump = load_dump(seg["dumps"]["0"])
    assert {o["compute_dtype"] for o in dump.ops if o["tf_type"] == "MatMul"} == {"float32"}
    # --msprobe: the same dump in msprobe's layout, which import_msprobe reads back op for op
    from ascend_emu.analysis.msprobe import import_msprobe

    assert rec["msprobe_dumps"]["0"] == str(tmp_path / "dump" / "msprobe" / "step0" / "rank0")
    back = import_msprobe(rec["msprobe_dumps"]["0"], tmp_path / "back")
    assert [o["name"] for o in back.ops] == [o["name"] for o in dump.ops]


# --------------------------------------------------------------------------- in this process

BAD_CONFIG = """
import tensorflow as tf
from npu_bridge.npu_init import *

config = tf.compat.v1.ConfigProto()
custom_op = config.graph_options.rewrite_options.custom_optimizers.add()
custom_op.name = "NpuOptimizer"
{lines}
sess = tf.compat.v1.Session(config=config)
print("NOT REACHED")
"""


def _main_run(tmp_path, capsys, source, *args):
    script = tmp_path / "train_npu.py"
    script.write_text(source)
    code = main(["run", str(script), *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("lines, message", [
    ('custom_op.parameter_map["precision_mode"].s = b"allow_mix_precision"\n'
     'custom_op.parameter_map["precision_mode_v2"].s = b"mixed_float16"',
     "'precision_mode' and 'precision_mode_v2' can not be assigned at the same time."),
    ('custom_op.parameter_map["precision_mode"].s = b"force_fp16"\n'
     'custom_op.parameter_map["modify_mixlist"].s = b"ops.json"',
     "modify_mixlist is assigned, please ensure that precision_mode is assigned to 'allow_mix_precision'"),
    ('custom_op.parameter_map["enable_dump"].b = True', "if use dump function, dump_path must be set."),
    ('custom_op.parameter_map["precision_mode"].s = b"allow_fp16"',
     "precision_mode: allow_fp16 is invalid, it should be one of the list:[force_fp32, "),
    ('custom_op.parameter_map["enable_dump"].b = True\ncustom_op.parameter_map["dump_path"].s = b"/nonexistent/d"',
     "the path /nonexistent/d is not directory."),
])
def test_bad_option_values_give_the_adapters_message_in_one_line(tmp_path, capsys, lines, message):
    code, out, err = _main_run(tmp_path, capsys, BAD_CONFIG.format(lines=lines))
    assert code == 2 and "NOT REACHED" not in out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("ascend-emu: error: tf.compat.v1.Session(config=...) NpuOptimizer parameter_map at "
                          "train_npu.py:") and message in err


def test_a_bad_global_options_value_is_one_line(tmp_path, capsys):
    code, _, err = _main_run(tmp_path, capsys, "import npu_device as npu\n"
                                               "npu.global_options().precision_mode = 'fp17'\n")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "precision_mode: 'fp17' not in optional list" in err


def test_npu_estimator_says_tf_estimator_is_absent(tmp_path, capsys):
    code, _, err = _main_run(tmp_path, capsys, "from npu_bridge.npu_init import *\n"
                                               "cfg = NPURunConfig(precision_mode='allow_mix_precision', "
                                               "auto_tune_mode='RL,GA')\n"
                                               "NPUEstimator(model_fn=None, config=cfg)\n")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "NPUEstimator: tf.estimator is not in the installed TensorFlow" in err


def test_a_script_that_fails_on_its_own_exits_with_its_traceback_and_status(tmp_path, capsys):
    code, _, err = _main_run(tmp_path, capsys, "import npu_device as npu\n\ndef f():\n    return 1 / 0\n\nf()\n")
    assert code == 1
    assert err.startswith("Traceback (most recent call last):")
    assert 'train_npu.py", line 6, in <module>' in err and 'line 4, in f' in err
    assert err.strip().endswith("ZeroDivisionError: division by zero") and "runpy" not in err
    code, _, _ = _main_run(tmp_path, capsys, "import sys\nsys.exit(3)\n")
    assert code == 3


def test_the_shim_is_put_back_after_the_run(tmp_path, capsys):
    import tensorflow as tf

    init = tf.compat.v1.Session.__init__
    code, out, _ = _main_run(tmp_path, capsys, "import npu_bridge, npu_device\nprint(npu_bridge.__version__)\n")
    assert code == 0 and "v1.15.0" in out
    assert tf.compat.v1.Session.__init__ is init
    assert "npu_bridge" not in sys.modules and not any("shim" in p for p in sys.path)
    from ascend_emu.frontend.tf.shim import SHIM_DIR

    sys.path.insert(0, SHIM_DIR)
    try:
        with pytest.raises(ImportError, match="run the script with `ascend-emu run script.py`"):
            import npu_bridge  # noqa: F401
    finally:
        sys.path.remove(SHIM_DIR)
        sys.modules.pop("npu_bridge", None)


def test_parameter_map_checks():
    from ascend_emu.frontend.tf.shim.options import AdapterOptionError, dump_steps, read_parameter_map

    assert dump_steps("0|3-5|9") == [0, 3, 4, 5, 9] and dump_steps(None) == "all"
    for bad, msg in (("5-3", "the first step is >= second step"), ("a", "dump_step string style is error")):
        with pytest.raises(AdapterOptionError, match=msg):
            read_parameter_map({"enable_dump": True, "dump_path": "/", "dump_step": bad})
    with pytest.raises(AdapterOptionError, match="dump mode should be one of the list"):
        read_parameter_map({"enable_dump": True, "dump_path": "/", "dump_mode": "both"})
    with pytest.raises(AdapterOptionError, match="precision_mode_v2 is assigned to 'mixed_float16'"):
        read_parameter_map({"precision_mode_v2": "origin", "modify_mixlist": "x.json"})
    # unknown keys pass, as the adapter ignores them; a mixlist under a mixed v2 mode is fine
    assert read_parameter_map({"precision_mode_v2": "mixed_float16", "modify_mixlist": "x", "my_key": 1})


IMPORTS_SCRIPT = """
import json
import npu_bridge.npu_init as init_module
from npu_bridge.npu_init import *
from npu_bridge.estimator import npu_ops
from npu_bridge.estimator.npu_unary_ops import npu_unary_ops
from npu_bridge.estimator.npu.npu_config import NPURunConfig, DumpConfig
from npu_bridge.estimator.npu.npu_loss_scale_optimizer import NPULossScaleOptimizer
from npu_bridge.estimator.npu.npu_loss_scale_manager import FixedLossScaleManager, ExponentialUpdateLossScaleManager
from npu_bridge.estimator.npu.npu_optimizer import NPUDistributedOptimizer, NPUOptimizer
from npu_bridge.estimator.npu.npu_callbacks import NPUBroadcastGlobalVariablesCallback
from npu_bridge.estimator.npu import npu_scope, util, npu_plugin
from npu_bridge.hccl import hccl_ops
import npu_device as npu
from npu_device.compat.v1.npu_init import RewriterConfig as RC2, npu_config_proto as ncp2
from npu_device.train.optimizer import NpuLossScaleOptimizer
from npu_device import distribute
import tensorflow as tf

names = [n for n in ("tf", "os", "session", "backend", "config_pb2", "rewriter_config_pb2", "RewriterConfig",
                     "NPURunConfig", "DumpConfig", "NPUEstimator", "NPULossScaleOptimizer", "FixedLossScaleManager",
                     "ExponentialUpdateLossScaleManager", "NPUDistributedOptimizer", "npu_distributed_optimizer_wrapper",
                     "NPUOptimizer", "npu_ops", "npu_scope", "util", "npu_plugin", "npu_unary_ops", "hccl_ops",
                     "npu_config_proto", "set_keras_session_npu_config", "init_resource", "shutdown_resource",
                     "close_session", "get_npu_rank_size", "create_group", "get_rank_size") if n not in globals()]
cfg = npu_config_proto()
m = FixedLossScaleManager(loss_scale=1024)
e = ExponentialUpdateLossScaleManager(init_loss_scale=2 ** 15, incr_every_n_steps=1000)
x = tf.constant([1.0, -2.0])
print(json.dumps({
    "missing": names, "same_rc": RC2 is RewriterConfig,
    "entry": [o.name for o in cfg.graph_options.rewrite_options.custom_optimizers],
    "remapping_off": cfg.graph_options.rewrite_options.remapping == RewriterConfig.OFF,
    "managers": [m.get_loss_scale(), e.get_loss_scale(), e.decr_every_n_nan_or_inf, e.decr_ratio, e.incr_ratio],
    "hccl": hccl_ops.allreduce(x, "sum") is x, "ranks": [get_npu_rank_size(), get_rank_size()],
    "iteration": util.set_iteration_per_loop(None, "op", 10),
    "gelu": [float(v) for v in npu_unary_ops.gelu(x).numpy()],
    "wrapper": npu_distributed_optimizer_wrapper("sgd").__class__.__name__,
    "tf2_all_reduce": distribute.all_reduce(x) is x,
}))
"""


def test_the_adapters_modules_and_names_import(tmp_path, capsys):
    """Every submodule the issue lists imports; the star import of npu_init brings what the adapter's does
    (RewriterConfig, tf, the helpers); npu_device.compat.v1 is npu_bridge."""
    code, out, _ = _main_run(tmp_path, capsys, IMPORTS_SCRIPT)
    assert code == 0
    got = json.loads(out.splitlines()[0])
    assert got["missing"] == [] and got["same_rc"] and got["entry"] == ["NpuOptimizer"] and got["remapping_off"]
    assert got["managers"] == [1024.0, 32768.0, 2, 0.8, 2]
    assert got["hccl"] and got["tf2_all_reduce"] and got["ranks"] == [1, 1] and got["iteration"] == "op"
    # the Gelu op's host kernel: the tanh form
    t = np.array([1.0, -2.0])
    tanh_gelu = 0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t ** 3)))
    np.testing.assert_allclose(got["gelu"], tanh_gelu, rtol=0, atol=1e-6)    # float32
    assert got["wrapper"] == "SGD"
    assert "set_iteration_per_loop(10): one emulated step per sess.run" in out


def test_bad_run_command_lines(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"ascend-emu: error: run: no script '{tmp_path / 'missing.py'}'; give the path "
                                        "of the Python script to run"]
    with pytest.raises(SystemExit) as e:
        main(["run"])
    assert e.value.code == 2 and "usage:" in capsys.readouterr().err
    (tmp_path / "s.py").write_text("print('ran')\n")
    assert main(["run", "--json", str(tmp_path / "no" / "dir" / "r.json"), str(tmp_path / "s.py")]) == 2
    out, err = capsys.readouterr()
    assert "ran" not in out and len(err.strip().splitlines()) == 1    # refused before the script runs


TF1_IN_GRAPH_SCRIPT = """
import json
import numpy as np
import tensorflow as tf
from npu_bridge.npu_init import *

rng = np.random.default_rng(0)
x = rng.normal(size=(16, 8)).astype("float32")
y = rng.normal(size=(16, 2)).astype("float32")
g = tf.Graph()
with g.as_default():
    xp = tf.compat.v1.placeholder(tf.float32, (None, 8), name="x")
    yp = tf.compat.v1.placeholder(tf.float32, (None, 2), name="y")
    w = tf.compat.v1.get_variable("w", (8, 2), initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    same = npu_ops.dropout(xp, 1.0) is xp
    loss = tf.reduce_mean(tf.square(tf.matmul(xp, w) - yp))
    opt = NPUOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.01), FixedLossScaleManager(loss_scale=2 ** 20),
                       is_loss_scale=True)
    train = opt.minimize(loss)
    status = npu_unary_ops.npu_get_float_status_v2()
    config = tf.compat.v1.ConfigProto()
    custom_op = config.graph_options.rewrite_options.custom_optimizers.add()
    custom_op.name = "NpuOptimizer"
    custom_op.parameter_map["precision_mode"].s = b"allow_mix_precision"
    custom_op.parameter_map["op_select_implmode"].s = b"high_performance"
    custom_op.parameter_map["deterministic"].i = 1
    custom_op.parameter_map["fusion_switch_file"].s = b"FUSION"
    sess = tf.compat.v1.Session(graph=g, config=config)
    sess.run(tf.compat.v1.global_variables_initializer())
    before = sess.run(status)
    w0 = sess.run(w)
    sess.run([train, loss], feed_dict={xp: x, yp: y})
    after = sess.run(status)
    print(json.dumps({"same": same, "before": before.tolist(), "after": after.tolist(),
                      "unchanged": bool((sess.run(w) == w0).all())}))
    sess.close()
"""


def test_npu_optimizer_with_a_fixed_manager_and_the_float_status_op(tmp_path, capsys):
    """NPUOptimizer(is_loss_scale=True) with FixedLossScaleManager: the planted overflow skips the step at a scale
    that stays; npu_get_float_status_v2 reads the status the step left; the session's implmode and determinism
    are the device's."""
    from ascend_emu.numerics.status import decode_status

    from ascend_emu.npu.emulate import SkippedStepsWarning
    from ascend_emu.npu.fusion.config import FusionConfig

    fusion = tmp_path / "fusion_switch.cfg"
    fusion.write_text('{"Switch": {"GraphFusion": {"ALL": "off"}, "UBFusion": {"ALL": "off"}}}')
    script = tmp_path / "train_npu.py"
    script.write_text(TF1_IN_GRAPH_SCRIPT.replace("FUSION", str(fusion)))
    with pytest.warns(SkippedStepsWarning, match=r"1 of 1 steps skipped, scale 2\^20 -> 2\^20"):
        code = main(["run", "--json", str(tmp_path / "r.json"), str(script)])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out.splitlines()[0])
    rec = json.loads((tmp_path / "r.json").read_text())
    step, = rec["segments"][0]["steps"]
    assert step["skipped"] and step["loss_scale"] == 2.0 ** 20 and got["unchanged"] and got["same"]
    assert rec["segments"][0]["config"]["loss_scale"]["kind"] == "fixed"
    assert got["before"] == [0] * 8 and got["after"] == [step["float_status"]] + [0] * 7
    assert decode_status(got["after"][0])
    device = rec["segments"][0]["config"]["device"]
    assert device["impl_mode"] == "high_performance" and device["deterministic"] is True
    assert device["fusion_switch"] == FusionConfig.load(str(fusion)).to_dict() != FusionConfig.load(None).to_dict()


def test_script_run_segments_and_settings(tmp_path):
    """A session configured before any step replaces the one before it; set_device_sat_mode and keep_dtype_scope
    made before the first step apply to the current session; options are recorded with where they were set."""
    from ascend_emu.errors import AscendEmuError
    from ascend_emu.npu.bridge import ScriptRun

    run = ScriptRun(str(tmp_path / "s.py"), soc="Ascend910")
    run.configure({"precision_mode": "force_fp16"}, "a")
    run.configure({"precision_mode": "allow_mix_precision", "use_off_line": True}, "b")
    seg, = run.segments
    assert seg["from"] == "b" and seg["emulation"].device.config()["precision_mode"] == "allow_mix_precision"
    assert seg["emulation"].overflow_check == "status"
    run.set_sat_mode(1, "c")
    seg, = run.segments
    assert seg["emulation"].device.overflow_mode == "inf_nan" and seg["emulation"].overflow_check == "isfinite"
    run.keep_dtype(["dense/MatMul"], "d")
    assert run.segments[0]["emulation"].device.precision.keep_names == frozenset({"dense/MatMul"})
    assert [(o["name"], o["status"], o["from"]) for o in run.options] == [
        ("precision_mode", "honoured", "a"), ("precision_mode", "honoured", "b"), ("use_off_line", "noted", "b"),
        ("sat_mode", "honoured", "c"), ("keep_dtype_scope", "honoured", "d")]
    with pytest.raises(AscendEmuError, match="^e: set_device_sat_mode: mode must be 0"):
        run.set_sat_mode(2, "e")


RANKS_SCRIPT = """
import json
import numpy as np
import tensorflow as tf
from npu_bridge.npu_init import *

rng = np.random.default_rng(0)
x = rng.normal(size=(32, 8)).astype("float32")
y = rng.normal(size=(32, 2)).astype("float32")
g = tf.Graph()
with g.as_default():
    xp = tf.compat.v1.placeholder(tf.float32, (None, 8), name="x")
    yp = tf.compat.v1.placeholder(tf.float32, (None, 2), name="y")
    w = tf.compat.v1.get_variable("w", (8, 2), initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    loss = tf.reduce_mean(tf.square(tf.matmul(xp, w) - yp))
    train = npu_distributed_optimizer_wrapper(tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(loss)
    config = tf.compat.v1.ConfigProto()
    custom_op = config.graph_options.rewrite_options.custom_optimizers.add()
    custom_op.name = "NpuOptimizer"
    custom_op.parameter_map["precision_mode"].s = b"must_keep_origin_dtype"
    sess = tf.compat.v1.Session(graph=g, config=config)
    sess.run(tf.compat.v1.global_variables_initializer())
    losses = [float(sess.run([train, loss], feed_dict={xp: x[16 * i:][:16], yp: y[16 * i:][:16]})[1]) for i in range(2)]
    print(json.dumps({"losses": losses, "w": sess.run(w).tolist(), "ranks": get_rank_size()}))
"""


def test_ranks_split_each_step_over_emulated_data_parallel_ranks(tmp_path, capsys):
    """--ranks 2: each batch in two shards, the gradients all-reduced; with float32 operands
    (must_keep_origin_dtype) the mean of the shards' mean-square gradients is the batch's, so the run follows one
    device on the whole batch to float32 rounding."""
    script = tmp_path / "train_npu.py"
    script.write_text(RANKS_SCRIPT)
    got = {}
    for ranks in (1, 2):
        assert main(["run", "--ranks", str(ranks), "--json", str(tmp_path / f"r{ranks}.json"), str(script)]) == 0
        out = capsys.readouterr().out
        got[ranks] = json.loads(out.splitlines()[0]), json.loads((tmp_path / f"r{ranks}.json").read_text())
    (one, _), (two, rec) = got[1], got[2]
    steps = rec["segments"][0]["steps"]
    assert rec["ranks"] == 2 and rec["segments"][0]["config"]["data_parallel"]["ranks"] == 2
    assert all(len(s["rank_losses"]) == 2 and s["loss"] == np.mean(s["rank_losses"]) for s in steps)
    assert two["ranks"] == 1          # the script's own rank helpers: one process
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-6)
    np.testing.assert_allclose(two["w"], one["w"], rtol=0, atol=1e-6)
    assert main(["run", "--ranks", "0", str(script)]) == 2
    assert "ranks must be a whole number from 1 to 1024" in capsys.readouterr().err


def test_customize_dtypes_keeps_float32_entries_and_says_the_others(tmp_path):
    from ascend_emu.npu.bridge import ScriptRun
    from ascend_emu.npu.precision import load_customize_dtypes

    cfg = tmp_path / "customize.cfg"
    cfg.write_text("# CANN's two forms\n"
                   "dense/MatMul::InputDtype:float32,float32,OutputDtype:float32\n"
                   "OpType::Square:InputDtype:float32,OutputDtype:float32\n"
                   "conv1::InputDtype:float16,float16,int8,OutputDtype:float16\n")
    keep, other = load_customize_dtypes(cfg)
    assert keep == ["dense/MatMul", "OpType::Square"]
    assert other == ["conv1::InputDtype:float16,float16,int8,OutputDtype:float16"]
    run = ScriptRun(str(tmp_path / "s.py"))
    run.configure({"precision_mode": "allow_mix_precision", "customize_dtypes": str(cfg)}, "a")
    policy = run.segments[0]["emulation"].device.precision
    assert policy.keep_names == {"dense/MatMul"} and policy.keep_types == {"Square"}
    assert [n["call"].startswith("customize_dtypes 'conv1::") for n in run.notes] == [True]
    run.configure({"precision_mode": "must_keep_origin_dtype", "customize_dtypes": str(cfg)}, "b")
    assert not run.segments[0]["emulation"].device.precision.keep_names     # ignored in origin, as the adapter
    (tmp_path / "bad.cfg").write_text("MatMul float32\n")
    with pytest.raises(AscendEmuError, match="is not OpName::InputDtype"):
        run.configure({"precision_mode": "allow_mix_precision", "customize_dtypes": str(tmp_path / "bad.cfg")}, "c")

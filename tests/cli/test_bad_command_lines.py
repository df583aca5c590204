"""A catalogue of bad command lines, one or more per subcommand and option, and a fuzz over argument vectors.

Each case runs ``ascend_emu.cli.main(argv)`` in-process. A bad command line must end with exit status 2
and one ``ascend-emu: error:`` line (or argparse's usage message), never a traceback, and must write
nothing outside its own directory.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random

import numpy as np
import pytest

from ascend_emu.analysis.dump import DumpWriter
from ascend_emu.cli import main


def run_cli(argv):
    """(exit status, stdout, stderr) of ``main(argv)``; an exception other than SystemExit fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:     # argparse: usage errors exit 2, --help exits 0
            code = e.code
        except BaseException as e:  # noqa: BLE001
            raise AssertionError(f"{argv}: {type(e).__name__}: {e}") from e
    return code, out.getvalue(), err.getvalue()


def assert_clean_error(argv, code, err, expect=None):
    assert code == 2, (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    lines = [ln for ln in err.splitlines() if ln.startswith("ascend-emu: error:") or ln.startswith("ascend-emu ")
             and ": error:" in ln]
    assert len(lines) == 1, (argv, err)
    if expect:
        assert expect in lines[0], (argv, lines[0])


def _dump(path, kind, *, fingerprint="f", inputs="s", ops=True):
    with DumpWriter(path, kind=kind, config={"overflow_mode": "saturation"},
                    model={"name": "m", "fingerprint": fingerprint}, inputs_sha256=inputs) as w:
        if ops:
            w.add_op("x", "Placeholder", "Data", "AICORE", "float32", [], [np.ones(3, np.float32)])
            w.add_op("y", "Relu", "Relu", "AICORE", "float32", ["x:0"], [np.ones(3, np.float32)])
        w.finish({})
    return str(path)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    e = {"tmp": str(tmp_path)}
    e["npu"] = _dump(tmp_path / "npu", "npu")
    e["bench"] = _dump(tmp_path / "bench", "bench")
    e["other_model"] = _dump(tmp_path / "other_model", "bench", fingerprint="g")
    e["other_inputs"] = _dump(tmp_path / "other_inputs", "bench", inputs="t")
    e["empty"] = _dump(tmp_path / "empty", "npu", ops=False)
    (tmp_path / "file.txt").write_text("not a model")
    e["file"] = str(tmp_path / "file.txt")
    (tmp_path / "random.keras").write_bytes(bytes(range(256)) * 8)
    e["file_keras"] = str(tmp_path / "random.keras")
    for name, cfg in (("bench_typo", {"optimizer": "sgd", "learnig_rate": 0.1}),
                      ("bench_type", {"optimizer": "sgd", "batch_size": "32"}),
                      ("bench_opt", {"optimizer": {"name": "lamb", "learning_rate": 0.1}})):
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
        e[name] = str(tmp_path / f"{name}.json")
    e["nodir"] = str(tmp_path / "no" / "such" / "dir")
    e["missing"] = str(tmp_path / "missing.keras")
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    e["deep"] = str(tmp_path / "deep.json")
    (tmp_path / "bad.json").write_text("{not json")
    e["badjson"] = str(tmp_path / "bad.json")
    (tmp_path / "msdeep").mkdir()
    (tmp_path / "msdeep" / "dump.json").write_text("[" * 100000 + "]" * 100000)
    e["msdeep"] = str(tmp_path / "msdeep")
    (tmp_path / "msbad").mkdir()
    (tmp_path / "msbad" / "dump.json").write_text('{"task": ')
    e["msbad"] = str(tmp_path / "msbad")
    # msprobe statistics dumps that would import as dumps no reader accepts: a huge leaf, no tensor at all
    leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1 << 30, 1 << 30], "Max": 1.0, "Min": 0.0,
            "Mean": 0.5, "Norm": 1.0}
    for name, data in (("mshuge", {"Functional.relu.0.forward": {"output": [leaf]}}), ("msempty", {})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "dump.json").write_text(json.dumps({"task": "statistics", "data": data}))
        e[name] = str(tmp_path / name)
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    e["objnpy"] = str(tmp_path / "obj.npy")
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object))
    e["objnpz"] = str(tmp_path / "obj.npz")
    (tmp_path / "trunc.npy").write_bytes(b"\x93NUMPY\x01\x00")
    e["truncnpy"] = str(tmp_path / "trunc.npy")
    # an output directory that is a link, and a dump whose reference/ part is one (issue 35)
    (tmp_path / "target").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "linkdir")
    e["linkdir"] = str(tmp_path / "linkdir")
    (tmp_path / "dref").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "dref" / "reference")
    e["dref"] = str(tmp_path / "dref")
    # the --keep-dumps of an earlier sensitivity run (issue 45, S3)
    (tmp_path / "kept").mkdir()
    _dump(tmp_path / "kept" / "reference", "bench")
    e["kept"] = str(tmp_path / "kept")
    os.symlink(tmp_path / "file.txt", tmp_path / "linkfile.txt")
    e["linkfile"] = str(tmp_path / "linkfile.txt")
    return e


# (argv with {placeholders}, expected text in the error line or None). Every case must exit 2 cleanly.
CATALOGUE = [
    # top level and argparse
    ("", None), ("nosuchcommand", None), ("--quiet", None), ("-x", None),
    # compare
    ("compare", None), ("compare {npu}", None), ("compare {nodir} {bench}", "does not exist"),
    ("compare {npu} {nodir}", "does not exist"), ("compare {file} {bench}", "does not exist"),
    ("compare {npu} {other_model}", "different models"), ("compare {npu} {other_inputs}", "different inputs"),
    ("compare {empty} {bench}", "no ops"), ("compare {npu} {bench} --csv {nodir}/x.csv", "does not exist"),
    ("compare {npu} {bench} --csv {tmp}", "directory"), ("compare {npu} {bench} --cosine x", None),
    ("compare {npu} {bench} --limit x", None), ("compare {npu} {bench} --limit", None),
    ("compare {npu} {bench} --bogus", None), ("compare {npu} {bench} --force x", None),
    ("compare {tmp} {bench}", "manifest"), ("compare {npu} {bench} --workers 0", "workers must be a positive"),
    ("compare {npu} {bench} --workers x", None),
    # overflow
    ("overflow", None), ("overflow {nodir}", "does not exist"), ("overflow {npu} --json {nodir}/o.json", "does not exist"),
    ("overflow {npu} --json {tmp}", "directory"), ("overflow {npu} --json", None), ("overflow {file}", "does not exist"),
    ("overflow {npu} --ops-info {nodir}/o.json", "does not exist"), ("overflow {npu} --ops-info", None),
    ("overflow {npu} --ops-info {npu}/manifest.json", "is inside what"),
    ("overflow {npu} --json {tmp}/x.json --ops-info {tmp}/x.json", None),
    # report
    ("report", None), ("report {npu}", None), ("report {npu} {bench} -o {nodir}/r.html", "does not exist"),
    ("report {npu} {bench} -o {tmp}", "directory"), ("report {npu} {other_model} -o r.html", "different models"),
    ("report {empty} {bench} -o r.html", "no ops"), ("report {npu} {bench} --output", None),
    # replay / reference / fusion-bisect: model and inputs
    ("replay", None), ("replay {missing}", "missing.keras"), ("replay {file}", None), ("replay {nodir}", None),
    ("reference", None), ("reference {missing}", "missing.keras"), ("reference {file}", None),
    ("fusion-bisect", None), ("fusion-bisect {missing}", "missing.keras"), ("fusion-bisect {file}", None),
    ("replay {model} --seed -1", "--seed"), ("reference {model} --seed -1", "--seed"),
    ("fusion-bisect {model} --seed -1", "--seed"), ("replay {model} --seed x", None),
    ("replay {model} --shape x=1,2", "unknown input"), ("replay {model} --shape x", "NAME="),
    ("replay {model} --shape x=a,b", None), ("replay {model} --shape inp=2000000000,4", "memory"),
    ("replay {model} --shape inp=4000000000,4", "too large"),
    ("reference {model} --shape inp=100000000000000,4", None),
    ("replay {model} --input inp={objnpy}", "object"), ("replay {model} --input inp={objnpz}", "object"),
    ("replay {model} --input {objnpz}", None), ("replay {model} --input inp={truncnpy}", None),
    ("replay {model} --input inp={missing}", None), ("replay {model} --input inp={file}", None),
    ("replay {model} --input inp={inp} --input inp={inp}", "twice"),
    ("reference {model} --input inp={inp} --input inp={inp}", "twice"),
    ("replay {model} --input nope={inp}", "unknown input"), ("replay {model} --signature nope", "SavedModel directories only"),
    # replay: dump options
    ("replay {model} --dump {file}", "not a directory"), ("replay {model} --dump {npu}", "--overwrite"),
    ("replay {model} --dump {tmp} --overwrite", "not part of a dump"), ("replay {model} --select (", "regular"),
    ("reference {model} --dump {file}", "not a directory"), ("reference {model} --select (", "regular"),
    ("replay {model} --dump", None), ("replay {model} --select-type", None),
    # replay: device options
    ("replay {model} --precision-mode nope", None), ("replay {model} --overflow-mode nope", None),
    ("replay {model} --soc nope", None), ("replay {model} --modify-mixlist {missing}", "not found"),
    ("replay {model} --modify-mixlist {deep}", "nested"), ("replay {model} --modify-mixlist {badjson}", "JSON"),
    ("replay {model} --modify-mixlist {tmp}", None), ("replay {model} --fusion-switch {missing}", "not found"),
    ("replay {model} --fusion-switch {deep}", "nested"), ("replay {model} --fusion-switch {badjson}", None),
    ("replay {model} --fusion-switch {tmp}", None), ("replay {model} --subnormals x", None),
    ("replay {model} --impl-mode x", None), ("replay {model} --reduce-accumulate x", None),
    ("replay {model} --cube-block-size 0", None), ("replay {model} --cube-block-size x", None),
    ("replay {model} --cube-block-sum x", None), ("replay {model} --cube-extra-bits -5", None),
    ("replay {model} --cube-normalize x", None), ("replay {model} --cube-conv-k-order x", None),
    ("replay {model} --no-aicpu-fallback --bogus", None),
    # replay: SoCs, precision_mode_v2, HF32 (issue 29)
    ("replay {model} --precision-mode-v2 nope", None), ("replay {model} --precision-mode-v2", None),
    ("replay {model} --precision-mode force_fp16 --precision-mode-v2 fp16", "both given"),
    ("replay {model} --soc Ascend310P --precision-mode-v2 mixed_bfloat16", "Ascend310P3 lacks"),
    ("replay {model} --soc Ascend910 --precision-mode allow_fp32_to_bf16", "Ascend910 lacks"),
    ("replay {model} --soc Ascend910B --precision-mode-v2 mixed_hif8", "HiFloat8"),
    ("replay {model} --soc Ascend310P3 --allow-hf32 conv", "no HF32"),
    ("replay {model} --soc Ascend910B --allow-hf32 conv,gemm", "unknown op family"),
    ("replay {model} --hf32-rounding odd", None),
    ("replay {model} --hf32-bits 12", None),
    ("replay {model} --hf32-matmul-rounding odd", None),
    ("replay {model} --soc Ascend910 --hf32-bits 10", "has no HF32"),
    ("replay {model} --soc Ascend310p", None), ("socs --bogus", None), ("socs x", None),
    ("train {model} --data {inp} --precision-mode-v2 origin --precision-mode must_keep_origin_dtype", None),
    ("mixlist-search {model} --precision-mode-v2 mixed_bfloat16 --soc Ascend910", "Ascend910 lacks"),
    # fusion-bisect options
    ("fusion-bisect {model} --metric x", None), ("fusion-bisect {model} --threshold x", None),
    ("fusion-bisect {model} --keep-dumps {file}", "not a directory"),
    ("fusion-bisect {model} --fusion-switch x", None),
    ("fusion-bisect {model} --scheduler nowhere", "tcp://host:8786"),
    ("fusion-bisect {model} --scheduler tcp://host", "scheduler 'tcp://host'"),
    ("fusion-bisect {model} --workers x", None),
    # fusion-bisect over a training
    ("fusion-bisect {model} --data {train}", "needs steps"),
    ("fusion-bisect {model} --data {train} --steps 0", "positive integer"),
    ("fusion-bisect {model} --data {train} --steps x", None),
    ("fusion-bisect {model} --steps 2", "apply to training only"),
    ("fusion-bisect {model} --learning-rate 0.1", "apply to training only"),
    ("fusion-bisect {model} --data {train} --steps 2 --metric cosine", "scores the loss curve"),
    ("fusion-bisect {model} --metric loss_rel_err", "unknown metric"),
    ("fusion-bisect {model} --data {train} --steps 2 --input inp={inp}", "apply to a replay"),
    ("fusion-bisect {model} --data {train} --steps 2 --keep-dumps kd", "keeps no dumps"),
    ("fusion-bisect {model} --data {missing} --steps 2", "does not exist"),
    ("fusion-bisect {model} --data {file} --steps 2 --loss mse --optimizer sgd", "not an .npz archive"),
    ("fusion-bisect {model} --data {objnpz} --steps 2 --loss mse --optimizer sgd", None),
    ("fusion-bisect {model} --data {wrong} --steps 2 --loss mse --optimizer sgd", None),
    ("fusion-bisect {model} --data {train} --steps 2", "no loss"),
    ("fusion-bisect {model} --data {train} --steps 2 --loss mse --optimizer nope", "unknown optimizer"),
    ("fusion-bisect {model} --data {train} --steps 2 --json {nodir}/b.json", "does not exist"),
    # mixlist-search
    ("mixlist-search", None), ("mixlist-search {missing}", "missing.keras"), ("mixlist-search {file}", None),
    ("mixlist-search {model} --target cosine=0.999", "METRIC>=VALUE"),
    ("mixlist-search {model} --target cosine<=0.999", "higher when better"),
    ("mixlist-search {model} --target max_rel_err>=0.1", "lower when better"),
    ("mixlist-search {model} --target kl>=1", "unknown metric"),
    ("mixlist-search {model} --target cosine>=x", "METRIC>=VALUE"),
    ("mixlist-search {model} --target cosine>=1.5", "out of range"),
    ("mixlist-search {model} --scheduler nowhere", "tcp://host:8786"),
    ("random-errors {model} --scheduler nowhere", "tcp://host:8786"),
    ("random-errors {model} --scheduler tcp://host:port", "scheduler 'tcp://host:port'"),
    ("mixlist-search {model} --scheduler tcp://host:port", "scheduler 'tcp://host:port'"),
    ("mixlist-search {model} --scheduler ftp://h:1", "scheduler 'ftp://h:1'"),
    ("mixlist-search {model} --by name", "op types only"), ("mixlist-search {model} --by x", None),
    # mixlist-search over a training
    ("mixlist-search {model} --target loss_rel_err<=0.01", "give the training data"),
    ("mixlist-search {model} --data {train} --steps 2", "the target is on the loss curve"),
    ("mixlist-search {model} --data {train} --target loss_rel_err<=0.01", "needs steps"),
    ("mixlist-search {model} --data {train} --steps 0 --target loss_rel_err<=0.01", "needs steps"),
    ("mixlist-search {model} --data {train} --steps x --target loss_rel_err<=0.01", None),
    ("mixlist-search {model} --steps 2", "apply to training only"),
    ("mixlist-search {model} --batch-size 4", "apply to training only"),
    ("mixlist-search {model} --data {train} --steps 2 --target loss_abs_err>=1", "lower when better"),
    ("mixlist-search {model} --data {train} --steps 2 --target loss_rel_err<=0.01 --input inp={inp}",
     "apply to a replay"),
    ("mixlist-search {model} --data {missing} --steps 2 --target loss_rel_err<=0.01", "does not exist"),
    ("mixlist-search {model} --data {train} --steps 2 --target loss_rel_err<=0.01", "no loss"),
    ("mixlist-search {model} --data {train} --steps 2 --target loss_rel_err<=0.01 --loss mse --optimizer nope",
     "unknown optimizer"),
    ("mixlist-search {model} --precision-mode force_fp16", "allow_mix_precision"),
    ("mixlist-search {model} --data {train} --steps 2 --target loss_rel_err<=0.01 --loss "
     "categorical_crossentropy_from_logits --optimizer nope", "unknown optimizer"),
    ("mixlist-search {model} --data {train} --steps 2 --target loss_rel_err<=0.01 --loss mse --optimizer sgd "
     "--seed -1", "--seed"),
    ("mixlist-search {model} --output {nodir}/o.json", "does not exist"),
    ("mixlist-search {model} --json {nodir}/o.json", "does not exist"),
    ("mixlist-search {model} --beam 0", "beam"), ("mixlist-search {model} --workers 0", "n_workers"),
    ("mixlist-search {model} --modify-mixlist {file}", None), ("mixlist-search {model} --seed -1", "--seed"),
    # --rules (compare, report)
    ("compare {npu} {bench} --rules x", None), ("report {npu} {bench} --rules x", None),
    # export-msprobe / import-msprobe
    ("export-msprobe", None), ("export-msprobe {npu}", None), ("export-msprobe {nodir} {tmp}/m", "does not exist"),
    ("export-msprobe {npu} {tmp}/m --tensor-format x", None), ("export-msprobe {npu} {tmp}/m --step x", None),
    ("export-msprobe {npu} {tmp}/m --rank x", None), ("export-msprobe {file} {tmp}/m", None),
    ("export-msprobe {npu} {file}", None),
    ("export-msprobe {npu} {linkdir}", "symbolic link"), ("import-msprobe {msdeep} {linkdir}", None),
    ("replay {model} --dump {linkdir}", "symbolic link"),
    ("fusion-bisect {model} --keep-dumps {linkdir}", "symbolic link"),
    ("random-errors {model} --out {linkdir}", "symbolic link"),
    ("import-msprobe", None), ("import-msprobe {nodir} {tmp}/o", None), ("import-msprobe {npu} {tmp}/o", None),
    ("import-msprobe {msdeep} {tmp}/o", "nested"), ("import-msprobe {msbad} {tmp}/o", "JSON"),
    ("import-msprobe {mshuge} {tmp}/o", "more than any tensor holds"),
    ("import-msprobe {msempty} {tmp}/o", "nothing to import"),
    ("import-msprobe {msdeep} {tmp}/o --mapping {missing}", None),
    ("import-msprobe {msdeep} {tmp}/o --against {nodir}", None), ("import-msprobe {msdeep} {tmp}/o --kind x", None),
    ("import-msprobe {msdeep} {tmp}/o --step x", None), ("import-msprobe {msdeep} {tmp}/o --rank x", None),
    ("import-msprobe {msdeep} {file}", None), ("import-msprobe {msdeep} {npu}", None),
    # train
    ("train", None), ("train {model}", None), ("train {missing} --data {train}", "no such file"),
    ("train {model} --data {missing}", "does not exist"), ("train {model} --data {file}", "not an .npz archive"),
    ("train {model} --data /dev/null", "not a regular file"), ("train {model} --data {tmp}", "not a regular file"),
    ("train {model} --data {truncnpy}", "single array"),
    ("train {model} --data {objnpz}", ".npz"), ("train {model} --data {train}", "no loss"),
    ("train {model} --data {train} --loss mean_squared_error", "no optimizer"),
    ("train {model} --data {train} --loss nope --optimizer sgd", "unknown loss"),
    ("train {model} --data {train} --loss mse --optimizer nope", "unknown optimizer"),
    ("train {model} --data {train} --loss mse --optimizer sgd --rho 0.9", "takes no rho"),
    # the documented --loss NAME_from_logits (issue 35: a TypeError traceback) and a negative --seed (a ValueError)
    ("train {model} --data {train} --loss categorical_crossentropy_from_logits --optimizer nope", "unknown optimizer"),
    ("train {model} --data {train} --loss mean_squared_error_from_logits --optimizer sgd", "takes no logits"),
    ("train {model} --data {train} --loss nope_from_logits --optimizer sgd", "unknown loss"),
    ("train {model} --data {train} --loss mse --optimizer sgd --shuffle --seed -1", "--seed"),
    ("train {model} --data {wrong} --loss mse --optimizer sgd", "shape"),
    ("train {model} --data {train} --steps 0", "steps must be"), ("train {model} --data {train} --epochs 0", "epochs"),
    ("train {model} --data {train} --batch-size 0", "batch_size"), ("train {model} --data {train} --steps x", None),
    ("train {model} --data {train} --loss-scale weird", "--loss-scale"),
    # issue 35: accepted silently before, or misnamed ("File not found" for a file that is there)
    ("replay {file_keras}", "not a .keras archive"), ("train {file_keras} --data {train}", "not a .keras archive"),
    ("train {model} --data {train} --loss mse --optimizer sgd --loss-scale fixed:inf", "finite"),
    ("train {model} --data {train} --loss mse --optimizer sgd --loss-scale fixed:nan", "finite"),
    ("train {model} --data {train} --loss mse --optimizer sgd --loss-scale exponential:init=inf", "finite"),
    ("train {model} --data {train} --loss mse --optimizer sgd --learning-rate nan", "learning_rate"),
    ("train {model} --data {train} --loss mse --optimizer sgd --learning-rate -1", "learning_rate"),
    ("train {model} --data {train} --loss mse --optimizer sgd --steps 100000000000000000000", "more than any run"),
    ("train {model} --data {train} --loss mse --optimizer sgd --ranks 2 --rank-init 1=3 --rank-init 1=4", "twice"),
    ("random-errors {model} --runs 100000000000000000000", "more than random-error"),
    ("mixlist-search {model} --max-steps -1", "max_steps"), ("mixlist-search {model} --max-steps 0", "max_steps"),
    ("train {model} --data {train} --loss-scale fixed:x", "fixed:1024"),
    ("train {model} --data {train} --loss-scale exponential:foo=1", "unknown setting"),
    ("train {model} --data {train} --loss-scale exponential:incr_every=1.5", "whole number"),
    ("train {model} --data {train} --dump-steps a,b", None), ("train {model} --data {train} --dump-steps 0", "--dump"),
    ("train {model} --data {train} --steps 2 --dump {tmp}/d --dump-steps 7", "outside the run"),
    ("train {model} --data {train} --overflow-check x", None), ("train {model} --data {train} --optimizer", None),
    ("train {model} --data {train} --json {nodir}/t.json", "does not exist"),
    ("train {model} --data {train} --report {tmp}", "directory"),
    ("train {model} --data {train} --precision-mode nope", None), ("train {model} --data {train} --soc nope", None),
    ("train {model} --data {train} --loss mse --optimizer sgd --ranks 3", "do not split evenly over 3 ranks"),
    ("train {model} --data {train} --ranks 0", "ranks must be"), ("train {model} --data {train} --ranks x", None),
    ("train {model} --data {train} --ranks 2 --allreduce star", None),
    ("train {model} --data {train} --ranks 2 --allreduce-dtype int8", None),
    ("train {model} --data {train} --check-rank-weights", "ranks of 2 or more"),
    ("train {model} --data {train} --allreduce ring", "ranks of 2 or more"),
    ("train {model} --data {train} --ranks 2 --rank-init 5=1", "ranks are 0..1"),
    ("train {model} --data {train} --ranks 2 --rank-init x", None),
    ("train {model} --data {train} --ranks 2 --dump {tmp}/d", "not supported yet"),
    ("train {model} --data {train} --loss mse --optimizer sgd --dump {linkdir}", "symbolic link"),
    ("train {model} --data {train} --loss mse --optimizer sgd --reference --dump {dref}", "symbolic link"),
    # check
    ("check", None), ("check {model}", None), ("check {missing} --data {train}", "no such file"),
    ("check {model} --data {missing}", "no such file"), ("check {model} --data {file}", "not a readable .npz"),
    ("check {model} --data {objnpz}", ".npz"), ("check {model} --data {train}", "no loss"),
    ("check {model} --data {train} --loss mean_squared_error", "no optimizer"),
    ("check {model} --data {wrong} --loss mse --optimizer sgd", "shape"),
    ("check {model} --data {train} --steps 0", "steps must be"), ("check {model} --data {train} --steps x", None),
    ("check {model} --data {train} --batch-size 0", "batch_size"), ("check {model} --data {train} --seed -1", "seed"),
    ("check {model} --data {train} --epochs 0", "epochs"),
    ("check {model} --data {train} --benchmark {missing}", "no such file"),
    ("check {model} --data {train} --loss mse --optimizer sgd --benchmark {file}", "--benchmark"),
    ("check {model} --data {train} --loss mse --optimizer sgd --benchmark {model}", "not compiled"),
    ("check {model} --data {train} --benchmark-config {missing}", "not found"),
    ("check {model} --data {train} --benchmark-config {badjson}", "JSON"),
    ("check {model} --data {train} --benchmark-config {deep}", "nested"),
    ("check {model} --data {train} --benchmark {model} --benchmark-config {badjson}", "not both"),
    # issue 35: a misspelt key or a value of the wrong type made item 10 pass by saying nothing
    ("check {model} --data {train} --benchmark-config {bench_typo}", "did you mean learning_rate"),
    ("check {model} --data {train} --benchmark-config {bench_type}", "batch_size has the value"),
    ("check {model} --data {train} --benchmark-config {bench_opt}", "unknown optimizer"),
    ("check {model} --data {train} --loss-scale weird", "--loss-scale"),
    ("check {model} --data {train} --overflow-check x", None), ("check {model} --data {train} --soc nope", None),
    ("check {model} --data {train} --precision-mode nope", None),
    ("check {model} --data {train} --json {nodir}/c.json", "does not exist"),
    ("check {model} --data {train} --report {tmp}", "directory"),
    ("check {model} --data {train} --ops-info {tmp}", "directory"),
    ("check {model} --data {train} --modify-mixlist {badjson}", "JSON"),
    ("check {model} --data {train} --loss categorical_crossentropy_from_logits --optimizer nope", "unknown optimizer"),
    ("check {model} --data {train} --loss mse --optimizer sgd --keep-dumps {linkdir}", "symbolic link"),
    # determinism options (replay, train) and random-errors
    ("replay {model} --deterministic 2", None), ("replay {model} --deterministic-level 3", None),
    ("replay {model} --deterministic 0 --deterministic-level 1", "contradicts"),
    ("replay {model} --run-seed -1", "run_seed"), ("replay {model} --run-seed x", None),
    ("replay {model} --aicore-num 0", "aicore_num"), ("train {model} --data {train} --deterministic x", None),
    ("random-errors", None), ("random-errors {missing}", "missing.keras"), ("random-errors {model} --runs 1", "runs"),
    ("random-errors {model} --runs x", None), ("random-errors {model} --steps 3", "--data"),
    ("random-errors {model} --data {train} --input inp={inp}", "--input"),
    ("random-errors {model} --out {file}", "not a directory"),
    ("random-errors {model} --json {nodir}/x.json", "does not exist"),
    ("random-errors {model} --data {missing} --steps 2", "does not exist"),
    ("random-errors {model} --data {train}", "steps"),
    ("random-errors {model} --data {train} --steps 2 --loss categorical_crossentropy_from_logits --optimizer nope",
     "unknown optimizer"),
    ("random-errors {model} --data {train} --steps 2 --loss mse --optimizer sgd --seed -1", "--seed"),
    ("random-errors {model} --deterministic 0 --deterministic-level 2", "contradicts"),
    # outputs over inputs, over each other or into a dump being written (issue 35: each replaced a file)
    ("train {model} --data {train} --loss mse --optimizer sgd --report {train} --json {model}", "is also what"),
    ("train {model} --data {train} --loss mse --optimizer sgd --json {tmp}/x.json --report {tmp}/x.json",
     "are the same path"),
    ("train {model} --data {train} --loss mse --optimizer sgd --dump {tmp} --overwrite --json {npu}/manifest.json",
     "is inside --dump"),
    ("check {model} --data {train} --loss mse --optimizer sgd --json {train}", "is also what"),
    ("check {model} --data {train} --loss mse --optimizer sgd --json {tmp}/c.json --ops-info {tmp}/c.json",
     "are the same path"),
    ("check {model} --data {train} --loss mse --optimizer sgd --keep-dumps {tmp} --report {npu}/r.html",
     "is inside --keep-dumps"),
    ("mixlist-search {model} --json {model}", "is also what"),
    ("mixlist-search {model} --json {tmp}/o.json --output {tmp}/o.json", "are the same path"),
    ("mixlist-search {model} --modify-mixlist {badjson} --output {badjson}", "is also what"),
    ("random-errors {model} --json {model}", "is also what"), ("random-errors {model} --input inp={inp} --report {inp}",
                                                                "is also what"),
    ("random-errors {model} --out {tmp} --json {npu}/manifest.json", "is inside --out"),
    ("replay {model} --dump {model}", "is also what"), ("reference {model} --input inp={inp} --dump {inp}", "is also what"),
    ("overflow {npu} --json {npu}/manifest.json", "is inside what"), ("compare {npu} {bench} --csv {bench}/x.csv",
                                                                      "is inside what"),
    ("report {npu} {bench} -o {npu}", "is also what"), ("export-msprobe {npu} {npu}", "is also what"),
    ("import-msprobe {msdeep} {msdeep}", "is also what"), ("import-msprobe {msdeep} {npu} --against {npu}", "is also"),
    # fit and sensitivity (issue 32)
    ("fit", None), ("fit {npu}", None), ("fit {nodir} {model}", "does not exist"),
    ("fit {npu} {model} --param nope", "unknown assumed parameter"), ("fit {npu} {model} --json {npu}/f.json", "inside"),
    ("fit {npu} {model} --scheduler nowhere", "scheduler"), ("sensitivity", None),
    ("sensitivity {model} --data {train}", "needs both"), ("sensitivity {model} --param nope", "unknown assumed"),
    ("sensitivity {model} --dump {nodir}", "does not exist"), ("sensitivity {model} --cosine-tol x", None),
    ("sensitivity {model} --dump {npu} --json {npu}/s.json", "inside"),
    ("sensitivity {model} --data {train} --steps 2 --dump {npu}", "keeps no dumps"),
    # outputs over inputs: --keep-dtype and the DUMP.sensitivity.json sidecar (issue 45, S2), kept dumps (S3)
    ("fit {npu} {model} --keep-dtype {file} --json {file}", "is also what"),
    ("sensitivity {model} --dump {npu} --modify-mixlist {npu}.sensitivity.json", "is also what"),
    ("sensitivity {model} --dump {npu} --keep-dtype {npu}.sensitivity.json", "is also what"),
    ("sensitivity {model} --dump {npu} --json {npu}.sensitivity.json", "are the same path"),
    ("sensitivity {model} --keep-dumps {kept}", "already holds the dumps of an earlier run"),
    # the --keep-dtype file read as hostile (S4): no device, no link, no endless file
    ("replay {model} --keep-dtype /dev/zero", "not a regular file"),
    ("replay {model} --keep-dtype {linkfile}", "is a symbolic link"),
    ("replay {model} --keep-dtype {tmp}/no-such-list.txt", "not found"),
    # options of a mode the run is not in (M1)
    ("replay {model} --hif8-rounding hybrid", "in the precision modes cube_hif8, mixed_hif8 only"),
    ("replay {model} --hif8-cube-out float32 --hif8-rounding round", "drop them"),
    ("replay {model} --hf32-rounding trunc --soc Ascend910 --allow-hf32 none", "HF32 is on"),
    ("fit {npu} {model} --hf32-rounding trunc --allow-hf32 none", "HF32 is on"),
    ("replay {model} --multicore-reduce-min-chunk 0", "reduce_min_chunk"),
    # demo, ops, rules
    ("demo --out {file}", "not a directory"), ("demo --out", None), ("ops --bogus", None), ("rules x", None),
]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from ascend_emu.frontend.tf.loader import import_tf

    tf = import_tf()
    d = tmp_path_factory.mktemp("model")
    inp = tf.keras.Input((4,), name="inp")
    out = tf.keras.layers.Dense(3, activation="relu")(inp)
    m = tf.keras.Model(inp, out)
    m.layers[1].set_weights([np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32),
                             np.zeros(3, np.float32)])
    path = d / "m.keras"
    m.save(path)
    np.save(d / "inp.npy", np.ones((1, 4), np.float32))
    np.savez(d / "train.npz", x=np.ones((8, 4), np.float32), y=np.zeros((8, 3), np.float32))
    np.savez(d / "wrong.npz", x=np.ones((8, 5), np.float32), y=np.zeros((8, 3), np.float32))
    return {"model": str(path), "inp": str(d / "inp.npy"), "train": str(d / "train.npz"),
            "wrong": str(d / "wrong.npz")}


def _outside_snapshot(tmp):
    parent = os.path.dirname(tmp)
    return sorted(os.listdir(parent))


@pytest.mark.parametrize("template,expect", CATALOGUE, ids=[c[0] or "(empty)" for c in CATALOGUE])
def test_bad_command_line(template, expect, env, model_file):
    before = _outside_snapshot(env["tmp"])
    argv = template.format(**env, **model_file).split()
    code, out, err = run_cli(argv)
    if expect is None and code == 2 and "usage:" in err + out:
        assert "Traceback" not in err + out
    else:
        assert_clean_error(argv, code, err, expect)
    assert _outside_snapshot(env["tmp"]) == before


def test_outputs_never_replace_inputs(env, model_file):
    """Issue 35: train m.keras --data d.npz --report d.npz --json m.keras replaced the data and the model, and
    --json DUMP/step-0/manifest.json a dump's manifest; refused before anything runs, every file as it was."""
    import shutil

    tmp = env["tmp"]
    m, d = shutil.copy(model_file["model"], tmp), shutil.copy(model_file["train"], tmp)
    before = {p: open(p, "rb").read() for p in (m, d, os.path.join(env["npu"], "manifest.json"))}
    for argv in (["train", m, "--data", d, "--loss", "mse", "--optimizer", "sgd", "--report", d, "--json", m],
                 ["train", m, "--data", d, "--loss", "mse", "--optimizer", "sgd", "--dump", tmp, "--overwrite",
                  "--json", os.path.join(env["npu"], "manifest.json")]):
        code, out, err = run_cli(argv)
        assert_clean_error(argv, code, err)
    assert {p: open(p, "rb").read() for p in before} == before


def test_keep_dtype_lines_matching_nothing_are_named(env, model_file):
    """M1 (issue 45): a --keep-dtype line naming no op of the model (a typo) kept nothing without a word."""
    keep = os.path.join(env["tmp"], "keep.txt")
    with open(keep, "w") as f:
        f.write("# ATC keep_dtype\nno_such_node\nOpType::NoSuchType\nOpType::MatMulV2\n")
    argv = ["replay", model_file["model"], "-q", "--soc", "Ascend910B", "--keep-dtype", keep]
    with pytest.warns(UserWarning, match="--keep-dtype line") as got:
        code, out, err = run_cli(argv)
    assert code == 0, err
    lines = [str(w.message) for w in got if "--keep-dtype" in str(w.message)]
    assert len(lines) == 1 and "'no_such_node', 'OpType::NoSuchType'" in lines[0] and "MatMulV2" not in lines[0]


def test_sensitivity_keeps_earlier_dumps(env, model_file):
    """S3 (issue 45): --keep-dumps DIR holding an earlier run's dumps is refused before anything runs, the dumps
    as they were."""
    manifest = os.path.join(env["kept"], "reference", "manifest.json")
    before = open(manifest, "rb").read()
    argv = ["sensitivity", model_file["model"], "--keep-dumps", env["kept"], "--param", "hif8_rounding"]
    code, out, err = run_cli(argv)
    assert_clean_error(argv, code, err, "pass --overwrite")
    assert open(manifest, "rb").read() == before


def test_unreachable_scheduler(env, model_file, monkeypatch):
    """A scheduler address where nothing listens: one line naming it, before the model is loaded."""
    import ascend_emu.tools.sweep as sweep

    pytest.importorskip("distributed")
    monkeypatch.setattr(sweep, "CONNECT_TIMEOUT", "1s")
    for cmd in ("mixlist-search", "fusion-bisect"):
        argv = [cmd, model_file["model"], "--scheduler", "tcp://127.0.0.1:9"]
        code, out, err = run_cli(argv)
        assert_clean_error(argv, code, err, "cannot reach the Dask scheduler at tcp://127.0.0.1:9")


OPTIONS = {
    "compare": ["--csv", "--cosine", "--limit", "--force", "--rules"],
    "overflow": ["--json", "--ops-info"],
    "report": ["-o", "--output", "--force", "--rules"],
    "replay": ["--input", "--shape", "--seed", "--signature", "--dump", "--overwrite", "--stats-only", "--select",
               "--select-type", "--precision-mode", "--overflow-mode", "--modify-mixlist", "--soc",
               "--fusion-switch", "--fusion-off", "--no-aicpu-fallback", "--subnormals", "--impl-mode",
               "--reduce-accumulate", "--cube-block-size", "--cube-block-sum", "--cube-extra-bits",
               "--cube-normalize", "--cube-conv-k-order", "--op-model"],
    "train": ["--data", "--steps", "--epochs", "--batch-size", "--shuffle", "--seed", "--loss", "--optimizer",
              "--learning-rate", "--momentum", "--nesterov", "--beta-1", "--beta-2", "--epsilon", "--amsgrad",
              "--weight-decay", "--rho", "--centered", "--loss-scale", "--overflow-check", "--reference", "--dump",
              "--dump-steps", "--overwrite", "--json", "--report", "--precision-mode", "--soc", "--op-model",
              "--ranks", "--allreduce", "--allreduce-dtype", "--check-rank-weights", "--rank-init"],
    "reference": ["--input", "--shape", "--seed", "--signature", "--dump", "--overwrite", "--stats-only",
                  "--select", "--select-type"],
    "fusion-bisect": ["--input", "--shape", "--seed", "--metric", "--threshold", "--keep-dumps",
                      "--precision-mode", "--modify-mixlist", "--json", "--data", "--steps", "--batch-size", "--loss",
                      "--optimizer", "--learning-rate", "--loss-scale", "--shuffle"],
    "mixlist-search": ["--input", "--shape", "--seed", "--target", "--output", "--by", "--beam", "--max-steps",
                       "--json", "--scheduler", "--workers", "--precision-mode", "--modify-mixlist"],
    "export-msprobe": ["--step", "--rank", "--tensor-format", "--framework", "--overwrite"],
    "torch-run": ["--soc", "--dump", "--dump-steps", "--stats-only", "--reference", "--steps", "--no-aicpu-fallback",
                  "--json", "--overwrite"],
    "import-msprobe": ["--mapping", "--against", "--allow-unmatched", "--kind", "--step", "--rank", "--overwrite"],
    "check": ["--data", "--benchmark", "--benchmark-config", "--steps", "--batch-size", "--epochs", "--shuffle",
              "--seed", "--loss", "--optimizer", "--learning-rate", "--loss-scale", "--overflow-check", "--json",
              "--report", "--ops-info", "--keep-dumps", "--precision-mode", "--soc"],
    "ops": [], "rules": [],
}
VALUES = ["", "x", "-1", "0", "1e400", "nan", "-inf", "10000000000000000000000", "a=b", "=", "x=1,2", "x=",
          "{file}", "{nodir}", "{npu}", "{bench}", "{deep}", "{badjson}", "{objnpz}", "{truncnpy}", "{empty}",
          "out.csv", "sub/out.csv", "(", "\x00", "é", "--", "-q"]


def test_fuzz_command_lines(env):
    """Random argument vectors for every subcommand (no model that loads: the cases stay fast)."""
    before = _outside_snapshot(env["tmp"])
    rng = random.Random("argv")
    n = 0
    for case in range(600):
        cmd = rng.choice(list(OPTIONS))
        argv = [cmd] if rng.random() < 0.97 else []
        npos = {"compare": 2, "report": 2, "overflow": 1, "export-msprobe": 2, "import-msprobe": 2}.get(cmd, 1 if cmd in ("replay", "reference", "fusion-bisect", "mixlist-search", "train", "check", "torch-run") else 0)
        for _ in range(npos + rng.choice([-1, 0, 0, 0, 1])):
            argv.append(rng.choice(VALUES + ["{npu}", "{bench}", "{missing}", "{file}"]))
        for _ in range(rng.randint(0, 3)):
            if OPTIONS[cmd] and rng.random() < 0.85:
                argv.append(rng.choice(OPTIONS[cmd]))
            argv.append(rng.choice(VALUES))
        argv = [a.format(**env) if "{" in a and "}" in a else a for a in argv]
        if cmd == "demo":
            continue
        code, out, err = run_cli(argv)
        assert "Traceback" not in err + out, (case, argv, err)
        assert code in (0, 2), (case, argv, code, err)
        if code == 2:
            n += 1
            assert "usage:" in err + out or len([ln for ln in err.splitlines() if ": error:" in ln]) == 1, (argv, err)
    assert n > 300
    assert _outside_snapshot(env["tmp"]) == before


def test_dumps_the_disk_will_not_hold_are_refused_before_writing(env, model_file, monkeypatch):
    """train --dump and random-errors estimate their dumps from the traced step or the loaded graph (tensor sizes
    x dumped steps x runs), replay --dump from the graph (issue 35): with the file system's free space
    (shutil.disk_usage) below it, one line, exit 2, nothing written; over ANNOUNCE_BYTES the estimate is told on
    stderr before the run."""
    import shutil

    from ascend_emu.analysis.dump import stats

    tmp = env["tmp"]
    free = {"bytes": 100}
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 40, 0, free["bytes"]))
    common = f"{model_file['model']} --data {model_file['train']} --loss mse --optimizer sgd --steps 2".split()
    for argv, made, fix in ((["train", *common, "--dump", f"{tmp}/d"], f"{tmp}/d", "dump fewer steps"),
                            (["random-errors", *common, "--out", f"{tmp}/re"], f"{tmp}/re", "give fewer --runs"),
                            (["random-errors", model_file["model"], "--out", f"{tmp}/re"], f"{tmp}/re",
                             "give fewer --runs"),
                            (["train", *common, "--reference", "--dump", f"{tmp}/d2/sub"], f"{tmp}/d2",
                             "dump fewer steps"),
                            (["replay", model_file["model"], "--dump", f"{tmp}/r"], f"{tmp}/r", "--stats-only")):
        code, out, err = run_cli(argv)
        assert_clean_error(argv, code, err, "nothing was written")
        assert "file system of" in err and fix in err
        assert not os.path.exists(made), argv
    # room enough, and every dump announced: the estimate comes first, then the run
    free["bytes"] = 1 << 40
    monkeypatch.setattr(stats, "ANNOUNCE_BYTES", 0)
    code, out, err = run_cli(["train", *common, "--dump", f"{tmp}/d", "-q"])
    assert code == 0, err
    assert "the dump of 2 step(s) will take about" in err and os.path.isdir(f"{tmp}/d/step-1")


def test_main_puts_the_callers_warning_format_back(tmp_path):
    """``main()`` formats its warnings as one ascend-emu line while it runs; a program that calls it keeps its
    own ``warnings.formatwarning`` afterwards (catch_warnings does not restore that one)."""
    import warnings

    def mine(message, category, filename, lineno, line=None):
        return "mine\n"

    before = warnings.formatwarning
    warnings.formatwarning = mine
    try:
        code, _, err = run_cli(["compare", str(tmp_path / "missing-a"), str(tmp_path / "missing-b")])
        assert code == 2 and "missing-a" in err
        assert warnings.formatwarning is mine
    finally:
        warnings.formatwarning = before

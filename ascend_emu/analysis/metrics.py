"""Tensor metrics: the one implementation of cosine, errors and the accuracy rule.

Every number a comparison reports comes from here: :func:`compare` fills its rows with
:func:`tensor_metrics`, and the fusion bisection scores a replay with the same function.
Definitions follow msprobe's ``compare`` (column names, the relative-error convention,
the "accuracy reached" rule) with the additions of msaccucmp (MeanAbsErr, RMSE); every
definition and where we differ is in NUMERICS.md section 7. Tensors stream chunk by
chunk in float64, so the memory needed is of the order of one chunk pair.

No TensorFlow here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..errors import AscendEmuError
from ..kernels import stats as _ks

#: the metric columns :func:`tensor_metrics` returns, in the comparison CSV's order
METRIC_COLUMNS = ["Cosine", "EucDist", "RelEucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                  "Five Thousandths Err Ratio", "MeanAbsErr", "RMSE"]
#: a row's Result
PASS, WARNING, ERROR, NA = "pass", "warning", "error", "N/A"
NAN = "Nan"                       # msprobe's marker for metrics that cannot be computed (inf/nan mismatch)
#: elements per chunk pair (float64 working set ~ 10 arrays of this many elements: stays in cache)
CHUNK = 1 << 16


@dataclass(frozen=True)
class Thresholds:
    """The "accuracy reached" rule of msprobe, with its default thresholds.

    A tensor fails (Result "error") when ``(Cosine < cosine and MaxAbsErr > max_abs_err)``
    or ``Cosine < cosine_min`` or ``MaxAbsErr > max_abs_err_max``; otherwise it passes.
    Tensors compared by statistics only fail when a statistic differs by more than
    ``stats_rel`` relative to ``max(|bench statistic|, 0.01)`` (msprobe's red highlight),
    or when the NPU tensor holds inf/nan the bench tensor does not.
    ``one_thousandth`` and ``five_thousandths`` are the relative-error bounds of the two ratios.
    """

    cosine: float = 0.99
    max_abs_err: float = 0.001
    cosine_min: float = 0.9
    max_abs_err_max: float = 1.0
    stats_rel: float = 0.5
    one_thousandth: float = 0.001
    five_thousandths: float = 0.005

    @classmethod
    def coerce(cls, value) -> "Thresholds":
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise AscendEmuError(f"unknown threshold(s) {', '.join(sorted(unknown))}; choose from: "
                                     f"{', '.join(cls.__dataclass_fields__)}")
            return cls(**value)
        raise AscendEmuError(f"thresholds must be a Thresholds or a dict, got {type(value).__name__}")


def accuracy_reached(cosine, max_abs_err, thresholds: Thresholds | None = None) -> bool:
    """msprobe's rule: not ((cos < 0.99 and MaxAbsErr > 0.001) or cos < 0.9 or MaxAbsErr > 1).

    A metric that is not a number ("Nan": mismatched inf/nan) fails; one that does not
    apply ("N/A", "unsupported": an empty tensor) is left out of the rule.
    """
    t = thresholds or Thresholds()
    if cosine == NAN or max_abs_err == NAN:
        return False
    cos = cosine if isinstance(cosine, float) else None
    mae = max_abs_err if isinstance(max_abs_err, float) else None
    if cos is not None and math.isnan(cos) or mae is not None and math.isnan(mae):
        return False
    if cos is not None and cos < t.cosine_min:
        return False
    if mae is not None and mae > t.max_abs_err_max:
        return False
    if cos is not None and mae is not None and cos < t.cosine and mae > t.max_abs_err:
        return False
    return True


def dtype_eps(dtype) -> float:
    """The eps added where the bench value is 0: machine epsilon of the bench dtype
    (float16 2^-10, bfloat16 2^-7, float32 2^-23, float64 2^-52); 1 for integers and booleans."""
    dt = np.dtype(dtype)
    if dt.name == "bfloat16":
        return float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps)
    if dt.kind == "f":
        return float(np.finfo(dt).eps)
    if dt.kind == "V":
        try:
            return float(ml_dtypes.finfo(dt).eps)
        except (TypeError, ValueError):
            return 1.0
    return 1.0


def _chunks_of(x, chunk):
    """Flat C-order chunks of an array, or the chunks an iterator already yields."""
    if isinstance(x, np.ndarray):
        flat = x.reshape(-1)
        for s in range(0, flat.size, chunk):
            yield flat[s:s + chunk]
    else:
        yield from x


def _to_f64(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:] = src as float64 (exact); fp16 and bf16 through the widening kernel (numpy's fp16 cast is slow)."""
    src = src.reshape(-1)
    if src.dtype == np.float16 or src.dtype == ml_dtypes.bfloat16:
        _ks.widen16_f64(src.view(np.uint16), dst, src.dtype != np.float16)
    else:
        np.copyto(dst, src, casting="unsafe")


def tensor_metrics(npu, bench, *, bench_dtype=None, thresholds: Thresholds | None = None,
                   chunk: int = CHUNK) -> dict:
    """Compare two tensors of the same number of elements, in float64.

    Parameters
    ----------
    npu, bench : array or iterable of flat chunks
        Arrays (any shape; compared in flat C order) or iterators of flat chunks
        (such as :meth:`Dump.chunks`) that yield matching lengths.
    bench_dtype : dtype, optional
        Dtype whose eps replaces a bench value of 0 in the relative error (default:
        the bench array's dtype).

    Returns
    -------
    dict
        ``Cosine, EucDist, RelEucDist, MaxAbsErr, MaxRelativeErr, One Thousandth Err Ratio,
        Five Thousandths Err Ratio, MeanAbsErr, RMSE`` (floats, or ``"Nan"`` when the
        inf/nan positions of the two tensors differ, or ``"N/A"`` for empty tensors),
        ``Err_message`` (str) and ``count`` (elements compared).

    Definitions (d = n - b over all elements, after zeroing positions where both
    sides hold the same inf or nan): Cosine = n.b / (|n| |b|) (1 if both are all
    zero, 0 if only one is); EucDist = |d| (absolute, msprobe's); RelEucDist = |d| / |b|
    (0 if d = 0, inf if b = 0 != d);
    MaxAbsErr = max |d|; rel = |d| / |b|, with eps(bench dtype) in place of |b| where
    b = 0; MaxRelativeErr = max rel; the ratios = fraction with rel < 0.001 / 0.005;
    MeanAbsErr = mean |d|; RMSE = sqrt(mean d^2).
    """
    t = thresholds or Thresholds()
    if bench_dtype is None:
        bench_dtype = bench.dtype if isinstance(bench, np.ndarray) else np.float32
    eps = dtype_eps(bench_dtype)
    if isinstance(npu, np.ndarray) and isinstance(bench, np.ndarray) and npu.size != bench.size:
        raise AscendEmuError(f"tensor_metrics: {npu.size} NPU elements vs {bench.size} bench elements")
    nb = bb = nn = dd = sabs = 0.0
    maxabs = maxrel = 0.0
    c1 = c5 = 0
    count = 0
    masked = 0
    mismatch = npu_only = bench_only = 0
    ni = _chunks_of(npu, chunk)
    bi = _chunks_of(bench, chunk)
    bufs = None
    with np.errstate(all="ignore"):
        for nc in ni:
            bc = next(bi, None)
            if bc is None:
                raise AscendEmuError("tensor_metrics: the NPU tensor has more elements than the bench tensor")
            k = nc.size
            if k != bc.size:
                raise AscendEmuError(f"tensor_metrics: chunk of {k} NPU elements vs {bc.size} bench elements")
            if bufs is None or bufs[0].size < k:
                # reused float64 work buffers: one chunk each, whatever the tensor's size
                bufs = (np.empty(k), np.empty(k))
            n, b = (x[:k] for x in bufs)
            _to_f64(n, nc)
            _to_f64(b, bc)
            # one pass, fixed order (kernels.stats.pair_stats): not BLAS, whose dots sum in an order that depends
            # on the CPU's vector width and its thread count
            sums = _ks.pair_stats(n, b, eps, t.one_thousandth, t.five_thousandths)
            # an inf or nan anywhere makes a sum of squares non-finite: only then look for the masks
            if not (math.isfinite(sums[0]) and math.isfinite(sums[1])):
                fn = np.isfinite(n)
                fb = np.isfinite(b)
                if not (fn.all() and fb.all()):
                    # same positions and the same special value (nan, +inf or -inf) on both sides
                    same = ~fn & ~fb & ((np.isnan(n) & np.isnan(b)) | (n == b))
                    mismatch += int(((~fn | ~fb) & ~same).sum())
                    npu_only += int((~fn & fb).sum())
                    bench_only += int((fn & ~fb).sum())
                    masked += int(same.sum())
                    n[~fn] = 0.0
                    b[~fb] = 0.0
                    sums = _ks.pair_stats(n, b, eps, t.one_thousandth, t.five_thousandths)
            count += k
            if mismatch or not k:
                continue  # keep counting mismatches; no metric will be reported
            cnn, cbb, cnb, cdd, cabs, cmax, crel, k1, k5 = sums
            nn += cnn
            bb += cbb
            nb += cnb
            dd += cdd
            sabs += cabs
            # max |d|, max relative error |d| / |b| (eps where b = 0) and the two ratios' counts
            maxabs = max(maxabs, float(cmax))
            maxrel = max(maxrel, float(crel))
            c1 += int(k1)
            c5 += int(k5)
        for _ in bi:
            raise AscendEmuError("tensor_metrics: the bench tensor has more elements than the NPU tensor")
    msgs = []
    if masked:
        msgs.append(f"{masked} matching inf/nan value(s) zeroed before comparing.")
    if mismatch:
        where = [f"{npu_only} non-finite only in the NPU tensor" if npu_only else "",
                 f"{bench_only} only in the bench tensor" if bench_only else "",
                 f"{mismatch - npu_only - bench_only} a different inf/nan on each side"
                 if mismatch - npu_only - bench_only else ""]
        msgs.append(f"The position of inf or nan in NPU and bench Tensor do not match ({mismatch} element(s): "
                    + ", ".join(w for w in where if w) + ").")
        return {**{c: NAN for c in METRIC_COLUMNS}, "Err_message": " ".join(msgs), "count": count}
    if count == 0:
        return {**{c: NA for c in METRIC_COLUMNS}, "Err_message": "This is empty data, can not compare.",
                "count": 0}
    na, nbn = math.sqrt(nn), math.sqrt(bb)
    if na == 0 and nbn == 0:
        cos = 1.0
    elif na == 0 or nbn == 0:
        cos = 0.0
        msgs.append("All the data is zero in the " + ("NPU" if na == 0 else "bench")
                    + " tensor only: Cosine set to 0.")
    else:
        cos = min(1.0, max(-1.0, nb / na / nbn))
    rd = math.sqrt(dd)
    euc = 0.0 if rd == 0 else (rd / nbn if nbn > 0 else math.inf)
    return {"Cosine": cos, "EucDist": rd, "RelEucDist": euc, "MaxAbsErr": maxabs, "MaxRelativeErr": maxrel,
            "One Thousandth Err Ratio": c1 / count, "Five Thousandths Err Ratio": c5 / count,
            "MeanAbsErr": sabs / count, "RMSE": math.sqrt(dd / count), "Err_message": " ".join(msgs),
            "count": count}


def _stats_compare(nout: dict, bout: dict, t: Thresholds) -> tuple[str, str]:
    """Result and message for a pair compared by dumped statistics only."""
    worst = 0.0
    worst_name = None
    for k in ("max", "min", "mean", "l2norm"):
        a, b = nout.get(k), bout.get(k)
        if a is None or b is None:
            if (a is None) != (b is None):
                worst, worst_name = math.inf, k
            continue
        if a == b or (math.isnan(a) and math.isnan(b)):
            r = 0.0   # equal, including the same infinity (a tensor with no finite value)
        elif not (math.isfinite(a) and math.isfinite(b)):
            r = math.inf
        else:
            r = abs(a - b) / max(abs(b), 0.01)
        if r > worst or worst_name is None:
            worst, worst_name = r, k
    n_bad = int(nout.get("nan", 0)) + int(nout.get("inf", 0))
    b_bad = int(bout.get("nan", 0)) + int(bout.get("inf", 0))
    msg = (f"statistics only (tensor not dumped): largest relative difference {worst:.3g} in {worst_name}"
           if worst_name else "statistics only (tensor not dumped)")
    if n_bad != b_bad:
        msg += f"; NPU has {n_bad} inf/nan, bench {b_bad}"
        return ERROR, msg + "."
    return (ERROR if worst > t.stats_rel else PASS), msg + "."


def format_metric(v: float, digits: int = 6) -> str:
    """A metric for a table: ``digits`` significant digits, but a cosine just below 1 with enough decimals
    to show how far below (0.99999973, not 1)."""
    if math.isnan(v):
        return "nan"
    if 0.99 <= v < 1.0:
        k = min(15, max(6, math.ceil(-math.log10(1.0 - v)) + 1))
        return f"{v:.{k}f}"
    return f"{v:.{digits}g}"

"""The one-pass float32 chain with several outputs (numerics/chain.py ``chain_f32``, kernels/chain32.py): the
optimizers' update programs bit for bit against an independent oracle (each step in float64, rounded once to
float32: exact for + - * / and sqrt, whose double rounding through float64 is innocuous) and against today's
op-by-op path (the registry's float32 ops), on hostile data: signed zeros, float32 subnormals, values near
the float32 limit whose products and sums overflow, Inf and NaN. On finite data the kernel must be the path
taken; wherever a step's result is Inf or NaN it must hand the chain back (None).
"""
from __future__ import annotations

import naive
import numpy as np
import pytest

from ascend_emu.numerics import chain as nchain
from ascend_emu.ops import OPS, OpContext

rng = np.random.default_rng(20261206)

#: step name -> the registry op today's path runs for it
TF_TYPES = {"add": "AddV2", "sub": "Sub", "mul": "Mul", "realdiv": "RealDiv", "neg": "Neg", "square": "Square",
            "sqrt": "Sqrt"}


def _adam(nesterov=False):
    """Keras 3 Adam (and TF's ApplyAdam chain): inputs g, m, v, w (full), 1 - beta1, 1 - beta2, alpha, eps,
    beta1 (single); outputs w, m, v."""
    s = [("sub", 0, 1), ("mul", 9, 4), ("add", 1, 10),                          # 11: m
         ("square", 0, -1), ("sub", 12, 2), ("mul", 13, 5), ("add", 2, 14)]     # 15: v
    mm = 11
    if nesterov:
        s += [("mul", 11, 8), ("mul", 0, 4), ("add", 16, 17)]                  # 18: m b1 + (1 - b1) g
        mm = 18
    k = 9 + len(s)
    s += [("mul", mm, 6), ("sqrt", 15, -1), ("add", k + 1, 7), ("realdiv", k, k + 2), ("sub", 3, k + 3)]
    return s, (k + 4, 11, 15), 4, 5


def _weight_decay():
    """AdamW's decoupled decay (Keras): inputs w (full), lr, wd (single); w - w * (lr * wd)."""
    return [("mul", 1, 2), ("mul", 0, 3), ("sub", 0, 4)], (5,), 1, 2


def _momentum(nesterov=False):
    """Keras SGD momentum: inputs g, accum, w (full), momentum, lr (single); accum = accum m - g lr; w += accum
    (nesterov: w += accum m - g lr). Outputs w, accum."""
    s = [("mul", 1, 3), ("mul", 0, 4), ("sub", 5, 6)]                            # 7: accum
    if nesterov:
        s += [("mul", 7, 3), ("mul", 0, 4), ("sub", 8, 9), ("add", 2, 10)]        # 11: w
        return s, (11, 7), 3, 2
    s += [("add", 2, 7)]
    return s, (8, 7), 3, 2


def _rmsprop():
    """TF's ApplyRMSProp: inputs g, ms, mom, w (full), 1 - rho, momentum, lr, eps (single); outputs w, ms, mom."""
    s = [("square", 0, -1), ("sub", 8, 1), ("mul", 9, 4), ("add", 1, 10),         # 11: ms
         ("mul", 2, 5), ("mul", 6, 0), ("add", 11, 7), ("sqrt", 14, -1), ("realdiv", 13, 15), ("add", 12, 16),  # 17
         ("neg", 17, -1), ("add", 3, 18)]                                           # 19: w - mom as w + (-mom)
    return s, (19, 11, 17), 4, 4


PROGRAMS = {"adam": _adam(), "adam_nesterov": _adam(True), "momentum": _momentum(),
            "momentum_nesterov": _momentum(True), "rmsprop": _rmsprop(), "weight_decay": _weight_decay()}
SHAPES = [(7,), (3, 1500), (40, 1024), (5, 0)]
SINGLES = {"adam": [0.1, 0.001, 1e-3, 1e-7, 0.9], "adam_nesterov": [0.1, 0.001, 1e-3, 1e-7, 0.9],
           "momentum": [0.9, 0.01], "momentum_nesterov": [0.9, 0.01], "rmsprop": [0.1, 0.9, 1e-3, 1e-7],
           "weight_decay": [1e-3, 4e-3]}


def _data(shape, nfull, kind):
    """Full-size float32 inputs: normal values mixed with signed zeros and float32 subnormals; ``big`` adds
    values near the float32 limit (products and sums overflow), ``specials`` Inf and NaN."""
    out = []
    for _ in range(nfull):
        x = rng.standard_normal(shape)
        pick = rng.integers(0, 10, shape)
        x = np.where(pick == 1, rng.choice([0.0, -0.0], shape), x)
        x = np.where(pick == 2, rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-149, -126, shape)), x)
        if kind == "big":
            x = np.where(pick == 3, rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(120, 127.9, shape)), x)
        if kind == "specials":
            x = np.where(pick == 3, rng.choice([np.inf, -np.inf, np.nan], shape), x)
        out.append(x.astype(np.float32))
    return out


def _ops(inputs, steps, outputs, overflow_mode):
    """Today's path: each step the registry's float32 op; (outputs, OR of the statuses)."""
    vals = list(inputs)
    status = 0
    for name, a, b in steps:
        ctx = OpContext(dtype="float32", overflow_mode=overflow_mode)
        args = (vals[a],) if name in nchain.F32_UNARY else (vals[a], vals[b])
        vals.append(OPS[TF_TYPES[name]](*args, ctx=ctx)[0])
        status |= ctx.status
    return [np.asarray(vals[o]) for o in outputs], status


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_update_programs_match_oracle_and_ops(name, shape):
    steps, outputs, nfull, nsingle = PROGRAMS[name]
    singles = [np.array(v, np.float32) for v in SINGLES[name]]
    assert len(singles) == nsingle
    for kind in ("finite", "big", "specials"):
        full = _data(shape, nfull, kind)
        if name.startswith("adam"):
            full[2] = np.abs(full[2])    # a second moment is never negative
        if name == "rmsprop":
            full[1] = np.abs(full[1])
        inputs = full + singles
        got = nchain.chain_f32(inputs, steps, outputs)
        want = naive.program32(inputs, steps, outputs)
        every = naive.program32(inputs, steps, range(len(inputs), len(inputs) + len(steps)))
        finite = all(np.isfinite(w).all() for w in every)
        for mode in ("inf_nan", "saturation"):
            ops, status = _ops(inputs, steps, outputs, mode)
            if got is not None:
                assert status == 0, (name, kind, mode)
                for g, o in zip(got, ops):
                    assert g.shape == o.shape and g.dtype == np.float32
                    np.testing.assert_array_equal(_bits(g), _bits(o), err_msg=f"{name} {kind} {mode}")
        if kind == "finite":
            assert finite, name                 # (the data is meant to be)
        # the kernel is the path taken whenever every step's value is finite, and only then
        assert (got is not None) == finite, (name, kind)
        if got is not None:
            for g, w in zip(got, want):
                np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=f"{name} {kind}")


def test_every_intermediate_is_checked():
    """An Inf in an intermediate that a later step turns finite again (x / Inf = 0) still hands the chain back:
    the ops would have raised the status there."""
    x = np.array([1.0, 2.0, 3.0e38], np.float32)
    big = np.array(10.0, np.float32)
    # (x * 10) overflows for 3e38; 1 / that is 0: finite outputs, yet not the kernel's to give
    got = nchain.chain_f32([x, big, np.array(1.0, np.float32)], [("mul", 0, 1), ("realdiv", 2, 3)], (4,))
    assert got is None
    _, status = _ops([x, big, np.array(1.0, np.float32)], [("mul", 0, 1), ("realdiv", 2, 3)], (4,), "inf_nan")
    assert status


def test_single_values_and_aliases():
    """Steps on single values run once (their results 0-d arrays); an output that is an input is that input."""
    a, b = np.array(0.25, np.float32), np.array(3.0, np.float32)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    got = nchain.chain_f32([a, b, w], [("sub", 1, 0), ("sqrt", 3, -1), ("mul", 2, 4)], (3, 4, 5, 2))
    assert got[0].shape == () and got[1].shape == () and got[2].shape == (4, 5) and got[3] is w
    np.testing.assert_array_equal(_bits(got[1]), _bits(np.sqrt(np.float32(2.75))))
    np.testing.assert_array_equal(_bits(got[2]), _bits(w * np.sqrt(np.float32(2.75))))
    # a single value that overflows: handed back
    assert nchain.chain_f32([np.array(3e38, np.float32), b], [("mul", 0, 1)], (2,)) is None


@pytest.mark.parametrize("inputs", [
    [np.ones((3, 4), np.float32), np.ones((4, 3), np.float32)],           # two full shapes
    [np.ones((3, 4), np.float32), np.ones((1, 4), np.float32)],           # a broadcast operand
    [np.ones((3, 4), np.float16), np.ones((3, 4), np.float32)],           # not float32
], ids=["shapes", "broadcast", "dtype"])
def test_declines_what_it_does_not_model(inputs):
    assert nchain.chain_f32(inputs, [("add", 0, 1)], (2,)) is None


def test_rows_are_reused_without_clobbering():
    """A long program whose row allocation reuses rows: every intermediate an output too, and not."""
    x, y = (rng.standard_normal(5000).astype(np.float32) for _ in range(2))
    steps = [("add", 0, 1)]
    for k in range(20):
        steps.append((("mul", "sub", "add", "realdiv")[k % 4], 2 + k, k % 2))
    outs_all = tuple(range(2, 2 + len(steps)))
    want = naive.program32([x, y], steps, outs_all)
    # (at most four outputs: the kernel compiled for four, as the optimizers use it)
    for outs in (outs_all[:4], outs_all[4:8], outs_all[8:12], outs_all[12:16], outs_all[16:20], outs_all[-4:],
                 (outs_all[-1],), (outs_all[3], outs_all[-1], outs_all[3])):
        got = nchain.chain_f32([x, y], steps, outs)
        assert got is not None
        for g, o in zip(got, outs):
            np.testing.assert_array_equal(_bits(g), _bits(want[o - 2]))


def _adam_inputs(n, g=None, v=None):
    full = _data((n,), 4, "finite")
    full[2] = np.abs(full[2])
    if g is not None:
        full[0][:len(g)] = g
    if v is not None:
        full[2][:len(v)] = v
    return full + [np.array(x, np.float32) for x in SINGLES["adam"]]


def _adam_match(steps, outputs, kinds):
    from ascend_emu.kernels import chain32
    prog, fill, out_rows, nrows = nchain._program32(tuple(steps), tuple(outputs), tuple(kinds))[:4]
    return chain32._adam_match(fill, prog, out_rows, nrows)


def test_adam_runs_in_its_one_pass_kernel_and_near_misses_do_not():
    """Adam's program is recognised (kernels/chain32.py ``_ADAM``: the inputs and outputs bound whatever their
    order); a program that differs in one operand's order, one step or one output is left to the blocked
    steps; both give the oracle's bits."""
    steps, outputs, nfull, nsingle = PROGRAMS["adam"]
    kinds = (1,) * nfull + (0,) * nsingle
    ins, sc, outk = _adam_match(steps, outputs, kinds)
    assert list(ins) == [0, 1, 2, 3] and list(sc) == [0, 1, 2, 3] and list(outk) == [1, 2, 0]
    # the same chain with its inputs listed in another order (m, g, w, v) and its outputs too (m, v, w)
    perm = [1, 0, 3, 2, 4, 5, 6, 7, 8]
    where = {old: new for new, old in enumerate(perm)}
    moved = [(nm, where.get(a, a), where.get(b, b)) for nm, a, b in steps]
    ins, sc, outk = _adam_match(moved, (11, 15, outputs[0]), kinds)
    assert list(ins) == [1, 0, 3, 2] and list(outk) == [0, 1, 2]
    misses = {"m + t as t + m": [(n, b, a) if k == 2 else (n, a, b) for k, (n, a, b) in enumerate(steps)],
              "g * g for square(g)": [("mul", 0, 0) if k == 3 else s for k, s in enumerate(steps)],
              "nesterov": PROGRAMS["adam_nesterov"][0]}
    for what, other in misses.items():
        outs = PROGRAMS["adam_nesterov"][1] if what == "nesterov" else outputs
        assert _adam_match(other, outs, kinds) is None, what
    assert _adam_match(steps, outputs[:2], kinds) is None                   # w and m only
    assert _adam_match(steps, outputs + (12,), kinds) is None               # and an intermediate
    inputs = _adam_inputs(3000)
    for other, outs in [(steps, outputs), (moved, (11, 15, outputs[0])), (misses["m + t as t + m"], outputs)]:
        ins_ = [inputs[p] for p in perm] if other is moved else inputs
        got = nchain.chain_f32(ins_, other, outs)
        want = naive.program32(ins_, other, outs)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(_bits(g), _bits(w))


@pytest.mark.parametrize("n", [1, 33, 70000])
def test_adam_hands_back_a_divisor_that_overflowed(n):
    """sqrt(v) + eps = Inf makes the step m alpha / Inf = 0 and w finite again: only the divisor shows the
    overflow the ops would raise (``_adam_pass`` tests it with the last step); one element is enough."""
    steps, outputs, _, _ = PROGRAMS["adam"]
    g = np.array([1e20], np.float32)                 # g^2 overflows, v becomes Inf
    inputs = _adam_inputs(n, g=g)
    every = naive.program32(inputs, steps, range(9, 9 + len(steps)))
    assert np.isfinite(every[-1]).all() and not np.isfinite(every[-3]).all()
    assert nchain.chain_f32(inputs, steps, outputs) is None
    inputs = _adam_inputs(n, v=np.array([-1.0], np.float32))   # a negative second moment: sqrt gives NaN
    assert nchain.chain_f32(inputs, steps, outputs) is None
    assert nchain.chain_f32(_adam_inputs(n), steps, outputs) is not None


#: operands that make the steps overflow (3e38 * 2, 3e38 + 3e38), underflow to 0, divide by 0 and give NaN
#: (0 / 0, Inf * 0, Inf - Inf, sqrt(-1)) mid-chain
_HOSTILE = np.array([0.0, -0.0, 1.0, -2.0, 0.5, 3e38, -3e38, 1e-30, np.inf, -np.inf, np.nan], np.float32)


def test_hidden_intermediates_still_hand_the_chain_back():
    """Only the steps no later step reads other than as a divisor are tested (kernels/chain32.py
    ``_tested_steps``); the chain must still be handed back exactly when some step's value is Inf or NaN, as
    when every step was tested (the ops would raise the status there). Random programs over mostly normal
    values with a few hostile ones (non-Adam: the blocked steps) against the oracle's every step; both ways an
    Inf or NaN leaves no trace in the outputs (a divisor: x / Inf = 0; a step no later step or output reads)
    must occur, or the test would prove nothing."""
    names = sorted(nchain.F32_STEP_CODES)
    r = np.random.default_rng(4646)
    by_divisor = unread = 0
    for trial in range(900):
        nfull, nsingle, nsteps = int(r.integers(1, 4)), int(r.integers(0, 3)), int(r.integers(1, 9))
        n = int(r.integers(1, 2100)) if trial % 8 == 0 else int(r.integers(1, 6))
        full = []
        for _ in range(nfull):
            x = r.standard_normal(n).astype(np.float32)
            bad = r.random(n) < (0.3 if n < 6 else 0.002)
            x[bad] = r.choice(_HOSTILE, int(bad.sum()))
            full.append(x)
        inputs = full + [np.array(r.choice(_HOSTILE[:8]), np.float32) for _ in range(nsingle)]
        steps = []
        for s in range(nsteps):
            name = "realdiv" if r.random() < 0.3 else names[r.integers(len(names))]
            a = int(r.integers(len(inputs) + s))
            b = -1 if name in nchain.F32_UNARY else int(r.integers(len(inputs) + s))
            steps.append((name, a, b))
        k_in, nv = len(inputs), len(inputs) + nsteps
        outputs = tuple(int(o) for o in r.choice(np.arange(nfull, nv), int(r.integers(1, 4))))
        every = naive.program32(inputs, steps, range(k_in, nv))
        finite = [bool(np.isfinite(w).all()) for w in every]
        got = nchain.chain_f32(inputs, steps, outputs)
        assert (got is not None) == all(finite), (trial, steps, outputs)
        read = {a for _, a, _ in steps} | {b for nm, _, b in steps if nm not in nchain.F32_UNARY} | set(outputs)
        seen = all(finite[o - k_in] for o in outputs if o >= k_in)
        dead_ok = all(finite[v - k_in] for v in range(k_in, nv) if v not in read)
        unread += seen and not dead_ok
        by_divisor += seen and dead_ok and not all(finite)
        if got is not None:
            want = naive.program32(inputs, steps, outputs)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=str((trial, steps, outputs)))
    assert by_divisor >= 10 and unread >= 10, (by_divisor, unread)


def _tested(name):
    from ascend_emu.kernels import chain32
    steps, outputs, nfull, nsingle = PROGRAMS[name]
    prog, _, _, nrows = nchain._program32(tuple(steps), tuple(outputs), (1,) * nfull + (0,) * nsingle)[:4]
    return {int(s) + nfull + nsingle for s in np.flatnonzero(chain32._tested_steps(prog, nrows))}


def test_tested_steps_of_the_update_chains():
    """The optimizers' chains test their last steps and their divisors only: SGD momentum its w (the
    accumulator is read by w's step), RMSProp the divisor sqrt(ms + eps) and w, Adam (nesterov: the blocked
    path) its divisor and w."""
    assert _tested("momentum") == {8}
    assert _tested("momentum_nesterov") == {11}
    assert _tested("rmsprop") == {15, 19}
    assert _tested("adam_nesterov") == {21, 23}
    assert _tested("weight_decay") == {5}

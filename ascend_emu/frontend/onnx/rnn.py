"""ONNX's recurrent ops onto the registry's cell ops (issue 45 item 6): LSTM as CANN's DynamicRNN, which the NPU
runs on the AI Core (cube and vector), one DynamicRNN per direction; GRU as DynamicGRUV2 (:func:`_gru`).

ONNX LSTM (layout 0: X is (T, B, input)) holds W (D, 4H, input), R (D, 4H, H) and B (D, 8H) with the gates in the
order i, o, f, c; DynamicRNN takes one weight ((input + H), 4H), the gates in the order i, j (ONNX's c), f, o, and
one bias: W and R are transposed, stacked and their gate blocks reordered when the model loads (data movement),
and the two biases Wb + Rb added in float32 there, as onnxruntime adds them before its steps. What DynamicRNN
cannot express runs on the AI CPU: activations other than sigmoid/tanh/tanh, clip, input_forget, peepholes,
sequence_lens, layout 1, weights not known at load.
"""
from __future__ import annotations

import numpy as np

from .build import FLOATS, Fallback
from .ops import converter

#: ONNX's gate blocks (i, o, f, c) in DynamicRNN's order (i, j = c, f, o)
_IJFO = (0, 3, 2, 1)


def _reorder(m, hidden):
    """The rows of (4H, ...) ``m`` in the order i, j, f, o."""
    return np.concatenate([m[k * hidden:(k + 1) * hidden] for k in _IJFO], axis=0)


@converter("LSTM")
def _lstm(b, n):
    acts = [str(a) for a in (n.a("activations") or [])]
    if acts and [a.lower() for a in acts] not in (["sigmoid", "tanh", "tanh"], ["sigmoid", "tanh", "tanh"] * 2):
        raise Fallback(f"LSTM activations {acts}")
    if n.a("clip") is not None or int(n.a("input_forget", 0)) or int(n.a("layout", 0)):
        raise Fallback("LSTM with clip, input_forget or layout 1")
    if n.inp(4) or n.inp(7):
        raise Fallback("LSTM with sequence_lens or peepholes")
    t = b.dtype(n.inputs[0])
    if t not in FLOATS:
        raise Fallback("LSTM of a non-float input")
    W = np.asarray(b.need(n.inputs[1], "LSTM's W"), np.float32)
    R = np.asarray(b.need(n.inputs[2], "LSTM's R"), np.float32)
    D, four_h, n_in = W.shape
    hidden = four_h // 4
    Bias = np.asarray(b.need(n.inp(3), "LSTM's B"), np.float32) if n.inp(3) else np.zeros((D, 8 * hidden), np.float32)
    T, batch, _ = b.static_shape(n.inputs[0])
    direction = n.a("direction", "forward")
    dirs = {"forward": ["UNIDIRECTIONAL"], "reverse": ["REDIRECTIONAL"],
            "bidirectional": ["UNIDIRECTIONAL", "REDIRECTIONAL"]}.get(direction)
    if dirs is None or len(dirs) != D:
        raise Fallback(f"LSTM direction {direction!r} with {D} weight sets")
    x = b.ref(n.inputs[0])
    ys, hs, cs = [], [], []
    for d, mode in enumerate(dirs):
        base = f"{n.name}/DynamicRNN" + (f"_{d}" if D > 1 else "")
        w = np.concatenate([_reorder(W[d], hidden).T, _reorder(R[d], hidden).T], axis=0)     # (in + H, 4H)
        bias = _reorder(Bias[d, :four_h] + Bias[d, four_h:], hidden)     # float32, as onnxruntime adds them
        init = []
        for k, what in ((5, "initial_h"), (6, "initial_c")):
            if n.inp(k):
                init.append(b.emit(f"{base}/{what}", "StridedSlice", [
                    b.ref(n.inp(k)), b.ints([d, 0, 0], f"{base}/{what}_begin"),
                    b.ints([d + 1, batch, hidden], f"{base}/{what}_end"), b.ints([1, 1, 1], f"{base}/strides")]))
            else:
                init.append(b.const(np.zeros((1, batch, hidden), t), f"{n.name}/zero_state"))
        b.emit(base, "DynamicRNN", [x, b.const(np.ascontiguousarray(w, dtype=t), f"{base}/weight"),
                                    b.const(bias.astype(t), f"{base}/bias"), *init],
               {"cell_type": "LSTM", "direction": mode, "forget_bias": 0.0, "time_major": True, "T": t}, 3)
        ys.append(b.emit(f"{base}/Y", "ExpandDims", [f"{base}:0", b.const(np.int32(1), f"{n.name}/axis1")]))
        hs.append(f"{base}:1")
        cs.append(f"{base}:2")
    if D > 1:
        axis0 = b.const(np.int32(0), f"{n.name}/axis0")
        outs = [b.emit(f"{n.name}/Y_concat", "ConcatV2", [*ys, b.const(np.int32(1), f"{n.name}/axis1")]),
                b.emit(f"{n.name}/Y_h_concat", "ConcatV2", [*hs, axis0]),
                b.emit(f"{n.name}/Y_c_concat", "ConcatV2", [*cs, axis0])]
    else:
        outs = [ys[0], hs[0], cs[0]]
    b.emit(n.name, "IdentityN", outs, {"T": [t] * 3}, 3, exact=True)
    return [f"{n.name}:{k}" for k in range(3)]


@converter("GRU")
def _gru(b, n):
    """ONNX GRU with linear_before_reset (torch.nn.GRU's export) as CANN's DynamicGRUV2, one per direction (its
    gate order zrh is ONNX's z, r, h): W and R transposed to (input, 3H) and (H, 3H) at load, the two biases kept
    apart (the kernel adds each to its own matmul). The reverse direction is the same cell over the sequence
    reversed in time (ReverseV2 of x in, of y out: data movement). ONNX's default linear_before_reset 0 (the
    reset before the hidden matmul) and what DynamicGRUV2 cannot express run on the AI CPU."""
    acts = [str(a).lower() for a in (n.a("activations") or [])]
    if acts and acts not in (["sigmoid", "tanh"], ["sigmoid", "tanh"] * 2):
        raise Fallback(f"GRU activations {acts}")
    if not int(n.a("linear_before_reset", 0)) or n.a("clip") is not None or int(n.a("layout", 0)):
        raise Fallback("GRU without linear_before_reset, or with clip or layout 1")
    if n.inp(4):
        raise Fallback("GRU with sequence_lens")
    t = b.dtype(n.inputs[0])
    if t not in FLOATS:
        raise Fallback("GRU of a non-float input")
    W = np.asarray(b.need(n.inputs[1], "GRU's W"), np.float32)
    R = np.asarray(b.need(n.inputs[2], "GRU's R"), np.float32)
    D, hidden = W.shape[0], R.shape[-1]
    Bias = np.asarray(b.need(n.inp(3), "GRU's B"), np.float32) if n.inp(3) else np.zeros((D, 6 * hidden), np.float32)
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(n.a("direction", "forward"))
    if dirs is None or len(dirs) != D:
        raise Fallback(f"GRU direction {n.a('direction')!r} with {D} weight sets")
    T, batch, _ = b.static_shape(n.inputs[0])
    time_axis = b.const(np.asarray([0], np.int32), f"{n.name}/time_axis")
    ys, hs = [], []
    for d, backward in enumerate(dirs):
        base = f"{n.name}/DynamicGRUV2" + (f"_{d}" if D > 1 else "")
        x = b.ref(n.inputs[0])
        if backward:
            x = b.emit(f"{base}/reverse_x", "ReverseV2", [x, time_axis])
        if n.inp(5):
            init = b.emit(f"{base}/initial_h", "StridedSlice", [
                b.ref(n.inp(5)), b.ints([d, 0, 0], f"{base}/initial_h_begin"),
                b.ints([d + 1, batch, hidden], f"{base}/initial_h_end"), b.ints([1, 1, 1], f"{base}/strides")])
        else:
            init = b.const(np.zeros((1, batch, hidden), t), f"{n.name}/zero_state")
        b.emit(base, "DynamicGRUV2", [x, b.const(np.ascontiguousarray(W[d].T, dtype=t), f"{base}/weight_input"),
                                      b.const(np.ascontiguousarray(R[d].T, dtype=t), f"{base}/weight_hidden"),
                                      b.const(Bias[d, :3 * hidden].astype(t), f"{base}/bias_input"),
                                      b.const(Bias[d, 3 * hidden:].astype(t), f"{base}/bias_hidden"), init],
               {"direction": "UNIDIRECTIONAL", "gate_order": "zrh", "reset_after": True, "time_major": True, "T": t}, 2)
        y = f"{base}:0"
        if backward:
            y = b.emit(f"{base}/reverse_y", "ReverseV2", [y, time_axis])
        ys.append(b.emit(f"{base}/Y", "ExpandDims", [y, b.const(np.int32(1), f"{n.name}/axis1")]))
        hs.append(f"{base}:1")
    if D > 1:
        outs = [b.emit(f"{n.name}/Y_concat", "ConcatV2", [*ys, b.const(np.int32(1), f"{n.name}/axis1")]),
                b.emit(f"{n.name}/Y_h_concat", "ConcatV2", [*hs, b.const(np.int32(0), f"{n.name}/axis0")])]
    else:
        outs = [ys[0], hs[0]]
    b.emit(n.name, "IdentityN", outs, {"T": [t] * 2}, 2, exact=True)
    return [f"{n.name}:0", f"{n.name}:1"]

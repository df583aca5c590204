"""Recurrent cells as CANN runs them on the AI Core: DynamicRNN (an LSTM over a whole sequence) and DynamicGRUV2 (a
GRU; issue 45 item 6).

DynamicRNN's TBE kernel (canndev ``ops/built-in/tbe/impl/dynamic_rnn.py``, ``dynamic_rnn_core``; read in the
public mirror dengguojie/vue-element-admin) computes each step t, with gates in the order i, j, f, o:

* the cube: [x_t, h_{t-1}] (M x (input + hidden), the operand dtype) times w ((input + hidden) x 4 hidden),
  accumulated in float32 (``c_l0c``: ``tvm.sum(... .astype('float32'))``), then the bias added in float32
  (``vadd(c_ub, bias_bc_ub)``; a float16 bias widened first);
* the gates in float32: sigmoid(i), tanh(j), sigmoid(f + forget_bias), sigmoid(o) with the kernel's own
  ``sigmoid_compute`` / ``tanh_compute``, which are the TBE Sigmoid and Tanh float32 forms (NUMERICS.md section
  2, "Sourced kernels"); the kernel always writes them to its gate outputs (``is_gate_output = True``, "due to
  FE/GE not support, now set default value") in the bias dtype and reads them back (``*_back_fp32``);
* c_t = c_{t-1} f + j i (float32 vmul, vmul, vadd), stored in the bias dtype (``update_c_fp16_drnn_cast``
  when the bias is float16), and tanh of the stored c, itself written to the tanhc output and read back;
* h_t = tanh(c_t) o in float32, stored in float16 (``update_h_fp16_drnn_cast``: the next step's cube operand and
  the output y). Its REDIRECTIONAL direction runs the steps from the last time index to the first.

The emulator's compute dtype plays the bias dtype: a 16-bit compute dtype stores c and h in it each step; float32
keeps both in float32 (the 2021 kernel takes float16 x only; a float32 DynamicRNN, as on a cube with float32,
is assumed to keep h in float32 too: NUMERICS.md section 9, ONNX models).
"""
from __future__ import annotations

import numpy as np

from ..errors import AscendEmuError
from ._util import to_f32
from .math_ops import vec
from .registry import CUBE, Source, register
from .sourced import _f32ctx

_RNN_SOURCE = Source(
    ("canndev ops/built-in/tbe/impl/dynamic_rnn.py (dynamic_rnn_core: float32 cube accumulation, float32 bias add and "
     "gates, the gates, tanh(c), c and h stored in the bias dtype)", "NUMERICS.md section 9 (ONNX models: LSTM)"), (),
    "the kernel's steps; the cube's K order is the emulated matmul's; a float32 DynamicRNN keeping h in float32 is "
    "assumed (no parameter)")


def _store(ctx, y32):
    """A float32 state stored in the compute dtype (the kernel's *_drnn_cast), status recorded."""
    from ..numerics.vector import cast

    if ctx.dtype == np.float32:
        return y32
    y, st = cast(y32, ctx.dtype_name, overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals)
    ctx.record(st)
    return y


@register("DynamicRNN", kind=CUBE, source=_RNN_SOURCE)
def dynamic_rnn(x, w, b, init_h, init_c, *, ctx, cell_type="LSTM", direction="UNIDIRECTIONAL", forget_bias=0.0,
                time_major=True):
    """An LSTM over the time-major sequence ``x`` (T, B, input): returns y (T, B, hidden) and the states h and c
    after the last step (1, B, hidden; CANN's output_h and output_c hold every step's, of which ONNX's Y_h and Y_c,
    the only readers here, take the last); ``init_h``/``init_c`` are (1, B, hidden)."""
    from ..numerics.cube import matmul

    if cell_type != "LSTM" or not time_major or direction not in ("UNIDIRECTIONAL", "REDIRECTIONAL"):
        raise AscendEmuError(f"DynamicRNN: cell_type {cell_type!r}, direction {direction!r}, time_major "
                             f"{time_major!r}: only a time-major LSTM, forward or reversed, is emulated")
    x, w = np.asarray(x), np.asarray(w)
    T, B, n_in = x.shape
    hidden = w.shape[1] // 4
    if w.shape != (n_in + hidden, 4 * hidden):
        raise AscendEmuError(f"DynamicRNN: weight of shape {w.shape} for input {n_in} needs ({n_in} + hidden, "
                             f"4 hidden)")
    c32 = _f32ctx(ctx)
    bias = to_f32(b).reshape(1, 4 * hidden)
    h = np.asarray(init_h).reshape(B, hidden)
    c = to_f32(init_c).reshape(B, hidden)
    steps = range(T - 1, -1, -1) if direction == "REDIRECTIONAL" else range(T)
    ys = np.empty((T, B, hidden), ctx.dtype)
    c_st = _store(ctx, c)
    for t in steps:
        a = np.concatenate([x[t], np.asarray(h, x.dtype)], axis=1)
        g, st = matmul(a, w, operand_dtype=ctx.dtype_name, out_dtype="float32", overflow_mode=ctx.overflow_mode,
                       subnormals=ctx.subnormals, model=ctx.cube_model, multicore=ctx.multicore)
        ctx.record(st)
        g = vec(c32, "add", g, bias)
        gi, gj, gf, go = np.split(g, 4, axis=1)
        if float(forget_bias):
            gf = vec(c32, "add", gf, np.float32(forget_bias))
        # the gates go out to their (gate) outputs in the bias dtype and are read back from them
        i, j, f, o = (to_f32(_store(ctx, g)) for g in (vec(c32, "sigmoid", gi), vec(c32, "tanh", gj),
                                                         vec(c32, "sigmoid", gf), vec(c32, "sigmoid", go)))
        c_new = vec(c32, "add", vec(c32, "mul", c, f), vec(c32, "mul", j, i))
        c_st = _store(ctx, c_new)
        c = to_f32(c_st)
        h = _store(ctx, vec(c32, "mul", to_f32(_store(ctx, vec(c32, "tanh", c))), o))
        ys[t] = h
    ctx.record(c32.status)
    return ys, np.array(h, ctx.dtype).reshape(1, B, hidden), np.asarray(c_st, ctx.dtype).reshape(1, B, hidden)


_GRU_SOURCE = Source(
    ("canndev ops/built-in/tbe/impl/dynamic_gru_v2.py (dynamic_gru_v2 core: two float32 cube accumulations, float32 "
     "biases and gates, h stored in the bias dtype)", "NUMERICS.md section 9 (ONNX models: GRU)"), (),
    "the kernel's steps; the cube's K order is the emulated matmul's; no gate outputs requested (inference) and a "
    "float32 DynamicGRUV2 keeping h in float32 are assumed (no parameter)")


@register("DynamicGRUV2", kind=CUBE, source=_GRU_SOURCE)
def dynamic_gru_v2(x, weight_input, weight_hidden, bias_input, bias_hidden, init_h, *, ctx,
                   direction="UNIDIRECTIONAL", gate_order="zrh", reset_after=True, time_major=True):
    """A GRU over the time-major sequence ``x`` (T, B, input), as CANN's DynamicGRUV2 computes each step (canndev
    ``ops/built-in/tbe/impl/dynamic_gru_v2.py``): gx = x_t weight_input and gh = h_{t-1} weight_hidden on the cube
    (operand dtype, float32 accumulation), each plus its bias in float32; in float32, r = sigmoid(gx_r + gh_r),
    z = sigmoid(gx_z + gh_z), n = tanh(gx_n + r gh_n) (the reset applied after the hidden matmul), h = (h_{t-1} - n)
    z + n (vsub, vmul, vadd), stored in the compute dtype (the next step's operand and y). Its gate outputs are
    optional (``is_gate_output = update is not None``): an inference graph asks none, so no gate is rounded to the
    bias dtype on the way (assumed). Returns y (T, B, hidden) and h after the last step (1, B, hidden)."""
    from ..numerics.cube import matmul

    if direction != "UNIDIRECTIONAL" or gate_order not in ("zrh", "rzh") or not reset_after or not time_major:
        raise AscendEmuError(f"DynamicGRUV2: direction {direction!r}, gate_order {gate_order!r}, reset_after "
                             f"{reset_after!r}, time_major {time_major!r}: only a forward, time-major GRU with the "
                             "reset after the hidden matmul is emulated")
    x, wi, wh = np.asarray(x), np.asarray(weight_input), np.asarray(weight_hidden)
    T, B, n_in = x.shape
    hidden = wh.shape[0]
    if wi.shape != (n_in, 3 * hidden) or wh.shape != (hidden, 3 * hidden):
        raise AscendEmuError(f"DynamicGRUV2: weights of shapes {wi.shape} and {wh.shape} for input {n_in} need "
                             f"({n_in}, 3 hidden) and (hidden, 3 hidden)")
    c32 = _f32ctx(ctx)
    kw = dict(operand_dtype=ctx.dtype_name, out_dtype="float32", overflow_mode=ctx.overflow_mode,
              subnormals=ctx.subnormals, model=ctx.cube_model, multicore=ctx.multicore)
    bi, bh = to_f32(bias_input).reshape(1, -1), to_f32(bias_hidden).reshape(1, -1)
    h = np.asarray(init_h).reshape(B, hidden)
    z_at, r_at = (0, 1) if gate_order == "zrh" else (1, 0)
    ys = np.empty((T, B, hidden), ctx.dtype)
    for t in range(T):
        gx, st = matmul(x[t], wi, **kw)
        ctx.record(st)
        gh, st = matmul(np.asarray(h, x.dtype), wh, **kw)
        ctx.record(st)
        gx, gh = np.split(vec(c32, "add", gx, bi), 3, axis=1), np.split(vec(c32, "add", gh, bh), 3, axis=1)
        r = vec(c32, "sigmoid", vec(c32, "add", gx[r_at], gh[r_at]))
        z = vec(c32, "sigmoid", vec(c32, "add", gx[z_at], gh[z_at]))
        n = vec(c32, "tanh", vec(c32, "add", gx[2], vec(c32, "mul", r, gh[2])))
        h = _store(ctx, vec(c32, "add", vec(c32, "mul", vec(c32, "sub", to_f32(h), n), z), n))
        ys[t] = h
    ctx.record(c32.status)
    return ys, np.array(h, ctx.dtype).reshape(1, B, hidden)

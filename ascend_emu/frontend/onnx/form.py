"""The ONNX form of a registry cube op the ONNX front end emitted: what onnxruntime runs for it on the AI CPU.

A float32 (or bf16) cube op stays in its dtype under a float32-keeping mode (must_keep_origin_dtype, v2
``origin``, ``--keep-dtype``); on a SoC whose cube lacks that dtype (the 910, the 310P) GE places it on the
AI CPU (NUMERICS.md section 13). The AI CPU of an ONNX model is onnxruntime, and the op (``/conv/Conv/Conv2D``,
``/fc/Gemm/MatMul``) is one the converters of :mod:`.ops` made from an ONNX node, in the registry's layout
(NHWC, HWIO filters). :func:`onnx_form` writes it back as ONNX nodes on those same inputs: the layout
transposes around the ONNX op, so that onnxruntime computes exactly what the registry op means.

Inputs are named ``aicpu_input_<i>`` and outputs ``aicpu_output_<i>``, as :mod:`.node` builds its sessions.
"""
from __future__ import annotations

import numpy as np

from ...errors import AscendEmuError
from ...graph.core import Node

_IN, _OUT = "aicpu_input_{}", "aicpu_output_{}"


def _ints(v) -> list:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _hw(v, default=1) -> list:
    v = _ints(v) if v is not None else [default] * 4
    return v[1:3] if len(v) == 4 else v


def _conv2d(node: Node, arrays) -> list:
    from onnx import helper

    x, w = arrays
    cin, cin_g = x.shape[-1], w.shape[2]
    a = node.attrs
    pad = a.get("padding", "VALID")
    geometry = {"strides": _hw(a.get("strides")), "dilations": _hw(a.get("dilations")),
                "group": int(cin // cin_g) if cin_g else 1}
    if pad == "SAME":
        geometry["auto_pad"] = "SAME_UPPER"     # TensorFlow's SAME puts the odd pixel at the bottom/right
    elif pad == "EXPLICIT":
        p = _ints(a.get("explicit_paddings"))
        geometry["pads"] = [p[2], p[4], p[3], p[5]]
    return [helper.make_node("Transpose", [_IN.format(0)], ["x_nchw"], perm=[0, 3, 1, 2]),
            helper.make_node("Transpose", [_IN.format(1)], ["w_oihw"], perm=[3, 2, 0, 1]),
            helper.make_node("Conv", ["x_nchw", "w_oihw"], ["y_nchw"], **geometry),
            helper.make_node("Transpose", ["y_nchw"], [_OUT.format(0)], perm=[0, 2, 3, 1])]


def _conv2d_backprop_input(node: Node, arrays) -> list:
    from onnx import helper

    sizes, w, dy = arrays
    a = node.attrs
    if a.get("padding") not in ("EXPLICIT", "VALID") or any(d != 1 for d in _hw(a.get("dilations"))):
        raise AscendEmuError(f"op {node.name} ({node.op}): no ONNX form for padding {a.get('padding')!r} "
                             f"with dilations; please report it with the model")
    p = _ints(a.get("explicit_paddings")) if a.get("padding") == "EXPLICIT" else [0] * 8
    s = _hw(a.get("strides"))
    kh, kw = w.shape[:2]
    n, oh, ow, _ = _ints(sizes)
    # ConvTranspose's output is (in - 1) * stride + kernel - pads + output_padding: the rest of input_sizes
    outpad = [oh - ((dy.shape[1] - 1) * s[0] + kh - p[2] - p[3]), ow - ((dy.shape[2] - 1) * s[1] + kw - p[4] - p[5])]
    if min(outpad) < 0:
        raise AscendEmuError(f"op {node.name} ({node.op}): input_sizes {_ints(sizes)} below its convolution's "
                             f"output; please report it with the model")
    return [helper.make_node("Transpose", [_IN.format(2)], ["dy_nchw"], perm=[0, 3, 1, 2]),
            helper.make_node("Transpose", [_IN.format(1)], ["w_iohw"], perm=[3, 2, 0, 1]),
            helper.make_node("ConvTranspose", ["dy_nchw", "w_iohw"], ["y_nchw"], strides=s,
                             pads=[p[2], p[4], p[3], p[5]], output_padding=outpad),
            helper.make_node("Transpose", ["y_nchw"], [_OUT.format(0)], perm=[0, 2, 3, 1])]


def _matmul(node: Node, arrays) -> list:
    from onnx import helper

    a, b = arrays
    ta = bool(node.attrs.get("transpose_a", node.attrs.get("adj_x", False)))
    tb = bool(node.attrs.get("transpose_b", node.attrs.get("adj_y", False)))
    nodes, ins = [], []
    for i, (arr, t) in enumerate(((a, ta), (b, tb))):
        if t:
            perm = list(range(arr.ndim - 2)) + [arr.ndim - 1, arr.ndim - 2]
            nodes.append(helper.make_node("Transpose", [_IN.format(i)], [f"t{i}"], perm=perm))
            ins.append(f"t{i}")
        else:
            ins.append(_IN.format(i))
    return nodes + [helper.make_node("MatMul", ins, [_OUT.format(0)])]


def _einsum(node: Node, arrays) -> list:
    from onnx import helper

    return [helper.make_node("Einsum", [_IN.format(i) for i in range(len(arrays))], [_OUT.format(0)],
                             equation=str(node.attrs["equation"]))]


def _dynamic_rnn(node: Node, arrays) -> list:
    """DynamicRNN (:mod:`.rnn`'s LSTM) back as an ONNX LSTM: the stacked weight split into W and R, the gate
    blocks from i, j, f, o to ONNX's i, o, f, c (the same swap both ways), the bias as Wb with Rb zero."""
    from onnx import helper, numpy_helper

    x, w, b = arrays[:3]
    n_in = x.shape[-1]
    hidden = w.shape[1] // 4

    def iofc(m):        # rows (4H, ...) from i, j, f, o to i, o, f, c
        return np.concatenate([m[k * hidden:(k + 1) * hidden] for k in (0, 3, 2, 1)], axis=0)

    consts = {"W": iofc(w[:n_in].T)[None], "R": iofc(w[n_in:].T)[None],
              "B": np.concatenate([iofc(np.asarray(b).reshape(-1)), np.zeros(4 * hidden, b.dtype)])[None]}
    nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(np.ascontiguousarray(v), k))
             for k, v in consts.items()]
    direction = "reverse" if node.attrs.get("direction") == "REDIRECTIONAL" else "forward"
    return nodes + [
        helper.make_node("LSTM", [_IN.format(0), "W", "R", "B", "", _IN.format(3), _IN.format(4)],
                         ["Y", _OUT.format(1), _OUT.format(2)], hidden_size=hidden, direction=direction),
        helper.make_node("Squeeze", ["Y", "axis1"], [_OUT.format(0)]),
        helper.make_node("Constant", [], ["axis1"], value=numpy_helper.from_array(np.asarray([1], np.int64)))]


def _dynamic_gru_v2(node: Node, arrays) -> list:
    """DynamicGRUV2 (:mod:`.rnn`'s GRU) back as an ONNX GRU with linear_before_reset: the weights transposed back,
    the two biases as Wb and Rb (the gate order zrh is ONNX's)."""
    from onnx import helper, numpy_helper

    _, wi, wh, bi, bh = arrays[:5]
    consts = {"W": wi.T[None], "R": wh.T[None], "B": np.concatenate([np.reshape(bi, -1), np.reshape(bh, -1)])[None]}
    nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(np.ascontiguousarray(v), k))
             for k, v in consts.items()]
    return nodes + [
        helper.make_node("GRU", [_IN.format(0), "W", "R", "B", "", _IN.format(5)], ["Y", _OUT.format(1)],
                         hidden_size=wh.shape[0], linear_before_reset=1),
        helper.make_node("Constant", [], ["axis1"], value=numpy_helper.from_array(np.asarray([1], np.int64))),
        helper.make_node("Squeeze", ["Y", "axis1"], [_OUT.format(0)])]


FORMS = {"DynamicRNN": _dynamic_rnn, "DynamicGRUV2": _dynamic_gru_v2,
         "Conv2D": _conv2d, "Conv2DBackpropInput": _conv2d_backprop_input, "MatMul": _matmul,
         "BatchMatMulV2": _matmul, "BatchMatMul": _matmul, "Einsum": _einsum}


def onnx_form(node: Node, arrays) -> list:
    """The ONNX nodes computing registry op ``node`` on ``arrays`` (inputs ``aicpu_input_<i>``, first output
    ``aicpu_output_0``)."""
    fn = FORMS.get(node.op)
    if fn is None:
        raise AscendEmuError(f"op {node.name} ({node.op}) of this ONNX model has no ONNX form to run on the AI "
                             f"CPU; please report it with the model")
    return fn(node, arrays)

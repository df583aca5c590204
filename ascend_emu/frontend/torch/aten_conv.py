"""The convolution lowerings (aclnnConvolution and aclnnConvolutionBackward), entries of :data:`.aten.ATEN` kept
apart by idea: 1-D (the 2-D one with H = 1), 2-D, transposed 2-D and 3-D convolutions on the emulated cube, in the
registry's channels-last layouts (torch's NCHW / NCDHW transposed, exactly). They register on import, as
:mod:`.aten_fused` does (the run, the .pt2 loader and its tracer import this module). NUMERICS.md section 16.

What aclnnConvolution runs ([NN] ``conv/convolution_forward/op_host/op_api/aclnn_convolution.cpp`` and
``convolution.cpp``): a convolution is Conv2D (Conv3DV2 in 3-D) with the bias as an input; a transposed 2-D
convolution is Conv2DTranspose, the bias an input too, except on the 950 (``IsSupportND``: arch 3510), whose
PostProcess adds the bias with a separate Add after the convolution. The backward runs the two gradients as
Conv2DBackpropInput / Conv2DBackpropFilter (Conv3DBackpropInputV2 / FilterV2) and the bias gradient as a reduction;
a transposed convolution's input gradient is the forward convolution of dy and its filter gradient the filter
gradient with x and dy swapped. Grouped transposed, grouped 3-D and grouped backward convolutions, transposed 3-D
ones, and padding by name run on the AI CPU (:class:`.Fallback`).
"""
from __future__ import annotations

import numpy as np
import torch

from .aten import Fallback, _arg, _cube_dtype, _nchw, _out, aten
from .convert import from_numpy, to_numpy


def _conv_attrs(stride, padding, dilation):
    s, p, d = list(stride), list(padding), list(dilation)
    return dict(strides=[1, s[0], s[1], 1], padding="EXPLICIT",
                explicit_paddings=[0, 0, p[0], p[0], p[1], p[1], 0, 0], dilations=[1, d[0], d[1], 1])


def _conv3d_attrs(stride, padding, dilation):
    s, p, d = list(stride), list(padding), list(dilation)
    return dict(strides=[1, *s, 1], padding="EXPLICIT", dilations=[1, *d, 1],
                explicit_paddings=[0, 0, p[0], p[0], p[1], p[1], p[2], p[2], 0, 0])


def _as_2d(x, w, stride, padding, dilation, transposed):
    """A 1-D convolution as the 2-D one aclnnConvolution runs (H = 1: View1dAs2d, [NN] conv/convolution_forward/
    op_host/op_api/aclnn_convolution.cpp): (x, w, stride, padding, dilation) with the H axis added, else as given."""
    if transposed or x.dim() != 3 or w.dim() != 3 or isinstance(padding, str) or \
            not (len(stride) == len(padding) == len(dilation) == 1):
        return x, w, stride, padding, dilation
    return (x.unsqueeze(2), w.unsqueeze(2), [1, stride[0]], [0, padding[0]], [1, dilation[0]])


def _geometry(x, w, stride, padding, dilation, output_padding, transposed):
    """Which convolution this is: ``"2d"``, ``"3d"`` or ``"transposed2d"``; anything else runs on the AI CPU."""
    nd = x.dim() - 2
    if isinstance(padding, str) or x.dim() != w.dim() or nd not in (2, 3):
        raise Fallback("only 2-D and 3-D convolutions with numeric padding run on the emulated cube")
    if not (len(stride) == len(padding) == len(dilation) == nd):
        raise Fallback("convolution geometry")
    if transposed and (nd != 2 or len(output_padding) != 2):
        raise Fallback("transposed 3-D convolutions run on the AI CPU")
    return ("transposed" if transposed else "") + f"{nd}d"


def _ndhwc(a):
    return np.ascontiguousarray(np.transpose(a, (0, 2, 3, 4, 1)))


def _ncdhw(a, dtype=None):
    return from_numpy(np.ascontiguousarray(np.transpose(a, (0, 4, 1, 2, 3))), dtype)


def _transposed_out(x, w, stride, padding, dilation, output_padding):
    """The (N, H, W, C) output of a transposed 2-D convolution, as torch sizes it."""
    hw = [(x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (w.shape[2 + i] - 1)
          + output_padding[i] + 1 for i in range(2)]
    return [x.shape[0], *hw, w.shape[1]]


@aten("aten.convolution")
def convolution(k, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """aclnnConvolution (cubeMathType from ``conv.allow_hf32`` alone, ASCEND-FACTS 13.1): the registry's Conv2D on
    NHWC (a 1-D convolution with H = 1), Conv3D on NDHWC, Conv2DTranspose; the bias goes into the float32
    accumulator (aclnnConvolution converts it to FLOAT, 13.3), except the 950's transposed convolution, which adds
    it after (above)."""
    one_d = x.dim() == 3
    x, w, stride, padding, dilation = _as_2d(x, w, stride, padding, dilation, transposed)
    kind = _geometry(x, w, stride, padding, dilation, output_padding, transposed)
    dt = _cube_dtype(x, w)
    b = None if bias is None else to_numpy(bias.detach().to(torch.float32))
    if kind == "3d":
        if groups != 1:
            raise Fallback("grouped 3-D convolution")
        (y,) = k.op("Conv3D", _ndhwc(_arg(x, dt)), np.ascontiguousarray(np.transpose(_arg(w, dt), (2, 3, 4, 1, 0))),
                    family="conv", bias=b, **_conv3d_attrs(stride, padding, dilation))
        return _ncdhw(y, dt)
    if kind == "transposed2d":
        if groups != 1:
            raise Fallback("grouped transposed convolution")
        attrs = _conv_attrs(stride, padding, dilation)
        p = [v for pair in zip(padding, padding) for v in pair]
        separate = k.bias_after_transposed_conv()
        (y,) = k.op("Conv2DTranspose", np.asarray(_transposed_out(x, w, stride, padding, dilation, output_padding),
                                                  np.int32),
                    np.ascontiguousarray(np.transpose(_arg(x, dt), (0, 2, 3, 1))),
                    np.ascontiguousarray(np.transpose(_arg(w, dt), (2, 3, 1, 0))), family="conv",
                    strides=attrs["strides"], pads=p, dilations=attrs["dilations"],
                    bias=None if separate else b)
        if separate and bias is not None:
            (y,) = k.op("BiasAdd", y, _arg(bias, dt))
        return _nchw(y, dt)
    (y,) = k.op("Conv2D", np.ascontiguousarray(np.transpose(_arg(x, dt), (0, 2, 3, 1))),
                np.ascontiguousarray(np.transpose(_arg(w, dt), (2, 3, 1, 0))), family="conv", bias=b,
                **_conv_attrs(stride, padding, dilation))
    y = _nchw(y, dt)
    return y.squeeze(2) if one_d and x.dim() == 4 else y


@aten("aten.convolution_backward")
def convolution_backward(k, dy, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                         output_mask):
    if x.dim() == 3 and dy.dim() == 3 and not transposed:
        # a 1-D convolution's gradients: the 2-D ones with H = 1 (View1dAs2d), the H axis dropped again
        x2, w2, st, pd, dl = _as_2d(x, w, stride, padding, dilation, transposed)
        if x2.dim() == 4:
            grads = convolution_backward(k, dy.unsqueeze(2), x2, w2, bias_sizes, st, pd, dl, transposed,
                                         [0, 0], groups, output_mask)
            return tuple(None if t is None or i == 2 else t.squeeze(2) for i, t in enumerate(grads[:2])) + \
                (grads[2],)
    kind = _geometry(x, w, stride, padding, dilation, output_padding, transposed)
    if groups != 1:
        raise Fallback("grouped convolution backward")
    dt = _cube_dtype(dy, x, w)
    if kind == "3d":
        return _backward_3d(k, dy, x, w, dt, stride, padding, dilation, output_mask)
    attrs = _conv_attrs(stride, padding, dilation)
    g = np.ascontiguousarray(np.transpose(_arg(dy, dt), (0, 2, 3, 1)))
    hwio = np.asarray([w.shape[2], w.shape[3], w.shape[1], w.shape[0]], np.int32)   # the registry's filter sizes

    def xn():   # x and w in the registry's layouts, made only for the gradients asked for
        return np.ascontiguousarray(np.transpose(_arg(x, dt), (0, 2, 3, 1)))

    def wn():
        return np.ascontiguousarray(np.transpose(_arg(w, dt), (2, 3, 1, 0)))
    dx = dw = db = None
    if kind == "transposed2d":
        # y = Conv2DTranspose(x, w): dx is the convolution of dy by w, dw the filter gradient of that convolution
        # with dy as its input and x as its output gradient; w is (Cin of x, Cout, kh, kw): HWIO (kh, kw, Cout, Cin)
        if output_mask[0]:
            (r,) = k.op("Conv2D", g, wn(), family="conv", **attrs)
            dx = _nchw(r, dt)
        if output_mask[1]:
            (r,) = k.op("Conv2DBackpropFilter", g, hwio, xn(), family="conv", **attrs)
            dw = from_numpy(np.ascontiguousarray(np.transpose(r, (3, 2, 0, 1))), dt)
    else:
        if output_mask[0]:
            (r,) = k.op("Conv2DBackpropInput", np.asarray([x.shape[0], x.shape[2], x.shape[3], x.shape[1]], np.int32),
                        wn(), g, family="conv", **attrs)
            dx = _nchw(r, dt)
        if output_mask[1]:
            (r,) = k.op("Conv2DBackpropFilter", xn(), hwio, g, family="conv", **attrs)
            dw = from_numpy(np.ascontiguousarray(np.transpose(r, (3, 2, 0, 1))), dt)
    if output_mask[2]:
        (r,) = k.op("BiasAddGrad", np.transpose(_arg(dy, dt), (0, 2, 3, 1)))   # (its sum reads any strides)
        db = _out(r, dt)
    return dx, dw, db


def _backward_3d(k, dy, x, w, dt, stride, padding, dilation, output_mask):
    """Conv3DBackpropInputV2 / Conv3DBackpropFilterV2 on NDHWC, the bias gradient as BiasAddGrad's channel sum."""
    attrs = _conv3d_attrs(stride, padding, dilation)
    g = _ndhwc(_arg(dy, dt))
    dx = dw = db = None
    if output_mask[0]:
        (r,) = k.op("Conv3DBackpropInputV2", np.asarray([x.shape[0], *x.shape[2:], x.shape[1]], np.int32),
                    np.ascontiguousarray(np.transpose(_arg(w, dt), (2, 3, 4, 1, 0))), g, family="conv", **attrs)
        dx = _ncdhw(r, dt)
    if output_mask[1]:
        (r,) = k.op("Conv3DBackpropFilterV2", _ndhwc(_arg(x, dt)), np.asarray([*w.shape[2:], w.shape[1], w.shape[0]],
                                                                              np.int32), g, family="conv", **attrs)
        dw = from_numpy(np.ascontiguousarray(np.transpose(r, (4, 3, 0, 1, 2))), dt)
    if output_mask[2]:
        (r,) = k.op("BiasAddGrad", g)
        db = _out(r, dt)
    return dx, dw, db

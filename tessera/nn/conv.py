"""The convolution family's layers, PyTorch's names, shapes and initialisations (NCHW):

    conv = nn.Conv2d(3, 64, kernel_size=3, padding=1)
    params = conv.init(seed)       # {"w": f32[64, 3, 3, 3], "b": f32[64]}
    y = conv(params, x)            # x [N, 3, H, W]

Batch normalisation keeps running statistics, which a functional layer cannot change in place:
``bn(params, x)`` normalises with the batch's statistics in training (``ts.is_training()`` and
``train=None``, or ``train=True``) and with the running ones otherwise, and
``bn.update(params, x)`` gives the parameters with the running statistics blended in (PyTorch's
``momentum``), which a training step returns with its new weights.
"""
from __future__ import annotations

import math

import numpy as np

from .. import op
from ..errors import ArgumentError
from ..trace import is_training
from .init import kaiming_uniform, ones, zeros
from .layers import STREAM_SHIFT, Module


def _tuple(v, n):
    return tuple(v) if isinstance(v, (tuple, list)) else (int(v),) * n


class _ConvNd(Module):
    """Conv1d/2d/3d: weight [out, in / groups, *kernel] and bias [out], both U(-b, b) with
    b = 1 / sqrt(in / groups * prod(kernel)) (PyTorch's kaiming_uniform with a = sqrt(5))."""
    dims = 2
    transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, output_padding=0,
                 dtype=np.float32):
        n = self.dims
        if in_channels % groups or out_channels % groups:
            raise ArgumentError(f"groups ({groups}) must divide {in_channels} input and "
                                f"{out_channels} output channels")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _tuple(kernel_size, n)
        self.stride, self.dilation = _tuple(stride, n), _tuple(dilation, n)
        self.padding = padding if isinstance(padding, str) else padding
        self.groups, self.bias, self.dtype = int(groups), bool(bias), np.dtype(dtype)
        self.output_padding = _tuple(output_padding, n)

    def weight_shape(self):
        if self.transposed:
            return (self.in_channels, self.out_channels // self.groups, *self.kernel_size)
        return (self.out_channels, self.in_channels // self.groups, *self.kernel_size)

    def init_params(self, key):
        shape = self.weight_shape()
        fan_in = shape[1] * math.prod(self.kernel_size)
        p = {"w": kaiming_uniform(key.child("w"), shape, fan_in, dtype=self.dtype)}
        if self.bias:
            bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
            p["b"] = key.child("b").uniform((self.out_channels,), -bound, bound, self.dtype)
        return p

    def __call__(self, params, x, **kw):
        if self.transposed:
            return op.conv_transpose(x, params["w"], params.get("b"), self.stride, self.padding,
                                     self.output_padding, self.dilation, self.groups)
        return op.conv(x, params["w"], params.get("b"), self.stride, self.padding,
                       self.dilation, self.groups)


class Conv1d(_ConvNd):
    dims = 1


class Conv2d(_ConvNd):
    dims = 2


class Conv3d(_ConvNd):
    dims = 3


class ConvTranspose1d(_ConvNd):
    dims, transposed = 1, True


class ConvTranspose2d(_ConvNd):
    dims, transposed = 2, True


class ConvTranspose3d(_ConvNd):
    dims, transposed = 3, True


class BatchNorm(Module):
    """BatchNorm1d/2d/3d over the channel axis (1): weight 1, bias 0, running_mean 0,
    running_var 1 (all in params; ``affine=False`` leaves out weight and bias)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, dtype=np.float32):
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), \
            float(momentum)
        self.affine, self.dtype = bool(affine), np.dtype(dtype)

    def init_params(self, key):
        p = {"running_mean": zeros((self.num_features,), self.dtype),
             "running_var": ones((self.num_features,), self.dtype)}
        if self.affine:
            p.update(weight=ones((self.num_features,), self.dtype),
                     bias=zeros((self.num_features,), self.dtype))
        return p

    def _training(self, train):
        return is_training() if train is None else bool(train)

    def __call__(self, params, x, train=None, **kw):
        training = self._training(train)
        return op.batch_norm(x, None if training else params["running_mean"],
                             None if training else params["running_var"], params.get("weight"),
                             params.get("bias"), training=training, eps=self.eps)

    def update(self, params, x):
        """params with the running statistics blended with x's batch statistics."""
        _, mean, var = op.batch_norm(x, params["running_mean"], params["running_var"],
                                     training=True, momentum=self.momentum, eps=self.eps)
        return {**params, "running_mean": mean, "running_var": var}


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class GroupNorm(Module):
    """GroupNorm(num_groups, num_channels): weight 1 and bias 0 per channel."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, dtype=np.float32):
        if num_channels % num_groups:
            raise ArgumentError(f"GroupNorm: {num_groups} groups do not divide {num_channels} "
                                "channels")
        self.num_groups, self.num_channels, self.eps = int(num_groups), int(num_channels), \
            float(eps)
        self.affine, self.dtype = bool(affine), np.dtype(dtype)

    def init_params(self, key):
        if not self.affine:
            return {}
        return {"weight": ones((self.num_channels,), self.dtype),
                "bias": zeros((self.num_channels,), self.dtype)}

    def __call__(self, params, x, **kw):
        return op.group_norm(x, self.num_groups, params.get("weight"), params.get("bias"),
                             self.eps)


class InstanceNorm(GroupNorm):
    """InstanceNorm1d/2d/3d (PyTorch's default: no affine parameters, no running statistics)."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = False,
                 dtype=np.float32):
        super().__init__(num_features, num_features, eps, affine, dtype)


InstanceNorm1d = InstanceNorm2d = InstanceNorm3d = InstanceNorm


class _Pool(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                 count_include_pad=True):
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, bool(ceil_mode)
        self.count_include_pad = bool(count_include_pad)


class MaxPool(_Pool):
    """MaxPool1d/2d/3d (kernel_size, stride = kernel_size, padding, dilation, ceil_mode)."""

    def __call__(self, params, x, **kw):
        return op.max_pool(x, self.kernel_size, self.stride, self.padding, self.dilation,
                           self.ceil_mode)


class AvgPool(_Pool):
    """AvgPool1d/2d/3d (kernel_size, stride = kernel_size, padding, ceil_mode,
    count_include_pad)."""

    def __call__(self, params, x, **kw):
        return op.avg_pool(x, self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode,
                           count_include_pad=self.count_include_pad)


MaxPool1d = MaxPool2d = MaxPool3d = MaxPool
AvgPool1d = AvgPool2d = AvgPool3d = AvgPool


class AdaptiveAvgPool(Module):
    """AdaptiveAvgPool1d/2d/3d(output_size)."""

    def __init__(self, output_size):
        self.output_size = output_size

    def __call__(self, params, x, **kw):
        return op.adaptive_avg_pool(x, self.output_size)


AdaptiveAvgPool1d = AdaptiveAvgPool2d = AdaptiveAvgPool3d = AdaptiveAvgPool


class Upsample(Module):
    """Upsample(size or scale_factor, mode="nearest"|"bilinear"|"bicubic"|"linear",
    align_corners): PyTorch's interpolate through op.resize."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=False):
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners = bool(align_corners)

    def __call__(self, params, x, **kw):
        if self.mode == "nearest":
            how = dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                       nearest_mode="floor")
        elif self.mode in ("linear", "bilinear", "trilinear", "bicubic"):
            how = dict(mode="cubic" if self.mode == "bicubic" else "linear",
                       coordinate_transformation_mode="align_corners" if self.align_corners
                       else "half_pixel")
        else:
            raise ArgumentError(f"Upsample mode {self.mode!r}",
                                expected="nearest, linear, bilinear, bicubic, trilinear")
        if self.size is not None:
            return op.resize(x, size=self.size, **how)
        return op.resize(x, scale=self.scale_factor, **how)


class Dropout2d(Module):
    """Zero whole channels with probability ``rate`` (and scale the rest by 1/(1 - rate)) in
    training, as nn.Dropout's seeds and modes (one draw per (sample, channel))."""
    streams = 1

    def __init__(self, rate: float = 0.5):
        if not 0.0 <= rate <= 1.0:
            raise ArgumentError(f"dropout rate must be in [0, 1], not {rate}")
        self.rate = float(rate)

    def __call__(self, params, x, seed=None, train=None, stream=0, **kw):
        if train is None:
            train = seed is not None and is_training()
        if not train or self.rate == 0.0:
            return x
        if seed is None:
            raise ArgumentError("dropout in training needs a seed")
        shape = tuple(x.shape)
        keep = op.random_uniform(shape[:2] + (1,) * (len(shape) - 2), seed,
                                 offset=int(stream) << STREAM_SHIFT) >= self.rate
        return op.where(keep, x * (1.0 / (1.0 - self.rate)), 0.0)

"""``tessera.nn``: functional layers, losses and deterministic initialisers.

A module holds hyperparameters; its parameters are a plain pytree of NumPy arrays made by
``init(seed)`` and passed to every call, so a training step is a pure function a
``tessera.function`` can compile:

    mlp = nn.MLP([784, 512, 10], activation="relu")
    params = mlp.init(seed=0)
    logits = mlp(params, x)                      # eager on NumPy, or traced inside ts.function
    loss = nn.cross_entropy(logits, labels, label_smoothing=0.1)

A compiled training step (tessera.optim for the update):

    opt = optim.Adam(1e-3)
    def train_step(params, state, x, y, seed):
        loss, grads = ts.value_and_grad(
            lambda p: nn.cross_entropy(mlp(p, x, seed=seed), y))(params)   # dropout if any
        params, state = opt.update(grads, state, params)
        return loss, params, state
    step = ts.function(train_step)
    loss, params, state = step(params, opt.init(params), x, y, np.int64(0))
"""
from . import init
from .attention import (ALiBi, FlashAttention2, FlashDecoding, KVCache, MultiHeadAttention, RoPE,
                        SlidingWindowAttention, TransformerBlock, alibi_bias, alibi_slopes,
                        flash_decoding, grouped_query_attention, rope, rope_frequencies,
                        rope_tables, sliding_window_mask)
from .init import Key
from .layers import (ACTIVATIONS, MLP, Dropout, Embedding, FusedLinearGeLU, FusedLinearSiLU,
                     LayerNorm, Linear, Module, RMSNorm, Sequential, SwiGLU, activation, dropout,
                     linear)
from .conv import (AdaptiveAvgPool, AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d,
                   AvgPool, AvgPool1d, AvgPool2d, AvgPool3d, BatchNorm, BatchNorm1d,
                   BatchNorm2d, BatchNorm3d, Conv1d, Conv2d, Conv3d, ConvTranspose1d,
                   ConvTranspose2d, ConvTranspose3d, Dropout2d, GroupNorm, InstanceNorm,
                   InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, MaxPool, MaxPool1d, MaxPool2d,
                   MaxPool3d, Upsample)
from .losses import cross_entropy, kl_divergence, mse
from .paged import PagedAttention, PagedKVCache, paged_attention
from .moe import MixtureOfExperts, SwitchTransformer, TopKRouter
from ..optim import FusedAdamW, FusedSGD
from .precision import MixedPrecision, to_mixed_precision
from .quantize import dequantize_int8, quantize_int8

__all__ = ["AdaptiveAvgPool", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
           "AvgPool", "AvgPool1d", "AvgPool2d", "AvgPool3d", "BatchNorm", "BatchNorm1d",
           "BatchNorm2d", "BatchNorm3d", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
           "ConvTranspose2d", "ConvTranspose3d", "Dropout2d", "GroupNorm", "InstanceNorm",
           "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "MaxPool", "MaxPool1d",
           "MaxPool2d", "MaxPool3d", "Upsample",
           "ACTIVATIONS", "Dropout", "Embedding", "KVCache", "Key", "LayerNorm", "Linear", "MLP",
           "Module", "MixtureOfExperts", "TopKRouter",
           "MultiHeadAttention", "RMSNorm", "RoPE", "Sequential", "TransformerBlock",
           "activation", "cross_entropy", "dropout", "init", "kl_divergence", "linear", "mse",
           "rope", "rope_frequencies", "rope_tables", "MixedPrecision", "to_mixed_precision",
           "quantize_int8", "dequantize_int8",
           # the seeds' standard library
           "ALiBi", "FlashAttention2", "FlashDecoding", "SlidingWindowAttention", "alibi_bias",
           "alibi_slopes", "flash_decoding", "sliding_window_mask", "FusedLinearGeLU",
           "FusedLinearSiLU", "SwiGLU", "SwitchTransformer", "FusedAdamW", "FusedSGD",
           "PagedAttention", "PagedKVCache", "paged_attention", "grouped_query_attention"]

"""GPT-2 (Radford et al.), as transformers' GPT2LMHeadModel computes it: token plus learned
position embeddings, N pre-norm decoder blocks (LayerNorm, causal multi-head attention from one
fused query/key/value projection, LayerNorm, a two-layer MLP with the tanh-approximated GELU),
a final LayerNorm and the LM head (the token embeddings, transposed, unless untied)."""
from __future__ import annotations

import math

import numpy as np

from .. import op
from ..errors import ArgumentError, TesseraError
from ..nn.init import normal
from ..nn.layers import Module, _shape, linear
from ..nn.paged import paged_attention
from .checkpoint import (check_settings, checkpoint_prefix, from_config, hidden_activation,
                         read_config, read_safetensors, write_checkpoint)

# config.json's names (transformers' GPT2Config) -> this class's, with their defaults
_CONFIG = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
           "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
           "initializer_range": 0.02, "scale_attn_weights": True,
           "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
           "tie_word_embeddings": True}

class GPT2(Module):
    """params {"embed": [V, D], "pos_embed": [P, D], "layers": [{"ln_1", "ln_1_bias", "attn"
    [D, 3D] (query, key, value side by side), "attn_bias", "attn_proj", "attn_proj_bias",
    "ln_2", "ln_2_bias", "fc", "fc_bias", "mlp_proj", "mlp_proj_bias"}], "norm", "norm_bias",
    "lm_head": [D, V] (absent when tied)}; weights are [in, out], as GPT-2's Conv1D keeps them.
    ``__call__(params, ids, mask=None)``: ids [B, S] int, mask [B, S] (1 keeps a token, 0 is
    padding) -> logits [B, S, V]. Positions are 0..S-1 in every row, padded or not, as
    transformers' forward numbers them when given only an attention mask."""
    model_type, architecture, settings = "gpt2", "GPT2LMHeadModel", _CONFIG

    def __init__(self, **config):
        check_settings(type(self), config, self.settings)
        c = {**self.settings, **config}
        if c["n_embd"] % c["n_head"]:
            raise ArgumentError(f"n_embd={c['n_embd']} does not split into {c['n_head']} heads")
        self.act = hidden_activation(c["activation_function"], "GPT2")
        self.config = c

    @property
    def head_dim(self) -> int:
        return self.config["n_embd"] // self.config["n_head"]

    @property
    def inner(self) -> int:
        """The MLP's width (n_inner, 4 * n_embd by default)."""
        return self.config["n_inner"] or 4 * self.config["n_embd"]

    def scale(self, layer: int) -> float:
        """Layer ``layer``'s attention scale: 1/sqrt(head size) (scale_attn_weights), further
        divided by layer + 1 (scale_attn_by_inverse_layer_idx)."""
        c = self.config
        s = self.head_dim ** -0.5 if c["scale_attn_weights"] else 1.0
        return s / (layer + 1) if c["scale_attn_by_inverse_layer_idx"] else s

    window = None               # (no sliding window: models.generate's protocol)

    # ---- parameters ----------------------------------------------------------------------------
    def init_params(self, key):
        """transformers' initialisation: normal(0, initializer_range) embeddings and weights,
        the two residual projections (c_proj) at initializer_range / sqrt(2 * n_layer) (GPT-2's
        scaling for the depth of the residual path), zero biases, LayerNorm ones and zeros."""
        c = self.config
        d, f, std = c["n_embd"], self.inner, c["initializer_range"]
        proj_std = std / math.sqrt(2 * c["n_layer"])
        zeros, ones = (lambda n: np.zeros(n, np.float32)), (lambda n: np.ones(n, np.float32))
        layers = []
        for i in range(c["n_layer"]):
            k = key.child(f"layer{i}")
            layers.append({
                "ln_1": ones(d), "ln_1_bias": zeros(d),
                "attn": normal(k.child("attn"), (d, 3 * d), std), "attn_bias": zeros(3 * d),
                "attn_proj": normal(k.child("attn_proj"), (d, d), proj_std),
                "attn_proj_bias": zeros(d),
                "ln_2": ones(d), "ln_2_bias": zeros(d),
                "fc": normal(k.child("fc"), (d, f), std), "fc_bias": zeros(f),
                "mlp_proj": normal(k.child("mlp_proj"), (f, d), proj_std),
                "mlp_proj_bias": zeros(d)})
        p = {"embed": normal(key.child("embed"), (c["vocab_size"], d), std),
             "pos_embed": normal(key.child("pos_embed"), (c["n_positions"], d), std),
             "layers": layers, "norm": ones(d), "norm_bias": zeros(d)}
        if not c["tie_word_embeddings"]:
            p["lm_head"] = normal(key.child("lm_head"), (d, c["vocab_size"]), std)
        return p

    # ---- the forward pass ----------------------------------------------------------------------
    def _heads(self, t):
        b, s = _shape(t)[:2]
        return op.transpose(op.reshape(t, [b, s, self.config["n_head"], self.head_dim]),
                            [0, 2, 1, 3])

    def _layers(self, params, ids, positions, attend):
        """The blocks over ids [B, S] at ``positions`` (int [S] or [B, S]), attention by
        ``attend(q, k, v, layer)`` (each [B, H, S, hd]). Returns (ln_f's output [B, S, D], the
        layers' keys and values)."""
        eps = self.config["layer_norm_epsilon"]
        x = op.take(params["embed"], ids, axis=0) + op.take(params["pos_embed"], positions,
                                                             axis=0)
        ks, vs = [], []
        for i, p in enumerate(params["layers"]):
            a = op.layernorm(x, p["ln_1"], p["ln_1_bias"], eps)
            q, k, v = (self._heads(t) for t in op.split(linear(a, p["attn"], p["attn_bias"]), 3))
            o = attend(q, k, v, i)
            b, h, s, hd = _shape(o)
            x = x + linear(op.reshape(op.transpose(o, [0, 2, 1, 3]), [b, s, h * hd]),
                           p["attn_proj"], p["attn_proj_bias"])
            a = op.layernorm(x, p["ln_2"], p["ln_2_bias"], eps)
            x = x + linear(self.act(linear(a, p["fc"], p["fc_bias"])), p["mlp_proj"],
                           p["mlp_proj_bias"])
            ks.append(k)
            vs.append(v)
        return op.layernorm(x, params["norm"], params["norm_bias"], eps), ks, vs

    def _head(self, params, x):
        head = params["lm_head"] if "lm_head" in params else op.transpose(params["embed"])
        return linear(x, head)

    def _causal(self, bias=None):
        """Causal attention over the input itself (``bias``: padded keys hidden)."""
        def attend(q, k, v, layer):
            return op.attention(q, k, v, mask=bias, causal=True, scale=self.scale(layer))
        return attend

    def __call__(self, params, ids, mask=None):
        b, s = _shape(ids)
        if s > self.config["n_positions"]:
            raise ArgumentError(f"GPT2: {s} tokens, more than its n_positions="
                                f"{self.config['n_positions']}")
        bias = None
        if mask is not None:            # padding: those keys hidden from every query
            bias = op.reshape(op.where(mask != 0, 0.0, -np.inf), [b, 1, 1, s])
        x, _, _ = self._layers(params, ids, np.arange(s), self._causal(bias))
        return self._head(params, x)

    # ---- generation: prefill and paged decoding steps (driven by models.generate) ------------
    def cache_shape(self):
        """(layers, key/value heads, head size) of this model's KV cache."""
        return self.config["n_layer"], self.config["n_head"], self.head_dim

    def rope_tables(self, positions):
        """What models.generate passes as the steps' (cos, sin): GPT-2 has no rotation, so the
        positions themselves [B, T] (for the position embedding) and None. A prompt's bucket
        may run past n_positions with padding after its tokens, which none of them sees: those
        positions read the last row; a decoding step's position (T = 1) past it is refused."""
        positions = np.asarray(positions, np.int64)
        n = self.config["n_positions"]
        if positions.shape[-1] == 1 and positions.size and positions.max() >= n:
            raise TesseraError(f"GPT2: position {int(positions.max())} is past its "
                               f"n_positions={n}")
        return np.minimum(positions, n - 1), None

    def prefill(self, params, ids, positions, _unused, last):
        """A prompt's step: ids [B, T] from position 0 (right-padded: padding after a row's
        tokens is never seen by them), positions [B, T] from ``rope_tables``; last [B] int, each
        row's last token. Returns (its logits [B, V], every layer's keys and values
        [B, H, T, hd])."""
        x, ks, vs = self._layers(params, ids, positions, self._causal())
        b, _, d = _shape(x)
        x = op.take_along_axis(x, op.broadcast_to(op.reshape(last, [b, 1, 1]), [b, 1, d]),
                               axis=1)
        return op.reshape(self._head(params, x), [b, -1]), ks, vs

    def decode(self, params, ids, positions, _unused, table, mask, window_mask, k_pools,
               v_pools):
        """One token per row: ids [B, 1] at positions [B, 1] (``rope_tables``), attending to
        its cached keys through the block table [B, W] and ``mask`` (``PagedKVCache.table`` /
        ``.mask``); k_pools, v_pools the cache's layers. Returns (logits [B, V], every layer's
        new keys and values [B, H, 1, hd])."""
        def attend(q, k, v, layer):
            return paged_attention(q, k, v, k_pools[layer], v_pools[layer], table, mask,
                                   scale=self.scale(layer))
        x, ks, vs = self._layers(params, ids, positions, attend)
        return op.reshape(self._head(params, x), [_shape(ids)[0], -1]), ks, vs

    def generate(self, params, prompts, max_new_tokens, **options):
        """``tessera.models.generate(self, params, prompts, max_new_tokens, ...)``: greedy or
        sampled decoding with a paged KV cache and continuous batching, refused when a prompt
        and its new tokens would not fit in n_positions."""
        from .generate import generate
        longest = max((len(p) for p in prompts), default=0)
        if longest + max_new_tokens > self.config["n_positions"]:
            raise TesseraError(f"GPT2.generate: {longest} prompt tokens and {max_new_tokens} "
                               f"new ones pass n_positions={self.config['n_positions']}")
        return generate(self, params, prompts, max_new_tokens, **options)

    # ---- transformers' checkpoint directories --------------------------------------------------
    _NAMES = {"ln_1": "ln_1.weight", "ln_1_bias": "ln_1.bias",
              "attn": "attn.c_attn.weight", "attn_bias": "attn.c_attn.bias",
              "attn_proj": "attn.c_proj.weight", "attn_proj_bias": "attn.c_proj.bias",
              "ln_2": "ln_2.weight", "ln_2_bias": "ln_2.bias",
              "fc": "mlp.c_fc.weight", "fc_bias": "mlp.c_fc.bias",
              "mlp_proj": "mlp.c_proj.weight", "mlp_proj_bias": "mlp.c_proj.bias"}
    _TOP = {"embed": "wte.weight", "pos_embed": "wpe.weight", "norm": "ln_f.weight",
            "norm_bias": "ln_f.bias"}

    @classmethod
    def from_pretrained(cls, directory):
        """(model, params) from a transformers checkpoint directory of GPT-2 (GPT2LMHeadModel's
        tensors under "transformer.", or a bare GPT2Model's / OpenAI's original names): its
        config.json and safetensors weights."""
        config = read_config(directory, cls.model_type)
        if config.get("add_cross_attention"):
            raise TesseraError(f"{directory}: GPT-2 with cross-attention (add_cross_attention) "
                               f"is not read; {cls.__name__} is the decoder alone")
        model = from_config(cls, config, directory)
        w = read_safetensors(directory)
        pre = checkpoint_prefix(w, "transformer.", "wte.weight")
        get = w.tensor
        layers = [{k: get(f"{pre}h.{i}.{n}") for k, n in cls._NAMES.items()}
                  for i in range(model.config["n_layer"])]
        params = {k: get(pre + n) for k, n in cls._TOP.items()}
        params["layers"] = layers
        if not model.config["tie_word_embeddings"]:
            params["lm_head"] = get("lm_head.weight", True)
        return model, params

    def save_pretrained(self, params, directory):
        """Write config.json and model.safetensors that transformers loads as GPT2LMHeadModel
        (its own tensor names, under "transformer."; lm_head.weight only when untied)."""
        tensors = {"transformer." + n: params[k] for k, n in self._TOP.items()}
        for i, layer in enumerate(params["layers"]):
            for k, n in self._NAMES.items():
                tensors[f"transformer.h.{i}.{n}"] = layer[k]
        if "lm_head" in params:
            tensors["lm_head.weight"] = np.asarray(params["lm_head"]).T
        config = {**self.config, "model_type": self.model_type,
                  "architectures": [self.architecture], "add_cross_attention": False,
                  "torch_dtype": "float32"}
        write_checkpoint(directory, tensors, config)

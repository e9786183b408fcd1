"""LLaMA (Touvron et al.), as transformers' LlamaForCausalLM computes it: token embeddings, N
pre-norm decoder layers (RMSNorm, grouped-query causal attention with rotate-half RoPE, RMSNorm,
a SwiGLU MLP), a final RMSNorm and the LM head (tied to the embeddings or not). Mistral (every
layer's attention within a sliding window) and Qwen2 (biased query/key/value projections,
sliding windows on the layers its config names) are LLaMA with those two differences."""
from __future__ import annotations

import numpy as np

from .. import op
from ..errors import ArgumentError, TesseraError
from ..nn.attention import (grouped_query_attention, rope, rope_frequencies, rope_tables,
                            sliding_window_mask)
from ..nn.init import normal
from ..nn.layers import Module, _shape, linear
from ..nn.paged import paged_attention
from ..nn.quantize import quantize_int8
from .checkpoint import (check_settings, from_config, read_config, read_safetensors,
                         write_checkpoint)

# config.json's names (transformers' LlamaConfig) -> this class's, with their defaults
_CONFIG = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
           "head_dim": None, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "max_position_embeddings": 2048,
           "initializer_range": 0.02, "attention_bias": False, "rope_scaling": None}


class LLaMA(Module):
    """params {"embed": [V, D], "layers": [{"input_norm", "q", "k", "v", "o", "post_norm",
    "gate", "up", "down"}], "norm": [D], "lm_head": [D, V] (absent when tied)}; projection
    weights are [in, out] (transformers' transposed), and "q_bias", ... where the model has
    them. ``__call__(params, ids, mask=None)``: ids [B, S] int, mask [B, S] (1 keeps a token,
    0 is padding) -> logits [B, S, V]. ``rope_scaling``: a context extension of RoPE
    (``nn.rope_frequencies``: ``{"rope_type": "llama3" | "linear" | "yarn", ...}``)."""
    model_type, architecture, settings = "llama", "LlamaForCausalLM", _CONFIG

    def __init__(self, **config):
        check_settings(type(self), config, self.settings)
        c = {**self.settings, **config}
        c["num_key_value_heads"] = c["num_key_value_heads"] or c["num_attention_heads"]
        c["head_dim"] = c["head_dim"] or c["hidden_size"] // c["num_attention_heads"]
        if c["num_attention_heads"] % c["num_key_value_heads"]:
            raise ArgumentError(f"{c['num_attention_heads']} attention heads do not share "
                                f"{c['num_key_value_heads']} key/value heads evenly")
        rope_frequencies(c["head_dim"], c["rope_theta"], c["rope_scaling"])   # (checked here)
        self.config = c

    @property
    def biased(self) -> tuple:
        """The attention projections with a bias."""
        return ("q", "k", "v", "o") if self.config["attention_bias"] else ()

    @property
    def windows(self) -> list:
        """Each layer's sliding window (None: the whole causal prefix)."""
        return [None] * self.config["num_hidden_layers"]

    @property
    def window(self):
        """The sliding window of the layers that have one (None when none has)."""
        return next((w for w in self.windows if w is not None), None)

    # ---- parameters ----------------------------------------------------------------------------
    def init_params(self, key):
        """transformers' initialisation: normal(0, initializer_range) weights, RMSNorm ones."""
        c = self.config
        d, hd, std = c["hidden_size"], c["head_dim"], c["initializer_range"]
        h, kv, f = c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]

        def w(k, shape):
            return normal(k, shape, std)
        layers = []
        for i in range(c["num_hidden_layers"]):
            k = key.child(f"layer{i}")
            layers.append({"input_norm": np.ones(d, np.float32), "q": w(k.child("q"), (d, h * hd)),
                           "k": w(k.child("k"), (d, kv * hd)), "v": w(k.child("v"), (d, kv * hd)),
                           "o": w(k.child("o"), (h * hd, d)),
                           "post_norm": np.ones(d, np.float32), "gate": w(k.child("g"), (d, f)),
                           "up": w(k.child("u"), (d, f)), "down": w(k.child("d"), (f, d))})
        for layer in layers:
            for n in self.biased:
                layer[n + "_bias"] = np.zeros(layer[n].shape[1], np.float32)
        p = {"embed": w(key.child("embed"), (c["vocab_size"], d)), "layers": layers,
             "norm": np.ones(d, np.float32)}
        if not c["tie_word_embeddings"]:
            p["lm_head"] = w(key.child("lm_head"), (d, c["vocab_size"]))
        return p

    def quantize(self, params, precision="int8"):
        """params with every projection weight (attention, MLP and the LM head, a tied one
        too) as int8 with a float32 scale per output column (``nn.quantize_int8``): weight-only
        quantization, the seeds' ``precision="int8"``. Embeddings and norms stay float32; the
        products read the bytes (``op.matmul_int8_weight``). Decode with the result as with
        the float params; ``save_pretrained`` takes float params only."""
        if precision != "int8":
            raise ArgumentError(f"{type(self).__name__}.quantize: precision {precision!r} is "
                                "not supported", expected="'int8'")
        layers = [{k: quantize_int8(v) if k in self._NAMES else v for k, v in layer.items()}
                  for layer in params["layers"]]
        head = params["lm_head"] if "lm_head" in params else np.asarray(params["embed"]).T
        return {**params, "layers": layers, "lm_head": quantize_int8(head)}

    # ---- the forward pass ----------------------------------------------------------------------
    def _heads(self, t, n):
        b, s = _shape(t)[:2]
        return op.transpose(op.reshape(t, [b, s, n, self.config["head_dim"]]), [0, 2, 1, 3])

    def _layers(self, params, ids, attend, tables=None):
        """The decoder layers over ids [B, S], attention by ``attend(q, k, v, layer)`` (q [B, H,
        S, hd]; k, v [B, KV, S, hd] after RoPE: by position within the input, or by ``tables``,
        ``rope_tables`` of each row's positions). Returns (the final norm's output [B, S, D],
        the layers' keys and values)."""
        c = self.config
        eps, h, kv = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"]
        x = op.take(params["embed"], ids, axis=0)
        ks, vs = [], []
        for i, p in enumerate(params["layers"]):
            a = op.rmsnorm(x, p["input_norm"], eps)
            q = rope(self._heads(linear(a, p["q"], p.get("q_bias")), h), c["rope_theta"],
                     tables=tables, scaling=c["rope_scaling"])
            k = rope(self._heads(linear(a, p["k"], p.get("k_bias")), kv), c["rope_theta"],
                     tables=tables, scaling=c["rope_scaling"])
            v = self._heads(linear(a, p["v"], p.get("v_bias")), kv)
            o = attend(q, k, v, i)
            b, _, s, hd = _shape(o)
            x = x + linear(op.reshape(op.transpose(o, [0, 2, 1, 3]), [b, s, h * hd]), p["o"],
                           p.get("o_bias"))
            a = op.rmsnorm(x, p["post_norm"], eps)
            x = x + linear(op.silu(linear(a, p["gate"])) * linear(a, p["up"]), p["down"])
            ks.append(k)
            vs.append(v)
        return op.rmsnorm(x, params["norm"], eps), ks, vs

    def _head(self, params, x):
        head = params["lm_head"] if "lm_head" in params else op.transpose(params["embed"])
        return linear(x, head)

    def _causal(self, bias=None):
        """Causal attention over the input itself (within each layer's window)."""
        def attend(q, k, v, layer):
            window, mask = self.windows[layer], bias
            if window is not None:
                s = _shape(q)[-2]
                band = sliding_window_mask(s, s, window)
                mask = band if mask is None else mask + band
            return grouped_query_attention(q, k, v, mask=mask, causal=True)
        return attend

    def __call__(self, params, ids, mask=None):
        bias = None
        if mask is not None:            # padding: those keys hidden from every query
            b, s = _shape(mask)
            bias = op.reshape(op.where(mask != 0, 0.0, -np.inf), [b, 1, 1, s])
        x, _, _ = self._layers(params, ids, self._causal(bias))
        return self._head(params, x)

    # ---- generation: prefill and paged decoding steps (driven by models.generate) ------------
    def cache_shape(self):
        """(layers, key/value heads, head size) of this model's KV cache."""
        c = self.config
        return c["num_hidden_layers"], c["num_key_value_heads"], c["head_dim"]

    def rope_tables(self, positions):
        """``rope_tables`` of positions [B, T], shaped to turn q and k [B, heads, T, hd]."""
        c = self.config
        cos, ssin = rope_tables(0, c["head_dim"], c["rope_theta"], positions=positions,
                                scaling=c["rope_scaling"])
        return cos[:, None], ssin[:, None]

    def prefill(self, params, ids, cos, ssin, last):
        """A prompt's step: ids [B, T] from position 0 (right-padded: padding after a row's
        tokens is never seen by them), tables of positions 0..T-1; last [B] int, each row's
        last token. Returns (its logits [B, V], every layer's keys and values [B, KV, T, hd])."""
        x, ks, vs = self._layers(params, ids, self._causal(), tables=(cos, ssin))
        b, _, d = _shape(x)
        x = op.take_along_axis(x, op.broadcast_to(op.reshape(last, [b, 1, 1]), [b, 1, d]),
                               axis=1)
        return op.reshape(self._head(params, x), [b, -1]), ks, vs

    def decode(self, params, ids, cos, ssin, table, mask, window_mask, k_pools, v_pools):
        """One token per row: ids [B, 1] at each row's own position (cos, ssin from
        ``rope_tables``), attending to its cached keys through the block table [B, W] and
        ``mask`` (``PagedKVCache.table`` / ``.mask``), or ``window_mask`` (``.mask(...,
        window=self.window)``) in the layers with a sliding window; k_pools, v_pools the
        cache's layers. Returns (logits [B, V], every layer's new keys and values
        [B, KV, 1, hd])."""
        def attend(q, k, v, layer):
            m = mask if self.windows[layer] is None else window_mask
            return paged_attention(q, k, v, k_pools[layer], v_pools[layer], table, m)
        x, ks, vs = self._layers(params, ids, attend, tables=(cos, ssin))
        return op.reshape(self._head(params, x), [_shape(ids)[0], -1]), ks, vs

    def generate(self, params, prompts, max_new_tokens, **options):
        """``tessera.models.generate(self, params, prompts, max_new_tokens, ...)``: greedy or
        sampled decoding with a paged KV cache and continuous batching."""
        from .generate import generate
        return generate(self, params, prompts, max_new_tokens, **options)

    # ---- transformers' checkpoint directories --------------------------------------------------
    _NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
              "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
              "down": "mlp.down_proj"}

    @classmethod
    def from_pretrained(cls, directory):
        """(model, params) from a transformers checkpoint directory of this architecture
        (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM): its config.json and
        model.safetensors (or sharded model-*.safetensors with their index)."""
        config = read_config(directory, cls.model_type)
        if config.get("mlp_bias"):
            raise TesseraError(f"{directory}: an MLP with biases (mlp_bias) is not read yet")
        # transformers 5 keeps RoPE's settings in rope_parameters, with rope_theta; 4 wrote a
        # rope_scaling beside a top-level rope_theta
        rope_params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        if "rope_theta" in rope_params:
            config = {**config, "rope_theta": rope_params.pop("rope_theta")}
        kind = rope_params.get("rope_type", rope_params.get("type", "default"))
        if rope_params.get("partial_rotary_factor", 1.0) != 1.0:
            raise TesseraError(f"{directory}: RoPE over part of each head "
                               "(partial_rotary_factor) is not read yet")
        scaling = None
        if kind != "default":
            scaling = {**rope_params, "rope_type": kind}
            scaling.pop("type", None)
            if kind == "yarn" and scaling.get("factor") is None:   # (DeepSeek's convention)
                scaling["factor"] = (config["max_position_embeddings"]
                                     / scaling["original_max_position_embeddings"])
        config = {**config, "rope_scaling": scaling}
        model = from_config(cls, config, directory)
        w = read_safetensors(directory)
        c = model.config
        get = w.tensor
        layers = []
        for i in range(c["num_hidden_layers"]):
            pre = f"model.layers.{i}."
            layer = {k: get(pre + n + ".weight", True) for k, n in cls._NAMES.items()}
            layer.update({k + "_bias": get(pre + cls._NAMES[k] + ".bias") for k in model.biased})
            layer["input_norm"] = get(pre + "input_layernorm.weight")
            layer["post_norm"] = get(pre + "post_attention_layernorm.weight")
            layers.append(layer)
        params = {"embed": get("model.embed_tokens.weight"), "layers": layers,
                  "norm": get("model.norm.weight")}
        if not c["tie_word_embeddings"]:
            params["lm_head"] = get("lm_head.weight", True)
        return model, params

    def save_pretrained(self, params, directory):
        """Write config.json and model.safetensors that transformers loads as this
        architecture (the directory is made; its files are written whole, then renamed into
        place)."""
        if isinstance(params.get("lm_head"), dict) or any(
                isinstance(v, dict) for layer in params["layers"] for v in layer.values()):
            raise TesseraError("save_pretrained writes float weights; these params are "
                               "quantized (int8)", hint="save the params you quantized from")
        tensors = {"model.embed_tokens.weight": params["embed"],
                   "model.norm.weight": params["norm"]}
        for i, layer in enumerate(params["layers"]):
            pre = f"model.layers.{i}."
            for k, n in self._NAMES.items():
                tensors[pre + n + ".weight"] = np.asarray(layer[k]).T
            for k in self.biased:
                tensors[pre + self._NAMES[k] + ".bias"] = layer[k + "_bias"]
            tensors[pre + "input_layernorm.weight"] = layer["input_norm"]
            tensors[pre + "post_attention_layernorm.weight"] = layer["post_norm"]
        if "lm_head" in params:
            tensors["lm_head.weight"] = np.asarray(params["lm_head"]).T
        scaling = self.config["rope_scaling"] or {"rope_type": "default"}
        config = {**{k: v for k, v in self.config.items() if k != "rope_scaling"},
                  "model_type": self.model_type, "architectures": [self.architecture],
                  "hidden_act": "silu", "torch_dtype": "float32", "mlp_bias": False,
                  "rope_parameters": {**scaling, "rope_theta": self.config["rope_theta"]}}
        write_checkpoint(directory, tensors, config)


class Mistral(LLaMA):
    """Mistral (Jiang et al.): LLaMA whose every attention layer sees only the
    ``sliding_window`` most recent positions (its own included), as transformers'
    MistralForCausalLM; ``sliding_window=None`` is LLaMA's whole prefix."""
    model_type, architecture = "mistral", "MistralForCausalLM"
    settings = {**{k: v for k, v in _CONFIG.items() if k != "attention_bias"},
                "sliding_window": 4096, "max_position_embeddings": 4096 * 32}

    @property
    def biased(self) -> tuple:
        return ()

    @property
    def windows(self) -> list:
        return [self.config["sliding_window"]] * self.config["num_hidden_layers"]


class Qwen2(LLaMA):
    """Qwen2: LLaMA with biases on the query, key and value projections, and a sliding window
    on the layers its config names (``layer_types``; by default, when ``use_sliding_window``,
    the layers from ``max_window_layers`` on, transformers' Qwen2Config rule)."""
    model_type, architecture = "qwen2", "Qwen2ForCausalLM"
    settings = {**{k: v for k, v in _CONFIG.items() if k != "attention_bias"},
                "max_position_embeddings": 32768, "use_sliding_window": False,
                "sliding_window": 4096, "max_window_layers": 28, "layer_types": None}

    @property
    def biased(self) -> tuple:
        return ("q", "k", "v")

    @property
    def windows(self) -> list:
        c = self.config
        window = c["sliding_window"] if c["use_sliding_window"] else None
        kinds = c["layer_types"] or [
            "sliding_attention" if window is not None and i >= c["max_window_layers"]
            else "full_attention" for i in range(c["num_hidden_layers"])]
        return [c["sliding_window"] if k == "sliding_attention" else None for k in kinds]

"""BERT (Devlin et al.), as transformers' BertModel computes it: word, position and token-type
embeddings summed and layer-normalised, N post-norm encoder layers (bidirectional multi-head
attention, residual, LayerNorm; a GELU MLP, residual, LayerNorm) and the pooler (a dense layer
and tanh on the first token's state)."""
from __future__ import annotations

import numpy as np

from .. import op
from ..errors import ArgumentError, TesseraError
from ..nn.init import normal
from ..nn.layers import Module, _shape, linear
from .checkpoint import (check_settings, checkpoint_prefix, from_config, hidden_activation,
                         read_config, read_safetensors, write_checkpoint)

# config.json's names (transformers' BertConfig) -> this class's, with their defaults
_CONFIG = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
           "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
           "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
           "layer_norm_eps": 1e-12, "pad_token_id": 0}


class BERT(Module):
    """params {"embed": [V, D], "pos_embed": [P, D], "type_embed": [T, D], "embed_norm",
    "embed_norm_bias", "layers": [{"q", "q_bias", "k", "k_bias", "v", "v_bias", "o", "o_bias",
    "attn_norm", "attn_norm_bias", "up", "up_bias", "down", "down_bias", "out_norm",
    "out_norm_bias"}], "pooler", "pooler_bias" (absent from a checkpoint saved without its
    pooler)}; weights are [in, out] (transformers' transposed).
    ``__call__(params, ids, mask=None, token_type_ids=None)``: ids [B, S] int, mask [B, S] (1
    keeps a token, 0 is padding: hidden as a key from every query), token types [B, S] (all 0
    by default) -> (last_hidden_state [B, S, D], pooler_output [B, D], or None without a
    pooler)."""
    model_type, architecture, settings = "bert", "BertModel", _CONFIG

    def __init__(self, **config):
        check_settings(type(self), config, self.settings)
        c = {**self.settings, **config}
        if c["hidden_size"] % c["num_attention_heads"]:
            raise ArgumentError(f"hidden_size={c['hidden_size']} does not split into "
                                f"{c['num_attention_heads']} heads")
        self.act = hidden_activation(c["hidden_act"], "BERT")
        self.config = c

    @property
    def head_dim(self) -> int:
        return self.config["hidden_size"] // self.config["num_attention_heads"]

    # ---- parameters ----------------------------------------------------------------------------
    def init_params(self, key):
        """transformers' initialisation: normal(0, initializer_range) embeddings and weights
        (the padding token's embedding row zero), zero biases, LayerNorm ones and zeros."""
        c = self.config
        d, f, std = c["hidden_size"], c["intermediate_size"], c["initializer_range"]
        zeros, ones = (lambda n: np.zeros(n, np.float32)), (lambda n: np.ones(n, np.float32))

        def dense(k, name, n_in, n_out):
            return {name: normal(k.child(name), (n_in, n_out), std), name + "_bias": zeros(n_out)}
        layers = []
        for i in range(c["num_hidden_layers"]):
            k = key.child(f"layer{i}")
            layer = {**dense(k, "q", d, d), **dense(k, "k", d, d), **dense(k, "v", d, d),
                     **dense(k, "o", d, d), **dense(k, "up", d, f), **dense(k, "down", f, d)}
            for n in ("attn_norm", "out_norm"):
                layer[n], layer[n + "_bias"] = ones(d), zeros(d)
            layers.append(layer)
        embed = normal(key.child("embed"), (c["vocab_size"], d), std)
        if c["pad_token_id"] is not None:
            embed[c["pad_token_id"]] = 0.0
        return {"embed": embed,
                "pos_embed": normal(key.child("pos_embed"), (c["max_position_embeddings"], d),
                                    std),
                "type_embed": normal(key.child("type_embed"), (c["type_vocab_size"], d), std),
                "embed_norm": ones(d), "embed_norm_bias": zeros(d), "layers": layers,
                **dense(key, "pooler", d, d)}

    # ---- the forward pass ----------------------------------------------------------------------
    def _heads(self, t):
        b, s = _shape(t)[:2]
        return op.transpose(op.reshape(
            t, [b, s, self.config["num_attention_heads"], self.head_dim]), [0, 2, 1, 3])

    def __call__(self, params, ids, mask=None, token_type_ids=None):
        c = self.config
        eps = c["layer_norm_eps"]
        b, s = _shape(ids)
        if s > c["max_position_embeddings"]:
            raise ArgumentError(f"BERT: {s} tokens, more than its max_position_embeddings="
                                f"{c['max_position_embeddings']}")
        x = op.take(params["embed"], ids, axis=0) + op.take(params["pos_embed"], np.arange(s),
                                                            axis=0)
        if token_type_ids is None:              # every token of type 0
            x = x + op.take(params["type_embed"], np.zeros(1, np.int64), axis=0)
        else:
            x = x + op.take(params["type_embed"], token_type_ids, axis=0)
        x = op.layernorm(x, params["embed_norm"], params["embed_norm_bias"], eps)
        bias = None
        if mask is not None:            # padding: those keys hidden from every query
            bias = op.reshape(op.where(mask != 0, 0.0, -np.inf), [b, 1, 1, s])
        for p in params["layers"]:
            q, k, v = (self._heads(linear(x, p[n], p[n + "_bias"])) for n in ("q", "k", "v"))
            o = op.attention(q, k, v, mask=bias)
            o = op.reshape(op.transpose(o, [0, 2, 1, 3]), [b, s, c["hidden_size"]])
            x = op.layernorm(x + linear(o, p["o"], p["o_bias"]), p["attn_norm"],
                             p["attn_norm_bias"], eps)
            h = linear(self.act(linear(x, p["up"], p["up_bias"])), p["down"], p["down_bias"])
            x = op.layernorm(x + h, p["out_norm"], p["out_norm_bias"], eps)
        if "pooler" not in params:
            return x, None
        first = op.reshape(op.take(x, np.zeros(1, np.int64), axis=1), [b, c["hidden_size"]])
        return x, op.tanh(linear(first, params["pooler"], params["pooler_bias"]))

    # ---- transformers' checkpoint directories --------------------------------------------------
    _NAMES = {"q": "attention.self.query", "k": "attention.self.key",
              "v": "attention.self.value", "o": "attention.output.dense",
              "attn_norm": "attention.output.LayerNorm", "up": "intermediate.dense",
              "down": "output.dense", "out_norm": "output.LayerNorm"}
    _TOP = {"embed": "embeddings.word_embeddings.weight",
            "pos_embed": "embeddings.position_embeddings.weight",
            "type_embed": "embeddings.token_type_embeddings.weight",
            "embed_norm": "embeddings.LayerNorm.weight",
            "embed_norm_bias": "embeddings.LayerNorm.bias"}
    _NORMS = ("attn_norm", "out_norm")

    @classmethod
    def from_pretrained(cls, directory):
        """(model, params) from a transformers checkpoint directory of BERT: BertModel's tensor
        names, or a task model's (BertForMaskedLM, BertForSequenceClassification, ...) under
        "bert." (their heads are not read); a checkpoint without the pooler gives params
        without it. Decoder BERTs (is_decoder, cross-attention) and relative position
        embeddings are refused."""
        config = read_config(directory, cls.model_type)
        if config.get("is_decoder") or config.get("add_cross_attention"):
            raise TesseraError(f"{directory}: a decoder BERT (is_decoder, add_cross_attention) "
                               f"is not read; {cls.__name__} is the bidirectional encoder")
        kind = config.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise TesseraError(f"{directory}: position embeddings of type {kind!r} are not "
                               f"read; {cls.__name__} reads absolute ones")
        model = from_config(cls, config, directory)
        w = read_safetensors(directory)
        pre = checkpoint_prefix(w, "bert.", cls._TOP["embed"])
        get = w.tensor
        layers = []
        for i in range(model.config["num_hidden_layers"]):
            at = f"{pre}encoder.layer.{i}."
            layer = {}
            for k, n in cls._NAMES.items():
                norm = k in cls._NORMS
                layer[k] = get(at + n + ".weight", not norm)
                layer[k + "_bias"] = get(at + n + ".bias")
            layers.append(layer)
        params = {k: get(pre + n) for k, n in cls._TOP.items()}
        params["layers"] = layers
        if pre + "pooler.dense.weight" in w:
            params["pooler"] = get(pre + "pooler.dense.weight", True)
            params["pooler_bias"] = get(pre + "pooler.dense.bias")
        return model, params

    def save_pretrained(self, params, directory):
        """Write config.json and model.safetensors that transformers' AutoModel loads as
        BertModel (its own tensor names, no "bert." prefix)."""
        tensors = {n: params[k] for k, n in self._TOP.items()}
        for i, layer in enumerate(params["layers"]):
            at = f"encoder.layer.{i}."
            for k, n in self._NAMES.items():
                w = layer[k]
                tensors[at + n + ".weight"] = w if k in self._NORMS else np.asarray(w).T
                tensors[at + n + ".bias"] = layer[k + "_bias"]
        if "pooler" in params:
            tensors["pooler.dense.weight"] = np.asarray(params["pooler"]).T
            tensors["pooler.dense.bias"] = params["pooler_bias"]
        config = {**self.config, "model_type": self.model_type,
                  "architectures": [self.architecture], "is_decoder": False,
                  "add_cross_attention": False, "torch_dtype": "float32"}
        write_checkpoint(directory, tensors, config)

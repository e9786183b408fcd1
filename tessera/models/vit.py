"""The Vision Transformer (Dosovitskiy et al.), as transformers' ViTForImageClassification
computes it: the image cut into patches by a strided convolution, a learned CLS token before
them, learned position embeddings added, N pre-norm encoder layers (LayerNorm, multi-head
attention over every token, LayerNorm, a two-layer MLP), a final LayerNorm and a linear
classifier on the CLS token. The encoder layer here is CLIP's too (tessera/models/clip.py)."""
from __future__ import annotations

import numpy as np

from .. import op
from ..errors import ArgumentError, TesseraError
from ..nn.init import normal
from ..nn.layers import Module, _shape, linear
from .checkpoint import (check_settings, from_config, hidden_activation, read_config,
                         read_safetensors, write_checkpoint)


# ---- pieces shared with CLIP ------------------------------------------------------------------
def pair(v):
    """An int or a pair (transformers' image_size / patch_size) as a pair of ints."""
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else tuple(int(i) for i in v)


def patch_embed(x, w, b, patch, image_size, where):
    """pixel_values [B, C, H, W] -> [B, H/p * W/p, D]: one convolution of kernel and stride p
    (each patch's linear projection), its patches row by row."""
    shape = _shape(x)
    if len(shape) != 4 or tuple(shape[2:]) != tuple(image_size) or shape[1] != _shape(w)[1]:
        raise ArgumentError(f"{where} takes pixel_values [B, {_shape(w)[1]}, "
                            f"{image_size[0]}, {image_size[1]}], not {list(shape)}",
                            hint="the position embeddings are not interpolated to other sizes")
    y = op.conv(x, w, b, stride=patch)
    n, d = shape[0], _shape(w)[0]
    return op.transpose(op.reshape(y, [n, d, -1]), [0, 2, 1])


def with_class_token(x, cls, pos):
    """[B, N, D] -> [B, 1 + N, D]: the learned class token first, then + position embeddings
    [1 + N, D]."""
    b, _, d = _shape(x)
    first = op.broadcast_to(op.reshape(cls, [1, 1, d]), [b, 1, d])
    return op.concat([first, x], axis=1) + pos


def encoder_layer(p, x, heads, eps, act, mask=None, causal=False):
    """One pre-norm encoder layer over x [B, S, D]: x + attention(LayerNorm(x)), then
    x + fc2(act(fc1(LayerNorm(x)))). Attention is multi-head (``heads`` of D / heads, scaled
    by 1/sqrt(head size)) with the additive ``mask`` (broadcast to [B, H, S, S]) and, when
    ``causal``, each token seeing only those before it. params {"norm1", "q", "k", "v", "o",
    "norm2", "fc1", "fc2"} and their "_bias" ("q_bias" ... absent when unbiased)."""
    b, s, d = _shape(x)
    hd = d // heads

    def split(t):
        return op.transpose(op.reshape(t, [b, s, heads, hd]), [0, 2, 1, 3])
    a = op.layernorm(x, p["norm1"], p["norm1_bias"], eps)
    q, k, v = (split(linear(a, p[n], p.get(n + "_bias"))) for n in "qkv")
    o = op.attention(q, k, v, mask=mask, causal=causal)
    x = x + linear(op.reshape(op.transpose(o, [0, 2, 1, 3]), [b, s, d]), p["o"], p["o_bias"])
    a = op.layernorm(x, p["norm2"], p["norm2_bias"], eps)
    return x + linear(act(linear(a, p["fc1"], p["fc1_bias"])), p["fc2"], p["fc2_bias"])


_LINEARS, _NORMS = ("q", "k", "v", "o", "fc1", "fc2"), ("norm1", "norm2")


def init_encoder_layer(key, d, f, std_qkv, std_o, std_fc1, std_fc2, qkv_bias=True):
    """An encoder layer's parameters: normal weights of those deviations, zero biases,
    LayerNorms of ones and zeros."""
    stds = {"q": std_qkv, "k": std_qkv, "v": std_qkv, "o": std_o, "fc1": std_fc1,
            "fc2": std_fc2}
    shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "fc1": (d, f), "fc2": (f, d)}
    p = {}
    for n in _LINEARS:
        p[n] = normal(key.child(n), shapes[n], stds[n])
        if qkv_bias or n not in ("q", "k", "v"):
            p[n + "_bias"] = np.zeros(shapes[n][1], np.float32)
    for n in _NORMS:
        p[n], p[n + "_bias"] = np.ones(d, np.float32), np.zeros(d, np.float32)
    return p


def read_encoder_layer(get, prefix, names, qkv_bias=True):
    """An encoder layer from a checkpoint's tensors ``prefix + names[n] + ".weight"`` (linear
    weights transposed to [in, out])."""
    p = {}
    for n in _LINEARS + _NORMS:
        p[n] = get(prefix + names[n] + ".weight", n in _LINEARS)
        if qkv_bias or n not in ("q", "k", "v"):
            p[n + "_bias"] = get(prefix + names[n] + ".bias")
    return p


def write_encoder_layer(tensors, p, prefix, names):
    """An encoder layer's tensors under transformers' names (linear weights [out, in])."""
    for n in _LINEARS + _NORMS:
        tensors[prefix + names[n] + ".weight"] = np.asarray(p[n]).T if n in _LINEARS else p[n]
        if n + "_bias" in p:
            tensors[prefix + names[n] + ".bias"] = p[n + "_bias"]


def labels(config, where):
    """The number of classes of a checkpoint's config.json (its id2label, else num_labels)."""
    n = len(config["id2label"]) if "id2label" in config else config.get("num_labels", 2)
    if n < 1:
        raise TesseraError(f"{where}: a model without a classifier (num_labels 0) is not read")
    return n


def label_names(n):
    """config.json's id2label and label2id for n classes (transformers' default names)."""
    return {"id2label": {str(i): f"LABEL_{i}" for i in range(n)},
            "label2id": {f"LABEL_{i}": i for i in range(n)}}


# ---- ViT ----------------------------------------------------------------------------------------
_CONFIG = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
           "intermediate_size": 3072, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
           "image_size": 224, "patch_size": 16, "num_channels": 3, "qkv_bias": True,
           "initializer_range": 0.02, "num_labels": 2}


class ViT(Module):
    """params {"patch": [D, C, p, p], "patch_bias": [D], "cls": [D], "pos": [1 + N, D],
    "layers": [encoder layers], "norm", "norm_bias": [D], "classifier": [D, L],
    "classifier_bias": [L]}; linear weights are [in, out] (transformers' transposed), the
    convolution's [out, in, kh, kw] as PyTorch's. ``__call__(params, pixel_values)``:
    pixel_values [B, C, H, W] float32 of the configured image size -> logits [B, L]."""
    model_type, architecture, settings = "vit", "ViTForImageClassification", _CONFIG

    def __init__(self, **config):
        check_settings(type(self), config, self.settings)
        c = {**self.settings, **config}
        if c["hidden_size"] % c["num_attention_heads"]:
            raise ArgumentError(f"hidden_size {c['hidden_size']} does not split into "
                                f"{c['num_attention_heads']} attention heads")
        if c["num_labels"] < 1:
            raise ArgumentError("ViT needs a classifier of at least one class (num_labels)")
        self.act = hidden_activation(c["hidden_act"], "ViT")
        self.config = c

    @property
    def num_patches(self):
        (h, w), (ph, pw) = pair(self.config["image_size"]), pair(self.config["patch_size"])
        return (h // ph) * (w // pw)

    def init_params(self, key):
        """transformers' initialisation: normal(0, initializer_range) weights (the CLS token
        and position embeddings too), zero biases, LayerNorms of ones and zeros."""
        c = self.config
        d, std, n = c["hidden_size"], c["initializer_range"], c["num_labels"]
        layers = [init_encoder_layer(key.child(f"layer{i}"), d, c["intermediate_size"],
                                     std, std, std, std, c["qkv_bias"])
                  for i in range(c["num_hidden_layers"])]
        return {"patch": normal(key.child("patch"), (d, c["num_channels"],
                                                     *pair(c["patch_size"])), std),
                "patch_bias": np.zeros(d, np.float32),
                "cls": normal(key.child("cls"), (d,), std),
                "pos": normal(key.child("pos"), (1 + self.num_patches, d), std),
                "layers": layers, "norm": np.ones(d, np.float32),
                "norm_bias": np.zeros(d, np.float32),
                "classifier": normal(key.child("classifier"), (d, n), std),
                "classifier_bias": np.zeros(n, np.float32)}

    def features(self, params, pixel_values):
        """The final LayerNorm's output [B, 1 + N, D] (the CLS token first)."""
        c = self.config
        x = patch_embed(pixel_values, params["patch"], params["patch_bias"],
                        pair(c["patch_size"]), pair(c["image_size"]), "ViT")
        x = with_class_token(x, params["cls"], params["pos"])
        for p in params["layers"]:
            x = encoder_layer(p, x, c["num_attention_heads"], c["layer_norm_eps"], self.act)
        return op.layernorm(x, params["norm"], params["norm_bias"], c["layer_norm_eps"])

    def __call__(self, params, pixel_values):
        x = self.features(params, pixel_values)
        b, _, d = _shape(x)
        cls = op.reshape(x[:, 0:1, :], [b, d])
        return linear(cls, params["classifier"], params["classifier_bias"])

    # ---- transformers' checkpoint directories --------------------------------------------------
    _NAMES = {"q": "attention.attention.query", "k": "attention.attention.key",
              "v": "attention.attention.value", "o": "attention.output.dense",
              "fc1": "intermediate.dense", "fc2": "output.dense", "norm1": "layernorm_before",
              "norm2": "layernorm_after"}

    @classmethod
    def from_pretrained(cls, directory):
        """(model, params) from a transformers ViTForImageClassification directory (its
        config.json and safetensors weights)."""
        config = read_config(directory, cls.model_type)
        config = {**config, "num_labels": labels(config, directory)}
        model = from_config(cls, config, directory)
        c = model.config
        get = read_safetensors(directory).tensor
        d = c["hidden_size"]
        params = {"patch": get("vit.embeddings.patch_embeddings.projection.weight"),
                  "patch_bias": get("vit.embeddings.patch_embeddings.projection.bias"),
                  "cls": get("vit.embeddings.cls_token").reshape(d),
                  "pos": get("vit.embeddings.position_embeddings").reshape(-1, d),
                  "layers": [read_encoder_layer(get, f"vit.encoder.layer.{i}.", cls._NAMES,
                                                c["qkv_bias"])
                             for i in range(c["num_hidden_layers"])],
                  "norm": get("vit.layernorm.weight"), "norm_bias": get("vit.layernorm.bias"),
                  "classifier": get("classifier.weight", True),
                  "classifier_bias": get("classifier.bias")}
        return model, params

    def save_pretrained(self, params, directory):
        """Write config.json and model.safetensors that transformers loads as a
        ViTForImageClassification (the files written whole, then renamed into place)."""
        d = self.config["hidden_size"]
        tensors = {"vit.embeddings.patch_embeddings.projection.weight": params["patch"],
                   "vit.embeddings.patch_embeddings.projection.bias": params["patch_bias"],
                   "vit.embeddings.cls_token": np.reshape(params["cls"], (1, 1, d)),
                   "vit.embeddings.position_embeddings": np.reshape(params["pos"], (1, -1, d)),
                   "vit.layernorm.weight": params["norm"], "vit.layernorm.bias":
                   params["norm_bias"], "classifier.weight": np.asarray(params["classifier"]).T,
                   "classifier.bias": params["classifier_bias"]}
        for i, p in enumerate(params["layers"]):
            write_encoder_layer(tensors, p, f"vit.encoder.layer.{i}.", self._NAMES)
        config = {k: v for k, v in self.config.items() if k != "num_labels"}
        config.update(label_names(self.config["num_labels"]), model_type=self.model_type,
                      architectures=[self.architecture], torch_dtype="float32")
        write_checkpoint(directory, tensors, config)

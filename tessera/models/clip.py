"""CLIP (Radford et al.), as transformers' CLIPModel computes it: a text tower (token and
position embeddings, N causal pre-norm encoder layers, a final LayerNorm, the state at each
row's end-of-text token) and a vision tower (ViT's patch convolution without bias, a class
embedding, position embeddings, a LayerNorm before the encoder (transformers'
``pre_layrnorm``), N pre-norm encoder layers, a LayerNorm on the class token), each projected
into a shared space without bias; the two sets of features, normalised to unit length, give
cosine similarities scaled by exp(logit_scale)."""
from __future__ import annotations

import numpy as np

from .. import op
from ..errors import ArgumentError, TesseraError
from ..nn.init import normal
from ..nn.layers import Module, _shape, linear
from .checkpoint import (check_settings, from_config, hidden_activation, read_config,
                         read_safetensors, write_checkpoint)
from .vit import (encoder_layer, init_encoder_layer, pair, patch_embed, read_encoder_layer,
                  with_class_token, write_encoder_layer)

# config.json's names (transformers' CLIPTextConfig, CLIPVisionConfig, CLIPConfig), defaults
_TEXT = {"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048,
         "num_hidden_layers": 12, "num_attention_heads": 8, "max_position_embeddings": 77,
         "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "initializer_range": 0.02,
         "initializer_factor": 1.0, "pad_token_id": 1, "bos_token_id": 49406,
         "eos_token_id": 49407}
_VISION = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
           "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 32,
           "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "initializer_range": 0.02,
           "initializer_factor": 1.0}
_CONFIG = {"text_config": _TEXT, "vision_config": _VISION, "projection_dim": 512,
           "logit_scale_init_value": 2.6592, "initializer_factor": 1.0}
_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
          "o": "self_attn.out_proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2", "norm1": "layer_norm1",
          "norm2": "layer_norm2"}


class CLIP(Module):
    """params {"text": {"token": [V, Dt], "pos": [P, Dt], "layers": [encoder layers], "norm",
    "norm_bias"}, "vision": {"patch": [Dv, C, p, p], "cls": [Dv], "pos": [1 + N, Dv],
    "pre_norm", "pre_norm_bias", "layers", "post_norm", "post_norm_bias"},
    "text_projection": [Dt, E], "visual_projection": [Dv, E], "logit_scale": []}; linear
    weights are [in, out] (transformers' transposed).

    ``text_features(params, ids, mask=None)``: ids [B, S] int, mask [B, S] (1 keeps a token, 0
    is padding) -> [B, E]; ``image_features(params, pixel_values)``: [B, C, H, W] float32 ->
    [B, E] (both unnormalised, transformers' get_text_features / get_image_features);
    ``__call__(params, ids, pixel_values, mask=None)`` -> (logits_per_image [Bi, Bt],
    logits_per_text [Bt, Bi])."""
    model_type, architecture, settings = "clip", "CLIPModel", _CONFIG

    def __init__(self, text_config=None, vision_config=None, **config):
        check_settings(type(self), config, self.settings)
        text, vision = dict(text_config or {}), dict(vision_config or {})
        check_settings(type(self), text, _TEXT)
        check_settings(type(self), vision, _VISION)
        c = {**self.settings, **config, "text_config": {**_TEXT, **text},
             "vision_config": {**_VISION, **vision}}
        for tower in ("text_config", "vision_config"):
            t = c[tower]
            if t["hidden_size"] % t["num_attention_heads"]:
                raise ArgumentError(f"CLIP {tower}: hidden_size {t['hidden_size']} does not "
                                    f"split into {t['num_attention_heads']} attention heads")
        eos = c["text_config"]["eos_token_id"]
        if not isinstance(eos, (int, np.integer)) or isinstance(eos, bool):
            raise TesseraError(f"CLIP text_config: eos_token_id {eos!r} is not read; the text "
                               "is pooled at one end-of-text token id")
        self.text_act = hidden_activation(c["text_config"]["hidden_act"], "CLIP text_config")
        self.vision_act = hidden_activation(c["vision_config"]["hidden_act"],
                                            "CLIP vision_config")
        self.config = c

    # ---- parameters ----------------------------------------------------------------------------
    def init_params(self, key):
        """transformers' initialisation (f = initializer_factor): embeddings normal(0, 0.02 f)
        (the image's by its initializer_range f), the class embedding normal(0, f/sqrt(D)),
        attention inputs normal(0, f / sqrt(D) / sqrt(2 layers)), its output normal(0,
        f/sqrt(D)), the MLP's normal(0, f/sqrt(2 D)) and normal(0, f/sqrt(D)/sqrt(2 layers)),
        projections normal(0, f/sqrt(D)), zero biases, LayerNorms of ones and zeros,
        logit_scale logit_scale_init_value."""
        c, f = self.config, self.config["initializer_factor"]
        t, v = c["text_config"], c["vision_config"]

        def layers(k, tc):
            d, n = tc["hidden_size"], tc["num_hidden_layers"]
            deep = d ** -0.5 * (2 * n) ** -0.5 * f
            return [init_encoder_layer(k.child(f"layer{i}"), d, tc["intermediate_size"], deep,
                                       d ** -0.5 * f, (2 * d) ** -0.5 * f, deep)
                    for i in range(n)]
        dt, dv, e = t["hidden_size"], v["hidden_size"], c["projection_dim"]
        kt, kv = key.child("text"), key.child("vision")
        std = v["initializer_range"] * f
        return {
            "text": {"token": normal(kt.child("token"), (t["vocab_size"], dt), 0.02 * f),
                     "pos": normal(kt.child("pos"), (t["max_position_embeddings"], dt), 0.02 * f),
                     "layers": layers(kt, t), "norm": np.ones(dt, np.float32),
                     "norm_bias": np.zeros(dt, np.float32)},
            "vision": {"patch": normal(kv.child("patch"), (dv, v["num_channels"],
                                                           *pair(v["patch_size"])), std),
                       "cls": normal(kv.child("cls"), (dv,), dv ** -0.5 * f),
                       "pos": normal(kv.child("pos"), (1 + self.num_patches, dv), std),
                       "pre_norm": np.ones(dv, np.float32),
                       "pre_norm_bias": np.zeros(dv, np.float32), "layers": layers(kv, v),
                       "post_norm": np.ones(dv, np.float32),
                       "post_norm_bias": np.zeros(dv, np.float32)},
            "text_projection": normal(key.child("text_projection"), (dt, e), dt ** -0.5 * f),
            "visual_projection": normal(key.child("visual_projection"), (dv, e),
                                        dv ** -0.5 * f),
            "logit_scale": np.array(c["logit_scale_init_value"], np.float32)}

    @property
    def num_patches(self):
        v = self.config["vision_config"]
        (h, w), (ph, pw) = pair(v["image_size"]), pair(v["patch_size"])
        return (h // ph) * (w // pw)

    # ---- the forward pass ----------------------------------------------------------------------
    def text_features(self, params, ids, mask=None):
        """The text tower: causal encoder layers over token + position embeddings (padding
        hidden by ``mask``), the final LayerNorm, the state at each row's end-of-text token
        (transformers' rule: the first position holding eos_token_id, or position 0 where
        none does; with the legacy eos_token_id 2, the position of the largest id), projected."""
        t, p = self.config["text_config"], params["text"]
        b, s = _shape(ids)
        if s > t["max_position_embeddings"]:
            raise ArgumentError(f"CLIP reads at most {t['max_position_embeddings']} tokens, "
                                f"not {s}")
        x = op.take(p["token"], ids, axis=0) + p["pos"][0:s]
        bias = None
        if mask is not None:            # padding: those keys hidden from every query
            bias = op.reshape(op.where(mask != 0, 0.0, -np.inf), [b, 1, 1, s])
        for layer in p["layers"]:
            x = encoder_layer(layer, x, t["num_attention_heads"], t["layer_norm_eps"],
                              self.text_act, mask=bias, causal=True)
        x = op.layernorm(x, p["norm"], p["norm_bias"], t["layer_norm_eps"])
        eos = t["eos_token_id"]
        where = op.argmax(ids if eos == 2 else op.cast(op.eq(ids, eos), "int32"), axis=-1)
        d = _shape(x)[-1]
        pooled = op.take_along_axis(x, op.broadcast_to(op.reshape(where, [b, 1, 1]), [b, 1, d]),
                                    axis=1)
        return linear(op.reshape(pooled, [b, d]), params["text_projection"])

    def image_features(self, params, pixel_values):
        """The vision tower: patch embeddings after the class embedding, + positions,
        LayerNorm, the encoder layers, LayerNorm of the class token's state, projected."""
        v, p = self.config["vision_config"], params["vision"]
        eps = v["layer_norm_eps"]
        x = patch_embed(pixel_values, p["patch"], None, pair(v["patch_size"]),
                        pair(v["image_size"]), "CLIP")
        x = op.layernorm(with_class_token(x, p["cls"], p["pos"]), p["pre_norm"],
                         p["pre_norm_bias"], eps)
        for layer in p["layers"]:
            x = encoder_layer(layer, x, v["num_attention_heads"], eps, self.vision_act)
        b, _, d = _shape(x)
        cls = op.layernorm(op.reshape(x[:, 0:1, :], [b, d]), p["post_norm"],
                           p["post_norm_bias"], eps)
        return linear(cls, params["visual_projection"])

    def __call__(self, params, ids, pixel_values, mask=None):
        def unit(e):
            return e * op.rsqrt(op.sum(e * e, axis=-1, keepdim=True))
        text = unit(self.text_features(params, ids, mask))
        image = unit(self.image_features(params, pixel_values))
        per_text = op.matmul(text, op.transpose(image)) * op.exp(params["logit_scale"])
        return op.transpose(per_text), per_text

    # ---- transformers' checkpoint directories --------------------------------------------------
    @classmethod
    def from_pretrained(cls, directory):
        """(model, params) from a transformers CLIPModel directory (its config.json, with
        nested text_config and vision_config, and safetensors weights)."""
        config = read_config(directory, cls.model_type)
        towers = {k: {n: x for n, x in (config.get(k) or {}).items() if n in cls.settings[k]}
                  for k in ("text_config", "vision_config")}
        model = from_config(cls, {**config, **towers}, directory)
        c = model.config
        get = read_safetensors(directory).tensor
        dv = c["vision_config"]["hidden_size"]
        params = {
            "text": {"token": get("text_model.embeddings.token_embedding.weight"),
                     "pos": get("text_model.embeddings.position_embedding.weight"),
                     "layers": [read_encoder_layer(get, f"text_model.encoder.layers.{i}.", _NAMES)
                                for i in range(c["text_config"]["num_hidden_layers"])],
                     "norm": get("text_model.final_layer_norm.weight"),
                     "norm_bias": get("text_model.final_layer_norm.bias")},
            "vision": {"patch": get("vision_model.embeddings.patch_embedding.weight"),
                       "cls": get("vision_model.embeddings.class_embedding").reshape(dv),
                       "pos": get("vision_model.embeddings.position_embedding.weight"),
                       "pre_norm": get("vision_model.pre_layrnorm.weight"),
                       "pre_norm_bias": get("vision_model.pre_layrnorm.bias"),
                       "layers": [read_encoder_layer(get, f"vision_model.encoder.layers.{i}.",
                                                     _NAMES)
                                  for i in range(c["vision_config"]["num_hidden_layers"])],
                       "post_norm": get("vision_model.post_layernorm.weight"),
                       "post_norm_bias": get("vision_model.post_layernorm.bias")},
            "text_projection": get("text_projection.weight", True),
            "visual_projection": get("visual_projection.weight", True),
            "logit_scale": get("logit_scale").reshape(())}
        return model, params

    def save_pretrained(self, params, directory):
        """Write config.json and model.safetensors that transformers loads as a CLIPModel
        (the files written whole, then renamed into place)."""
        t, v = params["text"], params["vision"]
        tensors = {"text_model.embeddings.token_embedding.weight": t["token"],
                   "text_model.embeddings.position_embedding.weight": t["pos"],
                   "text_model.final_layer_norm.weight": t["norm"],
                   "text_model.final_layer_norm.bias": t["norm_bias"],
                   "vision_model.embeddings.patch_embedding.weight": v["patch"],
                   "vision_model.embeddings.class_embedding": v["cls"],
                   "vision_model.embeddings.position_embedding.weight": v["pos"],
                   "vision_model.pre_layrnorm.weight": v["pre_norm"],
                   "vision_model.pre_layrnorm.bias": v["pre_norm_bias"],
                   "vision_model.post_layernorm.weight": v["post_norm"],
                   "vision_model.post_layernorm.bias": v["post_norm_bias"],
                   "text_projection.weight": np.asarray(params["text_projection"]).T,
                   "visual_projection.weight": np.asarray(params["visual_projection"]).T,
                   "logit_scale": np.reshape(params["logit_scale"], ())}
        for i, layer in enumerate(t["layers"]):
            write_encoder_layer(tensors, layer, f"text_model.encoder.layers.{i}.", _NAMES)
        for i, layer in enumerate(v["layers"]):
            write_encoder_layer(tensors, layer, f"vision_model.encoder.layers.{i}.", _NAMES)
        c = self.config
        e = c["projection_dim"]
        config = {**c, "model_type": self.model_type, "architectures": [self.architecture],
                  "torch_dtype": "float32",
                  "text_config": {**c["text_config"], "model_type": "clip_text_model",
                                  "projection_dim": e},
                  "vision_config": {**c["vision_config"], "model_type": "clip_vision_model",
                                    "projection_dim": e}}
        write_checkpoint(directory, tensors, config)


"""ResNet (He et al.), as transformers' ResNetForImageClassification computes it in inference:
a stem (7x7 convolution of stride 2, BatchNorm, activation, 3x3 max pooling of stride 2),
stages of residual layers (basic: two 3x3 convolutions; bottleneck: 1x1 down to a quarter of
the channels, 3x3, 1x1 back up), each convolution followed by BatchNorm with its running
statistics, a 1x1 convolution and BatchNorm on the shortcut where the shape changes, then
global average pooling and a linear classifier."""
from __future__ import annotations

import math

import numpy as np

from .. import op
from ..errors import ArgumentError
from ..nn.init import kaiming_uniform, normal
from ..nn.layers import Module, _shape, linear
from .checkpoint import (check_settings, from_config, hidden_activation, read_config,
                         read_safetensors, write_checkpoint)
from .vit import label_names, labels

_CONFIG = {"num_channels": 3, "embedding_size": 64, "hidden_sizes": [256, 512, 1024, 2048],
           "depths": [3, 4, 6, 3], "layer_type": "bottleneck", "hidden_act": "relu",
           "downsample_in_first_stage": False, "downsample_in_bottleneck": False,
           "num_labels": 2}
_EPS = 1e-5          # torch.nn.BatchNorm2d's default, which transformers' ResNet keeps
_BN = ("weight", "bias", "running_mean", "running_var")


class ResNet(Module):
    """params {"embedder": unit, "stages": [[{"layer": [unit, ...], "shortcut": unit (where
    the shape changes)}, ...], ...], "classifier": [C, L], "classifier_bias": [L]}, a unit a
    convolution without bias and its BatchNorm: {"w": [O, C, k, k], "weight", "bias",
    "running_mean", "running_var": [O]}. ``__call__(params, pixel_values)``: pixel_values
    [B, C, H, W] float32 -> logits [B, L] (BatchNorm with the running statistics)."""
    model_type, architecture, settings = "resnet", "ResNetForImageClassification", _CONFIG

    def __init__(self, **config):
        check_settings(type(self), config, self.settings)
        c = {**self.settings, **config}
        c["hidden_sizes"], c["depths"] = list(c["hidden_sizes"]), list(c["depths"])
        if c["layer_type"] not in ("basic", "bottleneck"):
            raise ArgumentError(f"ResNet layer_type {c['layer_type']!r}",
                                expected="basic or bottleneck")
        if len(c["hidden_sizes"]) != len(c["depths"]) or not c["depths"] or \
                min(c["depths"]) < 1:
            raise ArgumentError(f"ResNet needs one hidden size per stage of at least one "
                                f"layer, not hidden_sizes {c['hidden_sizes']} and depths "
                                f"{c['depths']}")
        if c["num_labels"] < 1:
            raise ArgumentError("ResNet needs a classifier of at least one class (num_labels)")
        self.act = hidden_activation(c["hidden_act"], "ResNet")
        self.config = c

    def layers(self):
        """Every residual layer as (stage, index, in channels, out channels, stride)."""
        c = self.config
        ins = [c["embedding_size"]] + c["hidden_sizes"][:-1]
        for s, (cin, cout, depth) in enumerate(zip(ins, c["hidden_sizes"], c["depths"])):
            stride = 2 if s or c["downsample_in_first_stage"] else 1
            for i in range(depth):
                yield s, i, (cin if i == 0 else cout), cout, (stride if i == 0 else 1)

    def convs(self, cin, cout, stride):
        """A residual layer's convolutions as (in, out, kernel, stride, activated): transformers
        activates the inner ones with ReLU whatever hidden_act says (it names only the stem's
        and the one after the residual sum)."""
        if self.config["layer_type"] == "basic":
            return [(cin, cout, 3, stride, True), (cout, cout, 3, 1, False)]
        r, first = cout // 4, self.config["downsample_in_bottleneck"]
        return [(cin, r, 1, stride if first else 1, True), (r, r, 3, 1 if first else stride, True),
                (r, cout, 1, 1, False)]

    # ---- parameters ----------------------------------------------------------------------------
    def init_params(self, key):
        """transformers' initialisation: convolutions normal(0, sqrt(2 / fan_out)) (Kaiming,
        fan out, ReLU), BatchNorm weight 1, bias 0, running mean 0, variance 1, the
        classifier PyTorch's nn.Linear U(-1/sqrt(in), 1/sqrt(in))."""
        c = self.config

        def unit(k, cin, cout, size):
            return {"w": normal(k, (cout, cin, size, size), math.sqrt(2.0 / (cout * size * size))),
                    "weight": np.ones(cout, np.float32), "bias": np.zeros(cout, np.float32),
                    "running_mean": np.zeros(cout, np.float32),
                    "running_var": np.ones(cout, np.float32)}
        stages = [[] for _ in c["depths"]]
        for s, i, cin, cout, stride in self.layers():
            k = key.child(f"stage{s}").child(f"layer{i}")
            layer = {"layer": [unit(k.child(j), a, b, size) for j, (a, b, size, _, _) in
                               enumerate(self.convs(cin, cout, stride))]}
            if cin != cout or stride != 1:
                layer["shortcut"] = unit(k.child("shortcut"), cin, cout, 1)
            stages[s].append(layer)
        d, n = c["hidden_sizes"][-1], c["num_labels"]
        return {"embedder": unit(key.child("embedder"), c["num_channels"], c["embedding_size"], 7),
                "stages": stages,
                "classifier": kaiming_uniform(key.child("classifier"), (d, n), d),
                "classifier_bias": kaiming_uniform(key.child("classifier_bias"), (n,), d)}

    # ---- the forward pass ----------------------------------------------------------------------
    @staticmethod
    def _unit(p, x, stride):
        """A convolution (padding half its kernel) and BatchNorm with running statistics."""
        k = _shape(p["w"])[-1]
        y = op.conv(x, p["w"], None, stride=stride, padding=k // 2)
        return op.batch_norm(y, p["running_mean"], p["running_var"], p["weight"], p["bias"],
                             training=False, eps=_EPS)

    def features(self, params, pixel_values):
        """The last stage's feature map [B, hidden_sizes[-1], H', W']."""
        c = self.config
        shape = _shape(pixel_values)
        if len(shape) != 4 or shape[1] != c["num_channels"]:
            raise ArgumentError(f"ResNet takes pixel_values [B, {c['num_channels']}, H, W], not "
                                f"{list(shape)}")
        x = self.act(self._unit(params["embedder"], pixel_values, 2))
        x = op.max_pool(x, 3, 2, 1)
        layers = [p for stage in params["stages"] for p in stage]
        for p, (_, _, cin, cout, stride) in zip(layers, self.layers()):
            y = x
            for u, (_, _, _, s, activated) in zip(p["layer"], self.convs(cin, cout, stride)):
                y = self._unit(u, y, s)
                if activated:
                    y = op.relu(y)
            shortcut = self._unit(p["shortcut"], x, stride) if "shortcut" in p else x
            x = self.act(y + shortcut)
        return x

    def __call__(self, params, pixel_values):
        x = self.features(params, pixel_values)
        b, ch = _shape(x)[:2]
        pooled = op.reshape(op.adaptive_avg_pool(x, 1), [b, ch])
        return linear(pooled, params["classifier"], params["classifier_bias"])

    # ---- transformers' checkpoint directories --------------------------------------------------
    def _names(self):
        """(the params' unit, its transformers prefix) for every convolution with BatchNorm."""
        yield ("embedder",), "resnet.embedder.embedder."
        for s, i, cin, cout, stride in self.layers():
            pre = f"resnet.encoder.stages.{s}.layers.{i}."
            for j in range(len(self.convs(cin, cout, stride))):
                yield ("stages", s, i, "layer", j), f"{pre}layer.{j}."
            if cin != cout or stride != 1:
                yield ("stages", s, i, "shortcut"), pre + "shortcut."

    @classmethod
    def from_pretrained(cls, directory):
        """(model, params) from a transformers ResNetForImageClassification directory (its
        config.json and safetensors weights)."""
        config = read_config(directory, cls.model_type)
        config = {**config, "num_labels": labels(config, directory)}
        model = from_config(cls, config, directory)
        get = read_safetensors(directory).tensor
        params = {"embedder": None, "stages": [[] for _ in model.config["depths"]],
                  "classifier": get("classifier.1.weight", True),
                  "classifier_bias": get("classifier.1.bias")}
        for s, i, _, _, _ in model.layers():
            params["stages"][s].append({"layer": []})
        for where, pre in model._names():
            unit = {"w": get(pre + "convolution.weight")}
            unit.update({n: get(pre + "normalization." + n) for n in _BN})
            if where[0] == "embedder":
                params["embedder"] = unit
            elif where[-1] == "shortcut":
                params["stages"][where[1]][where[2]]["shortcut"] = unit
            else:
                params["stages"][where[1]][where[2]]["layer"].append(unit)
        return model, params

    def save_pretrained(self, params, directory):
        """Write config.json and model.safetensors that transformers loads as a
        ResNetForImageClassification (the files written whole, then renamed into place)."""
        tensors = {"classifier.1.weight": np.asarray(params["classifier"]).T,
                   "classifier.1.bias": params["classifier_bias"]}
        for where, pre in self._names():
            unit = params
            for k in where:
                unit = unit[k]
            tensors[pre + "convolution.weight"] = unit["w"]
            for n in _BN:
                tensors[pre + "normalization." + n] = unit[n]
        # (BatchNorm's num_batches_tracked is left out: transformers reports it missing and
        # makes it 0, what this model would write; only training without momentum reads it)
        config = {k: v for k, v in self.config.items() if k != "num_labels"}
        config.update(label_names(self.config["num_labels"]), model_type=self.model_type,
                      architectures=[self.architecture], torch_dtype="float32")
        write_checkpoint(directory, tensors, config)

"""transformers' checkpoint directories on disk, shared by the zoo's models: ``config.json``
and safetensors weights (one file, or shards beside their index), read and written whole; and
the config's names every model reads alike (activations, unknown settings)."""
from __future__ import annotations

import json
import os

import numpy as np

from .. import op
from ..errors import ArgumentError, TesseraError


def read_config(directory, model_type):
    """config.json as a dict, refused unless it describes a ``model_type`` model."""
    path = os.path.join(directory, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as e:
        raise TesseraError(f"{directory} has no readable config.json ({e.strerror})") from None
    if config.get("model_type") != model_type:
        raise TesseraError(f"{path} describes a {config.get('model_type')!r} model, not "
                           f"{model_type!r}")
    return config


def read_safetensors(directory):
    """Every tensor of the directory's .safetensors files, by name, as NumPy arrays."""
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise TesseraError("reading a checkpoint needs the safetensors package",
                           hint="pip install safetensors") from None
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if not files:
        raise TesseraError(f"{directory} holds no .safetensors weights")
    tensors = {}
    for f in files:
        tensors.update(load_file(os.path.join(directory, f)))
    return Weights(directory, tensors)


class Weights(dict):
    """A checkpoint's tensors by name; ``tensor(name)`` is float32, refused by name if absent."""

    def __init__(self, directory, tensors):
        super().__init__(tensors)
        self.directory = directory

    def tensor(self, name, transpose=False):
        """The tensor ``name`` as float32 (transposed: a torch Linear's [out, in] weight as
        tessera's [in, out])."""
        if name not in self:
            raise TesseraError(f"{self.directory}: the checkpoint has no tensor {name!r}")
        a = self[name].astype(np.float32)
        return np.ascontiguousarray(a.T) if transpose else a


def write_checkpoint(directory, tensors, config):
    """model.safetensors (float32, contiguous) and config.json into ``directory`` (made if
    absent), each written whole then renamed into place."""
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise TesseraError("writing a checkpoint needs the safetensors package",
                           hint="pip install safetensors") from None
    os.makedirs(directory, exist_ok=True)
    # (np.array keeps a 0-d tensor 0-d, as logit_scale must be; ascontiguousarray would not)
    tensors = {k: np.array(v, np.float32, order="C") for k, v in tensors.items()}
    _write_whole(os.path.join(directory, "model.safetensors"),
                 lambda path: save_file(tensors, path, metadata={"format": "pt"}))
    _write_whole(os.path.join(directory, "config.json"),
                 lambda path: open(path, "w").write(json.dumps(config, indent=2)))


def _write_whole(path, write):
    """write(temporary path), then an atomic rename: no half-written file at ``path``."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ---- config.json's names ----------------------------------------------------------------------
def _gelu_tanh(x):
    return op.gelu(x, approximate="tanh")


def _quick_gelu(x):
    return x * op.sigmoid(x * 1.702)


# transformers' activation names (hidden_act, activation_function) -> the function each computes;
# only exact equivalents ("gelu_new" and "gelu_pytorch_tanh" are both the tanh approximation,
# "gelu" is erf's), so an unknown name is refused rather than replaced
ACTIVATIONS = {"gelu": op.gelu, "gelu_new": _gelu_tanh, "gelu_pytorch_tanh": _gelu_tanh,
               "quick_gelu": _quick_gelu, "relu": op.relu, "silu": op.silu, "swish": op.silu,
               "tanh": op.tanh}


def hidden_activation(name, where):
    """The activation transformers calls ``name`` (an ArgumentError naming ``where`` and the
    names read when there is none)."""
    if name not in ACTIVATIONS:
        raise ArgumentError(f"{where}: the activation {name!r} is not implemented",
                            expected=", ".join(sorted(ACTIVATIONS)))
    return ACTIVATIONS[name]


def check_settings(cls, config, settings):
    """Refuse a setting the class does not have, by name."""
    unknown = set(config) - set(settings)
    if unknown:
        raise ArgumentError(f"{cls.__name__} has no setting {sorted(unknown)[0]!r}",
                            expected=", ".join(settings))


def checkpoint_prefix(weights, prefix, probe):
    """``prefix`` when the checkpoint names its tensors under it (a task model's base model:
    "transformer.", "bert."), else "" (the base model saved alone)."""
    return prefix if prefix + probe in weights else ""


def from_config(cls, config, directory):
    """``cls`` built from a checkpoint's config.json (the settings it has; transformers writes
    more), a setting it refuses named with the directory."""
    try:
        return cls(**{k: v for k, v in config.items() if k in cls.settings})
    except ArgumentError as e:
        raise TesseraError(f"{directory}: {e}") from None

"""transformers' checkpoint directories on disk, shared by the zoo's models: ``config.json``
and safetensors weights (one file, or shards beside their index), read and written whole."""
from __future__ import annotations

import json
import os

import numpy as np

from ..errors import TesseraError


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
    tensors = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
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

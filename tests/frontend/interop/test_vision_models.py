"""transformers' vision models as people bring them (small random configurations, their
default settings, nothing downloaded) through ts.from_torch: ResNet, ConvNeXt and ViT give
PyTorch's logits within rounding; a ResNet's gradients are PyTorch's."""
import numpy as np
import pytest

import tessera as ts
from tessera import op

from conftest import onnx_exported_by_pytorch

torch = pytest.importorskip("torch", reason="ts.from_torch needs PyTorch")
transformers = pytest.importorskip("transformers", reason="the models come from transformers")


def _models():
    return {
        "resnet": lambda: transformers.ResNetForImageClassification(transformers.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1],
            num_labels=5)),
        "convnext": lambda: transformers.ConvNextForImageClassification(
            transformers.ConvNextConfig(hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1],
                                        num_labels=5)),
        "vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
            image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64, num_labels=5)),
    }


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


@pytest.mark.parametrize("name", sorted(_models()))
def test_a_vision_model_gives_pytorchs_logits(name, rng):
    torch.manual_seed(int(rng.integers(1 << 30)))
    model = Logits(_models()[name]()).eval()
    x = torch.from_numpy(rng.standard_normal((2, 3, 32, 32)).astype(np.float32))
    with torch.no_grad():
        want = model(x).numpy()
    fn, params = ts.from_torch(model, x)
    got = fn(params, x.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max())


def test_a_resnets_gradients_are_pytorchs(rng):
    torch.manual_seed(int(rng.integers(1 << 30)))
    model = Logits(_models()["resnet"]()).eval()
    x = torch.from_numpy(rng.standard_normal((2, 3, 32, 32)).astype(np.float32))
    fn, params = ts.from_torch(model, x)
    grads = ts.grad(lambda p, x: op.sum(fn(p, x) ** 2))(params, x.numpy())
    (model(x) ** 2).sum().backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=2e-3,
                                   atol=2e-4 * np.abs(p.grad.numpy()).max(), err_msg=name)


@pytest.mark.parametrize("name", sorted(_models()))
def test_a_vision_model_through_onnx_gives_pytorchs_logits(name, rng):
    """Exported by PyTorch's ONNX exporter (torch.export, then onnxscript's translation, at
    opset 18), imported by ts.onnx.import_model."""
    pytest.importorskip("onnxscript", reason="PyTorch's ONNX exporter needs onnxscript")
    torch.manual_seed(int(rng.integers(1 << 30)))
    model = Logits(_models()[name]()).eval()
    x = torch.from_numpy(rng.standard_normal((2, 3, 32, 32)).astype(np.float32))
    with torch.no_grad():
        want = model(x).numpy()
    got = ts.onnx.import_model(onnx_exported_by_pytorch(model, x))(x.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max())

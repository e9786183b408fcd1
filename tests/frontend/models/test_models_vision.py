"""The zoo's vision models (ViT, ResNet, CLIP), written with tessera's own operators, read
checkpoint directories that transformers writes (random initialisations from small
configurations, nothing downloaded) and give transformers' outputs; the directories they
write load back into transformers with the same outputs; settings they do not implement and
incomplete checkpoints are refused by name."""
import json

import numpy as np
import pytest

import tessera as ts
from tessera.models import CLIP, ResNet, ViT

torch = pytest.importorskip("torch", reason="transformers' models run on PyTorch")
transformers = pytest.importorskip("transformers", reason="the checkpoints are transformers'")
safetensors_numpy = pytest.importorskip("safetensors.numpy",
                                        reason="checkpoints are safetensors files")


def _seed(rng):
    torch.manual_seed(int(rng.integers(1 << 30)))


def _noisy(model, std=0.3):
    """Random biases and LayerNorm parameters (transformers initialises them to 0 and 1), so
    a misplaced one shows."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.normal_(0, std)
    return model


def _images(rng, size, n=2):
    return rng.standard_normal((n, 3, size, size)).astype(np.float32)


def _logits(model, **inputs):
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()


# ---- ViT ----------------------------------------------------------------------------------------
def _vit_config(**kw):
    return transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=48, image_size=16, patch_size=4,
                                  num_labels=5, **kw)


@pytest.mark.parametrize("qkv_bias, act", [(True, "gelu"), (False, "gelu_pytorch_tanh")])
def test_vit_reads_transformers_checkpoints(qkv_bias, act, tmp_path, rng):
    _seed(rng)
    theirs = _noisy(transformers.ViTForImageClassification(
        _vit_config(qkv_bias=qkv_bias, hidden_act=act))).eval()
    theirs.save_pretrained(tmp_path)
    model, params = ViT.from_pretrained(tmp_path)
    assert model.config["qkv_bias"] is qkv_bias and ("q_bias" in params["layers"][0]) is qkv_bias
    x = _images(rng, 16)
    got = ts.function(model)(params, x)
    assert got.shape == (2, 5)
    np.testing.assert_allclose(got, _logits(theirs, pixel_values=x), atol=2e-5, rtol=1e-5)


def test_vit_writes_checkpoints_transformers_loads(tmp_path, rng):
    model = ViT(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                image_size=16, patch_size=4, num_labels=3, initializer_range=0.2)
    params = model.init(int(rng.integers(1 << 30)))
    model.save_pretrained(params, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    theirs = transformers.AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "ViTForImageClassification"
    x = _images(rng, 16, 3)
    np.testing.assert_allclose(ts.function(model)(params, x), _logits(theirs, pixel_values=x),
                               atol=2e-5, rtol=1e-5)
    again, params2 = ViT.from_pretrained(tmp_path)                     # and back
    assert again.config == model.config
    np.testing.assert_array_equal(params2["layers"][1]["fc1"], params["layers"][1]["fc1"])
    np.testing.assert_array_equal(params2["pos"], params["pos"])


# ---- ResNet -------------------------------------------------------------------------------------
def _resnet(rng, **kw):
    """transformers' ResNetForImageClassification with random BatchNorm weights and running
    statistics (its initialisation's 1, 0, 0, 1 would hide a misread one)."""
    _seed(rng)
    config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 2],
                                       num_labels=4, **kw)
    theirs = transformers.ResNetForImageClassification(config).eval()
    with torch.no_grad():
        for m in theirs.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.3)
                m.running_mean.normal_(0, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    return theirs


@pytest.mark.parametrize("kw", [
    dict(layer_type="basic", downsample_in_first_stage=True),
    dict(layer_type="bottleneck", downsample_in_bottleneck=True),
    dict(layer_type="bottleneck", hidden_act="gelu"),       # the stem's and residuals' only
], ids=["basic-downsample-in-first-stage", "bottleneck-downsample-in-bottleneck",
        "bottleneck-gelu"])
def test_resnet_reads_transformers_checkpoints(kw, tmp_path, rng):
    theirs = _resnet(rng, **kw)
    theirs.save_pretrained(tmp_path / "theirs")
    model, params = ResNet.from_pretrained(tmp_path / "theirs")
    x = _images(rng, 32)
    want = _logits(theirs, pixel_values=x)
    got = ts.function(model)(params, x)
    assert got.shape == (2, 4)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    model.save_pretrained(params, tmp_path / "ours")    # and back: the same weights (PyTorch's
    back = transformers.AutoModelForImageClassification.from_pretrained(    # convolutions may
        tmp_path / "ours").eval()                 # pick another algorithm for another copy)
    np.testing.assert_allclose(_logits(back, pixel_values=x), want, atol=1e-6, rtol=1e-6)


def test_resnet_writes_checkpoints_transformers_loads(tmp_path, rng):
    model = ResNet(embedding_size=8, hidden_sizes=[8, 16, 32], depths=[1, 1, 1],
                   layer_type="basic", num_labels=3)
    params = model.init(int(rng.integers(1 << 30)))
    model.save_pretrained(params, tmp_path)
    theirs = transformers.AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "ResNetForImageClassification"
    x = _images(rng, 32)
    np.testing.assert_allclose(ts.function(model)(params, x), _logits(theirs, pixel_values=x),
                               atol=2e-5, rtol=1e-5)
    again, params2 = ResNet.from_pretrained(tmp_path)
    assert again.config == model.config
    np.testing.assert_array_equal(params2["stages"][2][0]["shortcut"]["w"],
                                  params["stages"][2][0]["shortcut"]["w"])


# ---- CLIP ---------------------------------------------------------------------------------------
def _clip_config(eos=49):
    return transformers.CLIPConfig(
        text_config=dict(vocab_size=50, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=12,
                         eos_token_id=eos, bos_token_id=0, pad_token_id=1),
        vision_config=dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, image_size=16, patch_size=4),
        projection_dim=24)


def _texts(rng, eos):
    """Four rows of 9 tokens: one ending at its end-of-text token, one right-padded after it,
    one left-padded, one without an end-of-text token (pooled at position 0)."""
    ids = rng.integers(3, 48, size=(4, 9))
    mask = np.ones((4, 9), np.int64)
    ids[0, 8] = eos
    ids[1, 5], ids[1, 6:], mask[1, 6:] = eos, 1, 0
    ids[2, :3], mask[2, :3], ids[2, 7] = 1, 0, eos
    if eos == 2:               # the legacy rule pools at the largest id: make it the last token
        ids[0, 8], ids[1, 5], ids[2, 7] = 49, 49, 49
    return ids, mask


@pytest.mark.parametrize("eos", [49, 2], ids=["eos-token", "legacy-argmax"])
def test_clip_reads_transformers_checkpoints(eos, tmp_path, rng):
    _seed(rng)
    theirs = _noisy(transformers.CLIPModel(_clip_config(eos))).eval()
    theirs.save_pretrained(tmp_path)
    model, params = CLIP.from_pretrained(tmp_path)
    ids, mask = _texts(rng, eos)
    x = _images(rng, 16, 3)
    t = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    with torch.no_grad():
        out = theirs(pixel_values=torch.from_numpy(x), **t)
        text = theirs.get_text_features(**t).pooler_output.numpy()
        image = theirs.get_image_features(pixel_values=torch.from_numpy(x)).pooler_output.numpy()
    per_image, per_text = ts.function(model)(params, ids, x, mask)
    assert per_image.shape == (3, 4) and per_text.shape == (4, 3)
    np.testing.assert_allclose(per_image, out.logits_per_image.numpy(), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(per_text, out.logits_per_text.numpy(), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(ts.function(model.text_features)(params, ids, mask), text,
                               atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(ts.function(model.image_features)(params, x), image, atol=2e-5,
                               rtol=1e-5)


def test_clip_writes_checkpoints_transformers_loads(tmp_path, rng):
    model = CLIP(text_config=dict(vocab_size=50, hidden_size=32, intermediate_size=48,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  max_position_embeddings=12, eos_token_id=49),
                 vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                    num_attention_heads=2, image_size=16, patch_size=8),
                 projection_dim=16)
    params = model.init(int(rng.integers(1 << 30)))
    model.save_pretrained(params, tmp_path)
    theirs = transformers.AutoModel.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "CLIPModel"
    ids, _ = _texts(rng, 49)
    x = _images(rng, 16)
    with torch.no_grad():
        out = theirs(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(x))
    per_image, per_text = ts.function(model)(params, ids, x)
    np.testing.assert_allclose(per_image, out.logits_per_image.numpy(), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(per_text, out.logits_per_text.numpy(), atol=2e-5, rtol=1e-5)
    again, params2 = CLIP.from_pretrained(tmp_path)                    # and back
    assert again.config == model.config
    np.testing.assert_array_equal(params2["vision"]["layers"][0]["q"],
                                  params["vision"]["layers"][0]["q"])
    assert params2["logit_scale"] == params["logit_scale"]


# ---- what is refused ----------------------------------------------------------------------------
def _edit_config(directory, edit):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def _drop_tensor(directory, name):
    path = str(directory / "model.safetensors")
    tensors = safetensors_numpy.load_file(path)
    del tensors[name]
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})


def test_unimplemented_settings_and_incomplete_checkpoints_are_refused(tmp_path):
    vit = ViT(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
              image_size=8, patch_size=4, num_labels=2)
    vit.save_pretrained(vit.init(0), tmp_path / "vit")
    _edit_config(tmp_path / "vit", lambda c: c.update(hidden_act="gelu_fast"))
    with pytest.raises(ts.TesseraError, match="activation 'gelu_fast' is not implemented"):
        ViT.from_pretrained(tmp_path / "vit")
    _edit_config(tmp_path / "vit", lambda c: c.update(hidden_act="gelu"))
    _drop_tensor(tmp_path / "vit", "vit.encoder.layer.0.attention.attention.key.weight")
    with pytest.raises(ts.TesseraError, match="no tensor 'vit.encoder.layer.0.attention"):
        ViT.from_pretrained(tmp_path / "vit")
    with pytest.raises(ts.TesseraError, match="describes a 'vit' model, not 'resnet'"):
        ResNet.from_pretrained(tmp_path / "vit")
    with pytest.raises(ts.ArgumentError, match="takes pixel_values"):    # no interpolation
        ts.function(vit)(vit.init(0), np.zeros((1, 3, 12, 12), np.float32))

    resnet = ResNet(embedding_size=8, hidden_sizes=[8], depths=[1], num_labels=2)
    resnet.save_pretrained(resnet.init(0), tmp_path / "resnet")
    _drop_tensor(tmp_path / "resnet",
                 "resnet.encoder.stages.0.layers.0.layer.1.normalization.running_var")
    with pytest.raises(ts.TesseraError, match="no tensor .*layer.1.normalization.running_var"):
        ResNet.from_pretrained(tmp_path / "resnet")
    _edit_config(tmp_path / "resnet", lambda c: c.update(layer_type="preactivation"))
    with pytest.raises(ts.TesseraError, match="layer_type 'preactivation'"):
        ResNet.from_pretrained(tmp_path / "resnet")
    with pytest.raises(ts.ArgumentError, match="no setting 'groups'"):
        ResNet(groups=32)

    clip = CLIP(text_config=dict(vocab_size=20, hidden_size=16, intermediate_size=16,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 max_position_embeddings=8, eos_token_id=19),
                vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                   num_attention_heads=2, image_size=8, patch_size=4),
                projection_dim=8)
    clip.save_pretrained(clip.init(0), tmp_path / "clip")
    _edit_config(tmp_path / "clip", lambda c: c["text_config"].update(eos_token_id=[19, 18]))
    with pytest.raises(ts.TesseraError, match="eos_token_id \\[19, 18\\] is not read"):
        CLIP.from_pretrained(tmp_path / "clip")
    _edit_config(tmp_path / "clip", lambda c: c["text_config"].update(eos_token_id=19))
    _edit_config(tmp_path / "clip", lambda c: c["vision_config"].update(hidden_act="gelu_fast"))
    with pytest.raises(ts.TesseraError, match="vision_config: the activation 'gelu_fast'"):
        CLIP.from_pretrained(tmp_path / "clip")
    _edit_config(tmp_path / "clip", lambda c: c["vision_config"].update(hidden_act="quick_gelu"))
    CLIP.from_pretrained(tmp_path / "clip")
    _drop_tensor(tmp_path / "clip", "logit_scale")
    with pytest.raises(ts.TesseraError, match="no tensor 'logit_scale'"):
        CLIP.from_pretrained(tmp_path / "clip")
    with pytest.raises(ts.ArgumentError, match="at most 8 tokens"):
        ts.function(clip.text_features)(clip.init(0), np.zeros((1, 9), np.int64))
    with pytest.raises(ts.ArgumentError, match="has no setting 'pooling'"):
        CLIP(text_config={"pooling": "mean"})

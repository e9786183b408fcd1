"""tessera.models: the zoo's LLaMA, written with tessera's own operators, reads checkpoint
directories that transformers writes (random initialisations from small configurations,
nothing downloaded) and gives transformers' logits; the directories it writes load back into
transformers with the same logits."""
import numpy as np
import pytest

import tessera as ts
from tessera import models

torch = pytest.importorskip("torch", reason="transformers' models run on PyTorch")
transformers = pytest.importorskip("transformers", reason="the checkpoints are transformers'")
pytest.importorskip("safetensors", reason="checkpoints are safetensors files")


def _config(tied=False, kv_heads=2):
    return transformers.LlamaConfig(
        vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
        rope_theta=500.0, rms_norm_eps=1e-5, tie_word_embeddings=tied, bos_token_id=0,
        eos_token_id=0, pad_token_id=0)


def _batch(rng, padded):
    ids = rng.integers(1, 101, size=(2, 9))
    mask = np.ones((2, 9), np.int64)
    if padded:
        mask[1, :int(rng.integers(1, 5))] = 0
    return ids, mask


def _their_logits_on_a_padded_batch(theirs, model, params, rng):
    """transformers' logits on a left-padded batch, ours equal at every token that is not
    padding: (ids, mask, their logits)."""
    ids, mask = _batch(rng, True)
    with torch.no_grad():
        want = theirs(input_ids=torch.from_numpy(ids),
                      attention_mask=torch.from_numpy(mask)).logits.numpy()
    got = ts.function(model)(params, ids, mask)
    keep = mask.astype(bool)
    np.testing.assert_allclose(got[keep], want[keep], atol=2e-5, rtol=1e-5)
    return ids, mask, want


@pytest.mark.parametrize("tied, kv_heads", [(False, 2), (True, 4), (False, 1)])
def test_llama_reads_transformers_checkpoints(tied, kv_heads, tmp_path, rng):
    """Grouped-query (2 of 4 heads), multi-head and multi-query attention; tied and untied
    heads; the logits of every token that is not padding, with a left-padded batch too."""
    torch.manual_seed(int(rng.integers(1 << 30)))
    theirs = transformers.LlamaForCausalLM(_config(tied, kv_heads)).eval()
    theirs.save_pretrained(tmp_path)
    model, params = models.LLaMA.from_pretrained(tmp_path)
    fn = ts.function(model)                 # (a callable object: its __call__)
    for padded in (False, True):
        ids, mask = _batch(rng, padded)
        with torch.no_grad():
            want = theirs(input_ids=torch.from_numpy(ids),
                          attention_mask=torch.from_numpy(mask)).logits.numpy()
        got = fn(params, ids, mask)
        keep = mask.astype(bool)
        np.testing.assert_allclose(got[keep], want[keep], atol=2e-5, rtol=1e-5)


def test_llama_writes_checkpoints_transformers_loads(tmp_path, rng):
    model = models.LLaMA(vocab_size=101, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         rope_theta=500.0)
    params = model.init(int(rng.integers(1 << 30)))
    model.save_pretrained(params, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    ids, mask = _batch(rng, False)
    with torch.no_grad():
        want = theirs(input_ids=torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(ts.function(model)(params, ids, mask), want, atol=2e-5,
                               rtol=1e-5)
    again, params2 = models.LLaMA.from_pretrained(tmp_path)             # and back
    assert again.config == model.config
    np.testing.assert_array_equal(params2["layers"][1]["q"], params["layers"][1]["q"])


SCALINGS = {    # head_dim 8 at theta 500: wavelengths 6.3, 30, 140, 660 positions, so an original
    # context of 16 puts one in each of llama3's three bands and yarn's ramp inside the head
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
             "beta_fast": 8.0, "beta_slow": 0.5},
    "yarn_mscale": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16,
                    "mscale": 0.8, "mscale_all_dim": 0.3}}


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_llama_reads_and_writes_scaled_rope(kind, tmp_path, rng):
    """RoPE stretched past the context it was trained on (Llama 3.1's llama3, linear position
    interpolation, YaRN with its attention factor): transformers' logits on a padded batch,
    transformers' greedy tokens decoding past the original context, and the directory written
    back loads into transformers with the same logits."""
    config = _config()
    config.rope_parameters = {**SCALINGS[kind], "rope_theta": 500.0}
    torch.manual_seed(int(rng.integers(1 << 30)))
    theirs = transformers.LlamaForCausalLM(config).eval()
    theirs.save_pretrained(tmp_path / "theirs")
    model, params = models.LLaMA.from_pretrained(tmp_path / "theirs")
    assert model.config["rope_scaling"]["rope_type"] == SCALINGS[kind]["rope_type"]
    ids, mask, want = _their_logits_on_a_padded_batch(theirs, model, params, rng)
    prompt = rng.integers(1, 101, 7)
    tokens = model.generate(params, [prompt], max_new_tokens=20, block_size=4)[0]
    with torch.no_grad():
        theirs_tokens = theirs.generate(torch.from_numpy(prompt)[None], max_new_tokens=20,
                                        do_sample=False, pad_token_id=0,
                                        eos_token_id=None)[0].numpy()
    np.testing.assert_array_equal(tokens, theirs_tokens)
    model.save_pretrained(params, tmp_path / "ours")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        again = back(input_ids=torch.from_numpy(ids),
                     attention_mask=torch.from_numpy(mask)).logits.numpy()
    np.testing.assert_array_equal(again, want)


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_rope_frequencies_are_transformers(kind, rng):
    """nn.rope_frequencies against transformers' own RoPE initialisers (float32 there), with a
    head of 64 features at theta 10000, where the bands fall across many dimensions; the RoPE
    module turns x by those frequencies."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    scaling = {**SCALINGS[kind]}
    if "original_max_position_embeddings" in scaling:
        scaling["original_max_position_embeddings"] = 2048
    config = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4,
                                      max_position_embeddings=8192,
                                      rope_parameters={**scaling, "rope_theta": 10000.0})
    want, want_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
    inv, factor = ts.nn.rope_frequencies(64, 10000.0, scaling)
    np.testing.assert_allclose(inv, want.numpy(), rtol=3e-7)
    assert factor == pytest.approx(want_factor, rel=1e-12)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    angle = np.arange(3)[:, None] * inv
    cos, sin = factor * np.cos(angle), factor * np.sin(angle)
    want_x = np.concatenate([x[:, :32] * cos - x[:, 32:] * sin,
                             x[:, 32:] * cos + x[:, :32] * sin], axis=1)
    got = ts.function(lambda x: ts.nn.RoPE(10000.0, scaling)(None, x))(x)
    np.testing.assert_allclose(got, want_x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_a_rope_whose_frequencies_follow_the_call_is_refused_by_name(kind, tmp_path):
    model = models.LLaMA(vocab_size=11, hidden_size=16, intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=2)
    model.save_pretrained(model.init(0), tmp_path)
    import json
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"].update(rope_type=kind, factor=2.0)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ts.TesseraError, match=f"(?s){tmp_path}.*RoPE scaling of type '{kind}' is "
                                              "not supported .its frequencies follow"):
        models.LLaMA.from_pretrained(tmp_path)
    with pytest.raises(ts.TesseraError, match="'llama3' RoPE scaling needs low_freq_factor"):
        models.LLaMA(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                   "original_max_position_embeddings": 16,
                                   "high_freq_factor": 4.0})


@pytest.mark.parametrize("name", ["Mistral", "Qwen2"])
def test_llamas_relatives_read_and_write_transformers_checkpoints(name, tmp_path, rng):
    """Mistral's sliding window (3 positions, shorter than the 9 tokens) and Qwen2's biased
    projections with a window on its second layer, a left-padded batch: transformers' logits;
    the directory written back loads as the same architecture with the same logits."""
    common = dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rope_theta=500.0, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0,
                  pad_token_id=0)
    config = transformers.MistralConfig(sliding_window=3, **common) if name == "Mistral" else \
        transformers.Qwen2Config(use_sliding_window=True, sliding_window=3, max_window_layers=1,
                                 **common)
    torch.manual_seed(int(rng.integers(1 << 30)))
    theirs = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for n, p in theirs.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.3)
    theirs.save_pretrained(tmp_path / "theirs")
    model, params = getattr(models, name).from_pretrained(tmp_path / "theirs")
    ids, mask, want = _their_logits_on_a_padded_batch(theirs, model, params, rng)
    model.save_pretrained(params, tmp_path / "ours")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert type(back).__name__ == type(theirs).__name__
    with torch.no_grad():
        again = back(input_ids=torch.from_numpy(ids),
                     attention_mask=torch.from_numpy(mask)).logits.numpy()
    np.testing.assert_array_equal(again, want)
    llama = models.LLaMA(vocab_size=101, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=1, num_attention_heads=4)
    llama.save_pretrained(llama.init(0), tmp_path / "llama")
    with pytest.raises(ts.TesseraError, match=f"describes a 'llama' model, not "
                                              f"'{model.model_type}'"):
        getattr(models, name).from_pretrained(tmp_path / "llama")


def test_a_directory_that_is_no_llama_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ts.TesseraError, match="no readable config.json"):
        models.LLaMA.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ts.TesseraError, match="describes a 'gpt2' model"):
        models.LLaMA.from_pretrained(tmp_path)


def test_llama_int8_weights_are_the_dequantized_model(rng):
    """LLaMA.quantize: every projection and the (tied) head as int8 with per-column scales.
    Its logits are those of the float model holding the dequantized weights (int8 * scale),
    within float32 rounding, and close to the float model's; greedy decoding through the
    paged cache picks each next token as the quantized model's own forward pass does."""
    model = models.LLaMA(vocab_size=101, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True)
    params = model.init(int(rng.integers(1 << 30)))
    q = model.quantize(params)
    assert q["layers"][0]["q"]["int8"].dtype == np.int8 and "int8" in q["lm_head"]
    dq = {**q, "layers": [{k: ts.nn.dequantize_int8(v) if isinstance(v, dict) else v
                           for k, v in layer.items()} for layer in q["layers"]],
          "lm_head": ts.nn.dequantize_int8(q["lm_head"])}
    fn = ts.function(model)
    ids, mask = _batch(rng, True)
    got = fn(q, ids, mask)
    keep = mask.astype(bool)
    np.testing.assert_allclose(got[keep], fn(dq, ids, mask)[keep], rtol=1e-5, atol=1e-5)
    full = fn(params, ids, mask)[keep]
    assert np.abs(got[keep] - full).max() < 0.05 * np.abs(full).max()
    out = model.generate(q, [ids[0, :5]], max_new_tokens=6)[0]
    logits = fn(q, out[None, :-1])[0, 4:]
    top2 = np.sort(logits, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4                  # (no near-tie to decide)
    np.testing.assert_array_equal(out[5:][clear], logits.argmax(-1)[clear])
    with pytest.raises(ts.TesseraError, match="float weights"):
        model.save_pretrained(q, "unused")
    with pytest.raises(ts.TesseraError, match="precision 'int4'"):
        model.quantize(params, "int4")

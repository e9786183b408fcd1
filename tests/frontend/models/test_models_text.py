"""tessera.models' GPT-2 and BERT, written with tessera's own operators, read checkpoint
directories that transformers writes (random initialisations from small configurations,
nothing downloaded) and give transformers' outputs; the directories they write load back into
transformers (AutoModelForCausalLM, AutoModel) with the same outputs; GPT-2 decodes through
models.generate with transformers' greedy tokens; what they do not implement is refused."""
import json

import numpy as np
import pytest

import tessera as ts
from tessera.models import BERT, GPT2

torch = pytest.importorskip("torch", reason="transformers' models run on PyTorch")
transformers = pytest.importorskip("transformers", reason="the checkpoints are transformers'")
safetensors_numpy = pytest.importorskip("safetensors.numpy",
                                        reason="checkpoints are safetensors files")


def _batch(rng, padded, vocab=101, n=9):
    ids = rng.integers(1, vocab, size=(2, n))
    mask = np.ones((2, n), np.int64)
    if padded:                                  # left padding in the second row
        mask[1, :int(rng.integers(1, 5))] = 0
    return ids, mask


def _perturb(theirs, rng, std=0.3):
    """Biases and LayerNorm parameters away from transformers' zeros and ones, so that a
    misplaced one shows."""
    torch.manual_seed(int(rng.integers(1 << 30)))
    with torch.no_grad():
        for n, p in theirs.named_parameters():
            if n.endswith("bias") or "ln" in n or "LayerNorm" in n:
                p.add_(torch.randn_like(p) * std)
    return theirs


def _gpt2_config(**kw):
    return transformers.GPT2Config(vocab_size=101, n_positions=64, n_embd=32, n_layer=2,
                                   n_head=4, bos_token_id=0, eos_token_id=0, **kw)


def _bert_config(**kw):
    return transformers.BertConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=48,
                                   max_position_embeddings=64, type_vocab_size=3, **kw)


# ---- GPT-2 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [
    {},                                                         # GPT-2 itself: gelu_new, tied
    {"activation_function": "gelu", "tie_word_embeddings": False, "n_inner": 40,
     "scale_attn_by_inverse_layer_idx": True, "layer_norm_epsilon": 1e-3}])
def test_gpt2_reads_transformers_checkpoints(options, tmp_path, rng):
    """GPT2LMHeadModel's logits on every token that is not padding, without a mask and with a
    left-padded batch (positions 0..S-1 in every row, as transformers' forward numbers them);
    untied LM head, erf GELU, a narrower MLP and per-layer attention scaling too."""
    torch.manual_seed(int(rng.integers(1 << 30)))
    theirs = _perturb(transformers.GPT2LMHeadModel(_gpt2_config(**options)).eval(), rng)
    theirs.save_pretrained(tmp_path)
    model, params = GPT2.from_pretrained(tmp_path)
    assert ("lm_head" in params) == (not model.config["tie_word_embeddings"])
    fn = ts.function(model)
    for padded in (False, True):
        ids, mask = _batch(rng, padded)
        with torch.no_grad():
            want = theirs(input_ids=torch.from_numpy(ids),
                          attention_mask=torch.from_numpy(mask)).logits.numpy()
        got = fn(params, ids, mask) if padded else fn(params, ids)
        keep = mask.astype(bool)
        np.testing.assert_allclose(got[keep], want[keep], atol=2e-5, rtol=1e-5)


def test_gpt2_writes_checkpoints_transformers_loads(tmp_path, rng):
    model = GPT2(vocab_size=101, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    params = model.init(int(rng.integers(1 << 30)))
    model.save_pretrained(params, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    names = safetensors_numpy.load_file(str(tmp_path / "model.safetensors"))
    assert "transformer.h.1.attn.c_attn.weight" in names and "lm_head.weight" not in names
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "GPT2LMHeadModel"
    ids, mask = _batch(rng, True)
    with torch.no_grad():
        want = theirs(input_ids=torch.from_numpy(ids),
                      attention_mask=torch.from_numpy(mask)).logits.numpy()
    keep = mask.astype(bool)
    np.testing.assert_allclose(ts.function(model)(params, ids, mask)[keep], want[keep],
                               atol=2e-5, rtol=1e-5)
    again, params2 = GPT2.from_pretrained(tmp_path)                   # and back
    assert again.config == model.config
    np.testing.assert_array_equal(params2["layers"][1]["attn"], params["layers"][1]["attn"])
    # GPT-2's initialisation: the residual projections at 0.02 / sqrt(2 * n_layer)
    stds = [np.std(np.concatenate([layer[k].ravel() for layer in params["layers"]]))
            for k in ("fc", "mlp_proj")]
    assert abs(stds[0] - 0.02) < 0.002 and abs(stds[1] - 0.01) < 0.001


def test_gpt2_generates_transformers_greedy_tokens(tmp_path, rng):
    """models.generate drives GPT2 (positions through ``rope_tables``): three prompts of
    different lengths through two slots of a paged cache, transformers' greedy tokens (which
    stop at its eos token, 0)."""
    torch.manual_seed(int(rng.integers(1 << 30)))
    theirs = transformers.GPT2LMHeadModel(_gpt2_config(initializer_range=0.2)).eval()
    theirs.save_pretrained(tmp_path)
    model, params = GPT2.from_pretrained(tmp_path)
    prompts = [rng.integers(1, 101, size=n) for n in (3, 11, 6)]
    out = model.generate(params, prompts, 7, batch_size=2, block_size=4, stop_tokens=[0])
    for prompt, got in zip(prompts, out):
        with torch.no_grad():
            want = theirs.generate(torch.from_numpy(prompt)[None], max_new_tokens=7,
                                   do_sample=False, pad_token_id=0)[0].numpy()
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ts.TesseraError, match="pass n_positions=64"):
        model.generate(params, prompts, 60)


# ---- BERT --------------------------------------------------------------------------------------
def test_bert_reads_transformers_checkpoints(tmp_path, rng):
    """BertModel's last hidden state (every token that is not padding) and pooler output,
    without a mask, with a left-padded batch and token types; a BertForMaskedLM checkpoint
    (its encoder under "bert.", no pooler) gives the same encoder and no pooler output."""
    torch.manual_seed(int(rng.integers(1 << 30)))
    theirs = _perturb(transformers.BertModel(_bert_config()).eval(), rng)
    theirs.save_pretrained(tmp_path / "bert")
    model, params = BERT.from_pretrained(tmp_path / "bert")
    fn = ts.function(model)
    for padded in (False, True):
        ids, mask = _batch(rng, padded)
        types = rng.integers(0, 3, size=ids.shape) if padded else None
        with torch.no_grad():
            want = theirs(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                          token_type_ids=None if types is None else torch.from_numpy(types))
        hidden, pooled = fn(params, ids, mask, types) if padded else fn(params, ids)
        keep = mask.astype(bool)
        np.testing.assert_allclose(hidden[keep], want.last_hidden_state.numpy()[keep],
                                   atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(pooled, want.pooler_output.numpy(), atol=2e-5, rtol=1e-5)

    mlm = transformers.BertForMaskedLM(_bert_config()).eval()
    mlm.save_pretrained(tmp_path / "mlm")
    model, params = BERT.from_pretrained(tmp_path / "mlm")
    assert "pooler" not in params
    ids, mask = _batch(rng, True)
    with torch.no_grad():
        want = mlm.bert(input_ids=torch.from_numpy(ids),
                        attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    hidden, pooled = ts.function(model)(params, ids, mask)
    keep = mask.astype(bool)
    assert pooled is None
    np.testing.assert_allclose(hidden[keep], want[keep], atol=2e-5, rtol=1e-5)


def test_bert_writes_checkpoints_transformers_loads(tmp_path, rng):
    model = BERT(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=48, max_position_embeddings=64, hidden_act="gelu_new")
    params = model.init(int(rng.integers(1 << 30)))
    assert not params["embed"][0].any()                     # the padding token's row
    model.save_pretrained(params, tmp_path)
    names = safetensors_numpy.load_file(str(tmp_path / "model.safetensors"))
    assert "encoder.layer.1.attention.self.query.weight" in names and \
        "pooler.dense.weight" in names and not any(n.startswith("bert.") for n in names)
    theirs = transformers.AutoModel.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "BertModel"
    ids, mask = _batch(rng, True)
    types = rng.integers(0, 2, size=ids.shape)
    with torch.no_grad():
        want = theirs(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                      token_type_ids=torch.from_numpy(types))
    hidden, pooled = ts.function(model)(params, ids, mask, types)
    keep = mask.astype(bool)
    np.testing.assert_allclose(hidden[keep], want.last_hidden_state.numpy()[keep], atol=2e-5,
                               rtol=1e-5)
    np.testing.assert_allclose(pooled, want.pooler_output.numpy(), atol=2e-5, rtol=1e-5)
    again, params2 = BERT.from_pretrained(tmp_path)                   # and back
    assert again.config == model.config
    np.testing.assert_array_equal(params2["layers"][1]["q"], params["layers"][1]["q"])


# ---- what is not implemented is refused ----------------------------------------------------------
def _edit_config(directory, **changes):
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _drop_tensor(directory, name):
    path = str(directory / "model.safetensors")
    tensors = safetensors_numpy.load_file(path)
    del tensors[name]
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})


def test_settings_and_checkpoints_not_implemented_are_clear_errors(tmp_path):
    with pytest.raises(ts.TesseraError, match="activation 'gelu_fast' is not implemented"):
        GPT2(activation_function="gelu_fast")
    with pytest.raises(ts.TesseraError, match="activation 'gelu_fast' is not implemented"):
        BERT(hidden_act="gelu_fast")
    with pytest.raises(ts.TesseraError, match="has no setting 'hidden_size'"):
        GPT2(hidden_size=32)

    small = dict(vocab_size=101, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    gpt2 = GPT2(**small)
    gpt2.save_pretrained(gpt2.init(0), tmp_path / "gpt2")
    with pytest.raises(ts.TesseraError, match="describes a 'gpt2' model, not 'bert'"):
        BERT.from_pretrained(tmp_path / "gpt2")
    with pytest.raises(ts.TesseraError, match="more than its n_positions=16"):
        ts.function(gpt2)(gpt2.init(0), np.ones((1, 17), np.int64))
    _drop_tensor(tmp_path / "gpt2", "transformer.h.0.mlp.c_fc.bias")
    with pytest.raises(ts.TesseraError, match="no tensor 'transformer.h.0.mlp.c_fc.bias'"):
        GPT2.from_pretrained(tmp_path / "gpt2")
    _edit_config(tmp_path / "gpt2", activation_function="gelu_fast")
    with pytest.raises(ts.TesseraError, match="activation 'gelu_fast' is not implemented"):
        GPT2.from_pretrained(tmp_path / "gpt2")
    _edit_config(tmp_path / "gpt2", add_cross_attention=True)
    with pytest.raises(ts.TesseraError, match="cross-attention"):
        GPT2.from_pretrained(tmp_path / "gpt2")

    bert = BERT(vocab_size=101, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=24, max_position_embeddings=16)
    bert.save_pretrained(bert.init(0), tmp_path / "bert")
    _drop_tensor(tmp_path / "bert", "encoder.layer.0.attention.self.key.weight")
    with pytest.raises(ts.TesseraError, match="no tensor 'encoder.layer.0.attention.self.key"):
        BERT.from_pretrained(tmp_path / "bert")
    _edit_config(tmp_path / "bert", position_embedding_type="relative_key")
    with pytest.raises(ts.TesseraError, match="of type 'relative_key' are not read"):
        BERT.from_pretrained(tmp_path / "bert")
    _edit_config(tmp_path / "bert", is_decoder=True)
    with pytest.raises(ts.TesseraError, match="a decoder BERT"):
        BERT.from_pretrained(tmp_path / "bert")

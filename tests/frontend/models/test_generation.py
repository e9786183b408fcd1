"""Generation with the zoo's LLaMA (tessera.models.generate): greedy decoding gives the tokens of
transformers' own generate, with prompts of different lengths served by continuous batching
through a paged KV cache; sampling follows transformers' warpers and is reproducible from its
seed whatever the batch; the paged cache and its attention against NumPy."""
import numpy as np
import pytest

import tessera as ts
from tessera import models, nn

torch = pytest.importorskip("torch", reason="transformers' models run on PyTorch")
transformers = pytest.importorskip("transformers", reason="the reference is transformers'")
pytest.importorskip("safetensors", reason="checkpoints are safetensors files")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A small grouped-query LLaMA (4 heads sharing 2 key/value heads), transformers' and ours
    from the same checkpoint directory."""
    torch.manual_seed(20261202)
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rope_theta=500.0, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    theirs = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("llama")
    theirs.save_pretrained(path)
    model, params = models.LLaMA.from_pretrained(path)
    return theirs, model, params


def _theirs(theirs, prompt, new, **kw):
    with torch.no_grad():
        return theirs.generate(torch.from_numpy(prompt)[None], max_new_tokens=new,
                               do_sample=False, pad_token_id=0, **kw)[0].numpy()


def test_greedy_decoding_gives_transformers_tokens(llama, rng):
    """Five prompts (3 to 19 tokens: prefills of 8, 16 and 32 positions) through two slots, so
    finished sequences hand their slot and blocks to waiting ones; blocks of 4 positions, so
    each sequence spans several and the block table's width grows as it decodes."""
    theirs, model, params = llama
    prompts = [rng.integers(1, 97, n) for n in (5, 19, 3, 11, 8)]
    got = model.generate(params, prompts, max_new_tokens=14, batch_size=2, block_size=4)
    for p, g in zip(prompts, got):
        np.testing.assert_array_equal(g, _theirs(theirs, p, 14, eos_token_id=None))


_COMMON = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
               rope_theta=500.0, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0,
               pad_token_id=0)
RELATIVES = {   # windows far shorter than the sequences, so decoding slides past them
    "Mistral": lambda: transformers.MistralConfig(sliding_window=5, **_COMMON),
    "Qwen2": lambda: transformers.Qwen2Config(use_sliding_window=True, sliding_window=4,
                                              max_window_layers=1, **_COMMON),
    "LLaMA": lambda: transformers.LlamaConfig(attention_bias=True, **_COMMON)}


@pytest.mark.parametrize("name", sorted(RELATIVES))
def test_greedy_decoding_of_llamas_relatives(name, tmp_path, rng):
    """Mistral (every layer in a sliding window of 5), Qwen2 (biased q/k/v, its second layer
    in a window of 4) and LLaMA with attention biases: transformers' greedy tokens, prompt and
    new tokens reaching three to four windows back."""
    torch.manual_seed(int(rng.integers(1 << 30)))
    theirs = transformers.AutoModelForCausalLM.from_config(RELATIVES[name]()).eval()
    with torch.no_grad():
        for n, p in theirs.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.3)
    theirs.save_pretrained(tmp_path)
    model, params = getattr(models, name).from_pretrained(tmp_path)
    prompts = [rng.integers(1, 97, n) for n in (3, 11, 6)]
    got = model.generate(params, prompts, max_new_tokens=12, batch_size=2, block_size=4)
    for p, g in zip(prompts, got):
        np.testing.assert_array_equal(g, _theirs(theirs, p, 12, eos_token_id=None))


def test_a_stop_token_ends_its_sequence_and_frees_its_slot(llama, rng):
    """The stop token is the third transformers' greedy run produces for the first prompt:
    both stop at its first appearance."""
    theirs, model, params = llama
    prompts = [rng.integers(1, 97, n) for n in (6, 9, 4)]
    free = _theirs(theirs, prompts[0], 3, eos_token_id=None)[len(prompts[0]):]
    stop = int(free[-1])
    got = model.generate(params, prompts, max_new_tokens=10, stop_tokens=[stop], batch_size=2)
    for p, g in zip(prompts, got):
        want = _theirs(theirs, p, 10, eos_token_id=stop)
        np.testing.assert_array_equal(g, want[:len(p) + 10])
        assert stop not in g[len(p):-1]
    assert got[0][-1] == stop and len(got[0]) == len(prompts[0]) + list(free).index(stop) + 1


def test_the_sampling_distribution_is_transformers_warpers(rng):
    from transformers.generation import logits_process as lp
    logits = rng.standard_normal((4, 50)).astype(np.float32) * 3
    for temperature, top_k, top_p in ((0.7, None, None), (1.0, 5, None), (1.3, None, 0.8),
                                      (0.9, 20, 0.6), (1.0, 1, None)):
        t = torch.from_numpy(logits)
        t = lp.TemperatureLogitsWarper(temperature)(None, t)
        if top_k is not None:
            t = lp.TopKLogitsWarper(top_k)(None, t)
        if top_p is not None:
            t = lp.TopPLogitsWarper(top_p)(None, t)
        want = torch.softmax(t.double(), dim=-1).numpy()
        got = models.sampling_distribution(logits, temperature, top_k, top_p)
        np.testing.assert_array_equal(got > 0, want > 0)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


def test_sampling_is_reproducible_from_its_seed_whatever_the_batch(llama, rng):
    theirs, model, params = llama
    prompts = [rng.integers(1, 97, n) for n in (4, 10, 7)]
    kw = dict(max_new_tokens=9, temperature=0.9, top_k=30, top_p=0.9)
    a = model.generate(params, prompts, seed=5, batch_size=3, **kw)
    b = model.generate(params, prompts, seed=5, batch_size=1, **kw)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    c = model.generate(params, prompts, seed=6, batch_size=3, **kw)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))
    assert all(len(x) == len(p) + 9 for x, p in zip(a, prompts))
    greedy = model.generate(params, prompts, max_new_tokens=9)
    top1 = model.generate(params, prompts, max_new_tokens=9, temperature=1.0, top_k=1, seed=3)
    for x, y in zip(greedy, top1):
        np.testing.assert_array_equal(x, y)


def test_sampled_tokens_follow_the_models_distribution(llama, rng):
    """600 copies of one prompt, one sampled token each (each copy its own generator): the
    counts against transformers' next-token probabilities, by a chi-square test."""
    theirs, model, params = llama
    prompt = rng.integers(1, 97, 6)
    with torch.no_grad():
        logits = theirs(torch.from_numpy(prompt)[None]).logits[0, -1].numpy()
    p = models.sampling_distribution(logits, temperature=2.0)
    draws = model.generate(params, [prompt] * 600, max_new_tokens=1, temperature=2.0,
                           seed=int(rng.integers(1 << 30)), batch_size=8)
    counts = np.bincount([d[-1] for d in draws], minlength=97)
    big = p * 600 >= 5                           # cells expected to hold five or more
    observed, expected = counts[big], p[big] * 600
    if not big.all():                            # the rare tokens pooled in one cell
        observed = np.append(observed, counts[~big].sum())
        expected = np.append(expected, p[~big].sum() * 600)
    chi2 = ((observed - expected) ** 2 / expected).sum()
    dof = len(observed) - 1
    assert chi2 < dof + 5 * np.sqrt(2 * dof), (chi2, dof)        # ~5 sigma


def test_paged_attention_is_attention_over_the_sequences_cache(rng):
    """Two sequences of 7 and 13 positions in blocks of 4 taken from a shared pool in an
    interleaved order, then 2 new positions each: NumPy's softmax attention over each
    sequence's keys followed by the new ones (causal among themselves)."""
    cache = nn.PagedKVCache(layers=1, kv_heads=2, head_dim=8, num_blocks=12, block_size=4)
    lengths = {"a": 7, "b": 13}
    full_k, full_v = {}, {}
    for s in ("a", "b"):
        cache.add(s)
    for step in range(13):                            # interleaved: blocks alternate
        for s, n in lengths.items():
            if step < n:
                cache.reserve(s, 1)
                k, v = rng.standard_normal((2, 1, 2, 1, 8)).astype(np.float32)
                cache.write(s, k, v)
                full_k.setdefault(s, []).append(k[0, :, 0])
                full_v.setdefault(s, []).append(v[0, :, 0])
    assert cache.blocks == {"a": [0, 2], "b": [1, 3, 4, 5]}
    q = rng.standard_normal((2, 4, 2, 8)).astype(np.float32)
    kn, vn = rng.standard_normal((2, 2, 2, 2, 8)).astype(np.float32)
    seqs, width = ["a", "b"], 4
    f = ts.function(lambda q, k, v, kp, vp, t, m: nn.paged_attention(q, k, v, kp, vp, t, m))
    got = f(q, kn, vn, cache.k[0], cache.v[0], cache.table(seqs, width),
            cache.mask(seqs, width, new=2))
    for b, s in enumerate(seqs):
        keys = np.concatenate([np.stack(full_k[s], axis=1), kn[b]], axis=1)       # [2, n+2, 8]
        vals = np.concatenate([np.stack(full_v[s], axis=1), vn[b]], axis=1)
        keys, vals = np.repeat(keys, 2, axis=0), np.repeat(vals, 2, axis=0)       # 4 heads
        sc = q[b].astype(np.float64) @ keys.transpose(0, 2, 1) / np.sqrt(8)
        sc[:, 0, -1] = -np.inf                                  # new position 0 sees itself
        e = np.exp(sc - sc.max(-1, keepdims=True))
        np.testing.assert_allclose(got[b], (e / e.sum(-1, keepdims=True)) @ vals,
                                   rtol=2e-5, atol=2e-6)


def test_the_paged_cache_keeps_its_accounts(rng):
    cache = nn.PagedKVCache(layers=2, kv_heads=1, head_dim=4, num_blocks=5, block_size=3)
    cache.add("a")
    cache.add("b")
    cache.reserve("a", 7)                                          # 3 blocks: 0, 1, 2
    assert cache.blocks["a"] == [0, 1, 2] and cache.free_blocks == 2
    with pytest.raises(ts.TesseraError, match="3 more blocks needed for 'b', 2 free"):
        cache.reserve("b", 9)
    assert cache.free_blocks == 2 and cache.blocks["b"] == []      # nothing taken
    cache.reserve("b", 4)
    with pytest.raises(ts.ArgumentError, match="room for 6 positions, not 7"):
        cache.write("b", *np.zeros((2, 2, 1, 7, 4), np.float32))
    with pytest.raises(ts.ArgumentError, match=r"expected \[2, 1, T, 4\]"):
        cache.write("a", *np.zeros((2, 2, 2, 4), np.float32))
    cache.release("a")
    assert cache.free_blocks == 3
    cache.add("c")
    cache.reserve("c", 1)
    assert cache.blocks["c"] == [0]                                # the lowest free block
    k = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    cache.write("c", k, k)
    np.testing.assert_array_equal(cache.k[:, 0, :, :2], k)
    w = cache.mask(["c"], width=1, new=2, window=2)     # held 0, 1; new at 2 and 3
    assert (w[0, 0] == [[-np.inf, 0, -np.inf, 0, -np.inf], [-np.inf, -np.inf, -np.inf, 0, 0]]).all()
    m = cache.mask(["c", None], width=2, new=1)
    assert m.shape == (2, 1, 1, 7)
    assert (m[0, 0, 0] == [0, 0, -np.inf, -np.inf, -np.inf, -np.inf, 0]).all()
    assert (m[1, 0, 0, :6] == -np.inf).all() and m[1, 0, 0, 6] == 0
    with pytest.raises(ts.ArgumentError, match="no sequence 'z'"):
        cache.reserve("z", 1)


def test_bad_generation_arguments_are_clear_errors(llama):
    _, model, params = llama
    with pytest.raises(ts.ArgumentError, match="outside \\[0, 97\\)"):
        model.generate(params, [[1, 97]], max_new_tokens=2)
    with pytest.raises(ts.ArgumentError, match="prompt 1 is not a non-empty"):
        model.generate(params, [[1, 2], []], max_new_tokens=2)
    with pytest.raises(ts.ArgumentError, match="top_p must lie in"):
        model.generate(params, [[1, 2]], max_new_tokens=2, temperature=1.0, top_p=0.0)
    with pytest.raises(ts.ArgumentError, match="max_new_tokens must be a positive int"):
        model.generate(params, [[1, 2]], max_new_tokens=0)
    with pytest.raises(ts.TesseraError, match="needs 3 blocks of 4; the cache has 2"):
        model.generate(params, [[1] * 9], max_new_tokens=2, block_size=4, num_blocks=2)


def test_rope_tables_at_each_rows_positions_are_the_offset_tables(rng):
    pos = np.array([[3, 4, 5], [0, 1, 2]])
    cos, ssin = nn.rope_tables(0, 8, 500.0, positions=pos)
    for b, start in enumerate((3, 0)):
        c, s = nn.rope_tables(3, 8, 500.0, offset=start)
        np.testing.assert_array_equal(cos[b], c)
        np.testing.assert_array_equal(ssin[b], s)
    x = rng.standard_normal((2, 4, 3, 8)).astype(np.float32)          # [B, H, T, D]
    got = ts.function(lambda x, c, s: nn.rope(x, tables=(c, s)))(x, cos[:, None], ssin[:, None])
    for b, start in enumerate((3, 0)):
        np.testing.assert_allclose(got[b], nn.rope(x[b], 500.0, offset=start), rtol=1e-6,
                                   atol=1e-6)


@pytest.mark.parametrize("mask_heads", [0, 1, 4])
def test_grouped_query_attention_is_attention_with_the_heads_repeated(mask_heads, rng):
    """4 query heads over 2 key/value heads: PyTorch's SDPA with enable_gqa (each key/value
    head serving consecutive query heads), with no mask, one for all heads, or one per head."""
    q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)
    k, v = rng.standard_normal((2, 2, 2, 7, 8)).astype(np.float32)
    mask = None if not mask_heads else np.where(
        rng.random((2, mask_heads, 5, 7)) < 0.2, -np.inf, 0).astype(np.float32)
    f = ts.function(lambda q, k, v, m: nn.grouped_query_attention(q, k, v, mask=m, causal=True))
    got = f(q, k, v, mask)
    tm = None if mask is None else torch.from_numpy(mask)
    causal = torch.ones(5, 7, dtype=torch.bool).tril(2)
    bias = torch.where(causal, 0.0, -torch.inf) + (0 if tm is None else tm)
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(t) for t in (q, k, v)), attn_mask=bias, enable_gqa=True)
    want = torch.nan_to_num(want, nan=0.0).numpy()         # (a row with no key: 0 in tessera)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

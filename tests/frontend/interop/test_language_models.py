"""transformers' language and multimodal models as people bring them: small random
configurations with the library's default settings (scaled-dot-product attention, the cache on,
the LM heads), nothing downloaded, through ts.from_torch, with and without a padded batch; each
gives PyTorch's outputs within rounding. Then the ATen pieces those models lean on
(scaled_dot_product_attention with its masks and grouped-query attention, advanced indexing,
slice_scatter, cumsum, boolean and), each against PyTorch on fresh inputs."""
import numpy as np
import pytest

import tessera as ts

from conftest import onnx_exported_by_pytorch

torch = pytest.importorskip("torch", reason="ts.from_torch needs PyTorch")
transformers = pytest.importorskip("transformers", reason="the models come from transformers")

SMALL = dict(vocab_size=100, bos_token_id=0, eos_token_id=0, pad_token_id=0)
DECODER = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64,
               max_position_embeddings=64)


def _text_models():
    T = transformers
    return {
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_head=2, n_embd=32,
                                                       n_positions=64, **SMALL)),
        "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**DECODER, **SMALL)),
        "opt": lambda: T.OPTForCausalLM(T.OPTConfig(
            num_hidden_layers=2, num_attention_heads=2, hidden_size=32, ffn_dim=64,
            max_position_embeddings=64, word_embed_proj_dim=32, **SMALL)),
        "bert": lambda: T.BertModel(T.BertConfig(**DECODER, **SMALL)),
        "roberta": lambda: T.RobertaModel(T.RobertaConfig(
            **{**DECODER, "max_position_embeddings": 80}, vocab_size=100, pad_token_id=1,
            bos_token_id=0, eos_token_id=2)),
        "distilbert": lambda: T.DistilBertModel(T.DistilBertConfig(
            n_layers=2, n_heads=2, dim=32, hidden_dim=64, max_position_embeddings=64,
            vocab_size=100, pad_token_id=0)),
        "t5": lambda: T.T5EncoderModel(T.T5Config(num_layers=2, num_heads=2, d_model=32, d_kv=16,
                                                  d_ff=64, vocab_size=100, pad_token_id=0)),
        "bart": lambda: T.BartModel(T.BartConfig(
            encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
            max_position_embeddings=64, vocab_size=100, pad_token_id=1, bos_token_id=0,
            eos_token_id=2, decoder_start_token_id=2)),
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**DECODER, num_key_value_heads=2,
                                                          **SMALL)),
        "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(
            **DECODER, num_key_value_heads=2, sliding_window=4, **SMALL)),
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**DECODER, num_key_value_heads=2,
                                                          **SMALL)),
        "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**DECODER, num_key_value_heads=1,
                                                          head_dim=8, **SMALL)),
        "phi": lambda: T.PhiForCausalLM(T.PhiConfig(**DECODER, **SMALL)),
        "falcon": lambda: T.FalconForCausalLM(T.FalconConfig(
            num_hidden_layers=2, num_attention_heads=4, hidden_size=32, **SMALL)),
        "clip_text": lambda: T.CLIPTextModel(T.CLIPTextConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32, projection_dim=16, **SMALL)),
    }


class Outputs(torch.nn.Module):
    """The model's logits (its LM head) or last hidden state: the tensor a user reads."""
    def __init__(self, model, key):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x, *mask):
        out = self.model(**{self.key: x}, **({"attention_mask": mask[0]} if mask else {}))
        return out.logits if getattr(out, "logits", None) is not None else \
            out.last_hidden_state


def _assert_pytorchs(module, *args):
    fn, params = ts.from_torch(module, *args)
    with torch.no_grad():
        want = module(*args).numpy()
    got = fn(params, *[a.numpy() for a in args])
    assert not np.isnan(want).any()
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("name", sorted(_text_models()))
def test_a_language_model_with_its_defaults_gives_pytorchs_outputs(name, padded, rng):
    """The padded batch's second sequence starts with padding (left padding, as generation
    uses): the model's own mask arithmetic (bitwise and, advanced indexing) is imported too."""
    torch.manual_seed(int(rng.integers(1 << 30)))
    model = Outputs(_text_models()[name]().eval(), "input_ids")
    ids = torch.from_numpy(rng.integers(3, 100, size=(2, 9)))
    if not padded:
        return _assert_pytorchs(model, ids)
    mask = torch.ones(2, 9, dtype=torch.int64)
    mask[1, :int(rng.integers(1, 5))] = 0
    _assert_pytorchs(model, ids, mask)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_a_model_as_it_comes_returns_its_outputs_and_its_cache(name, rng):
    """The model itself, no wrapper: its ModelOutput comes back as a dict of its fields, the
    key/value cache (on by default) as the tuple of each layer's keys and values, each
    PyTorch's."""
    torch.manual_seed(int(rng.integers(1 << 30)))
    model = _text_models()[name]().eval()
    ids = torch.from_numpy(rng.integers(3, 100, size=(2, 9)))
    fn, params = ts.from_torch(model, ids)
    got = fn(params, ids.numpy())
    with torch.no_grad():
        want = model(ids)
    assert list(got) == list(want.keys())
    for key, w in want.items():
        if hasattr(w, "layers"):            # the cache (transformers 5 names the field "cache")
            w = [t for layer in w.layers for t in (layer.keys, layer.values)]
            assert len(got[key]) == len(w) == 2 * model.config.num_hidden_layers
            for g, t in zip(got[key], w):
                np.testing.assert_allclose(g, t.numpy(), atol=2e-5, rtol=1e-5)
        else:
            np.testing.assert_allclose(got[key], w.numpy(), atol=2e-5, rtol=1e-5)


def test_clip_vision_and_whisper_encoders_give_pytorchs_outputs(rng):
    T = transformers
    torch.manual_seed(int(rng.integers(1 << 30)))
    clip = T.CLIPVisionModel(T.CLIPVisionConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, projection_dim=16)).eval()
    _assert_pytorchs(Outputs(clip, "pixel_values"),
                     torch.from_numpy(rng.standard_normal((2, 3, 16, 16), np.float32)))
    whisper = T.models.whisper.modeling_whisper.WhisperEncoder(T.WhisperConfig(
        num_mel_bins=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=10, max_target_positions=16, decoder_start_token_id=0,
        **SMALL)).eval()
    _assert_pytorchs(Outputs(whisper, "input_features"),
                     torch.from_numpy(rng.standard_normal((2, 8, 20), np.float32)))


# T5 is left out: PyTorch's exporter itself fails on it (a ConversionError while decomposing
# its FX graph, torch 2.13), before there is a file to import.
@pytest.mark.parametrize("name", sorted(set(_text_models()) - {"t5"}))
def test_a_language_model_exported_by_pytorch_imports_to_its_outputs(name, rng):
    """PyTorch's ONNX exporter on the model with its defaults and a left-padded batch, then
    ts.onnx.import_model: PyTorch's outputs at every token; at the padding, whose queries see
    no key, the exported graph's own value (its softmax's NaN set to zero, where PyTorch's fused
    attention gives something else), so there onnxruntime on the same file is the reference."""
    pytest.importorskip("onnxscript", reason="PyTorch's ONNX exporter needs onnxscript")
    torch.manual_seed(int(rng.integers(1 << 30)))
    model = Outputs(_text_models()[name]().eval(), "input_ids")
    ids = torch.from_numpy(rng.integers(3, 100, size=(2, 9)))
    mask = torch.ones(2, 9, dtype=torch.int64)
    pad = int(rng.integers(1, 5))
    mask[1, :pad] = 0
    exported = onnx_exported_by_pytorch(model, ids, mask)
    got = ts.onnx.import_model(exported)(ids.numpy(), mask.numpy())
    with torch.no_grad():
        want = model(ids, mask).numpy()
    np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(got[1, pad:], want[1, pad:], atol=2e-5, rtol=1e-5)
    try:
        import onnxruntime
    except ImportError:         # (the test extra installs it)
        return
    session = onnxruntime.InferenceSession(exported, providers=["CPUExecutionProvider"])
    feeds = dict(zip([i.name for i in session.get_inputs()], (ids.numpy(), mask.numpy())))
    np.testing.assert_allclose(got, session.run(None, feeds)[0], atol=2e-5, rtol=1e-5)


def test_clip_vision_and_whisper_encoders_exported_by_pytorch_import_to_its_outputs(rng):
    pytest.importorskip("onnxscript", reason="PyTorch's ONNX exporter needs onnxscript")
    T = transformers
    torch.manual_seed(int(rng.integers(1 << 30)))
    clip = T.CLIPVisionModel(T.CLIPVisionConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, projection_dim=16)).eval()
    whisper = T.models.whisper.modeling_whisper.WhisperEncoder(T.WhisperConfig(
        num_mel_bins=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=10, max_target_positions=16, decoder_start_token_id=0,
        **SMALL)).eval()
    for model, key, shape in [(clip, "pixel_values", (2, 3, 16, 16)),
                              (whisper, "input_features", (2, 8, 20))]:
        module = Outputs(model, key)
        x = torch.from_numpy(rng.standard_normal(shape, np.float32))
        got = ts.onnx.import_model(onnx_exported_by_pytorch(module, x))(x.numpy())
        with torch.no_grad():
            want = module(x).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "t5"])
def test_an_imported_language_model_exports_to_onnx_and_back(name, opset, rng):
    """from_torch, then ts.onnx.export at the opset asked (onnx.checker with full shape
    inference passes inside it): ONNX's reference evaluator and onnxruntime compute tessera's
    outputs, padded rows too, and the model imports back to them."""
    from onnx.reference import ReferenceEvaluator
    torch.manual_seed(int(rng.integers(1 << 30)))
    model = Outputs(_text_models()[name]().eval(), "input_ids")
    ids = rng.integers(3, 100, size=(2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, :int(rng.integers(1, 5))] = 0
    fn, params = ts.from_torch(model, torch.from_numpy(ids), torch.from_numpy(mask))
    ours = fn(params, ids, mask)
    exported = ts.onnx.export(lambda ids, mask: fn(params, ids, mask), None, ids, mask,
                              opset_version=opset)
    assert exported.opset_import[0].version == opset
    feeds = dict(zip([i.name for i in exported.graph.input], (ids, mask)))
    with np.errstate(invalid="ignore"):        # (its softmax of a padded row's -inf scores)
        theirs = ReferenceEvaluator(exported).run(None, feeds)[0]
    np.testing.assert_allclose(theirs, ours, atol=2e-5, rtol=1e-5)
    try:
        import onnxruntime
    except ImportError:         # (the test extra installs it)
        onnxruntime = None
    if onnxruntime is not None:
        session = onnxruntime.InferenceSession(exported.SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(session.run(None, feeds)[0], ours, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(ts.onnx.import_model(exported)(ids, mask), ours, atol=2e-5,
                               rtol=1e-5)


# ---- the ATen pieces, each against PyTorch ------------------------------------------------------
class Fn(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *xs):
        return self.f(*xs)


def _randn(rng, *shape):
    return torch.from_numpy(rng.standard_normal(shape, np.float32))


@pytest.mark.parametrize("case", ["bool_mask", "float_mask", "causal", "gqa", "gqa_causal",
                                  "unbatched"])
def test_scaled_dot_product_attention_is_pytorchs(case, rng):
    """A boolean mask keeps the keys it marks True; enable_gqa shares each key/value head among
    consecutive query heads; every query row keeps at least one key (PyTorch's value for a row
    that sees none is its own NaN)."""
    F = torch.nn.functional
    kv_heads = 2 if case.startswith("gqa") else 4
    q, k, v = _randn(rng, 2, 4, 5, 8), _randn(rng, 2, kv_heads, 7, 8), _randn(rng, 2, kv_heads,
                                                                             7, 8)
    if case == "bool_mask":
        mask = torch.from_numpy(rng.random((2, 1, 5, 7)) < 0.6)
        mask[..., 0] = True
        f = Fn(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
        return _assert_pytorchs(f, q, k, v, mask)
    if case == "float_mask":
        f = Fn(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                                 scale=0.3))
        return _assert_pytorchs(f, q, k, v, _randn(rng, 5, 7))
    if case == "unbatched":                  # (no head axis: [S, D] operands)
        f = Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return _assert_pytorchs(f, q[0, 0], k[0, 0], v[0, 0])
    causal = case.endswith("causal")
    f = Fn(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=case.startswith("gqa")))
    _assert_pytorchs(f, q, k, v)


@pytest.mark.parametrize("where", ["adjacent_first", "adjacent_inner", "apart", "negative"])
def test_advanced_indexing_is_pytorchs(where, rng):
    """aten.index.Tensor: the broadcast index shape replaces adjacent indexed axes in place, and
    goes first when they are apart (NumPy's rule, and PyTorch's)."""
    x = _randn(rng, 4, 5, 6, 3)
    i = torch.from_numpy(rng.integers(0, 4, (2, 3)))
    j = torch.from_numpy(rng.integers(0, 5, (3,)))
    k = torch.from_numpy(rng.integers(-6, 6, (2, 1)))
    f = {"adjacent_first": lambda x, i, j, k: x[i, j],
         "adjacent_inner": lambda x, i, j, k: x[:, j, k],
         "apart": lambda x, i, j, k: x[i, :, k],
         "negative": lambda x, i, j, k: x[:, :, k]}[where]
    _assert_pytorchs(Fn(f), x, i, j, k)


def test_advanced_indexing_past_an_inner_axis_is_reported(rng):
    """x[i, j] is read through one flat index: j = 6 on an axis of 6 must fault, not read the
    next row's first element."""
    fn, params = ts.from_torch(Fn(lambda x, i, j: x[i, j]), _randn(rng, 4, 6),
                               torch.tensor([0, 1]), torch.tensor([2, 3]))
    x = rng.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(fn(params, x, np.array([0, 1]), np.array([2, -6])),
                                  x[[0, 1], [2, -6]])
    with pytest.raises(ts.RuntimeFault, match="out of range"):
        fn(params, x, np.array([0, 1]), np.array([2, 6]))


@pytest.mark.parametrize("step", [1, 2])
def test_an_assignment_into_a_slice_is_pytorchs(step, rng):
    """y[:, 1:6:step] = z inside a model: torch.export writes slice_scatter (and copy)."""
    def f(x, z):
        y = x.clone()
        y[:, 1:6:step] = z
        return y * 2
    x = _randn(rng, 3, 8)
    _assert_pytorchs(Fn(f), x, _randn(rng, 3, len(range(1, 6, step))))


def test_cumsum_and_boolean_and_are_pytorchs(rng):
    def f(x, m):
        keep = (x > 0) & (m > 1)
        return torch.cumsum(torch.where(keep, x, 0.0), dim=1), torch.cumsum(m, 0)
    x = _randn(rng, 3, 7)
    m = torch.from_numpy(rng.integers(0, 4, (3, 7)))
    fn, params = ts.from_torch(Fn(f), x, m)
    got = fn(params, x.numpy(), m.numpy())
    for g, w in zip(got, f(x, m)):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
        assert np.asarray(g).dtype == w.numpy().dtype


def test_bit_operations_and_small_integer_dtypes_are_pytorchs(rng):
    """A uint8 image and int16 bits (& | ^ ~ << >> on tensors and scalars, shifts by tensors):
    PyTorch's dtypes and bits."""
    def f(img, bits, by):
        x = img.to(torch.float32) / 255.0
        return (x.mean(dim=(2, 3)), (bits & 0x0F) | (bits << 2) ^ (bits >> by), ~bits,
                torch.bitwise_right_shift(img, 3), (img > 100) & (img < 200), bits.sum(dim=1))
    img = torch.from_numpy(rng.integers(0, 256, (2, 3, 8, 8)).astype(np.uint8))
    bits = torch.from_numpy(rng.integers(-3000, 3000, (2, 5)).astype(np.int16))
    by = torch.from_numpy(rng.integers(0, 9, (5,)).astype(np.int16))
    fn, params = ts.from_torch(Fn(f), img, bits, by)
    got = fn(params, img.numpy(), bits.numpy(), by.numpy())
    for g, w in zip(got, f(img, bits, by)):
        assert np.asarray(g).dtype == w.numpy().dtype
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6)

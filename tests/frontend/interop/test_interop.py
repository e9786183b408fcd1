"""Arrays from PyTorch through DLPack, results in the caller's array type, and tessera functions
as PyTorch autograd functions (tessera/interop.py), against PyTorch itself."""
import io
import os

import numpy as np
import pytest

import tessera as ts
from tessera import op

torch = pytest.importorskip("torch", reason="PyTorch is the library these bridges connect to")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 and fp8 need ml_dtypes")


def test_from_dlpack_shares_memory_and_keeps_dtypes(rng):
    t = torch.from_numpy(rng.standard_normal((5, 6)).astype(np.float32))
    x = ts.from_dlpack(t)
    assert isinstance(x, np.ndarray) and x.dtype == np.float32 and x.shape == (5, 6)
    t[1, 2] = 42.0                                        # the same memory, no copy
    assert x[1, 2] == 42.0
    col = ts.from_dlpack(t[:, 3])                         # a strided view stays a view
    assert col.strides == (24,) and np.shares_memory(col, x)
    g = torch.ones(3, dtype=torch.float64, requires_grad=True)
    np.testing.assert_array_equal(ts.from_dlpack(g), np.ones(3))         # read detached
    for dtype in (torch.int64, torch.int32, torch.bool, torch.float16):
        v = (torch.arange(6) % 3).to(dtype)
        np.testing.assert_array_equal(ts.from_dlpack(v), v.numpy())
    for dtype, np_dtype in [(torch.bfloat16, ml_dtypes.bfloat16),
                            (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
                            (torch.float8_e5m2, ml_dtypes.float8_e5m2)]:
        v = torch.from_numpy(rng.standard_normal(64).astype(np.float32)).to(dtype)
        got = ts.from_dlpack(v)                           # by its bits: DLPack has no fp8
        assert got.dtype == np_dtype
        np.testing.assert_array_equal(got.astype(np.float32), v.to(torch.float32).numpy())
    with pytest.raises(ts.ArgumentError, match="on meta"):
        ts.from_dlpack(torch.empty(3, device="meta"))


def test_pytorch_in_pytorch_out(rng):
    f = ts.function(lambda a, b: (op.tanh(a @ b) * 2, op.sum(a, axis=0)))
    a = rng.standard_normal((7, 5)).astype(np.float32)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    want = f(a, b)
    got = f(torch.from_numpy(a), torch.from_numpy(b).requires_grad_())
    assert isinstance(got, tuple) and all(isinstance(g, torch.Tensor) for g in got)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)       # the same program, the same bits
    mixed = f(a, torch.from_numpy(b))                     # not all PyTorch: NumPy, as always
    assert all(isinstance(m, np.ndarray) for m in mixed)
    tree = ts.function(lambda p, x: p["w"] * x)(
        {"w": torch.ones(4, dtype=torch.float64)}, torch.arange(4, dtype=torch.float64))
    assert isinstance(tree, torch.Tensor) and tree.tolist() == [0, 1, 2, 3]
    half = ts.function(lambda x: x * 3)(torch.from_numpy(a).to(torch.bfloat16))
    assert half.dtype == torch.bfloat16
    np.testing.assert_array_equal(half.to(torch.float32).numpy(),
                                  (a.astype(ml_dtypes.bfloat16).astype(np.float32) * 3)
                                  .astype(ml_dtypes.bfloat16).astype(np.float32))


def test_to_torch_gradients_match_pytorch_autograd(rng):
    def loss(w, x, scale):
        h = op.tanh(x @ w)
        return op.sum(h * h) * scale, op.mean(h, axis=0)
    layer = ts.to_torch(loss)
    w = torch.from_numpy(rng.standard_normal((6, 4))).requires_grad_()
    x = torch.from_numpy(rng.standard_normal((9, 6))).requires_grad_()
    value, mean = layer(w, x, 0.5)
    (value + (mean * torch.arange(4.0, dtype=torch.float64)).sum()).backward()
    w2, x2 = w.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    h = torch.tanh(x2 @ w2)
    ((h * h).sum() * 0.5 + (h.mean(0) * torch.arange(4.0, dtype=torch.float64)).sum()).backward()
    torch.testing.assert_close(value, (h * h).sum().detach() * 0.5)
    torch.testing.assert_close(w.grad, w2.grad)
    torch.testing.assert_close(x.grad, x2.grad)
    idx = ts.to_torch(lambda x, i: op.sum(op.take(x, i, axis=0)))
    xi = torch.ones(5, 2, dtype=torch.float64, requires_grad=True)
    idx(xi, torch.tensor([0, 0, 3])).backward()           # an integer argument: no gradient
    assert xi.grad[:, 0].tolist() == [2, 0, 0, 1, 0]


def test_to_torch_trains_in_a_pytorch_loop(rng):
    """Ten SGD steps on a tessera loss inside torch.optim give PyTorch's own trajectory."""
    x = torch.from_numpy(rng.standard_normal((32, 8)))
    y = torch.from_numpy(rng.standard_normal((32, 1)))
    w0 = rng.standard_normal((8, 1)) * 0.1
    loss = ts.to_torch(lambda w, x, y: op.mean((op.tanh(x @ w) - y) ** 2))
    runs = []
    for use_tessera in (True, False):
        w = torch.from_numpy(w0.copy()).requires_grad_()
        opt = torch.optim.SGD([w], lr=0.5)
        trace = []
        for _ in range(10):
            opt.zero_grad()
            value = loss(w, x, y) if use_tessera else ((torch.tanh(x @ w) - y) ** 2).mean()
            value.backward()
            opt.step()
            trace.append(float(value.detach()))
        runs.append(trace)
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-10)
    assert runs[0][-1] < runs[0][0]


# ---- from_torch: torch.export's ATen graph onto the registry -------------------------------------
class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16)
        self.l2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.ln(self.l1(x)))
        return torch.softmax(self.l2(h), dim=-1) + x[:, :4].mean(dim=-1, keepdim=True)


class _Block(torch.nn.Module):
    """Embedding, a fused qkv projection split three ways, heads, a causal mask built from
    ones/tril, masked softmax attention and PyTorch's SDPA side by side."""
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.emb, self.ln = torch.nn.Embedding(10, d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, ids):
        x = self.emb(ids)
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln(x)).split(D, dim=-1))
        att = (q @ k.transpose(-2, -1)) / (D // self.heads) ** 0.5
        keep = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~keep, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        y2 = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y) + y2.transpose(1, 2).reshape(B, T, D)


def test_from_torch_matches_pytorch_and_trains(rng):
    torch.manual_seed(int(rng.integers(1 << 31)))
    model = _MLP()
    x = torch.from_numpy(rng.standard_normal((5, 8)).astype(np.float32))
    fn, params = ts.from_torch(model, x)
    assert sorted(params) == sorted(model.state_dict())
    np.testing.assert_allclose(fn(params, x.numpy()), model(x).detach().numpy(), atol=2e-6)
    assert "softmax" in str(fn.lower(params, x.numpy()).graph_ir)

    def loss(p, x):
        return op.sum(fn(p, x) ** 2)
    grads = ts.grad(loss)(params, x.numpy())
    (model(x) ** 2).sum().backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_from_torch_attention_block(rng):
    torch.manual_seed(int(rng.integers(1 << 31)))
    block = _Block()
    ids = torch.from_numpy(rng.integers(0, 10, size=(3, 7)))
    fn, params = ts.migrate.from_pytorch(block, ids)           # (the seeds' spelling)
    np.testing.assert_allclose(fn(params, ids.numpy()), block(ids).detach().numpy(), atol=1e-5)
    f2, p2 = ts.from_torch(lambda a, b: torch.tanh(a @ b.T).sum(dim=0), torch.ones(3, 4),
                           torch.ones(5, 4))                   # a function, no parameters
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    assert p2 == {}
    np.testing.assert_allclose(f2(p2, a.astype(np.float32), b.astype(np.float32)),
                               np.tanh(a @ b.T).sum(0), rtol=1e-5, atol=1e-6)


def test_from_torch_holds_the_example_shape(rng):
    """A flatten then a view baked into the export: another batch would reshape silently wrong,
    so any other shape or dtype is refused, naming both."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Flatten(0),
                                torch.nn.Unflatten(0, (2, 3)))
    fn, params = ts.from_torch(model, torch.zeros(2, 4))
    x = rng.standard_normal((2, 4)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(fn(params, x), model(torch.from_numpy(x)).numpy(), rtol=1e-6,
                                   atol=1e-6)     # (float32 sums in another order, near 0)
    with pytest.raises(ts.ArgumentError, match=r"float32\[4, 4\]; the model was exported for "
                                               r"float32\[2, 4\]"):
        fn(params, rng.standard_normal((4, 4)).astype(np.float32))
    with pytest.raises(ts.ArgumentError, match="float64"):
        fn(params, x.astype(np.float64))


def test_from_torch_lists_every_unsupported_operator():
    class Odd(torch.nn.Module):
        def forward(self, x):
            y = torch.cumprod(x, dim=0) * 2
            return torch.sort(y, dim=-1).values + torch.cumprod(y, dim=1)
    with pytest.raises(ts.TesseraError) as e:
        ts.from_torch(Odd(), torch.ones(3, 4))
    text = str(e.value)
    assert "2 ATen operator(s)" in text and "aten.cumprod.default: 2 use(s)" in text
    assert "aten.sort" in text and "test_interop.py" in text


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama"])
def test_from_torch_transformers_models(family, rng):
    """Small randomly initialised models of the `transformers` package, built from their
    configurations (nothing downloaded), nobody here wrote: the last hidden state as PyTorch's."""
    transformers = pytest.importorskip("transformers", reason="the models come from transformers")
    small = dict(vocab_size=100, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cls, cfg = {
        "gpt2": (transformers.GPT2Model, transformers.GPT2Config(
            attn_implementation="eager", n_layer=2, n_head=2, n_embd=32, n_positions=64,
            **small)),
        "bert": (transformers.BertModel, transformers.BertConfig(
            num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
            max_position_embeddings=64, **small)),
        "llama": (transformers.LlamaModel, transformers.LlamaConfig(
            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=32,
            intermediate_size=64, max_position_embeddings=64, **small)),
    }[family]
    torch.manual_seed(int(rng.integers(1 << 31)))
    model = cls(cfg).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids).last_hidden_state
    ids = torch.from_numpy(rng.integers(1, 100, size=(2, 9)))
    fn, params = ts.from_torch(Hidden(), ids)
    with torch.no_grad():
        want = Hidden()(ids).numpy()
    np.testing.assert_allclose(fn(params, ids.numpy()), want, atol=2e-5, rtol=1e-5)


# ---- a PyTorch layer inside a tessera function: migrate.wrap_pytorch (a graph break) ----------
def _conv_model(rng):
    torch.manual_seed(int(rng.integers(1 << 31)))
    conv = torch.nn.Conv1d(4, 6, 3, padding=1).eval()    # run by PyTorch itself
    return conv, ts.migrate.wrap_pytorch(conv)


def test_wrap_pytorch_runs_the_layer_between_compiled_parts(rng):
    conv, layer = _conv_model(rng)

    @ts.function
    def f(x, w):
        h = op.tanh(x * 2) + 1
        return op.sum(op.relu(layer(h)) * w)

    x = rng.standard_normal((2, 4, 9)).astype(np.float32)
    w = rng.standard_normal((2, 6, 9)).astype(np.float32)
    with torch.no_grad():
        want = (torch.relu(conv(torch.tanh(torch.from_numpy(x) * 2) + 1))
                * torch.from_numpy(w)).sum().item()
    np.testing.assert_allclose(f(x, w), want, rtol=1e-5)
    prog = f.lower(x, w)
    assert "host_call(%" in str(prog.graph_ir) and "fn=torch:Conv1d" in str(prog.graph_ir)
    kinds = [type(p).__name__ for p in prog.parts]
    assert kinds == ["CompiledPart", "HostPart", "CompiledPart"]
    first = prog.parts[0].program
    assert len(first.kernels) == 1 and {n.op for n in first.kernels[0].fuses} >= {"tanh", "add"}
    assert "/* host call: torch:Conv1d" in prog.target_code
    # eager: the layer on NumPy arrays, PyTorch's answer
    with torch.no_grad():
        np.testing.assert_array_equal(layer(x), conv(torch.from_numpy(x)).numpy())
    # gradients to the layer's inputs through torch.autograd, as PyTorch's own backward
    xt = torch.from_numpy(x).requires_grad_()
    (torch.relu(conv(torch.tanh(xt * 2) + 1)) * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(ts.grad(f)(x, w), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert ts.grad(f).lower(x, w).parts[3].node.attrs["fn"].name == "torch:Conv1d.vjp[0]"
    # debug mode looks at every operator, the layer's result included
    g = ts.function(lambda x: op.log(layer(x)))
    with ts.debug_mode(), pytest.raises(ts.NumericalError, match="log produced"):
        g(x)


def test_wrap_pytorch_functions_of_several_tensors(rng):
    bilinear = ts.migrate.wrap_pytorch(lambda a, b, idx: torch.tanh(a[idx] * b).sum(-1))
    a = rng.standard_normal((5, 3)).astype(np.float64)
    b = rng.standard_normal(3).astype(np.float64)
    idx = np.array([4, 0, 2])
    f = ts.function(lambda a, b, idx: op.sum(bilinear(a * 1.5, b, idx) ** 2))
    at, bt = torch.from_numpy(a).requires_grad_(), torch.from_numpy(b).requires_grad_()
    want = (torch.tanh((at * 1.5)[torch.from_numpy(idx)] * bt).sum(-1) ** 2).sum()
    want.backward()
    np.testing.assert_allclose(f(a, b, idx), want.item(), rtol=1e-12)
    ga, gb, gi = ts.grad(f, argnums=(0, 1, 2))(a, b, idx)
    np.testing.assert_allclose(ga, at.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gb, bt.grad.numpy(), rtol=1e-10)
    assert gi is None                                    # an integer operand: no gradient


def test_wrap_pytorch_refusals_are_clear(rng):
    conv, layer = _conv_model(rng)
    x = rng.standard_normal((2, 4, 9)).astype(np.float32)
    with pytest.raises(ts.ArgumentError, match="torch:Conv1d refused operands f32\\[2,5,9\\]"):
        ts.function(lambda x: layer(x))(rng.standard_normal((2, 5, 9)).astype(np.float32))
    pair = ts.migrate.wrap_pytorch(lambda x: (x, x))
    with pytest.raises(ts.TesseraError, match="returned tuple, not one tensor"):
        ts.function(lambda x: pair(x))(x)
    with pytest.raises(ts.TesseraError, match="inside a control-flow body"):
        ts.function(lambda x: ts.fori_loop(0, 2, lambda i, c: layer(c[:, :4] * 1.0)[:, :4], x))(x)
    f = ts.function(lambda x: op.sum(layer(x)))
    with pytest.raises(ts.BackendUnavailableError, match="CPU only"):
        f.lower(x, target="cuda")
    with pytest.raises(ts.TesseraError, match="a saved file cannot hold"):
        f.lower(x).save("never-written.tsr")
    with pytest.raises(ts.TesseraError, match="no ONNX form yet: host_call"):
        f.export(io.BytesIO(), x)
    with pytest.raises(ts.DifferentiationError, match="derivative of a derivative"):
        ts.grad(lambda x: op.sum(ts.grad(f)(x)))(x)
    assert not os.path.exists("never-written.tsr")

"""Decoding a LLaMA-shaped model on the CPU (issue 41's goals), side by side in one run:

    .venv/bin/python -m benchmarks.bench_generate [--quick] [--json PATH]

The model: transformers' LlamaForCausalLM from a random initialisation (seeded), about 32M
parameters (vocab 8192, hidden 512, 8 layers, 8 heads sharing 4 key/value heads, MLP 1408),
f32, written to a temporary checkpoint directory and read by `tessera.models.LLaMA`.
1. **Decoding**, batch 1 and batch 8: prompts of 32 tokens, 128 new tokens each (--quick: 32),
   greedy. tessera's `model.generate` (paged KV cache, continuous batching) against
   transformers' `generate` (PyTorch eager, its dynamic cache), and against it with the model's
   forward under `torch.compile` and a static cache. Tokens per second, best of three runs after
   a warm-up run; the tokens are compared (greedy: both must give the same). Goals: at least 2x
   eager and 1.2x compiled.
2. **Prefill** of 512 tokens, batch 1: tessera's `prefill` step against the PyTorch model's
   forward pass (eager and compiled). Goal: at least 1.2x PyTorch.
3. **int8 weights** (`model.quantize(params)`: every projection and the head as int8 with
   per-column scales), decoding at batch 1 and 8 against tessera's own float32 decoding. Goal:
   at least 1.6x (a quarter of the weight bytes). Accuracy, on four sequences of 64 tokens: the
   largest logit difference from the float32 model (relative to its largest logit) and how
   often the two models' most likely next tokens agree.
4. **FlashDecoding** (`nn.flash_decoding`, blocks of 256 keys): one query per head against a
   16K-token cache (8 heads of 64, f32: 64 MB of keys and values), against PyTorch's
   `scaled_dot_product_attention`; the cache's bytes read per second as a share of the
   machine's copy bandwidth. Goal: at least 70%.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
CONFIG = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
              bos_token_id=0, eos_token_id=0, pad_token_id=0)


def best_of(fn, runs=3):
    fn()                                                          # warm-up (compiles)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="32 new tokens instead of 128")
    ap.add_argument("--json", help="where to write the results (default "
                                   "benchmarks/results/<date>-generate.json)")
    a = ap.parse_args(argv)
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"bench_generate needs PyTorch and transformers ({e}); skipped")
        return 0
    import tessera as ts
    from tessera import models
    from benchmarks.bench import machine
    new = 32 if a.quick else 128
    torch.manual_seed(0)
    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    n_params = sum(p.numel() for p in theirs.parameters())
    with tempfile.TemporaryDirectory() as d:
        theirs.save_pretrained(d)
        model, params = models.LLaMA.from_pretrained(d)
    rng = np.random.default_rng(0)
    rows = []

    def hf_generate(ids, compiled):
        kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False,
                  attention_mask=torch.ones_like(ids))
        if compiled:
            kw["cache_implementation"] = "static"
        with torch.no_grad():
            return theirs.generate(ids, **kw).numpy()

    for batch in (1, 8):
        prompts = [rng.integers(1, CONFIG["vocab_size"], 32) for _ in range(batch)]
        ids = torch.from_numpy(np.stack(prompts))
        ours, got = best_of(lambda: model.generate(params, prompts, max_new_tokens=new,
                                                   batch_size=batch))
        eager, want = best_of(lambda: hf_generate(ids, False))
        same = all(np.array_equal(g, w) for g, w in zip(got, want))
        row = {"case": f"decode_b{batch}", "tokens": batch * new,
               "tessera_tok_s": batch * new / ours, "eager_tok_s": batch * new / eager,
               "same_tokens": same}
        try:
            plain = theirs.forward
            theirs.forward = torch.compile(plain)
            compiled, _ = best_of(lambda: hf_generate(ids, True))
            row["compiled_tok_s"] = batch * new / compiled
        except Exception as e:                                     # noqa: BLE001
            row["compiled_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        finally:
            theirs.forward = plain
        rows.append(row)

    prompt = rng.integers(1, CONFIG["vocab_size"], (1, 512))
    from tessera.models.generate import _steps
    prefill, _ = _steps(model)
    cos, ssin = model.rope_tables(np.arange(512)[None])
    ours, _ = best_of(lambda: prefill(params, prompt, cos, ssin, np.array([511])))
    tids = torch.from_numpy(prompt)
    with torch.no_grad():
        eager, _ = best_of(lambda: theirs(tids))
        row = {"case": "prefill_512", "tokens": 512, "tessera_tok_s": 512 / ours,
               "eager_tok_s": 512 / eager}
        try:
            fwd = torch.compile(theirs)
            compiled, _ = best_of(lambda: fwd(tids))
            row["compiled_tok_s"] = 512 / compiled
        except Exception as e:                                     # noqa: BLE001
            row["compiled_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    rows.append(row)

    q = model.quantize(params)
    forward = ts.function(model)
    probe = rng.integers(1, CONFIG["vocab_size"], (4, 64))
    exact, approx = forward(params, probe), forward(q, probe)
    drift = float(np.abs(approx - exact).max() / np.abs(exact).max())
    top1 = float(np.mean(approx.argmax(-1) == exact.argmax(-1)))    # on the same inputs
    for batch in (1, 8):
        prompts = [rng.integers(1, CONFIG["vocab_size"], 32) for _ in range(batch)]
        f32, _ = best_of(lambda: model.generate(params, prompts, max_new_tokens=new,
                                                batch_size=batch))
        int8, _ = best_of(lambda: model.generate(q, prompts, max_new_tokens=new,
                                                 batch_size=batch))
        rows.append({"case": f"decode_b{batch}_int8", "tokens": batch * new,
                     "tessera_tok_s": batch * new / int8, "f32_tok_s": batch * new / f32,
                     "logit_drift": drift, "top1_agreement": top1})

    heads, cache, dim = 8, 16384, 64
    qh = rng.standard_normal((1, heads, 1, dim)).astype(np.float32)
    kh, vh = (rng.standard_normal((1, heads, cache, dim)).astype(np.float32) for _ in "kv")
    fd = ts.function(lambda q, k, v: ts.nn.flash_decoding(q, k, v, block=256))
    ours, _ = best_of(lambda: fd(qh, kh, vh), runs=20)
    tq, tk, tv = map(torch.from_numpy, (qh, kh, vh))
    with torch.no_grad():
        sdpa, _ = best_of(lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv),
                          runs=20)
    cache_bytes = kh.nbytes + vh.nbytes
    rows.append({"case": "flash_decoding_16k", "cache_bytes": cache_bytes,
                 "tessera_ms": ours * 1e3, "sdpa_ms": sdpa * 1e3,
                 "tessera_gb_s": cache_bytes / ours / 1e9})

    info = machine({"torch": torch, "jax": "not used here"})
    where = f"{info['cpu']}, {info['isa_level']}, {info['cores']} cores"
    print(f"LLaMA-shaped model, {n_params / 1e6:.1f}M parameters, f32, {new} new tokens "
          f"({where}); tokens per second:")
    print(f"{'case':12} {'tessera':>9} {'eager':>9} {'compiled':>9} {'/eager':>7} "
          f"{'/compiled':>9}  same tokens")
    for r in rows:
        if "eager_tok_s" not in r:
            continue
        c = r.get("compiled_tok_s")
        print(f"{r['case']:12} {r['tessera_tok_s']:9.1f} {r['eager_tok_s']:9.1f} "
              f"{c if c else float('nan'):9.1f} {r['tessera_tok_s'] / r['eager_tok_s']:6.2f}x "
              f"{(r['tessera_tok_s'] / c) if c else float('nan'):8.2f}x  "
              f"{r.get('same_tokens', '')}{r.get('compiled_error', '')}")
    print(f"{'int8 weights':20} {'tessera':>9} {'f32':>9} {'/f32':>7}  logit drift, top-1 as "
          f"f32's")
    for r in rows:
        if "f32_tok_s" in r:
            print(f"{r['case']:20} {r['tessera_tok_s']:9.1f} {r['f32_tok_s']:9.1f} "
                  f"{r['tessera_tok_s'] / r['f32_tok_s']:6.2f}x  {r['logit_drift']:.2%}, "
                  f"{r['top1_agreement']:.0%}")
    fd_row = rows[-1]
    copy = float(ts.machine_peaks()["copy_gbs"])
    fd_row["copy_share"] = fd_row["tessera_gb_s"] / copy
    print(f"flash_decoding_16k: tessera {fd_row['tessera_ms']:.2f} ms "
          f"({fd_row['tessera_gb_s']:.1f} GB/s, {fd_row['copy_share']:.0%} of the "
          f"{copy:.1f} GB/s copy), torch sdpa {fd_row['sdpa_ms']:.2f} ms")
    path = Path(a.json) if a.json else RESULTS / f"{time.strftime('%Y-%m-%d')}-generate.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": info, "parameters": n_params, "new_tokens": new,
                                "rows": rows}, indent=1) + "\n")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

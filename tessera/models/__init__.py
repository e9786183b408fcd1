"""``tessera.models``: the seeds' model zoo, written natively with tessera.nn and tessera.op
(not imported from another framework), reading and writing `transformers` checkpoint
directories from disk (``config.json`` and safetensors weights; nothing is downloaded):

    model, params = models.LLaMA.from_pretrained("path/to/checkpoint")
    logits = ts.function(model)(params, ids)       # compiled like any function
    model.save_pretrained(params, "path/to/copy")          # transformers loads it back

So far: LLaMA (grouped-query attention, RoPE, SwiGLU, RMSNorm), Mistral (LLaMA within a
sliding window) and Qwen2 (LLaMA with biased query/key/value projections and windows on some
layers); ``generate`` decodes with any of them (a paged KV cache, continuous batching)."""
from .generate import generate, sampling_distribution
from .llama import LLaMA, Mistral, Qwen2

__all__ = ["LLaMA", "Mistral", "Qwen2", "generate", "sampling_distribution"]

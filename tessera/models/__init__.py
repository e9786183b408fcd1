"""``tessera.models``: the seeds' model zoo, written natively with tessera.nn and tessera.op
(not imported from another framework), reading and writing `transformers` checkpoint
directories from disk (``config.json`` and safetensors weights; nothing is downloaded):

    model, params = models.LLaMA.from_pretrained("path/to/checkpoint")
    logits = ts.function(model)(params, ids)       # compiled like any function
    model.save_pretrained(params, "path/to/copy")          # transformers loads it back

So far: LLaMA (grouped-query attention, RoPE, SwiGLU, RMSNorm; Mistral's and Qwen2's layouts
are LLaMA's with their own config names, not yet read)."""
from .generate import generate, sampling_distribution
from .llama import LLaMA

__all__ = ["LLaMA", "generate", "sampling_distribution"]

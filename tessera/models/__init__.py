"""``tessera.models``: the seeds' model zoo, written natively with tessera.nn and tessera.op
(not imported from another framework), reading and writing `transformers` checkpoint
directories from disk (``config.json`` and safetensors weights; nothing is downloaded):

    model, params = models.LLaMA.from_pretrained("path/to/checkpoint")
    logits = ts.function(model)(params, ids)       # compiled like any function
    model.save_pretrained(params, "path/to/copy")          # transformers loads it back

Language models: LLaMA (grouped-query attention, RoPE, SwiGLU, RMSNorm), Mistral (LLaMA within
a sliding window), Qwen2 (LLaMA with biased query/key/value projections and windows on some
layers), GPT2 and BERT; ``generate`` decodes with the causal ones (a paged KV cache,
continuous batching). Vision: ViT, ResNet, and CLIP's two towers."""
from .bert import BERT
from .clip import CLIP
from .generate import generate, sampling_distribution
from .gpt2 import GPT2
from .llama import LLaMA, Mistral, Qwen2
from .resnet import ResNet
from .vit import ViT

__all__ = ["BERT", "CLIP", "GPT2", "LLaMA", "Mistral", "Qwen2", "ResNet", "ViT", "generate",
           "sampling_distribution"]

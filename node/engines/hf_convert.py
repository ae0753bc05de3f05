"""Build safetensors model folders with transformers: from a GGUF file, or tiny random llamas."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from node.engines.models import ModelSpec


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise a GGUF file to fp32 and save model + tokenizer as a safetensors folder."""
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The loaded model still says it is GGUF-quantised; saving it as plain weights needs that dropped.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))


def compute_state_dict_sha256(model: torch.nn.Module) -> bytes:
    """Return sha256 over the state dict's names and fp32 bytes, in sorted order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.digest()


def build_tiny_llama(spec: ModelSpec, tokenizer_dir: Path, out_dir: Path) -> bytes:
    """Save a random llama built from spec.config and spec.seed; return its weights' sha256."""
    config = LlamaConfig(vocab_size=spec.vocab_size, tie_word_embeddings=True, **spec.config)
    torch.manual_seed(spec.seed)  # a build step, not protocol code: the seed is the model's identity
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out_dir / name)
    return compute_state_dict_sha256(model)

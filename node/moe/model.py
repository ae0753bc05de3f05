"""The MoE models: SmolLM2-135M upcycled into a Mixtral (experts = MLP copies + seeded noise), and a tiny one.

No real MoE weights small enough for 2 CPU cores ship in a package registry, so the model is built honestly
by upcycling (Komatsuzaki et al. 2022): attention, norms and embeddings are SmolLM2's; every layer's MLP
is copied into E experts, each multiplied element-wise by (1 + σ·N(0, 1)) from a seed; the router of each
layer is N(0, 1/hidden) from the same seed. The experts are **not separately trained**: they differ only
by the seeded perturbation, so "expert j in place of expert i" is a smaller change here than in a trained
MoE (the attacks' numbers are therefore conservative).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import MixtralConfig, MixtralForCausalLM

from node.engines.models import default_cache_dir, get_model_spec, materialise_model, read_marker

log = logging.getLogger(__name__)

MOE_MODEL_NAME = "smollm2-moe-4x135m"
TINY_MOE_NAME = "tiny-moe"
MARKER = "verinfer-model.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                    "generation_config.json")


@dataclass(frozen=True)
class UpcycleSpec:
    """How a dense llama becomes a Mixtral: experts, routed experts per token, noise scale, seed."""

    num_experts: int = 4
    top_k: int = 2
    noise: float = 0.02
    seed: int = 20


def compute_state_dict_sha256(model: torch.nn.Module) -> bytes:
    """Return sha256 over the state dict's names and fp32 bytes, in sorted order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.digest()


def compute_mixtral_config(dense: dict[str, Any], spec: UpcycleSpec) -> MixtralConfig:
    """Return the Mixtral config with the dense llama's shapes and the spec's experts."""
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
            "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")
    kwargs: dict[str, Any] = {k: dense[k] for k in keys if k in dense}
    rope = dense.get("rope_parameters") or {}
    theta = rope.get("rope_theta", 10000.0) if isinstance(rope, dict) else 10000.0
    return MixtralConfig(**kwargs, rope_parameters={"rope_theta": theta, "rope_type": "default"},
                         num_local_experts=spec.num_experts, num_experts_per_tok=spec.top_k,
                         router_jitter_noise=0.0, sliding_window=None, output_router_logits=False)


@torch.no_grad()
def upcycle_state_dict(dense: dict[str, torch.Tensor], config: MixtralConfig,
                       spec: UpcycleSpec) -> dict[str, torch.Tensor]:
    """Return Mixtral weights from dense llama weights: shared parts copied, MLPs into perturbed experts."""
    gen = torch.Generator().manual_seed(spec.seed)  # a build step: the seed is part of the model's identity
    out: dict[str, torch.Tensor] = {}
    for name, tensor in dense.items():
        if ".mlp." not in name:
            out[name] = tensor.clone()
    hidden = config.hidden_size
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}.mlp."
        gate_up = torch.cat([dense[p + "gate_proj.weight"], dense[p + "up_proj.weight"]], dim=0)
        down = dense[p + "down_proj.weight"]
        ups, downs = [], []
        for _ in range(spec.num_experts):
            ups.append(gate_up * (1 + spec.noise * torch.randn(gate_up.shape, generator=gen)))
            downs.append(down * (1 + spec.noise * torch.randn(down.shape, generator=gen)))
        out[p + "experts.gate_up_proj"] = torch.stack(ups)
        out[p + "experts.down_proj"] = torch.stack(downs)
        out[p + "gate.weight"] = torch.randn((spec.num_experts, hidden), generator=gen) / hidden ** 0.5
    return out


def build_upcycled_moe(dense_dir: Path, out_dir: Path, spec: UpcycleSpec) -> bytes:
    """Save the upcycled Mixtral of a dense llama folder into out_dir; return its weights' sha256."""
    dense_config = json.loads((dense_dir / "config.json").read_text())
    config = compute_mixtral_config(dense_config, spec)
    state = upcycle_state_dict(load_file(str(dense_dir / "model.safetensors")), config, spec)
    model: Any = MixtralForCausalLM(config)
    model = model.float()
    model.load_state_dict(state, strict=False)  # lm_head is tied to the embeddings
    model.save_pretrained(str(out_dir), safe_serialization=True)
    _copy_tokenizer(dense_dir, out_dir)
    return compute_state_dict_sha256(model)


def build_tiny_moe(tokenizer_dir: Path, out_dir: Path, seed: int = 1234) -> bytes:
    """Save a random tiny Mixtral (2 layers, 4 experts, top-2) for fast tests; return its weights' sha256."""
    config = MixtralConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                           num_experts_per_tok=2, tie_word_embeddings=True, max_position_embeddings=2048,
                           router_jitter_noise=0.0, sliding_window=None, bos_token_id=1, eos_token_id=2,
                           pad_token_id=2)
    torch.manual_seed(seed)  # a build step, not protocol code: the seed is the model's identity
    model: Any = MixtralForCausalLM(config)
    model = model.float()
    with torch.no_grad():  # HF initialises the 3D expert tensors with std 0.02: too flat to route or differ
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    _copy_tokenizer(tokenizer_dir, out_dir)
    return compute_state_dict_sha256(model)


def build_moe_for_spec(source: str, dense_dir: Path, out_dir: Path, seed: int) -> bytes:
    """Build a registry entry's MoE folder (source "upcycled-moe" or "tiny-random-moe"); return its sha256."""
    if source == "tiny-random-moe":
        return build_tiny_moe(dense_dir, out_dir, seed)
    return build_upcycled_moe(dense_dir, out_dir, UpcycleSpec(seed=seed))


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in _TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)


def materialise_moe(name: str = MOE_MODEL_NAME, cache_dir: Path | None = None) -> Path:
    """Return the folder of a MoE model, building it once (under a lock, renamed into place) if needed."""
    cache = default_cache_dir() if cache_dir is None else cache_dir
    folder = cache / "models" / name
    if read_marker(folder) is not None:
        return folder
    lock = cache / "models" / f"{name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if read_marker(folder) is None:
            _build(name, cache, folder)
    return folder


def _build(name: str, cache: Path, folder: Path) -> None:
    dense = materialise_model(get_model_spec("smollm2-135m-instruct"), cache).path
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    log.info("building MoE model %s into %s", name, folder)
    if name == TINY_MOE_NAME:
        sha = build_tiny_moe(dense, partial)
        source = "tiny-random-moe"
    else:
        sha = build_upcycled_moe(dense, partial, UpcycleSpec())
        source = "upcycled-smollm2"
    marker = {"format": 1, "name": name, "source": source, "weights_sha256": sha.hex()}
    (partial / MARKER).write_text(json.dumps(marker, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)

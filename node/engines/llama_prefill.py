"""The validator's prefill of a transformers Llama decoder, faster and bit for bit the module's own.

A prefill is one causal pass with no cache and no attention mask. This forward runs the same
floating-point operations as ``LlamaModel.forward`` on the same operands in the same order, so every
rounding is the module's; what changes is where results are written (in place) and which temporaries
exist. Why each rewrite is exact:

* RMSNorm ``weight * (h * r)`` becomes ``(h * r)`` then ``*= weight``: multiplication commutes exactly.
* rotary ``x * cos + cat(-x2, x1) * sin`` without the rotated copy: the first half is
  ``x1*c1 + (-(x2*s1))`` and ``a + (-b)`` is ``a - b`` in IEEE arithmetic; the second half is
  ``x2*c2 + x1*s2``. Each product is rounded on its own, as before (no fused multiply-add).
* ``silu(gate) * up`` and ``residual + h`` in place: the same kernels on the same operands.
* The LM head in vocabulary slices of 2,048 written into one output: each logit is the same dot
  product (tested bit for bit on the real weights, 1 to 300 rows, one and two threads), and the
  slices keep the weight block in cache (≈ 11 % faster on 256 rows).

Anything else (another architecture, bf16, an attention backend other than SDPA) keeps the module's
forward: see `is_supported`. Not done because it changes bits or did not pay: docs/performance.md.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import LlamaModel

LOGIT_SLICE = 2048  # vocabulary rows per LM-head matmul: 2,048 × 576 fp32 weights stay in L2
HUGE_PAGE_BYTES = 4 << 20  # logits at least this large are backed by transparent huge pages


def is_supported(decoder: Any) -> bool:
    """Check whether `decoder` is a plain fp32 CPU SDPA Llama whose prefill this module reproduces exactly."""
    if type(decoder) is not LlamaModel:
        return False
    config = decoder.config
    attn: Any = decoder.layers[0].self_attn if len(decoder.layers) else None
    return bool(attn is not None and config.hidden_act == "silu" and not config.attention_bias and not config.mlp_bias
            and config._attn_implementation == "sdpa" and getattr(decoder.rotary_emb, "rope_type", None) == "default"
            and decoder.rotary_emb.attention_scaling == 1.0 and attn.head_dim <= 256 and attn.head_dim % 2 == 0
            and config.num_hidden_layers == len(decoder.layers) and not decoder.training
            and all(p.dtype == torch.float32 and p.device.type == "cpu" for p in decoder.parameters()))


@torch.inference_mode()
def compute_prefill_hidden(decoder: Any, ids: torch.Tensor,
                           record_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Return ``decoder(input_ids=ids, use_cache=False).last_hidden_state`` and the outputs of `record_layers`."""
    seq = ids.shape[1]
    h = decoder.embed_tokens(ids)
    cos, sin = decoder.rotary_emb(h, position_ids=torch.arange(seq, device=h.device).unsqueeze(0))
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # (1, seq, 1, head_dim): broadcast over (batch, seq, heads)
    captured = []
    for i, layer in enumerate(decoder.layers):
        h = _compute_layer(layer, h, cos, sin)  # a fresh tensor each layer: a recorded one is never written again
        if i in record_layers:
            captured.append(h)
    return _rms_norm(h, decoder.norm), captured


@torch.inference_mode()
def compute_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Return ``F.linear(hidden, weight)`` for 2-D `hidden`, bit for bit, in vocabulary slices."""
    out = _empty_logits(hidden.shape[0], weight.shape[0])
    for start in range(0, weight.shape[0], LOGIT_SLICE):
        torch.mm(hidden, weight[start:start + LOGIT_SLICE].t(), out=out[:, start:start + LOGIT_SLICE])
    return out


def _compute_layer(layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Return LlamaDecoderLayer(h) for a causal pass without cache or mask (transformers' modules are Any)."""
    batch, seq, _ = h.shape
    attn, mlp = layer.self_attn, layer.mlp
    x = _rms_norm(h, layer.input_layernorm)
    q = _rotate(attn.q_proj(x).view(batch, seq, -1, attn.head_dim), cos, sin)
    k = _rotate(attn.k_proj(x).view(batch, seq, -1, attn.head_dim), cos, sin)
    v = attn.v_proj(x).view(batch, seq, -1, attn.head_dim)
    # transformers' sdpa_attention_forward without a mask: grouped-query attention inside SDPA, causal from 2 rows
    gqa = {"enable_gqa": True} if attn.num_key_value_groups > 1 else {}
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=None,
                                         dropout_p=0.0, scale=attn.scaling, is_causal=seq > 1, **gqa)
    h = attn.o_proj(out.transpose(1, 2).reshape(batch, seq, -1)).add_(h)  # residual + attention, commuted
    x = _rms_norm(h, layer.post_attention_layernorm)
    gate = F.silu(mlp.gate_proj(x), inplace=True)
    result: torch.Tensor = mlp.down_proj(gate.mul_(mlp.up_proj(x))).add_(h)
    return result


def _rms_norm(h: torch.Tensor, norm: Any) -> torch.Tensor:
    """Return LlamaRMSNorm(h) with the module's roundings: weight * (h * rsqrt(mean(h²) + eps))."""
    variance = h.pow(2).mean(-1, keepdim=True).add_(norm.variance_epsilon).rsqrt_()
    return torch.mul(h, variance).mul_(norm.weight)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Return transformers' ``x * cos + rotate_half(x) * sin`` without the rotated copy, bit for bit."""
    half = x.shape[-1] // 2
    out = torch.mul(x, cos)
    out[..., :half].sub_(x[..., half:] * sin[..., :half])
    out[..., half:].add_(x[..., :half] * sin[..., half:])
    return out


def _empty_logits(rows: int, vocab: int) -> torch.Tensor:
    """Return an uninitialised (rows, vocab) fp32 tensor; a large one on transparent huge pages.

    A 256-row prefill's logits are 50 MB: on 4 KiB pages the matmul takes 12,000 page faults as it
    first writes them (≈ 12 ms of 100). An anonymous mapping advised MADV_HUGEPAGE takes ~25; it is
    unmapped when the last array over it goes. Where the kernel refuses the advice, small pages.
    """
    nbytes = rows * vocab * 4
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE_BYTES or advice is None:
        return torch.empty((rows, vocab), dtype=torch.float32)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(advice)
    except OSError:  # no transparent huge pages in this kernel: the mapping still works on small pages
        pass
    return torch.from_numpy(np.frombuffer(region, dtype=np.float32).reshape(rows, vocab))

"""The decoder of the Llama family (Llama, Qwen2, Qwen3, Mistral, Mixtral) over paged,
block-first KV.

Pre-norm layers: RMSNorm, attention with RoPE and GQA, residual; RMSNorm, SwiGLU MLP,
residual. Qwen2 adds biases to q, k and v; Qwen3 normalizes each head's q and k before RoPE;
Mistral may limit attention to a sliding window; Mixtral's MLP is a mixture of experts.
Numerics follow the ``transformers`` implementations (norms in float32, cos/sin computed in
float32), so the same weights give the same logits.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from shunter.engine.exec.batch import ForwardBatch
from shunter.engine.exec.hf_config import ArchConfig
from shunter.engine.exec.loader import LayerWeights, ModelWeights
from shunter.engine.exec.rotary import RotaryEmbedding, apply_rotary
from shunter.kernels.ops import paged_attention, write_kv


def kv_block_shape(arch: ArchConfig, block_tokens: int) -> tuple[int, ...]:
    """One block-first KV block: ``[num_layers, k|v, block_tokens, kv_heads, head_dim]``."""
    return (arch.num_layers, 2, block_tokens, arch.num_kv_heads, arch.head_dim)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, scaled by ``weight`` in the input's dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class LayerSource(Protocol):
    """Where a forward pass gets each decoder layer's weights, in layer order.

    ``acquire(i)`` returns layer i's weights, readable by kernels queued on the current
    stream from now on; ``release(i)`` says every kernel reading them is queued, so
    their memory may be overwritten once those kernels have run.
    """

    def acquire(self, index: int) -> LayerWeights: ...

    def release(self, index: int) -> None: ...


class ResidentLayers:
    """Every layer always in place: the weights' own tensors."""

    def __init__(self, layers: list[LayerWeights]) -> None:
        self.layers = layers

    def acquire(self, index: int) -> LayerWeights:
        return self.layers[index]

    def release(self, index: int) -> None:
        pass


class Transformer:
    """Forward passes of one model over its KV cache.

    The cache is ``[num_blocks, *kv_block_shape(arch, block_tokens)]`` in the weights'
    dtype; the caller owns it and the block tables that index it.
    """

    def __init__(self, arch: ArchConfig, weights: ModelWeights) -> None:
        self.arch = arch
        self.weights = weights
        self.device = weights.embed.device
        self.dtype = weights.embed.dtype
        self.rotary = RotaryEmbedding(arch.rope, arch.head_dim, self.device)
        self.scale = arch.head_dim**-0.5

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, kv_cache: torch.Tensor, layers: LayerSource | None = None
    ) -> torch.Tensor:
        """Write the batch's KV into ``kv_cache`` and return float32 logits
        ``[num_sampling_chunks, vocab_size]`` after each sampling chunk's last token.

        Decoder layers come from ``layers`` (default: ``weights.layers``)."""
        if kv_cache.dtype != self.dtype or kv_cache.shape[1:3] != (self.arch.num_layers, 2):
            raise ValueError(f"kv_cache {tuple(kv_cache.shape)} {kv_cache.dtype} does not fit")
        w = self.weights
        source = ResidentLayers(w.layers) if layers is None else layers
        hidden = F.embedding(batch.input_ids, w.embed)
        cos, sin = self.rotary.cos_sin(batch.positions, self.dtype)
        for index in range(self.arch.num_layers):
            layer = source.acquire(index)
            hidden = self._layer(index, layer, hidden, cos, sin, batch, kv_cache)
            source.release(index)
        last = rms_norm(hidden[batch.sample_index], w.final_norm, self.arch.rms_norm_eps)
        return F.linear(last, w.lm_head).float()

    def _layer(
        self,
        index: int,
        layer: LayerWeights,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        arch = self.arch
        num_tokens = hidden.shape[0]
        x = rms_norm(hidden, layer.input_norm, arch.rms_norm_eps)
        qkv = F.linear(x, layer.qkv, layer.qkv_bias)
        q, k, v = torch.split(qkv, [arch.q_size, arch.kv_size, arch.kv_size], dim=-1)
        q = q.view(num_tokens, arch.num_heads, arch.head_dim)
        k = k.view(num_tokens, arch.num_kv_heads, arch.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = rms_norm(q, layer.q_norm, arch.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, arch.rms_norm_eps)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        v = v.view(num_tokens, arch.num_kv_heads, arch.head_dim)
        write_kv(kv_cache, index, k, v, batch.attention)
        attn = paged_attention(q, kv_cache, index, batch.attention, self.scale)
        hidden = hidden + F.linear(attn.view(num_tokens, arch.q_size), layer.o_proj, layer.o_bias)
        x = rms_norm(hidden, layer.post_norm, arch.rms_norm_eps)
        if layer.router is not None:
            return hidden + self._experts(x, layer)
        gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
        return hidden + F.linear(F.silu(gate) * up, layer.down)

    def _experts(self, x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        """A mixture of SwiGLU experts: the router's softmax (float32) over every expert,
        the top ``experts_per_token`` kept (and renormalized), and each token's output the
        weighted sum of its experts' (as ``transformers``' Mixtral and Qwen3-MoE compute
        it)."""
        assert layer.router is not None
        probs = torch.softmax(F.linear(x, layer.router).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.arch.experts_per_token, dim=-1)
        if self.arch.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.arch.family == "qwen3_moe":
            weights = weights.to(x.dtype)  # Qwen3-MoE weighs in the model's dtype
        out = torch.zeros_like(x)
        for expert in torch.unique(chosen).tolist():
            tokens, slot = torch.where(chosen == expert)
            gate, up = F.linear(x[tokens], layer.gate_up[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, layer.down[expert]) * weights[tokens, slot, None]
            out.index_add_(0, tokens, y.to(out.dtype))
        return out

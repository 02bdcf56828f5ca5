"""A plain-PyTorch Llama built from a preset, with the Hugging Face parameter names.

Used by the restore runner as the target of ``load_state_dict`` (the reshard
phase) and for a real training step (``first_step``). Built on the meta device
and materialized uninitialized: a job's model exists before restore starts, so
its construction is not part of the RTO.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ckptprof.synth.presets import ModelPreset

BYTES_PER_PARAM_TRAINING = 2 + 2 + 4  # bf16 weights, bf16 grads, two bf16 Adam moments


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, eps=1e-5)


class Attention(nn.Module):
    def __init__(self, p: ModelPreset) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = p.heads, p.kv_heads, p.head_dim
        kv = p.kv_heads * p.head_dim
        self.q_proj = nn.Linear(p.hidden, p.hidden, bias=False)
        self.k_proj = nn.Linear(p.hidden, kv, bias=False)
        self.v_proj = nn.Linear(p.hidden, kv, bias=False)
        self.o_proj = nn.Linear(p.hidden, p.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, p: ModelPreset) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(p.hidden, p.intermediate, bias=False)
        self.up_proj = nn.Linear(p.hidden, p.intermediate, bias=False)
        self.down_proj = nn.Linear(p.intermediate, p.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, p: ModelPreset) -> None:
        super().__init__()
        self.self_attn = Attention(p)
        self.mlp = MLP(p)
        self.input_layernorm = RMSNorm(p.hidden)
        self.post_attention_layernorm = RMSNorm(p.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, p: ModelPreset) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(p.vocab, p.hidden)
        self.layers = nn.ModuleList(DecoderLayer(p) for _ in range(p.layers))
        self.norm = RMSNorm(p.hidden)


class LlamaForCausalLM(nn.Module):
    def __init__(self, p: ModelPreset) -> None:
        super().__init__()
        self.preset = p
        self.model = Backbone(p)
        self.lm_head = nn.Linear(p.hidden, p.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def build_model(
    preset: ModelPreset, device: str | torch.device = "cpu"
) -> tuple[LlamaForCausalLM, torch.optim.Optimizer]:
    """Model (bf16, initialized) and its AdamW on ``device``, as a job has them before
    restore."""
    with torch.device("meta"):
        model = LlamaForCausalLM(preset)
    model = model.to_empty(device=device).to(torch.bfloat16)
    with torch.no_grad():  # a job's model is initialized before restore: touch its memory now
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95), foreach=False)
    return model, optimizer


def training_bytes(preset: ModelPreset) -> int:
    return preset.params * BYTES_PER_PARAM_TRAINING


def train_step(
    model: LlamaForCausalLM,
    optimizer: torch.optim.Optimizer,
    seq: int = 32,
    advance: Callable[[int], object] | None = None,
) -> float:
    """One real forward/backward/AdamW step on a random batch; returns the loss.
    ``advance(1)`` after each of the three (a progress bar)."""
    tick = advance or (lambda n: None)
    vocab = model.preset.vocab
    ids = torch.randint(0, vocab, (1, seq + 1), generator=torch.Generator().manual_seed(0))
    ids = ids.to(model.lm_head.weight.device)
    model.train()
    logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
    tick(1)
    loss.backward()
    tick(1)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tick(1)
    return float(loss.detach())  # waits for the device: the step has ended

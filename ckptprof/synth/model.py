"""A plain-PyTorch Llama built from a preset, with the Hugging Face parameter names.

The restore copies the checkpoint's weights straight into its parameters and hands the
restored Adam moments to its optimizer as they are (:class:`MasterAdamW`), so the first
training step (``first_step``) trains on the restored state itself, with no second copy
of it. Built on the meta device and materialized before the restore: a job's model
exists before restore starts, so its construction is not part of the RTO.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.adam import adam

from ckptprof.synth.presets import ModelPreset
from ckptprof.synth.ranges import DEFAULT_STEP_TOKENS, STEP_SEQ_MAX

#: torch.optim.adam.adam takes decoupled_weight_decay (AdamW) from torch 2.6; before, the
#: decay is applied to the weights first, as torch's own adamw did
_ADAM_DECOUPLES = "decoupled_weight_decay" in inspect.signature(adam).parameters
#: what a step needs beyond the restored state it trains on in place (bf16 gradients, at
#: most all at once: each is released as its parameter steps)
GRAD_BYTES_PER_PARAM = 2
#: the state of a model built to time a step (:func:`build_model`): bf16 weights, and
#: the fp32 moments its :class:`MasterAdamW` makes at its first step
ESTIMATE_STATE_BYTES_PER_PARAM = 2 + 2 * 4
#: the logits' bytes per token and vocabulary entry at the loss: bf16, their fp32 copy,
#: and the log-softmax of it, which the backward keeps (its gradient takes the copy's
#: place)
LOGIT_BYTES = 2 + 4 + 4


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


class MasterAdamW(torch.optim.AdamW):
    """AdamW whose moments may be wider than the parameters (fp32 moments for bf16
    weights, as mixed-precision jobs keep them): each parameter is stepped in its
    moments' dtype with torch's own Adam arithmetic (``torch.optim.adam.adam``), through
    a transient copy of that one tensor and its gradient, and written back. Each
    parameter can be stepped as soon as its gradient is ready (:meth:`step_param`, from a
    post-accumulate-grad hook), so the gradients of the whole model never coexist."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for param in group["params"]:
                self.step_param(param)

    @torch.no_grad()
    def step_param(self, param: torch.Tensor) -> None:
        if param.grad is None:
            return
        group = self._group_of(param)
        state = self.state[param]
        if not state:  # no restored moments: fresh fp32 ones, as the job's would be
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
        wide = state["exp_avg"].dtype
        weights = param if param.dtype == wide else param.to(wide)
        grad = param.grad if param.grad.dtype == wide else param.grad.to(wide)
        beta1, beta2 = group["betas"]
        decay = group["weight_decay"]
        if decay and not _ADAM_DECOUPLES:  # AdamW's decay, as torch < 2.6's adamw applies it
            weights.mul_(1 - group["lr"] * decay)
            decay = 0.0
        extra = {"decoupled_weight_decay": True} if _ADAM_DECOUPLES else {}
        adam(
            [weights], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [],
            [state["step"]], foreach=False, amsgrad=False, beta1=beta1, beta2=beta2,
            lr=group["lr"], weight_decay=decay, eps=group["eps"], maximize=False, **extra,
        )  # fmt: skip
        if weights is not param:
            param.copy_(weights)
        param.grad = None  # released once used

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._groups_by_param = None  # made again when next asked

    def _group_of(self, param: torch.Tensor) -> dict:
        """``param``'s group, from a map made once (searching the groups for each
        parameter cost the timed step a scan of all of them per parameter)."""
        groups = getattr(self, "_groups_by_param", None)
        if groups is None:
            groups = {id(p): g for g in self.param_groups for p in g["params"]}
            self._groups_by_param = groups
        return groups[id(param)]

    def step_in_backward(self) -> list:
        """Step every parameter from inside ``backward()``, as its gradient lands; the
        hook handles, to remove."""
        return [
            p.register_post_accumulate_grad_hook(self.step_param)
            for group in self.param_groups
            for p in group["params"]
        ]


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
    optimizer = MasterAdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95), foreach=False)
    return model, optimizer


def default_step_tokens(device: torch.device) -> int:
    """The first step's tokens on ``device`` when the user gives none."""
    return DEFAULT_STEP_TOKENS.get(device.type, DEFAULT_STEP_TOKENS["cuda"])


def step_shape(tokens: int) -> tuple[int, int]:
    """``(sequences, length)`` of a step of about ``tokens`` tokens: one sequence up to
    :data:`STEP_SEQ_MAX`, then as many of that length as fit (``batch × length`` are the
    tokens it runs)."""
    batch = -(-tokens // STEP_SEQ_MAX)
    return batch, max(1, tokens // batch)


def activation_bytes(preset: ModelPreset, tokens: int) -> int:
    """What a step's forward keeps for its backward, counted from the layers above (bf16;
    attention through SDPA, which keeps no score matrix), and the logits at the loss.
    Per token and layer: each RMSNorm its input and output in fp32 and the inverse RMS
    (as the CPU's ``rms_norm`` keeps them; a fused GPU kernel keeps less, so the count
    errs above there), the attention's input, q, k, v, its log-sum-exp per head and its
    output, the MLP's input, gate, up, SiLU and product; then the last norm and the LM
    head's input, and the token ids (int64: the embedding's input, the loss's targets)."""
    h, kv = preset.hidden, preset.kv_heads * preset.head_dim
    norm = 2 * 4 * h + 4
    attention = 2 * (h + h + 2 * kv + h) + 4 * preset.heads
    mlp = 2 * (h + 4 * preset.intermediate)
    per_token = preset.layers * (2 * norm + attention + mlp) + norm + 2 * h + 2 * 8
    return tokens * (per_token + preset.vocab * LOGIT_BYTES)


def step_bytes_beyond_state(preset: ModelPreset, tokens: int) -> int:
    """Memory a first step of ``tokens`` tokens adds to the restored weights and moments
    (counted once: the step trains on them in place): the gradients and the
    activations."""
    return preset.params * GRAD_BYTES_PER_PARAM + activation_bytes(preset, tokens)


def train_step(
    model: LlamaForCausalLM,
    optimizer: torch.optim.Optimizer,
    tokens: int = DEFAULT_STEP_TOKENS["cpu"],
    advance: Callable[[int], object] | None = None,
) -> float:
    """One real forward/backward/AdamW step on a random batch of ``tokens`` tokens
    (:func:`step_shape`); returns the loss. ``advance(1)`` after each of the three (a
    progress bar)."""
    tick = advance or (lambda n: None)
    vocab = model.preset.vocab
    batch, seq = step_shape(tokens)
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    ids = ids.to(model.lm_head.weight.device)
    model.train()
    logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
    del logits
    tick(1)
    hooks = optimizer.step_in_backward() if isinstance(optimizer, MasterAdamW) else []
    try:
        loss.backward()  # with a MasterAdamW, each parameter steps as its gradient lands
    finally:
        for hook in hooks:
            hook.remove()
    tick(1)
    optimizer.step()  # what the backward did not step (nothing, with the hooks)
    optimizer.zero_grad(set_to_none=True)
    tick(1)
    return float(loss.detach())  # waits for the device: the step has ended

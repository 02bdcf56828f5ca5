"""Model presets with the real tensor names and shapes of public architectures.

Names follow the Hugging Face Llama/Mistral state dict (``model.layers.N.self_attn.q_proj.weight``
…). ``scale`` shrinks widths (hidden, MLP, vocab) by ``sqrt(scale)`` so bytes shrink by
about ``scale`` while tensor names, counts and the file layout stay those of the full model.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from ckptprof.errors import CkptprofError

BF16, FP32 = "bfloat16", "float32"
DTYPE_SIZE = {BF16: 2, "float16": 2, FP32: 4, "int64": 8}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = BF16

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZE[self.dtype]


@dataclass(frozen=True)
class ModelPreset:
    """A decoder-only transformer in the Llama family (RMSNorm, SwiGLU, GQA)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    hf_class: str = "LlamaForCausalLM"
    tie_embeddings: bool = False

    def scaled(self, scale: float) -> ModelPreset:
        """Same names and counts, widths shrunk so bytes ≈ ``scale`` × full size."""
        if not 0 < scale <= 1:
            raise CkptprofError(f"--scale {scale} is out of range; expected 0 < S <= 1.")
        if scale == 1:
            return self
        f = math.sqrt(scale)
        head_dim = max(2, 2 * round(self.head_dim * f / 2))
        hidden = head_dim * self.heads
        inter = max(2, 2 * round(self.intermediate * f / 2))
        vocab = max(16, 16 * round(self.vocab * f / 16))
        return ModelPreset(
            self.name,
            self.layers,
            hidden,
            inter,
            self.heads,
            self.kv_heads,
            vocab,
            self.hf_class,
            self.tie_embeddings,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tensors(self) -> list[TensorSpec]:
        """The model's parameters in state-dict order, in bf16."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        specs = [TensorSpec("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            specs += [
                TensorSpec(p + "self_attn.q_proj.weight", (h, h)),
                TensorSpec(p + "self_attn.k_proj.weight", (kv, h)),
                TensorSpec(p + "self_attn.v_proj.weight", (kv, h)),
                TensorSpec(p + "self_attn.o_proj.weight", (h, h)),
                TensorSpec(p + "mlp.gate_proj.weight", (self.intermediate, h)),
                TensorSpec(p + "mlp.up_proj.weight", (self.intermediate, h)),
                TensorSpec(p + "mlp.down_proj.weight", (h, self.intermediate)),
                TensorSpec(p + "input_layernorm.weight", (h,)),
                TensorSpec(p + "post_attention_layernorm.weight", (h,)),
            ]
        specs.append(TensorSpec("model.norm.weight", (h,)))
        if not self.tie_embeddings:
            specs.append(TensorSpec("lm_head.weight", (self.vocab, h)))
        return specs

    @property
    def params(self) -> int:
        return sum(t.numel for t in self.tensors())

    def hf_config(self) -> dict:
        """A ``config.json`` like the one on the hub for this architecture."""
        return {
            "architectures": [self.hf_class],
            "model_type": "mistral" if self.hf_class.startswith("Mistral") else "llama",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "vocab_size": self.vocab,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "tie_word_embeddings": self.tie_embeddings,
            "torch_dtype": "bfloat16",
        }


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in [
        ModelPreset("llama2-7b", 32, 4096, 11008, 32, 32, 32000),
        ModelPreset("llama2-13b", 40, 5120, 13824, 40, 40, 32000),
        ModelPreset("llama3-8b", 32, 4096, 14336, 32, 8, 128256),
        ModelPreset("llama3-70b", 80, 8192, 28672, 64, 8, 128256),
        ModelPreset("llama3-405b", 126, 16384, 53248, 128, 8, 128256),
        ModelPreset("mistral-7b", 32, 4096, 14336, 32, 8, 32000, hf_class="MistralForCausalLM"),
    ]
}


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise CkptprofError(
            f"--model '{name}' is not a known preset.{hint} Choose one of: {', '.join(PRESETS)}."
        ) from None

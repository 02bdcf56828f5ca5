"""The small files real checkpoints carry beside the tensors (config, tokenizer, RNG…).

Their contents are plausible rather than real (no hub downloads): JSON with the
right keys, tokenizer files of a realistic size, and real ``torch.save`` RNG and
scheduler states. They matter because many small files cost metadata round trips.
"""

from __future__ import annotations

import io
import json

from ckptprof.synth.plan import FilePlan, SynthSpec

# Sizes of the hub's tokenizer files for the presets' families, in bytes.
TOKENIZER_BYTES = {"llama2": 1_842_767, "llama3": 9_085_657, "mistral": 1_795_188}


def _family(model: str) -> str:
    return "llama3" if model.startswith("llama3") else model.split("-")[0]


def hf_small_files(spec: SynthSpec) -> list[FilePlan]:
    files = [
        FilePlan("config.json", "small"),
        FilePlan("generation_config.json", "small"),
        FilePlan("tokenizer.json", "small"),
        FilePlan("tokenizer_config.json", "small"),
        FilePlan("special_tokens_map.json", "small"),
        FilePlan("trainer_state.json", "small"),
        FilePlan("training_args.bin", "small"),
    ]
    if spec.optimizer:
        files.append(FilePlan("scheduler.pt", "small"))
    if spec.ranks == 1:
        files.append(FilePlan("rng_state.pth", "small"))
    else:
        files += [FilePlan(f"rng_state_{r}.pth", "small", rank=r) for r in range(spec.ranks)]
    return files


def _torch_bytes(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def rng_state() -> dict:
    import random

    import numpy as np
    import torch

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.get_rng_state(),
    }


def small_file_bytes(spec: SynthSpec, name: str) -> bytes:
    """Contents of one small file, by its base name."""
    preset = spec.preset()
    base = name.rsplit("/", 1)[-1]
    if base == "config.json":
        return json.dumps(preset.hf_config(), indent=2).encode()
    if base == "generation_config.json":
        return json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": True}).encode()
    if base == "tokenizer.json":
        target = max(4096, int(TOKENIZER_BYTES.get(_family(spec.model), 2_000_000) * spec.scale))
        vocab = {f"tok{i}": i for i in range(preset.vocab)}
        body = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": vocab}})
        pad = max(0, target - len(body))
        merges = " ".join(f"m{i}" for i in range(pad // 6 + 1))[:pad]
        return (body[:-2] + f', "merges": "{merges}"}}}}').encode()
    if base == "tokenizer_config.json":
        return json.dumps({"model_max_length": 4096, "tokenizer_class": "LlamaTokenizer"}).encode()
    if base == "special_tokens_map.json":
        return json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}).encode()
    if base == "trainer_state.json":
        history = [
            {"step": s, "loss": 2.0 - s / (spec.step * 2)} for s in range(10, spec.step + 1, 10)
        ]
        return json.dumps(
            {"global_step": spec.step, "epoch": 1.0, "log_history": history}, indent=2
        ).encode()
    if base == "training_args.bin":
        return _torch_bytes({"learning_rate": 2e-5, "per_device_train_batch_size": 4})
    if base == "scheduler.pt":
        return _torch_bytes({"last_epoch": spec.step, "base_lrs": [2e-5], "_step_count": spec.step})
    if base.startswith("rng_state"):
        return _torch_bytes(rng_state())
    if base == "zero_to_fp32.py":
        return (
            "# Synthetic stand-in for DeepSpeed's zero_to_fp32.py, which DeepSpeed copies\n"
            "# into every checkpoint folder (about 30 KB).\n" + "#" * 30_000 + "\n"
        ).encode()
    if base == "latest":
        return f"global_step{spec.step}".encode()
    raise KeyError(name)

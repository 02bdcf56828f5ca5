"""The ``.safetensors`` codec: 8 bytes of header length, a JSON header naming each
tensor's dtype, shape and byte range, then the tensors' bytes in order."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ckptprof.synth.codecs.base import Codec

if TYPE_CHECKING:
    from ckptprof.io.buffers import HostBuffer
    from ckptprof.synth.fill import RandomFiller

_ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "int64": "I64"}
_TORCH_DTYPES = {v: getattr(torch, k) for k, v in _ST_DTYPES.items()}


def header(tensors: dict[str, torch.Tensor]) -> bytes:
    """The length-prefixed JSON header of a shard holding ``tensors`` in state-dict order,
    ``{"format": "pt"}`` as its metadata, padded to 8 bytes (``safetensors``' own
    ``save_file`` sorts the tensors by dtype and name instead: the same format)."""
    meta: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        meta[key] = {
            "dtype": _ST_DTYPES[str(tensor.dtype).removeprefix("torch.")],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def read_safetensors(buffer) -> dict[str, torch.Tensor]:
    """The tensors of a fetched ``.safetensors`` file, in place (what ``safe_open`` does
    over its mmap: parse the JSON header, view each tensor's byte range; no copy)."""
    with buffer.reader() as stream:
        length = int.from_bytes(stream.read(8), "little")
        meta = json.loads(stream.read(length))
    base = 8 + length
    out = {}
    for key, info in meta.items():
        if key == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = _TORCH_DTYPES[info["dtype"]]
        count = (end - start) // dtype.itemsize
        flat = torch.frombuffer(buffer.view, dtype=dtype, count=count, offset=base + start)
        out[key] = flat.view(info["shape"])
    return out


class Safetensors(Codec):
    """``{name: tensor}`` as Hugging Face's ``save_pretrained`` shards hold it."""

    name = "safetensors"

    def generate(self, dest: Path, obj: dict, filler: RandomFiller) -> dict:
        head = header(obj)
        dest.write_bytes(head)
        fd = os.open(dest, os.O_WRONLY)
        try:
            filler.fill_fd(fd, len(head), sum(t.numel() * t.element_size() for t in obj.values()))
        finally:
            os.close(fd)
        return {}

    def save(self, dest: Path, obj: dict) -> None:
        """safetensors' own writer (``save_pretrained`` calls it, with metadata)."""
        from safetensors.torch import save_file

        save_file(obj, str(dest))

    def serialize(self, obj: dict, tensors: list) -> list:
        """The header, then each tensor's bytes as they are in memory."""
        return [header(obj), *(t.reshape(-1).view(torch.uint8).numpy() for t in obj.values())]

    def read(self, buffer: HostBuffer) -> dict:
        return read_safetensors(buffer)

    def load(self, path: str) -> dict:
        """safetensors' own reader, over its mmap of the file."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as shard:
            return {key: shard.get_tensor(key) for key in shard.keys()}  # noqa: SIM118

    def index_hints(self, sparse) -> list[tuple[int, int]]:
        """The header: 8 bytes of length, then the JSON."""
        sparse.ensure(0, 8)
        return [(8, int.from_bytes(sparse.view[:8], "little"))]

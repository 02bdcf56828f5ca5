"""``--strategy runai``: the Run:ai Model Streamer (PyPI ``runai-model-streamer``, the
``[bench]`` extra) loading a safetensors checkpoint's shards, so the report answers
which loader gets closest to the storage's ceiling with numbers.

The streamer reads and parses the shards itself, ``RUNAI_STREAMER_CONCURRENCY`` reads in
flight (set from ``--concurrency`` for the run), so its time is one ``deserialize``
interval marked fused (``ckpt.fused``: fetch+deserialize); the other files (the
optimizer archive, small files) are fetched and loaded as the ``framework`` strategy
does. It hands out tensors in buffers it reuses, so each is copied out as it arrives;
verify reads the files after the stream (from the page cache where the stream left
them), and reshard copies into the state as every strategy does.
"""

from __future__ import annotations

import time

from ckptprof.errors import CkptprofError
from ckptprof.phases import Attr, Phase, fused_value
from ckptprof.synth.strategies.base import (
    RunContext,
    Strategy,
    deserialize_files,
    env_for_run,
    load_pieces,
    pieces_loaded,
    verify_files,
    warm_files,
)
from ckptprof.synth.strategies.registry import install_hint

LOADER = "runai-model-streamer"
CONCURRENCY_ENV = "RUNAI_STREAMER_CONCURRENCY"
INSTALL = install_hint("runai")


class RunAI(Strategy):
    name = "runai"

    def check(self, storage) -> None:
        try:
            import runai_model_streamer  # noqa: F401
        except ImportError:
            raise CkptprofError(
                f"--strategy runai needs the Run:ai Model Streamer: {INSTALL}"
            ) from None
        if not storage.files_by_path:
            raise CkptprofError(
                "--strategy runai is measured on a local or mounted path here; for s3:// use "
                "staged or pipelined (or --stage DIR, then runai on the copy)."
            )

    def handlers(self):
        return {"safetensors": self.restore}

    def refusal(self, layout) -> str:
        return (
            f"--strategy runai streams safetensors shards; this checkpoint's layout is "
            f"{layout.name}: generate one with --layout safetensors."
        )

    def restore(self, ctx: RunContext) -> None:
        from runai_model_streamer import SafetensorsStreamer

        shards = [f for f in ctx.files if f.kind == "weights"]
        others = [f for f in ctx.files if f.kind != "weights"]
        warm_files(ctx, others)
        by_key = {p.key: (f, p) for f in shards for p in f.pieces}
        tensors: dict[str, dict] = {f.path: {} for f in shards}
        start = time.time_ns()
        with (
            ctx.op.phase(Phase.DESERIALIZE),
            env_for_run(CONCURRENCY_ENV, str(max(1, ctx.concurrency))),
            SafetensorsStreamer() as streamer,
        ):
            streamer.stream_files([ctx.path_of(f) for f in shards])
            for key, tensor in streamer.get_tensors():
                found = by_key.get(key)
                if found is not None:  # its buffers are reused: keep a copy
                    tensors[found[0].path][found[1]] = tensor.clone()
        seconds = (time.time_ns() - start) / 1e9
        nbytes = sum(ctx.manifest.files[f.path].size for f in shards)
        ctx.op.add_bytes(Phase.DESERIALIZE, nbytes)
        ctx.op.set_phase_attributes(
            Phase.DESERIALIZE,
            **{Attr.FUSED: fused_value((Phase.FETCH, Phase.DESERIALIZE), LOADER),
               Attr.LOADER: LOADER, Attr.LOADER_STREAMED_S: round(seconds, 6),
               Attr.LOADER_CONCURRENCY: ctx.concurrency},
        )  # fmt: skip
        missing = [key for key, (f, p) in by_key.items() if p not in tensors[f.path]]
        if missing:
            raise CkptprofError(
                f"{ctx.where(shards[0].path)}: the streamer returned no tensor {missing[0]!r} "
                f"({len(missing)} missing); is the checkpoint complete?"
            )
        loaded = [(f, tensors[f.path]) for f in shards]
        loaded += deserialize_files(ctx, lambda f: pieces_loaded(ctx, f), others)
        verify_files(ctx)
        load_pieces(ctx, loaded)


__all__ = ["RunAI"]

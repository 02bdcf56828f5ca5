"""Presets and planning are pure data: checked without touching a disk."""

from __future__ import annotations

import pytest
import torch

from ckptprof.errors import CkptprofError
from ckptprof.io.requests import RequestPolicy, RequestSummary
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.plan import (
    GROUP_MODEL,
    Piece,
    SynthSpec,
    pack_in_order,
    shard_pieces,
    shard_rows,
    whole_pieces,
)
from ckptprof.synth.presets import PRESETS, get_preset
from ckptprof.synth.readplan import Source, flat_sources, plan_copies, plan_reads


@pytest.mark.parametrize(
    "name,billions",
    [
        ("llama2-7b", 6.74),
        ("llama2-13b", 13.02),
        ("llama3-8b", 8.03),
        ("llama3-70b", 70.55),
        ("llama3-405b", 405.85),
        ("mistral-7b", 7.24),
    ],
)
def test_presets_have_the_published_parameter_counts(name, billions):
    assert PRESETS[name].params / 1e9 == pytest.approx(billions, abs=0.01)


def test_llama3_uses_grouped_query_attention():
    shapes = {t.name: t.shape for t in get_preset("llama3-8b").tensors()}
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (1024, 4096)  # 8 KV heads
    assert shapes["model.layers.31.mlp.gate_proj.weight"] == (14336, 4096)
    assert shapes["model.embed_tokens.weight"] == (128256, 4096)


@pytest.mark.parametrize("scale", [0.5, 0.01, 0.0005])
def test_scale_keeps_names_and_counts_and_shrinks_bytes(scale):
    full = get_preset("llama2-7b")
    small = full.scaled(scale)
    assert [t.name for t in small.tensors()] == [t.name for t in full.tensors()]
    ratio = small.params / full.params
    assert scale * 0.5 < ratio < scale * 2


@pytest.mark.parametrize("scale", [0, -1, 1.5])
def test_scale_out_of_range(scale):
    with pytest.raises(CkptprofError, match="--scale"):
        get_preset("llama2-7b").scaled(scale)


def test_unknown_model_suggests_a_name():
    with pytest.raises(CkptprofError, match="Did you mean 'llama2-7b'"):
        get_preset("llama-7b")


def test_shard_rows_match_torch_chunk():
    import torch

    for rows, world in [(10, 3), (7, 4), (2, 5), (4096, 8)]:
        chunks = torch.arange(rows).chunk(world)
        for rank in range(world):
            start, end = shard_rows(rows, world, rank)
            expected = chunks[rank].tolist() if rank < len(chunks) else []
            assert list(range(start, end)) == expected


def test_shards_cover_every_row_once():
    pieces = whole_pieces(get_preset("llama2-7b").scaled(0.001), GROUP_MODEL, "bfloat16")
    shards = [p for r in range(3) for p in shard_pieces(pieces, 3, r)]
    assert sum(p.nbytes for p in shards) == sum(p.nbytes for p in pieces)


@pytest.mark.parametrize("count", [1, 4, 291, 1000])
def test_pack_in_order_makes_exactly_n_nonempty_contiguous_files(count):
    pieces = whole_pieces(get_preset("llama2-7b").scaled(0.01), GROUP_MODEL, "bfloat16")
    groups = pack_in_order(pieces, count)
    assert len(groups) == count and all(groups)
    flat = [p for g in groups for p in g]
    assert sum(p.nbytes for p in flat) == sum(p.nbytes for p in pieces)
    assert [p.name for p in flat] == sorted(
        [p.name for p in flat], key=[q.name for q in pieces].index
    )  # state-dict order kept


def test_pack_refuses_more_files_than_rows():
    piece = Piece(GROUP_MODEL, "w", (2, 4), "bfloat16", 0, 2)
    with pytest.raises(CkptprofError, match="--files 5"):
        pack_in_order([piece], 5)


def test_files_must_divide_among_ranks():
    with pytest.raises(CkptprofError, match="multiple of --ranks 4"):
        get_layout("torch").plan(SynthSpec("llama2-7b", "torch", 0.01, ranks=4, files=6))


def test_deepspeed_layout_has_zero_file_names():
    plan = get_layout("deepspeed").plan(SynthSpec("llama2-7b", "deepspeed", 0.01, ranks=2))
    paths = [f.path for f in plan.files]
    assert "latest" in paths
    assert "global_step1000/mp_rank_00_model_states.pt" in paths
    assert "global_step1000/zero_pp_rank_1_mp_rank_00_optim_states.pt" in paths


def test_dcp_layout_metadata_last_and_per_rank_files():
    plan = get_layout("dcp").plan(SynthSpec("llama2-7b", "dcp", 0.01, ranks=2, files=4))
    paths = [f.path for f in plan.files]
    assert paths[-1] == ".metadata"
    assert paths[:-1] == ["__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp"]


def test_safetensors_default_shards_like_save_pretrained():
    plan = get_layout("safetensors").plan(SynthSpec("llama2-7b", "safetensors", 0.01))
    shards = [f.path for f in plan.files if f.kind == "weights"]
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert {"optimizer.pt", "model.safetensors.index.json", "trainer_state.json"} <= {
        f.path for f in plan.files
    }


def _saved_in_two_files(rows: int = 10, cols: int = 4) -> list[Source]:
    """A bf16 tensor saved by two ranks: rows 0:5 at byte 100 of a, rows 5:10 at 0 of b."""
    return [
        Source("a", 100, (GROUP_MODEL, "w"), "bfloat16", 0, 5 * cols),
        Source("b", 0, (GROUP_MODEL, "w"), "bfloat16", 5 * cols, rows * cols),
    ]


def test_copies_reshard_two_saved_ranks_into_three():
    targets = plan_targets_for("w", (10, 4), world=3)  # rows 0:4, 4:8, 8:10
    copies = plan_copies(targets, _saved_in_two_files())
    middle = [c for c in copies if targets[c.target].rank == 1]
    row = 4 * 2  # bytes per row
    assert [(c.path, c.offset, c.length, c.target_offset) for c in middle] == [
        ("a", 100 + 4 * row, 1 * row, 0),  # row 4 from the first file
        ("b", 0, 3 * row, 1 * row),  # rows 5:8 from the second
    ]
    assert sum(c.length for c in copies) == 10 * row  # every byte once


def test_one_rank_reads_only_its_rows():
    targets = plan_targets_for("w", (10, 4), world=2, ranks=[1])
    reads = plan_reads(plan_copies(targets, _saved_in_two_files()), RequestPolicy(16, 0, True))
    assert {r.path for r in reads} == {"b"}  # rank 1's rows all live in the second file
    assert sum(r.length for r in reads) == 5 * 8
    assert all(r.length <= 16 for r in reads)
    assert sum(c.length for r in reads for c in r.copies) == 5 * 8


def test_small_gaps_are_read_through_and_whole_files_read_whole():
    sources = [
        Source("f", 0, (GROUP_MODEL, "w"), "bfloat16", 0, 8),  # bytes 0:16
        Source("f", 100, (GROUP_MODEL, "w"), "bfloat16", 8, 40),  # bytes 100:164
    ]
    copies = plan_copies(plan_targets_for("w", (10, 4)), sources)
    merged = plan_reads(copies, RequestPolicy(1 << 20, 200, True))
    assert [(r.offset, r.length) for r in merged] == [(0, 164)]
    apart = plan_reads(copies, RequestPolicy(1 << 20, 10, True))
    assert [(r.offset, r.length) for r in apart] == [(0, 16), (100, 64)]
    whole = plan_reads(copies, RequestPolicy(1 << 20, 10, True), {"f": 500})
    assert [(r.offset, r.length) for r in whole] == [(0, 500)]


def _many_small_tensors(n: int, nbytes: int, gap: int):
    """``n`` one-row tensors of ``nbytes`` each in one file, ``gap`` bytes apart (headers)."""
    sources, targets = [], []
    for i in range(n):
        sources.append(Source("f", i * (nbytes + gap), (GROUP_MODEL, f"w{i}"), "bfloat16",
                              0, nbytes // 2))  # fmt: skip
        targets += plan_targets_for(f"w{i}", (1, nbytes // 2))
    return plan_copies(targets, sources)


def test_on_an_object_store_small_tensors_become_a_few_part_size_requests():
    # 1,000 tensors of 40 KiB with 4 KiB headers between them: one GET per tensor would
    # be 1,000 round trips; the object-store policy reads through the headers
    copies = _many_small_tensors(1000, 40 << 10, 4 << 10)
    summary = RequestSummary()
    part = 16 << 20
    reads = plan_reads(copies, RequestPolicy(part, 4 << 20, False), direct=True, summary=summary)
    span = 1000 * (44 << 10) - (4 << 10)
    assert summary.requests == -(-span // part) == len(reads)
    assert all(r.length <= part for r in reads)
    assert summary.attributes()["ckpt.fetch.read_beyond_bytes"] == 999 * (4 << 10)
    # every copy still lands: buffered reads carry them
    assert sum(c.length for r in reads for c in r.copies) == 1000 * (40 << 10)


def test_where_requests_are_cheap_they_are_cut_at_tensors_and_land_in_place():
    copies = _many_small_tensors(4, 40 << 10, 4 << 10)
    reads = plan_reads(copies, RequestPolicy(16 << 20, 64 << 10, True), direct=True)
    assert len(reads) == 4 and all(len(r.into) == 1 for r in reads)
    assert [r.into[0].target for r in reads] == [0, 1, 2, 3]


def test_an_object_store_request_lands_in_every_tensor_it_covers():
    # two 40 MiB tensors on an object store: five part-size GETs, each straight into the
    # state; the one that spans both tensors is scattered into the two of them
    copies = _many_small_tensors(2, 40 << 20, 0)
    reads = plan_reads(copies, RequestPolicy(16 << 20, 4 << 20, False), direct=True)
    assert [r.length for r in reads] == [16 << 20] * 5
    assert [[c.target for c in r.into] for r in reads] == [[0], [0], [0, 1], [1], [1]]
    assert [c.length for c in reads[2].into] == [8 << 20, 8 << 20]
    mib = 1 << 20  # where in each tensor a request's bytes land: file offset less its start
    assert [[c.target_offset for c in r.into] for r in reads] == [
        [0], [16 * mib], [32 * mib, 0], [8 * mib], [24 * mib],
    ]  # fmt: skip
    assert all(c.offset == r.offset + sum(p.length for p in r.into[:i])
               for r in reads for i, c in enumerate(r.into))  # fmt: skip
    assert not any(r.copies for r in reads)  # nothing is copied after


def test_a_request_with_bytes_no_tensor_needs_goes_through_a_buffer():
    # small tensors with headers between them: the headers land in a buffer, and the
    # tensors' bytes are copied out of it
    copies = _many_small_tensors(3, 1 << 20, 4096)
    reads = plan_reads(copies, RequestPolicy(16 << 20, 4 << 20, False), direct=True)
    assert len(reads) == 1 and not reads[0].into
    assert [c.target for c in reads[0].copies] == [0, 1, 2]


def test_a_zero_flat_partition_is_cut_back_into_tensors():
    order = [("a", 6, "float32"), ("b", 10, "float32")]
    sources = flat_sources("optim", 1000, "exp_avg", 4, 12, order)  # flat elements 4:12
    assert [(s.key[1], s.offset, s.elem_start, s.elem_end) for s in sources] == [
        ("a", 1000, 4, 6),
        ("b", 1008, 0, 6),
    ]


def test_missing_rows_are_named():
    with pytest.raises(CkptprofError, match="holds 20 of the 40 elements of w"):
        plan_copies(plan_targets_for("w", (10, 4)), _saved_in_two_files()[:1])


def plan_targets_for(name, shape, world=1, ranks=None):
    from ckptprof.synth.targets import TargetTensor

    rows = shape[0]
    out = []
    for rank in ranks if ranks is not None else range(world):
        start, end = shard_rows(rows, world, rank)
        out.append(TargetTensor(GROUP_MODEL, name, shape, "bfloat16", start, end, rank))
    return out


def test_every_tensor_file_is_in_a_known_codec_and_every_codec_is_used():
    """Layouts name their files' encodings; the codec registry holds exactly those."""
    from ckptprof.synth.codecs import CODEC_NAMES
    from ckptprof.synth.layouts import LAYOUT_NAMES, get_layout

    used = set()
    for name in LAYOUT_NAMES:
        layout = get_layout(name)
        plan = layout.plan(SynthSpec("llama2-7b", name, 0.002, ranks=2))
        used |= {layout.codec(f) for f in plan.data_files}
    assert used == set(CODEC_NAMES)


@pytest.mark.parametrize("name", ["torch", "safetensors", "deepspeed"])
def test_each_file_serialized_by_its_codec_reads_back_as_its_pieces(name):
    """Layout → archive → codec bytes (the parallel writer's segments) → codec.read →
    layout.pieces gives every piece back, equal, for every tensor file of the layout
    (DCP's items are written and read by DCP's own planner: tests/test_dcp.py)."""
    from ckptprof.io.buffers import HostBuffer
    from ckptprof.synth.codecs import get_codec
    from ckptprof.synth.layouts import get_layout
    from ckptprof.synth.savers.base import serialized

    layout = get_layout(name)
    plan = layout.plan(SynthSpec("llama2-7b", name, 0.0005, ranks=2))
    gen = torch.Generator().manual_seed(0)
    for file in plan.data_files:
        tensors = {
            p: torch.randn(p.piece_shape, generator=gen).to(getattr(torch, p.dtype))
            for p in file.pieces
        }
        raw = b"".join(bytes(s) for s in serialized(layout, plan, file, tensors))
        buffer = HostBuffer(len(raw))
        buffer.view[:] = raw
        back = layout.pieces(plan, file, get_codec(layout.codec(file)).read(buffer))
        assert back.keys() == tensors.keys(), file.path
        assert all(torch.equal(back[p], tensors[p]) for p in tensors), file.path
        del back
        buffer.close()

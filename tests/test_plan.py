"""Presets and planning are pure data: checked without touching a disk."""

from __future__ import annotations

import pytest

from ckptprof.errors import CkptprofError
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
    reads = plan_reads(plan_copies(targets, _saved_in_two_files()), part_size=16, gap=0)
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
    merged = plan_reads(copies, part_size=1 << 20, gap=200)
    assert [(r.offset, r.length) for r in merged] == [(0, 164)]
    apart = plan_reads(copies, part_size=1 << 20, gap=10)
    assert [(r.offset, r.length) for r in apart] == [(0, 16), (100, 64)]
    whole = plan_reads(copies, part_size=1 << 20, whole_files={"f": 500})
    assert [(r.offset, r.length) for r in whole] == [(0, 500)]


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

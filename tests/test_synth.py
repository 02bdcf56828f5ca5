"""Generate + restore every layout for real, at small scale, and read the trace back."""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch

from ckptprof.manifest import MANIFEST_NAME
from ckptprof.phases import RESTORE_PHASES
from ckptprof.storage.pagecache import resident_fraction
from ckptprof.synth.options import RestoreOptions
from ckptprof.synth.restore import run_restore
from ckptprof.synth.strategies import BUILTIN as STRATEGIES
from tests.conftest import SMALL_SCALE, read_spans

LAYOUTS = ["torch", "safetensors", "dcp", "deepspeed"]


BOOKKEEPING = 48 << 20  # the run's own records: spans, the read plan, the index's pages


def restore(path, tmp_path, **kw):
    options = RestoreOptions(
        caches=kw.pop("caches", ("cold", "hot")),
        concurrency=kw.pop("concurrency", (1, 4)),
        repeat=kw.pop("repeat", 1),
        progress=False,
        **kw,
    )
    return run_restore(str(path), options, tmp_path / "out", echo=lambda *_: None)


def restored_state(path, strategy, keep_runner=False, **kw):
    """One hot restore with ``strategy``; its state (or the runner, to look inside)."""
    from ckptprof.synth.runner import RestoreRunner
    from ckptprof.tracing import CheckpointTracer, setup_telemetry

    options = RestoreOptions(
        strategies=(strategy,), caches=("hot",), concurrency=(2,), repeat=1, verify="size",
        ceiling_gbps=1.0, first_step=False, progress=False, **kw,
    )  # fmt: skip
    telemetry = setup_telemetry(path.parent / "traces-state")
    try:
        runner = RestoreRunner(str(path), options, CheckpointTracer(telemetry.provider))
        runner.run_once(strategy, "hot", 2, 0)
    finally:
        telemetry.shutdown()
    return runner if keep_runner else runner.state


def restore_spans(payload):
    spans = read_spans(payload["trace_file"])
    roots = [s for s in spans if s["name"] == "ckpt.restore"]
    children = {}
    for s in spans:
        if s["parent_id"]:
            children.setdefault(s["parent_id"], {})[s["name"]] = s
    return roots, children


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_and_strategy_restores_every_phase(layout, strategy, checkpoints, tmp_path):
    ranks = 2 if layout in ("dcp", "deepspeed") else 1
    path = checkpoints(layout, ranks)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    total = sum(f["size"] for f in manifest["files"].values())
    # restored into one rank, so the first step runs for real: all six phases
    payload = restore(path, tmp_path, strategies=(strategy,), world_size=1)

    roots, children = restore_spans(payload)
    assert len(roots) == 4  # cold + hot at two concurrency levels
    for root in roots:
        phases = children[root["context"]["span_id"]]
        assert {p.span_name for p in RESTORE_PHASES} <= set(phases)
        fetch = phases["ckpt.fetch"]["attributes"]
        assert fetch["ckpt.bytes"] == total  # every byte once (verify full reads them all)
        assert fetch["ckpt.files"] == len(manifest["files"])
        assert phases["ckpt.verify"]["attributes"]["ckpt.bytes"] == total
        assert phases["ckpt.first_step"]["attributes"]["ckpt.emulated"] is False
        attrs = root["attributes"]
        assert attrs["ckpt.format"] == layout and attrs["ckpt.strategy"] == strategy
        assert attrs["ckpt.storage.kind"] == "posix"
        assert attrs["ckpt.concurrency"] in (1, 4)
        assert attrs["ckpt.memory.peak_rss_bytes"] >= attrs["ckpt.memory.start_rss_bytes"] > 0
        if torch.cuda.is_available():  # --device auto: the state is on the GPU
            assert attrs["ckpt.device"].startswith("cuda:")
        else:  # and where there is none, the span says no device copy was timed
            assert attrs["ckpt.device"] == "cpu"
            assert "no host→device copy" in attrs["ckpt.device.note"]
        if attrs["ckpt.cache"] == "cold":
            assert attrs["ckpt.cache.resident_fraction"] < 0.05
        else:
            assert attrs["ckpt.cache.resident_fraction"] > 0.95
    assert {r["cache"] for r in payload["runs"]} == {"cold", "hot"}
    assert {r["strategy"] for r in payload["runs"]} == {strategy}
    assert payload["options"]["device"] == roots[0]["attributes"]["ckpt.device"]
    assert all(r["peak_rss_bytes"] > 0 and r["state_bytes"] > 0 for r in payload["runs"])
    assert payload["environment"]["version.torch"] == torch.__version__.split("+")[0] or (
        payload["environment"]["version.torch"].startswith(torch.__version__.split("+")[0])
    )
    assert payload["environment"]["storage.fs_type"]
    assert payload["ceiling"]["read_gbps"] > 0
    csv = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert csv[0].startswith("strategy,cache,concurrency,repeat,time_to_state_s,rto_s,list_s")
    assert len(csv) == 1 + 4


def _rows_by_start(pieces: dict[tuple[str, str], list]) -> dict[tuple[str, str], torch.Tensor]:
    """Whole tensors from row pieces ``(row_start, tensor)``, which must tile them."""
    out = {}
    for key, found in pieces.items():
        found.sort(key=lambda item: item[0])
        ends = [0] + [start + len(t) for start, t in found]
        assert [start for start, _ in found] == ends[:-1], key  # no gap, no overlap
        out[key] = found[0][1] if len(found) == 1 else torch.cat([t for _, t in found])
    return out


def _torch_saved(path, names, scratch):
    """torch.load of every rank's archive: model rows and Adam moments, keyed
    ``name`` (a whole tensor) or ``name#rows=a:b`` (a rank's rows, put back together)."""
    pieces = {}
    for file in sorted(path.glob("checkpoint_rank*.pt")):
        obj = torch.load(file, weights_only=True)
        for group, tensors in {"model": obj["model"], **obj["optimizer"]["state"]}.items():
            for key, tensor in tensors.items():
                name, _, rows = key.partition("#rows=")
                start = int(rows.split(":")[0]) if rows else 0
                pieces.setdefault((group, name), []).append((start, tensor))
    return _rows_by_start(pieces)


def _safetensors_saved(path, names, scratch):
    """safetensors' load_file of every shard; torch.load of the Trainer's optimizer.pt,
    whose state is keyed by parameter index (the model's parameter order)."""
    from safetensors.torch import load_file

    saved = {}
    for shard in sorted(path.glob("model-*.safetensors")):
        saved.update({("model", k): v for k, v in load_file(shard).items()})
    optim = torch.load(path / "optimizer.pt", weights_only=True)["state"]
    assert sorted(optim) == list(range(len(names)))
    for index, moments in optim.items():
        saved.update({(group, names[index]): t for group, t in moments.items()})
    return saved


def _dcp_saved(path, names, scratch):
    """DCP's own reader, in one process: dcp_to_torch_save (dcp.load of every item,
    resharded into whole tensors by its planner), then torch.load."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = scratch / "dcp-whole.pt"
    dcp_to_torch_save(str(path), str(whole))
    obj = torch.load(whole, weights_only=True)
    saved = {("model", k): v for k, v in obj["model"].items()}
    for name, moments in obj["optim"]["state"].items():
        saved.update({(group, name): t for group, t in moments.items()})
    return saved


def _deepspeed_saved(path, names, scratch):
    """DeepSpeed's files, read as DeepSpeed reads them: ``latest`` names the tag; the
    module state dict of mp_rank_00_model_states.pt; every rank's flat fp32 partitions of
    *_optim_states.pt, concatenated in rank order and cut into tensors in ``param_shapes``
    order; then zero_to_fp32's own merge, which reads the master weights the same way."""
    folder = path / (path / "latest").read_text().strip()
    model_states = torch.load(folder / "mp_rank_00_model_states.pt", weights_only=False)
    saved = {("model", k): v for k, v in model_states["module"].items()}
    (shapes,) = model_states["param_shapes"]
    files = sorted(folder.glob("zero_pp_rank_*_mp_rank_00_optim_states.pt"),
                   key=lambda f: int(f.name.split("_")[3]))  # fmt: skip
    optim = [torch.load(f, weights_only=False)["optimizer_state_dict"] for f in files]
    assert [o["partition_count"] for o in optim] == [[len(files)]] * len(files)
    flat = {
        "master": [o["single_partition_of_fp32_groups"][0] for o in optim],
        **{g: [o["base_optimizer_state"]["state"][0][g] for o in optim]
           for g in ("exp_avg", "exp_avg_sq")},
    }  # fmt: skip
    for group, partitions in flat.items():
        whole, offset = torch.cat(partitions), 0
        for name, shape in shapes.items():
            numel = math.prod(shape)
            saved[group, name] = whole[offset : offset + numel].view(shape)
            offset += numel
        assert whole.numel() - offset == optim[0]["group_paddings"][0]  # only padding left
    # DeepSpeed is a dev dependency: an import that fails is a broken setup, not a skip
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    master = get_fp32_state_dict_from_zero_checkpoint(str(path))  # DeepSpeed's own merge
    assert master.keys() == shapes.keys()
    assert all(torch.equal(v, saved["master", k]) for k, v in master.items())
    return saved


SAVED_BY_ITS_FORMAT = {
    "torch": _torch_saved,
    "safetensors": _safetensors_saved,
    "dcp": _dcp_saved,
    "deepspeed": _deepspeed_saved,
}
OPTIMIZER_GROUPS = {
    "torch": {"exp_avg", "exp_avg_sq"},
    "safetensors": {"exp_avg", "exp_avg_sq"},
    "dcp": {"exp_avg", "exp_avg_sq"},
    "deepspeed": {"exp_avg", "exp_avg_sq", "master"},  # ZeRO keeps fp32 master weights
}


def saved_state(path, scratch) -> dict[tuple[str, str], torch.Tensor]:
    """Every tensor of the checkpoint at ``path``, whole, by ``(group, name)``, read by
    its format's own loader (never ckptprof's): what a restore must put back.
    ``scratch``: a folder of the test's own for a loader's output."""
    from ckptprof.synth.plan import SynthSpec

    spec = SynthSpec.from_dict(json.loads((path / MANIFEST_NAME).read_text())["spec"])
    names = [t.name for t in spec.preset().tensors()]  # the model's parameter order
    saved = SAVED_BY_ITS_FORMAT[spec.layout](path, names, scratch)
    assert {g for g, _ in saved} == {"model"} | OPTIMIZER_GROUPS[spec.layout]
    for group in {g for g, _ in saved}:  # every tensor, in every group
        assert {n for g, n in saved if g == group} == set(names), group
    return saved


def assert_holds_its_rows(state, saved, world: int) -> None:
    """Each target rank (of ``world``) holds its ``torch.chunk`` rows of every saved
    tensor of every group, byte for byte; and nothing else."""
    expected = {}
    for key, whole in saved.items():
        for rank, rows in enumerate(torch.chunk(whole, world) if whole.dim() else [whole]):
            expected[rank, key] = rows
    ranks = {t.rank for t in state.targets}
    held = {}
    for target, tensor in zip(state.targets, state.tensors, strict=True):
        held[target.rank, target.key] = tensor.detach().cpu()
    assert held.keys() == {k for k in expected if k[0] in ranks}
    for key, tensor in held.items():
        want = expected[key]
        assert tensor.dtype == want.dtype and tensor.shape == want.shape, key
        assert torch.equal(tensor, want), key


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_strategy_restores_the_same_state(layout, checkpoints, tmp_path):
    """What each strategy put into the state is, byte for byte, what the format's own
    loader reads from the files (torch.load, safetensors, dcp, DeepSpeed's zero_to_fp32),
    model and optimizer state both: for the whole job, and for one rank of a job with
    another world size."""
    ranks = 2 if layout in ("dcp", "deepspeed") else 1
    path = checkpoints(layout, ranks)
    saved = saved_state(path, tmp_path)
    for world, rank in ((None, None), (3, 1)):
        digests = {}
        played = {rank} if rank is not None else set(range(ranks))
        for strategy in STRATEGIES:
            state = restored_state(path, strategy, world_size=world, rank=rank)
            assert {t.rank for t in state.targets} == played
            assert_holds_its_rows(state, saved, world or ranks)
            digests[strategy] = state.digest()
        assert len(set(digests.values())) == 1, (world, rank, digests)


def test_the_restored_state_is_the_checkpoint(checkpoints):
    """Against torch's own loader: the model rows one rank of 2 holds are the file's."""
    path = checkpoints("torch")
    runner = restored_state(path, "pipelined", world_size=2, rank=1, keep_runner=True)
    saved = torch.load(path / "checkpoint_rank0.pt", weights_only=True)["model"]
    checked = 0
    for target, tensor in zip(runner.state.targets, runner.state.tensors, strict=True):
        if target.group == "model":
            expected = saved[target.name][target.row_start : target.row_end]
            assert torch.equal(tensor, expected), target.name
            checked += 1
    assert checked == len(saved)


@pytest.mark.slow
def test_one_rank_reads_only_what_it_needs(checkpoints, tmp_path):
    """A rank of 4 restoring a checkpoint saved by 4 reads its own file (torch), or only
    its rows of every whole tensor (safetensors): read amplification measured exactly."""
    saved_by_4 = checkpoints("torch", 4)
    manifest = json.loads((saved_by_4 / MANIFEST_NAME).read_text())["files"]
    payload = restore(
        saved_by_4, tmp_path / "a", strategies=("pipelined", "staged"), rank=2,
        caches=("cold",), concurrency=(4,), verify="size",
    )  # fmt: skip
    own = manifest["checkpoint_rank2.pt"]["size"] + manifest["config.json"]["size"]
    for run in payload["runs"]:
        assert run["read_bytes"] == own, run["strategy"]
    whole = checkpoints("safetensors")
    sizes = json.loads((whole / MANIFEST_NAME).read_text())["files"]
    payload = restore(
        whole, tmp_path / "b", strategies=("pipelined",), world_size=4, rank=3,
        caches=("cold",), concurrency=(4,), verify="size",
    )  # fmt: skip
    (run,) = payload["runs"]
    shards = sum(v["size"] for k, v in sizes.items() if k.endswith(".safetensors"))
    assert run["read_bytes"] < 0.45 * shards + sizes["optimizer.pt"]["size"]
    assert run["state_bytes"] < 0.3 * payload["runs"][0]["bytes"]


def test_a_memory_budget_smaller_than_the_checkpoint_holds(checkpoints, tmp_path):
    """pipelined inside 4 MiB in flight on a 140 MB checkpoint: its peak stays within the
    state (allocated before the run) plus the budget (plus a little bookkeeping)."""
    path = checkpoints("safetensors", scale=SMALL_SCALE)
    budget = 4 << 20
    payload = restore(
        path, tmp_path, strategies=("pipelined",), memory_budget=budget, part_size=1 << 20,
        caches=("cold",), concurrency=(4,), verify="full", first_step=False,
    )  # fmt: skip
    (run,) = payload["runs"]
    assert run["bytes"] > 25 * budget  # the checkpoint is far larger than the budget
    assert run["window_bytes"] <= budget
    grew = run["peak_rss_bytes"] - run["start_rss_bytes"]
    assert grew <= budget + BOOKKEEPING, f"grew {grew / 2**20:.1f} MiB"


@pytest.mark.slow
def test_first_step_estimate_is_beside_the_rto_not_in_it(checkpoints, tmp_path):
    """Beside the RTO, with the tokens it was estimated at, the same in every view:
    results.json (runs and summary), results.csv, the text report and the HTML page."""
    from ckptprof.report import aggregate, load, render_text
    from ckptprof.report.html import render_html

    path = checkpoints("torch", 2)
    payload = restore(path, tmp_path, caches=("hot",), concurrency=(2,), repeat=2,
                      first_step_tokens=48)  # fmt: skip
    for run in payload["runs"]:
        assert run["first_step"] == "estimated" and run["first_step_estimate_s"] > 0
        assert run["first_step_tokens"] == 48
        assert "first_step" not in run["phases"]  # not a phase of the RTO
    assert [s["first_step_tokens"] for s in payload["summary"]] == [48]
    out = tmp_path / "out"
    rows = (out / "results.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert {r.split(",")[header.index("first_step_tokens")] for r in rows[1:]} == {"48"}
    report = aggregate(load([str(out)]))
    for view in (render_text(report), render_html(report)):
        words = " ".join(view.split())  # as the text wraps it
        assert "estimated beside it (≈" in words and "for a step of 48 tokens," in words
    roots, children = restore_spans(payload)
    root = roots[0]["attributes"]
    assert root["ckpt.first_step.estimate_s"] > 0
    assert root["ckpt.first_step.tokens"] == 48  # the step estimated
    assert "cannot step alone" in root["ckpt.first_step.estimate_reason"]
    assert "ckpt.first_step" not in children[roots[0]["context"]["span_id"]]
    # a step time measured in the real job counts, as the user's
    given = restore(path, tmp_path / "given", caches=("hot",), concurrency=(2,), first_step_s=0.25)
    (run,) = given["runs"]
    assert run["first_step"] == "user" and run["first_step_tokens"] is None  # none run here
    assert run["phases"]["first_step"]["busy_s"] == pytest.approx(0.25, abs=0.01)
    assert run["wall_s"] >= 0.25
    # the time to state, what the table heads and compare ranks by, in every view
    state_s = run["wall_s"] - run["phases"]["first_step"]["busy_s"]
    assert run["time_to_state_s"] == pytest.approx(state_s)
    assert given["summary"][0]["time_to_state_s"]["median"] == pytest.approx(state_s)
    rows = (tmp_path / "given" / "out" / "results.csv").read_text().splitlines()
    assert float(rows[1].split(",")[rows[0].split(",").index("time_to_state_s")]) == (
        pytest.approx(state_s, abs=1e-5)
    )
    [row] = [r for s in aggregate(load([str(tmp_path / "given" / "out")])).sweeps for r in s.rows]
    assert row.breakdown.state_s[0] == pytest.approx(state_s)


def test_an_estimate_too_large_to_run_is_refused_before_the_sweep(
    checkpoints, tmp_path, monkeypatch, capsys
):
    """The estimate's 2-layer step of a million tokens would end the sweep out of memory
    (on a GPU, a CUDA error) after the restores began: one line before any work, naming
    the option and the fixes. The machine is given 4 GB to spare, whatever it has."""
    import psutil

    from ckptprof.cli import main
    from ckptprof.synth import first_step

    headroom = (4 << 30) / psutil.virtual_memory().available  # of what the machine has
    monkeypatch.setattr(first_step, "MEMORY_HEADROOM", headroom)
    path, out = checkpoints("torch", 2), tmp_path / "out"
    argv = ["synth", "restore", str(path), "--cache", "hot", "--concurrency", "2", "--repeat",
            "1", "--no-report", "--out", str(out), "--first-step-tokens"]  # fmt: skip
    assert main([*argv, str(1 << 20)]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert "--first-step-tokens 1048576" in line and "needs" in line and "--first-step-s" in line
    assert "ceiling" not in captured.out and not out.exists()  # before any work
    assert main([*argv, "32"]) == 0, capsys.readouterr().err  # a step that fits is estimated
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["first_step"] == "estimated" and run["first_step_tokens"] == 32


@pytest.mark.parametrize("tokens", [None, 96])
def test_first_step_is_a_real_training_step(tokens, checkpoints, tmp_path):
    """Measured, and the first of its process named: it pays the one-time set-up a
    resumed job's first step pays, the sweep's later runs do not. It runs the tokens
    asked (``--first-step-tokens``; the CPU's 32 by default), and says so."""
    payload = restore(checkpoints("torch"), tmp_path, caches=("hot",), concurrency=(2, 4),
                      first_step_tokens=tokens)  # fmt: skip
    first, later = (run["phases"]["first_step"] for run in payload["runs"])
    assert first["busy_s"] > 0 and not first.get("emulated")
    assert payload["runs"][0]["first_step"] == "measured"
    assert first.get("first_in_process") is True and "first_in_process" not in later
    assert first["details"]["tokens"] == later["details"]["tokens"] == (tokens or 32)
    roots, children = restore_spans(payload)
    flags = [children[r["context"]["span_id"]]["ckpt.first_step"]["attributes"] for r in roots]
    assert [f["ckpt.first_step.first_in_process"] for f in flags] == [True, False]
    assert {f["ckpt.first_step.tokens"] for f in flags} == {tokens or 32}


@pytest.mark.slow
def test_dcp_saved_by_two_ranks_restores_into_one(checkpoints, tmp_path):
    path = checkpoints("dcp", 2)
    payload = restore(path, tmp_path, world_size=1, caches=("hot",), concurrency=(2,))
    roots, children = restore_spans(payload)
    assert roots[0]["attributes"]["ckpt.world_size"] == 1
    assert roots[0]["attributes"]["ckpt.saved_world_size"] == 2
    assert not payload["runs"][0]["phases"]["first_step"].get("emulated")


def test_dcp_files_load_with_torch_dcp_and_reshard(checkpoints):
    """The .distcp/.metadata pair is read by DCP's own FileSystemReader."""
    import torch.distributed.checkpoint as dcp

    path = checkpoints("dcp", 2)
    md = pickle.loads((path / ".metadata").read_bytes())
    key = "model.model.layers.0.mlp.down_proj.weight"
    shape = md.state_dict_metadata[key].size
    assert len(md.state_dict_metadata[key].chunks) == 2
    state = {key: torch.empty(shape, dtype=torch.bfloat16)}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    assert torch.isfinite(state[key]).all() and state[key].abs().sum() > 0


def test_torch_files_are_valid_archives(checkpoints):
    import zipfile

    path = checkpoints("torch", 2)
    for rank in (0, 1):
        name = path / f"checkpoint_rank{rank}.pt"
        assert zipfile.ZipFile(name).testzip() is None  # every CRC-32 is right
        obj = torch.load(name, weights_only=True)
        w = obj["model"][next(iter(obj["model"]))]
        assert w.dtype == torch.bfloat16 and torch.isfinite(w).all()
        assert obj["optimizer"]["state"]["exp_avg"]


def test_safetensors_shards_match_their_index(checkpoints):
    from safetensors import safe_open

    path = checkpoints("safetensors")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    for name, shard in list(index["weight_map"].items())[:20]:
        with safe_open(str(path / shard), framework="pt") as handle:
            assert name in handle.keys()  # noqa: SIM118 - safe_open is not a dict


def test_random_bytes_do_not_compress(checkpoints):
    import zlib

    path = checkpoints("safetensors")
    shard = sorted(path.glob("model-*.safetensors"))[0].read_bytes()[-(4 << 20) :]
    assert len(zlib.compress(shard, 6)) > 0.9 * len(shard)


def test_cold_evicts_and_measures(checkpoints, tmp_path):
    from ckptprof.storage.posix import PosixStorage

    path = checkpoints("torch")
    storage = PosixStorage(str(path))
    files = [i.path for i in storage.list()]
    warm = storage.warm(files)
    assert warm.resident_fraction > 0.95
    cold = storage.evict(files)
    assert cold.resident_fraction < 0.05
    assert resident_fraction([path / f for f in files]) < 0.05
    assert "fadvise" in cold.method


def test_many_small_files_vs_packed(checkpoints, tmp_path):
    many = checkpoints("torch", 1, optimizer=False, files=64)
    assert len(list(many.glob("checkpoint_rank0_part*.pt"))) == 64
    payload = restore(many, tmp_path, caches=("hot",), concurrency=(8,), verify="sample")
    assert payload["runs"][0]["phases"]["fetch"]["files"] == 64 + 1  # + config.json


def test_direct_io_fetch_bypasses_the_page_cache(checkpoints, tmp_path):
    from ckptprof.storage.posix import PosixStorage

    path = checkpoints("torch")
    payload = restore(
        path,
        tmp_path,
        caches=("cold",),
        concurrency=(4,),
        direct_io=True,
        part_size=1 << 20,
        verify="full",
        first_step=False,
    )
    roots, children = restore_spans(payload)
    assert roots[0]["attributes"]["ckpt.fetch.direct_io"] is True
    assert payload["runs"][0]["phases"]["fetch"]["bytes"] == payload["runs"][0]["bytes"]
    # full verify passed on the bytes read, and those bytes never went through the cache
    storage = PosixStorage(str(path))
    data = [i.path for i in storage.list() if i.path.endswith(".pt")]
    storage.evict(data)
    storage.direct_io = True
    from ckptprof.io.transfer import fetch

    buffers = fetch(storage, storage.list(), 2, part_size=1 << 20, progress=False)
    for buf in buffers.values():
        buf.close()
    assert storage.resident_fraction(data) < 0.05


def test_unaligned_memory_falls_back_from_direct_io(checkpoints):
    from ckptprof.storage.posix import PosixStorage

    path = checkpoints("torch")
    storage = PosixStorage(str(path), direct_io=True)
    info = next(i for i in storage.list() if i.path.endswith(".pt"))
    raw = bytearray(8192 + 1)
    view = memoryview(raw)[1:]  # deliberately not block-aligned
    storage.read_into(info.path, 0, view)
    assert bytes(view) == (path / info.path).read_bytes()[:8192]


def test_fetched_files_are_loaded_in_place_without_descriptors(checkpoints):
    """Fetched bytes hold no file descriptor (two per file capped restores at
    ulimit -n / 2 files), and the loaders' tensors still alias them: no copy."""
    import os

    from safetensors.torch import load_file

    from ckptprof.io.transfer import fetch
    from ckptprof.storage.posix import PosixStorage
    from ckptprof.synth.codecs.safetensors_file import read_safetensors
    from ckptprof.synth.codecs.torch_archive import load_fetched

    torch_dir, st_dir = checkpoints("torch"), checkpoints("safetensors")
    infos = [i for i in PosixStorage(str(torch_dir)).list() if i.path.endswith(".pt")]
    shards = [i for i in PosixStorage(str(st_dir)).list() if i.path.endswith(".safetensors")]
    before = len(os.listdir("/proc/self/fd"))
    buffers = fetch(PosixStorage(str(torch_dir)), infos, 2, progress=False)
    st_buffers = fetch(PosixStorage(str(st_dir)), shards, 2, progress=False)
    assert len(os.listdir("/proc/self/fd")) == before
    buf = buffers["checkpoint_rank0.pt"]
    obj = load_fetched(buf)
    reference = torch.load(torch_dir / "checkpoint_rank0.pt", weights_only=True)
    start = torch.frombuffer(buf.view, dtype=torch.uint8).data_ptr()
    for name, tensor in obj["model"].items():
        assert torch.equal(tensor, reference["model"][name])
        assert start <= tensor.data_ptr() < start + buf.size  # a view of the fetched bytes
    shard = shards[0].path
    tensors = read_safetensors(st_buffers[shard])
    expected = load_file(st_dir / shard)
    assert tensors.keys() == expected.keys()
    assert all(torch.equal(tensors[k], expected[k]) for k in expected)
    for b in [*buffers.values(), *st_buffers.values()]:
        b.close()


def test_long_phases_show_progress(checkpoints, tmp_path, capsys):
    """Bars for deserialize, reshard and the first step (not only fetch), and generation's
    bar moves within a file, chunk by chunk."""
    from ckptprof.synth.fill import RandomFiller

    options = RestoreOptions(
        strategies=("staged",), caches=("hot",), concurrency=(1,), repeat=1, verify="size",
        ceiling_gbps=1.0, progress=True,
    )  # fmt: skip
    run_restore(str(checkpoints("torch")), options, tmp_path / "out", echo=lambda *_: None)
    err = capsys.readouterr().err
    for bar in (
        "fetch x1",
        "deserialize",
        "reshard",
        "first step (32 tokens: forward, backward, AdamW)",
    ):
        assert f"{bar}:" in err, bar
    filler, chunks = RandomFiller(0, chunk=1 << 20), []
    filler.on_chunk = chunks.append
    with open(tmp_path / "f", "wb") as handle:
        filler.fill_fd(handle.fileno(), 0, (5 << 20) + 7)
    assert chunks == [1 << 20] * 5 + [7]


def test_an_archive_index_fetches_its_hints_and_nothing_after_them(tmp_path):
    """Reading a ``torch.save`` archive's index from sparse bytes in large blocks (an object
    store's): once its hints are fetched, the loader fetches nothing more. A zip reader's
    read-ahead of one block after each 30-byte record header used to pull that block of
    tensor data, on S3 one request in series per record (3 s of a 9 s restore)."""
    from ckptprof.io.requests import RequestPolicy
    from ckptprof.io.sparse import SparseFile
    from ckptprof.storage.posix import PosixStorage
    from ckptprof.synth.codecs import get_codec

    tensors = {f"t{i}": torch.full((256, 1024), float(i)) for i in range(4)}  # 1 MiB each
    torch.save(tensors, tmp_path / "a.pt")
    size = (tmp_path / "a.pt").stat().st_size
    sparse = SparseFile(PosixStorage(str(tmp_path)), "a.pt", size, block=64 << 10)
    codec = get_codec("torch")
    sparse.prefetch(codec.index_hints(sparse), RequestPolicy(16 << 20, 0, False), 4)
    fetched = sparse.fetched_bytes
    loaded = codec.read(sparse)
    assert sparse.fetched_bytes == fetched  # the index was all in the hints
    assert fetched < size // 2
    assert sorted(loaded) == sorted(tensors)
    sparse.close()


def test_a_prefetch_asks_only_for_what_is_not_held_and_reads_one_request_itself(tmp_path):
    """The blocks the index read already (a zip's directory, at its end) are not asked for
    again, and what is left of a small file's index, one request, is read in the asking
    thread: a window's threads for one request cost more than the read (1.5 ms a file,
    a third of a 2,000-file restore here)."""
    import threading

    from ckptprof.io.requests import LOCAL_GAP, RequestPolicy
    from ckptprof.io.sparse import SparseFile
    from ckptprof.storage.posix import PosixStorage
    from ckptprof.synth.codecs import get_codec

    asked: list[tuple[threading.Thread, int, int]] = []

    class Recording(PosixStorage):
        def read_into(self, path, offset, view):
            asked.append((threading.current_thread(), offset, len(view)))
            return super().read_into(path, offset, view)

    torch.save({"t": torch.ones(128, 1024)}, tmp_path / "a.pt")  # 512 KiB between its ends
    size = (tmp_path / "a.pt").stat().st_size
    sparse = SparseFile(Recording(str(tmp_path)), "a.pt", size)
    codec = get_codec("torch")
    hints = codec.index_hints(sparse)  # reads the directory at the end
    ((_, tail, _),) = asked
    assert any(offset >= tail for offset, _ in hints)  # the hints name it again
    asked.clear()
    sparse.prefetch(hints, RequestPolicy(16 << 20, LOCAL_GAP, True), 8)
    assert [(thread, offset + length <= tail) for thread, offset, length in asked] == [
        (threading.current_thread(), True)
    ]
    loaded = codec.read(sparse)
    assert len(asked) == 1  # the index was all in the hints: its tensor, a view of bytes
    assert loaded["t"].shape == (128, 1024)  # not fetched (the restore's window reads them)
    sparse.close()

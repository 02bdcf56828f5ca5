"""Generate + restore every layout for real, at small scale, and read the trace back."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from ckptprof.manifest import MANIFEST_NAME
from ckptprof.phases import RESTORE_PHASES
from ckptprof.storage.pagecache import resident_fraction
from ckptprof.synth.restore import RestoreOptions, run_restore
from tests.conftest import read_spans

LAYOUTS = ["torch", "safetensors", "dcp", "deepspeed"]


def restore(path, tmp_path, **kw):
    options = RestoreOptions(
        caches=kw.pop("caches", ("cold", "hot")),
        concurrency=kw.pop("concurrency", (1, 4)),
        repeat=kw.pop("repeat", 1),
        progress=False,
        **kw,
    )
    return run_restore(str(path), options, tmp_path / "out", echo=lambda *_: None)


def restore_spans(payload):
    spans = read_spans(payload["trace_file"])
    roots = [s for s in spans if s["name"] == "ckpt.restore"]
    children = {}
    for s in spans:
        if s["parent_id"]:
            children.setdefault(s["parent_id"], {})[s["name"]] = s
    return roots, children


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generate_and_restore_every_phase(layout, checkpoints, tmp_path):
    ranks = 2 if layout in ("dcp", "deepspeed") else 1
    path = checkpoints(layout, ranks)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    total = sum(f["size"] for f in manifest["files"].values())
    payload = restore(path, tmp_path)

    roots, children = restore_spans(payload)
    assert len(roots) == 4  # cold + hot at two concurrency levels
    for root in roots:
        phases = children[root["context"]["span_id"]]
        assert {p.span_name for p in RESTORE_PHASES} <= set(phases)
        assert phases["ckpt.fetch"]["attributes"]["ckpt.bytes"] == total
        assert phases["ckpt.fetch"]["attributes"]["ckpt.files"] == len(manifest["files"])
        assert phases["ckpt.verify"]["attributes"]["ckpt.bytes"] == total
        attrs = root["attributes"]
        assert attrs["ckpt.format"] == layout
        assert attrs["ckpt.storage.kind"] == "posix"
        assert attrs["ckpt.concurrency"] in (1, 4)
        if attrs["ckpt.cache"] == "cold":
            assert attrs["ckpt.cache.resident_fraction"] < 0.05
        else:
            assert attrs["ckpt.cache.resident_fraction"] > 0.95
    assert {r["cache"] for r in payload["runs"]} == {"cold", "hot"}
    assert payload["environment"]["version.torch"] == torch.__version__.split("+")[0] or (
        payload["environment"]["version.torch"].startswith(torch.__version__.split("+")[0])
    )
    assert payload["environment"]["storage.fs_type"]
    assert payload["ceiling"]["read_gbps"] > 0
    csv = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert csv[0].startswith("cache,concurrency,repeat,rto_s,list_s,fetch_s")
    assert len(csv) == 1 + 4


def test_first_step_is_a_real_training_step(checkpoints, tmp_path):
    payload = restore(checkpoints("torch"), tmp_path, caches=("hot",), concurrency=(2,))
    first = payload["runs"][0]["phases"]["first_step"]
    assert first["busy_s"] > 0 and not first.get("emulated")


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


def test_emulated_first_step_is_marked(checkpoints, tmp_path):
    payload = restore(
        checkpoints("torch", 2),
        tmp_path,
        world_size=3,
        caches=("hot",),
        concurrency=(2,),
        repeat=2,
    )
    first = payload["runs"][0]["phases"]["first_step"]
    assert first["emulated"] is True and "extrapolated" in first["emulation_reason"]
    # estimated once before the sweep: every run carries the same emulated time
    assert len({round(r["phases"]["first_step"]["busy_s"], 6) for r in payload["runs"]}) == 1
    roots, children = restore_spans(payload)
    span = children[roots[0]["context"]["span_id"]]["ckpt.first_step"]
    assert span["attributes"]["ckpt.emulated"] is True


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
    from ckptprof.fetch import fetch

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
    """Fetched bytes hold no file descriptor (#17: two per file capped restores at
    ulimit -n / 2 files), and the loaders' tensors still alias them: no copy."""
    import os

    from safetensors.torch import load_file

    from ckptprof.fetch import fetch
    from ckptprof.storage.posix import PosixStorage
    from ckptprof.synth.layouts.safetensors_hf import read_safetensors
    from ckptprof.synth.layouts.torchfile import load_fetched

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

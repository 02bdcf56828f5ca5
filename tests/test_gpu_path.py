"""The parts of the GPU path that run without one: the first step's arithmetic on any
torch the package allows, and what the first step is said to need."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ckptprof.synth import model as model_mod
from ckptprof.synth.model import MasterAdamW


@pytest.mark.parametrize("decoupled", [True, False], ids=["torch>=2.6", "torch<2.6"])
def test_master_adamw_steps_as_torch_adamw_on_either_torch(decoupled, monkeypatch):
    """torch.optim.adam.adam took decoupled_weight_decay only from 2.6; below it the
    decay is applied first, as AdamW defines it: the same numbers either way."""
    monkeypatch.setattr(model_mod, "_ADAM_DECOUPLES", decoupled)
    torch.manual_seed(0)
    start = torch.randn(64, dtype=torch.float32)
    grads = [torch.randn(64) for _ in range(3)]
    ours = torch.nn.Parameter(start.clone())
    theirs = torch.nn.Parameter(start.clone())
    mine = MasterAdamW([ours], lr=1e-2, weight_decay=0.1)
    reference = torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.1, foreach=False)
    for grad in grads:
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        mine.step()
        reference.step()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-6, atol=1e-7)


def test_the_first_step_counts_the_restored_state_once(monkeypatch):
    """The step trains on the restored weights and moments in place: it needs them plus
    the gradients, not a second copy of them. Full llama2-7b with Adam (67 GB) then runs
    on a 141 GB H200 (its free memory stood in for here) instead of being estimated."""
    from ckptprof.errors import CkptprofError
    from ckptprof.synth.first_step import STEP_ESTIMATE, STEP_REAL, FirstStep
    from ckptprof.synth.presets import get_preset

    preset = get_preset("llama2-7b")
    subject = SimpleNamespace(
        world_size=1,
        plan=SimpleNamespace(preset=preset),
        state=SimpleNamespace(nbytes=preset.params * (2 + 8)),  # bf16 weights, fp32 moments
        device=torch.device("cuda", 0),
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (141 * 10**9, 0))
    assert FirstStep(subject, True, None).mode == STEP_REAL  # with 4,096 tokens' activations
    # the activations count too: 16 sequences of 4,096 tokens keep ~0.4 TB for the
    # backward, so the step is estimated from 2 layers (~48 GB)...
    assert FirstStep(subject, True, None, tokens=16 * 4096).mode == STEP_ESTIMATE
    # ...and at 64 sequences even the 2-layer step would not fit: refused before the sweep
    with pytest.raises(CkptprofError, match=r"--first-step-tokens 262144: .* 2-layer step"):
        FirstStep(subject, True, None, tokens=64 * 4096)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * 10**9, 0))
    assert FirstStep(subject, True, None).mode != STEP_REAL  # 67 GB + 13 GB of gradients do not fit
    # a default the user did not give is named as the default, with every way out
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * 10**9, 0))
    with pytest.raises(CkptprofError) as refused:
        FirstStep(subject, True, None)
    message = str(refused.value)
    assert message.startswith("the first step's 4096 tokens (cuda's default): ")
    assert all(f in message for f in ("--first-step-tokens", "--first-step-s", "--no-first-step"))


@pytest.mark.parametrize(
    "device, asked, shape",
    [("cuda", None, (1, 4096)), ("cpu", None, (1, 32)), ("cuda", 512, (1, 512)),
     ("cpu", 10_000, (3, 3333)), ("cuda", 1, (1, 1))],
)  # fmt: skip
def test_the_first_steps_shape_on_each_device_and_as_asked(device, asked, shape):
    """On a GPU the step runs a sequence the device is busy with (32 tokens time a 7B
    step's kernel launches, not its arithmetic); on a CPU a short one; the user's
    ``--first-step-tokens`` over both, in sequences of at most 4,096. The span and the
    step say the tokens it ran."""
    from ckptprof.synth.first_step import FirstStep
    from ckptprof.synth.model import step_shape
    from ckptprof.synth.presets import get_preset

    subject = SimpleNamespace(
        world_size=2,
        plan=SimpleNamespace(preset=get_preset("llama2-7b")),
        device=torch.device(device),
    )
    step = FirstStep(subject, False, None, tokens=asked)  # skipped: no device memory asked
    assert step_shape(step.tokens) == shape and step.tokens == shape[0] * shape[1]


@pytest.mark.parametrize("name", ["llama2-7b", "llama3-8b"])  # a large vocabulary, GQA
def test_the_activations_counted_are_what_autograd_keeps(name):
    """What the step is said to need beside the state and gradients (``activation_bytes``,
    counted from the layers) is what autograd saves in the forward of the real model
    (tensors saved for the backward, parameters aside, summed by storage), plus the
    logits' bf16 and fp32 forms alive at the loss, which it does not save."""
    from dataclasses import replace

    import torch.nn.functional as F

    from ckptprof.synth.model import activation_bytes, build_model, step_shape
    from ckptprof.synth.presets import get_preset

    preset = replace(get_preset(name).scaled(0.01), layers=2)
    model, _ = build_model(preset)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for tokens in (64, 512):
        saved: dict[int, int] = {}

        def keep(tensor, saved=saved):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in params:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        batch, seq = step_shape(tokens)
        ids = torch.randint(0, preset.vocab, (batch, seq + 1))
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            logits = model(ids[:, :-1])
            F.cross_entropy(logits.float().reshape(-1, preset.vocab), ids[:, 1:].reshape(-1))
        at_the_loss = tokens * preset.vocab * (2 + 4)  # the bf16 logits and their fp32 copy
        kept = activation_bytes(preset, tokens) - at_the_loss
        assert sum(saved.values()) <= kept <= 1.02 * sum(saved.values()), (tokens, saved)


@pytest.mark.parametrize(
    "local_rank,visible,expected",
    [(0, 8, 0), (7, 8, 7), (3, 1, 0), (5, 1, 0), (4, 4, None), (0, 0, None)],
)
def test_each_rank_takes_its_gpu_or_the_one_it_sees(local_rank, visible, expected):
    """A scheduler that shows each rank one GPU (CUDA_VISIBLE_DEVICES per rank) made
    set_device(LOCAL_RANK) fail with "invalid device ordinal" on every rank but 0."""
    from ckptprof.errors import CkptprofError
    from ckptprof.synth.distributed import rank_gpu

    if expected is None:
        with pytest.raises(CkptprofError, match=f"local rank {local_rank} sees {visible}"):
            rank_gpu(local_rank, visible)
    else:
        assert rank_gpu(local_rank, visible) == expected


def test_one_gpu_named_for_every_rank_is_refused_before_launch(tmp_path, capsys):
    from ckptprof.cli import main

    code = main(["synth", "restore", str(tmp_path), "--nproc-per-node", "2",
                 "--device", "cuda:1", "--no-report"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--device cuda:1" in err[0] and "--device cuda" in err[0] and "LOCAL_RANK" in err[0]


def test_device_out_of_memory_is_one_line(monkeypatch, capsys):
    """A CUDA out-of-memory error (torch.OutOfMemoryError, raised by the device's
    allocator) is what to do about it, not "unexpected"."""
    from ckptprof.cli import one_line

    message, code = one_line(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert code == 5 and "out of device memory" in message and "--scale" in message


def test_a_failed_pinned_allocation_is_one_line(monkeypatch):
    from ckptprof.errors import CkptprofError
    from ckptprof.synth.device import PinnedBuffer

    def refuse(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")

    monkeypatch.setattr(torch, "empty", refuse)
    with pytest.raises(CkptprofError, match="could not pin 4096 bytes.*--memory-budget"):
        PinnedBuffer(4096)


def test_a_device_restore_maps_no_file(tmp_path):
    """Mapped pages are pageable: a host→device copy from them runs at about half the
    link. A state on a device reads every file through the pinned window instead."""
    from ckptprof.synth.strategies.pipelined import FileMaps

    big = tmp_path / "optimizer.pt"
    with open(big, "wb") as handle:
        handle.truncate(FileMaps.MIN_BYTES)
    from ckptprof.storage import PosixStorage

    storage = PosixStorage(str(tmp_path))
    files = [SimpleNamespace(path="optimizer.pt")]

    def ctx(on_host: bool):
        return SimpleNamespace(storage=storage, files=files, size=lambda p: FileMaps.MIN_BYTES,
                               state=SimpleNamespace(on_host=on_host))  # fmt: skip

    host = FileMaps(ctx(on_host=True))
    try:
        assert list(host.maps) == ["optimizer.pt"]
    finally:
        host.close()
    assert FileMaps(ctx(on_host=False)).maps == {}


def test_a_window_buffer_is_reused_only_after_its_copy_has_read_it():
    """The pinned window's buffers go back to the pool once the asynchronous copy out of
    each has passed its fence (a CUDA event on a device; a stand-in here that fills the
    buffer's bytes only when the fence is waited on, as a late DMA would read them)."""
    from dataclasses import dataclass

    from ckptprof.io.window import Window

    @dataclass
    class Request:
        path: str
        offset: int
        length: int

    data = bytes(range(256)) * 64  # 16 KiB, read in 16 requests of 1 KiB
    storage = SimpleNamespace(
        read_into=lambda path, offset, view: view.__setitem__(
            slice(None), data[offset : offset + len(view)]
        )
    )
    landed = bytearray(len(data))
    in_copy: dict[int, tuple] = {}  # buffer address -> the copy not yet done

    class Fence:
        def __init__(self, request, view):
            self.request, self.view = request, view
            in_copy[id(view.obj)] = (request, self)

        def synchronize(self):
            r = self.request
            landed[r.offset : r.end] = self.view  # the late copy reads the buffer now
            in_copy.pop(id(self.view.obj), None)

    def land(request, view):
        request.end = request.offset + request.length
        assert id(view.obj) not in in_copy, "a buffer reused before its copy had read it"
        return Fence(request, view)

    requests = [Request("f", n * 1024, 1024) for n in range(16)]
    window = Window(storage, concurrency=4, budget=3 * 1024)
    window.run(requests, land=land)
    for _, fence in list(in_copy.values()):
        fence.synchronize()
    assert bytes(landed) == data


def test_the_first_step_ends_on_the_devices_clock(tmp_path, monkeypatch):
    """The callbacks end the first step when the GPU has run its kernels: a device that
    still works for 0.3 s after the hook returns (a synchronize that takes that long
    stands in for it) is inside first_step, not in the second step."""
    import time

    from ckptprof.integrations.session import TracingSession

    waited = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: (time.sleep(0.3), waited.append(1)))
    session = TracingSession("test", trace_dir=tmp_path / "traces")
    try:
        session.begin_restore({})
        summary = session.first_step_done(1, since_ns=time.time_ns(), announce=False)
    finally:
        session.close()
    assert waited == [1]
    assert summary.phases["first_step"].busy_s >= 0.3


def test_device_memory_is_read_on_the_restores_gpu_allocated_and_reserved(monkeypatch):
    """A rank restoring onto GPU 1 had its memory read on GPU 0 (the sampler thread's
    current device), and only what tensors held: the caching allocator's reserved bytes,
    which no other allocation can have, went unreported. A device whose allocator holds
    more than its tensors stands in for the GPU."""
    import threading

    from ckptprof.memory import MemoryWatch
    from ckptprof.phases import Attr

    asked = []

    def reading(value):
        def read(index):
            asked.append((index, threading.current_thread().name))
            return value

        return read

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda index: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", reading(3 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", reading(5 << 30))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", reading(4 << 30))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", reading(6 << 30))
    watch = MemoryWatch(reset_peak=True, cuda=True, interval_s=0.001).start()
    for _ in range(10_000):  # until the sampler thread has read once (10 s at most)
        if any(thread == "ckptprof-memory" for _, thread in asked):
            break
        threading.Event().wait(0.001)
    watch.stop()
    assert any(thread == "ckptprof-memory" for _, thread in asked)
    assert {index for index, _ in asked} == {1}  # every read on the restore's GPU
    recorded = {}
    watch.record(SimpleNamespace(set_attributes=recorded.update, phase_stats=dict))
    assert recorded[Attr.MEMORY_DEVICE_PEAK_BYTES] == 4 << 30  # the counters' peaks
    assert recorded[Attr.MEMORY_DEVICE_RESERVED_PEAK_BYTES] == 6 << 30


def test_pinned_buffers_are_made_before_the_runs_and_lent_to_each(tmp_path):
    """Pinning host memory takes milliseconds per MB: the window pinned its buffers inside
    the first run's fetch, and again in every run. The pool makes them before any run
    (a page-aligned buffer stands in for the pinned one), lends them to each run's
    window, and frees them at the end."""
    from dataclasses import dataclass

    from ckptprof.io.buffers import BufferPool, HostBuffer
    from ckptprof.io.window import Window

    @dataclass
    class Request:
        path: str
        offset: int
        length: int

    made, closed = [], []

    class Pinned(HostBuffer):
        def __init__(self, size, name="pinned"):
            super().__init__(size, name)
            made.append(size)

        def close(self):
            if not self._closed:
                closed.append(self.size)
            super().close()

    data = bytes(range(256)) * 64
    storage = SimpleNamespace(
        read_into=lambda path, offset, view: view.__setitem__(
            slice(None), data[offset : offset + len(view)]
        )
    )
    pool = BufferPool(Pinned)
    pool.reserve(4, 1024)  # before any run: what the runner does when it prepares
    assert made == [1024] * 4 and pool.reserved_bytes == 4096
    for _ in range(3):  # three runs, none of which pins anything
        landed = bytearray(len(data))

        def land(request, view, landed=landed):
            landed[request.offset : request.offset + request.length] = view

        window = Window(storage, concurrency=2, budget=4096, buffer_type=Pinned, pool=pool)
        window.run([Request("f", n * 1024, 1024) for n in range(16)], land=land)
        assert bytes(landed) == data and closed == []  # lent, not closed
    assert made == [1024] * 4 and pool.made_in_runs == 0
    bigger = pool.take(2048)  # a request larger than reserved: made now, and counted
    assert bigger.size == 2048 and pool.made_in_runs == 1
    pool.close()
    assert sorted(closed) == [1024] * 4 + [2048]


@pytest.mark.slow
def test_the_gpu_check_rehearses_on_the_cpu(tmp_path):
    """The one GPU run ``benchmarks/gpu_check.py`` gets must not be spent on its own bugs:
    rehearsed here with the state in host memory, every step that needs no CUDA runs and
    gives its figures (none failed), the others say they need a GPU. As on the device
    machine, ckptprof runs from the source tree, not installed (``-S``: no site hooks,
    the packages on PYTHONPATH): that once crashed on importing the package."""
    import json
    import os
    import subprocess
    import sys
    import sysconfig

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    argv = [sys.executable, "-S", str(root / "benchmarks" / "gpu_check.py"), "--device", "cpu",
            "--dir", str(tmp_path / "check"), "--scale", "0.0005", "--bench-scale", "0.0005",
            "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{sysconfig.get_paths()['purelib']}"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "gpu_check.json").read_text())
    ran = {name: v for name, v in report.items() if name not in ("device", "scale")}
    assert not [v for v in ran.values() if isinstance(v, str) and v.startswith("failed")], ran
    skipped = {name for name, v in ran.items() if v == "skipped: needs a GPU (--device cpu)"}
    assert skipped == {"link", "h2d_gbps", "copy_kinds", "out_of_memory"}
    strategies = ("pipelined", "staged", "framework")
    assert all(ran["restores"][f"{s} cpu"]["rto_s"] > 0 for s in strategies)
    step = ran["fresh_first_step"]
    assert step["first_step"] == "measured" and step["tokens"] == 32 and step["first_in_process"]
    table = [line.split()[:3] for line in ran["gpu_restore"]]
    assert {(s, c, "cpu") for s in strategies for c in ("cold", "hot")} <= {tuple(r) for r in table}
    assert ran["environment"]["cpu.count"] >= 1

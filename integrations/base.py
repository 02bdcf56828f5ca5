"""What every framework adapter shares: telemetry, undoable patches, the restore/save
operation lifecycle, per-file list/fetch/verify/deserialize, and the manifest.

Adapters (Lightning, Hugging Face, DeepSpeed) only decide *where* in their framework
each phase starts and ends; the phase model, export and file handling live here and in
:mod:`ckptprof.tracing`. Everything here is a guest in the training job: bookkeeping
errors are logged once and swallowed, the framework's own exceptions pass unchanged,
and every patch is made on one object's instance and undone by :meth:`detach`.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptprof.errors import VerifyError
from ckptprof.manifest import Manifest, entry_for_bytes
from ckptprof.phases import Attr, Phase
from ckptprof.tracing.export import Telemetry, setup_telemetry
from ckptprof.tracing.recorder import CheckpointTracer, Operation, OperationSummary

log = logging.getLogger("ckptprof")

MANIFEST_SUFFIX = ".ckptprof.json"
FOLDER_MANIFEST = "ckptprof-manifest.rank{rank}.json"
VERIFY_MODES = ("full", "size", "none")


def shared_run_id() -> str | None:
    """One run id for every rank of a distributed job, so the report can group ranks.

    ``CKPTPROF_RUN_ID`` wins; else torchrun's ``TORCHELASTIC_RUN_ID``; else, when
    ``WORLD_SIZE`` > 1, the rendezvous address and port every rank shares, with the date.
    """
    if os.environ.get("CKPTPROF_RUN_ID"):
        return os.environ["CKPTPROF_RUN_ID"]
    if os.environ.get("TORCHELASTIC_RUN_ID") not in (None, "", "none"):
        return os.environ["TORCHELASTIC_RUN_ID"]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("MASTER_PORT"):
        day = time.strftime("%Y%m%d")
        return f"{day}-{os.environ.get('MASTER_ADDR', 'localhost')}-{os.environ['MASTER_PORT']}"
    return None


def manifest_path(checkpoint: str) -> str:
    """Sidecar manifest of a checkpoint file (or folder)."""
    return str(checkpoint).rstrip("/") + MANIFEST_SUFFIX


class Instrumentation:
    """Shared state of one adapter instance.

    Args:
        framework: value of ``ckpt.framework``.
        trace_dir: trace-file directory (default ``$CKPTPROF_TRACE_DIR`` or ``./ckptprof-traces``).
        tracer_provider: record into this provider instead of ckptprof's own (no trace file).
            Give it ``id_generator=OsRandomIdGenerator()`` (``ckptprof.tracing.export``):
            the SDK's default draws ids from Python's ``random``, the job's own stream.
        verify: at save, write a manifest with sizes (``size``) or sizes and xxh3 hashes
            (``full``, costs one read of each saved file); at resume, check against it.
        rank: ``ckpt.rank`` of this process (default from ``RANK``).
    """

    def __init__(
        self,
        framework: str,
        *,
        trace_dir: str | os.PathLike | None = None,
        tracer_provider=None,
        verify: str = "size",
        rank: int | None = None,
    ) -> None:
        if verify not in VERIFY_MODES:
            from ckptprof.errors import CkptprofError

            raise CkptprofError(f"verify={verify!r} is not valid; expected one of {VERIFY_MODES}.")
        self.framework = framework
        self.verify = verify
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self._trace_dir = trace_dir
        self._provider = tracer_provider
        self.telemetry: Telemetry | None = None
        self.tracer: CheckpointTracer | None = None
        self._patches: list[tuple[Any, str, bool, Any]] = []
        self.restore_op: Operation | None = None
        self.save_op: Operation | None = None
        self.last_restore: OperationSummary | None = None
        self.last_save: OperationSummary | None = None
        self._warned: set[str] = set()
        self.save_parent = None  # an OpenTelemetry context: saves nest under it (emergency)
        self.interruptions = None  # an InterruptionGuard when interruption tracing is on

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Create the tracer (lazily, in the process that trains)."""
        if self.tracer is not None:
            return
        provider = self._provider
        run_id = shared_run_id()
        if provider is None:
            self.telemetry = setup_telemetry(self._trace_dir, run_id=run_id)
            provider = self.telemetry.provider
            run_id = self.telemetry.run_id
        self.tracer = CheckpointTracer(provider, framework=self.framework, run_id=run_id)

    def detach(self) -> None:
        """Undo every patch (newest first) and flush spans; safe to call twice."""
        while self._patches:
            obj, name, had_own, previous = self._patches.pop()
            try:
                if had_own:
                    setattr(obj, name, previous)
                else:
                    delattr(obj, name)
            except Exception as exc:  # noqa: BLE001
                self.warn_once("detach", exc)
        for op in (self.restore_op, self.save_op):
            if op is not None and not op.finished:
                op.finish()
        if self.telemetry is not None:
            self.telemetry.flush()

    def watch_interruptions(
        self,
        options: bool | dict | None,
        location: Callable[[], str | None],
        save: Callable[[], str | None],
        stop: Callable[[], None] | None = None,
    ) -> None:
        """Start an :class:`~ckptprof.interrupt.guard.InterruptionGuard` when
        ``options`` is True or a dict of its keyword options (once)."""
        if not options or self.interruptions is not None:
            return
        from ckptprof.errors import CkptprofError
        from ckptprof.interrupt.guard import InterruptionGuard

        kwargs = {} if options is True else dict(options)
        try:
            guard = InterruptionGuard(self, location, save, stop, **kwargs)
        except CkptprofError:
            raise  # a bad option: the user's to fix
        except (TypeError, ValueError) as exc:
            raise CkptprofError(
                f"interruptions={options!r}: {exc}; expected True or a dict of sources, "
                "metadata_url, signal_grace_s, cost_per_hour_usd (and numbers in "
                "CKPTPROF_SIGNAL_GRACE_S / CKPTPROF_COST_PER_HOUR)."
            ) from None
        try:
            self.interruptions = guard.start()
        except Exception as exc:  # noqa: BLE001
            self.warn_once("interruptions", exc)

    def stop_interruptions(self) -> None:
        guard, self.interruptions = self.interruptions, None
        if guard is not None:
            guard.close()

    def close(self) -> None:
        """Detach and stop exporting; a later :meth:`start` makes a fresh tracer."""
        self.stop_interruptions()
        self.detach()
        if self.telemetry is not None:
            self.telemetry.shutdown()
        self.telemetry = None
        self.tracer = None

    def warn_once(self, where: str, exc: BaseException) -> None:
        if where not in self._warned:
            self._warned.add(where)
            log.warning("ckptprof: internal error in %s ignored: %r", where, exc)

    # ------------------------------------------------------------------ patching
    def patch(self, obj: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        """Replace ``obj.name`` on this instance only with ``make(original)``; once."""
        original = getattr(obj, name)
        if getattr(original, "__ckptprof_owner__", None) is self:
            return
        wrapper = make(original)
        functools.update_wrapper(wrapper, original, updated=())
        wrapper.__ckptprof_owner__ = self
        had_own = name in getattr(obj, "__dict__", {})
        self._patches.append((obj, name, had_own, obj.__dict__.get(name) if had_own else None))
        setattr(obj, name, wrapper)

    @property
    def attached(self) -> bool:
        return bool(self._patches)

    @contextlib.contextmanager
    def temporarily(
        self, obj: Any, name: str, make: Callable[[Callable], Callable], force: bool = False
    ) -> Iterator[None]:
        """Like :meth:`patch`, for one call of the framework: undone when the block ends.

        A missing attribute is left alone (the framework version does not have it); one
        ckptprof already wrapped is wrapped again only with ``force`` (a timer around it).
        """
        original = getattr(obj, name, None)
        ours = getattr(original, "__ckptprof_owner__", None) is self
        if original is None or (ours and not force):
            yield
            return
        had_own = name in getattr(obj, "__dict__", {})
        wrapper = make(original)
        functools.update_wrapper(wrapper, original, updated=())
        wrapper.__ckptprof_owner__ = self
        setattr(obj, name, wrapper)
        try:
            yield
        finally:
            try:
                if had_own:
                    setattr(obj, name, original)
                else:
                    delattr(obj, name)
            except Exception as exc:  # noqa: BLE001
                self.warn_once("temporarily", exc)

    def split(
        self,
        op: Operation | None,
        phase: Phase | str,
        fn: Callable,
        *args,
        inner: Iterable[tuple[Any, str, Phase | str]] = (),
        **kwargs,
    ):
        """Run the framework's ``fn`` as ``phase``, except time inside the ``inner`` methods.

        ``inner`` names ``(object, method, phase)``: while ``fn`` runs, each such method is
        timed as its own phase (e.g. ``model.load_state_dict`` as ``reshard`` inside a
        loader that is otherwise ``deserialize``), so the two never double count. A phase
        of ``None`` only leaves the method's time out (it records its own phases).
        """
        if op is None:
            return fn(*args, **kwargs)
        taken: list[tuple[int, int]] = []

        def timer(inner_phase):
            def make(original):
                def timed_method(*a, **kw):
                    start = time.time_ns()
                    try:
                        return original(*a, **kw)
                    finally:
                        end = time.time_ns()
                        taken.append((start, end))
                        if inner_phase is not None:
                            op.add_interval(inner_phase, start, end)

                return timed_method

            return make

        with contextlib.ExitStack() as stack:
            for obj, name, inner_phase in inner:
                if obj is not None:
                    timed_inner = timer(inner_phase)
                    stack.enter_context(self.temporarily(obj, name, timed_inner, force=True))
            start = time.time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                for gap in _gaps(start, time.time_ns(), taken):
                    op.add_interval(phase, *gap)

    # ------------------------------------------------------------------ operations
    def begin_restore(self, attributes: dict[str, Any]) -> Operation | None:
        """Start a ``ckpt.restore``; linked to the interrupted run when a record says so."""
        try:
            self.start()
            if self.restore_op is not None and not self.restore_op.finished:
                self.restore_op.finish()
            links, extra = [], {}
            if self.interruptions is not None:
                links, extra = self.interruptions.resume_links()
            self.restore_op = self.tracer.restore(self._attrs({**attributes, **extra}), links)
            return self.restore_op
        except Exception as exc:  # noqa: BLE001
            self.warn_once("begin_restore", exc)
            return None

    def end_restore(self, error: BaseException | None = None) -> OperationSummary | None:
        op, self.restore_op = self.restore_op, None
        if op is None:
            return None
        try:
            step = op.attributes.get(Attr.RESTORED_STEP)  # the checkpoint's own step
            if self.interruptions is not None and error is None and step is not None:
                self.interruptions.resumed(op, int(step))
            summary = op.finish(error)
            self.last_restore = summary
            if summary is not None and self.telemetry is not None:
                # off the training loop's critical path, unless the restore failed
                self.telemetry.flush(wait=error is not None)
            return summary
        except Exception as exc:  # noqa: BLE001
            self.warn_once("end_restore", exc)
            return None

    def first_step_done(
        self, step: int, since_ns: int | None = None, announce: bool = True, **attributes: Any
    ) -> OperationSummary | None:
        """End the restore at the end of the first training step after it: ``first_step``
        from ``since_ns`` (default: the end of the last restore phase), the step reached,
        and the one-line summary logged where ``announce`` (rank zero)."""
        op = self.restore_op
        if op is None:
            return None
        try:
            op.add_interval(Phase.FIRST_STEP, since_ns or op.latest_end_ns, time.time_ns())
            op.set_attributes({Attr.STEP: step, **attributes})
        except Exception as exc:  # noqa: BLE001
            self.warn_once("first_step", exc)
        summary = self.end_restore()
        if summary is not None and announce:
            log.warning("%s", summary.one_line())
        return summary

    def begin_save(self, attributes: dict[str, Any]) -> Operation | None:
        try:
            self.start()
            self.save_op = self.tracer.save(self._attrs(attributes), parent=self.save_parent)
            return self.save_op
        except Exception as exc:  # noqa: BLE001
            self.warn_once("begin_save", exc)
            return None

    def end_save(self, error: BaseException | None = None) -> OperationSummary | None:
        op, self.save_op = self.save_op, None
        if op is None:
            return None
        try:
            self.last_save = op.finish(error)
            return self.last_save
        except Exception as exc:  # noqa: BLE001
            self.warn_once("end_save", exc)
            return None

    @contextlib.contextmanager
    def saving(self, attributes: dict[str, Any]) -> Iterator[Operation | None]:
        """A ``ckpt.save`` around the block; the framework's exception ends it and passes."""
        op = self.begin_save(attributes)
        try:
            yield op
        except BaseException as exc:
            self.end_save(exc)
            raise
        self.end_save()

    def begin_background_save(self, attributes: dict[str, Any], queued_by) -> Operation | None:
        """The second half of an asynchronous save (a writer thread or process): its own
        ``ckpt.save`` marked ``ckpt.save.background``, linked to the save that queued it
        (``queued_by``: that save's span context)."""
        try:
            from opentelemetry.trace import Link

            if self.tracer is None:
                return None
            links = [Link(queued_by)] if queued_by is not None else None
            attrs = self._attrs({**attributes, "ckpt.save.background": True})
            return self.tracer.save(attrs, links=links)
        except Exception as exc:  # noqa: BLE001
            self.warn_once("background_save", exc)
            return None

    def _attrs(self, attributes: dict[str, Any]) -> dict[str, Any]:
        return {Attr.RANK: self.rank, **attributes}

    # ------------------------------------------------------------------ files
    def read_file(self, path: str, op: Operation):
        """list + fetch + verify of one checkpoint file; returns a HostBuffer.

        Reads through ckptprof's storage layer (a POSIX path or ``s3://``), so the bytes
        a framework then deserializes are exactly the bytes that were timed and checked.
        """
        from ckptprof.fetch import fetch
        from ckptprof.manifest import hash_full
        from ckptprof.storage import open_storage

        parent, name = os.path.split(str(path).rstrip("/"))
        storage = open_storage(parent or ".")
        info, manifest = self._list(storage, name, op)
        with op.phase(Phase.FETCH):
            buffer = fetch(storage, [info], concurrency=4, op=op, progress=False)[name]
        try:
            self._verify(str(path), len(buffer.view), manifest, op, lambda: hash_full(buffer.view))
        except BaseException:
            buffer.close()
            raise
        return buffer

    def load_file(self, path: str, op: Operation, loader: Callable[[Any], Any]) -> Any:
        """list + verify, then ``loader(file)`` with fetch and deserialize told apart.

        The framework's own loader reads the file as it always does (no extra copy);
        every read it makes is timed as ``fetch`` and the time between reads as
        ``deserialize``. ``verify='full'`` costs one extra read of the file to hash it.
        """
        from ckptprof.storage import PosixStorage

        parent, name = os.path.split(str(path))
        info, manifest = self._list(PosixStorage(parent or "."), name, op)
        self._verify(str(path), info.size, manifest, op, lambda: _hash_file(path))
        return timed_read(str(path), op, loader)

    def _list(self, storage, name: str, op: Operation):
        """The list phase for one file: its size, and the manifest saved beside it."""
        with op.phase(Phase.LIST):
            return storage.stat(name), self._load_manifest(storage, name)

    def _verify(self, where: str, size: int, manifest, op: Operation, digest) -> None:
        """The verify phase: size, or size and xxh3 (``digest()``), against the manifest."""
        name = os.path.basename(where)
        with op.phase(Phase.VERIFY) as stats:
            if manifest is None or name not in manifest.files:
                stats.attributes[Attr.VERIFY_MODE] = (
                    "none (no manifest)" if self.verify != "none" else "none"
                )
                return
            mode = self.verify
            if mode == "full" and manifest.spec.get("verify") == "size":
                mode = "size"  # the save recorded sizes only
            stats.attributes[Attr.VERIFY_MODE] = mode
            if mode == "none":
                return
            want = manifest.files[name]
            if size != want.size:
                raise VerifyError(
                    f"{where}: {size} bytes, the manifest says {want.size} (truncated or "
                    "replaced); restore the file or resume from another checkpoint."
                )
            if mode == "full":
                got = digest()
                if got != want.xxh3:
                    raise VerifyError(
                        f"{where}: xxh3 {got} does not match the manifest's {want.xxh3}: the "
                        "file is corrupt; resume from another checkpoint."
                    )
                op.add_bytes(Phase.VERIFY, size)

    def _load_manifest(self, storage, name: str) -> Manifest | None:
        sidecar = name + MANIFEST_SUFFIX
        try:
            raw = storage.read_bytes(sidecar)
        except FileNotFoundError:
            return None
        try:
            return Manifest.from_json(raw, sidecar)
        except Exception:  # noqa: BLE001 - a broken sidecar is not the job's problem
            log.warning("ckptprof: ignoring unreadable manifest %s", sidecar)
            return None

    def write_manifest(self, path: str, op: Operation | None) -> None:
        """After a save: record the file's size (and hash with verify='full') beside it."""
        if self.verify == "none":
            return
        try:
            with _phase(op, Phase.COMMIT):
                p = Path(path)
                if self.verify == "full":
                    with open(p, "rb") as handle:
                        entry = entry_for_bytes(handle.read())
                else:
                    from ckptprof.manifest import FileEntry

                    entry = FileEntry(p.stat().st_size, "", "")
                tmp = p.with_name(p.name + MANIFEST_SUFFIX + ".partial")
                tmp.write_bytes(Manifest({p.name: entry}, spec={"verify": self.verify}).to_json())
                os.replace(tmp, manifest_path(str(p)))
        except Exception as exc:  # noqa: BLE001
            self.warn_once("write_manifest", exc)

    def remove_manifest(self, path: str) -> None:
        try:
            Path(manifest_path(str(path))).unlink(missing_ok=True)
        except Exception as exc:  # noqa: BLE001
            self.warn_once("remove_manifest", exc)


@dataclass
class FolderListing:
    """What the list phase found in a checkpoint folder the framework reads itself."""

    folder: str
    sizes: dict[str, int]
    manifest: Manifest | None
    resident_pages: int = 0
    total_pages: int = 0
    verified: set[str] = field(default_factory=set)


class FolderCheckpoints:
    """list / fetch / verify / commit for checkpoints that are folders of files the
    framework opens itself (Hugging Face ``checkpoint-N``, DeepSpeed ``<dir>/<tag>``).

    ``fetch`` reads each file into the page cache just before the framework's loader
    runs (pages already cached are not read again), so the loader that follows is
    ``deserialize`` whether it uses mmap (safetensors) or reads (torch.load). Each rank
    writes ``ckptprof-manifest.rank<R>.json`` for the files it saved.
    """

    def __init__(self, inst: Instrumentation) -> None:
        self.inst = inst

    def list(self, folder: str, op: Operation) -> FolderListing | None:
        """Names, sizes and manifests; None when there is no such folder (the framework
        then reports that in its own words). A file the manifest lists but the folder
        lacks raises :class:`VerifyError` naming it."""
        with op.phase(Phase.LIST):
            if not os.path.isdir(folder):
                return None
            sizes = {e.name: e.stat().st_size for e in os.scandir(folder) if e.is_file()}
            listing = FolderListing(folder, sizes, self.read_manifest(folder))
        if listing.manifest is not None and self.inst.verify != "none":
            with op.phase(Phase.VERIFY):
                missing = sorted(set(listing.manifest.files) - set(sizes))
                if missing:
                    raise VerifyError(
                        f"{os.path.join(folder, missing[0])}: missing, but the save wrote it "
                        "(ckptprof manifest); restore the file or resume from another checkpoint."
                    )
        return listing

    def fetch(self, listing: FolderListing | None, names: Iterable[str], op: Operation) -> None:
        """fetch + verify of ``names`` (those present) ahead of the framework's own load."""
        from ckptprof.storage.pagecache import resident_pages, warm

        if listing is None:
            return
        for name in names:
            if name not in listing.sizes:
                continue
            path = os.path.join(listing.folder, name)
            start = time.time_ns()
            with op.phase(Phase.FETCH):
                resident, total = resident_pages(Path(path))
                if resident < total:
                    warm([Path(path)])
            op.add_file(Phase.FETCH, path, listing.sizes[name], (time.time_ns() - start) / 1e9)
            listing.resident_pages += resident
            listing.total_pages += total
            if listing.total_pages:
                fraction = listing.resident_pages / listing.total_pages
                cache = "hot" if fraction > 0.95 else "cold" if fraction < 0.05 else "mixed"
                op.set_phase_attributes(
                    Phase.FETCH,
                    **{Attr.CACHE_RESIDENT_FRACTION: round(fraction, 4), Attr.CACHE: cache},
                )
            self.inst._verify(
                path, listing.sizes[name], listing.manifest, op, lambda p=path: _hash_file(p)
            )

    def load(self, listing: FolderListing | None, path: str, op: Operation, loader) -> Any:
        """verify (once per file) + ``loader(file)`` with fetch and deserialize told apart,
        for frameworks whose loader takes a file object (``torch.load``)."""
        name = os.path.basename(path)
        if listing is not None and name in listing.sizes and name not in listing.verified:
            listing.verified.add(name)
            self.inst._verify(
                path, listing.sizes[name], listing.manifest, op, lambda: _hash_file(path)
            )
        return timed_read(path, op, loader)

    def read_manifest(self, folder: str) -> Manifest | None:
        """Every rank's manifest in ``folder``, merged (None when the save wrote none)."""
        merged: dict[str, Any] = {}
        spec = {"verify": "full"}
        for path in sorted(Path(folder).glob(FOLDER_MANIFEST.format(rank="*"))):
            try:
                one = Manifest.from_json(path.read_bytes(), str(path))
            except Exception:  # noqa: BLE001 - a broken manifest is not the job's problem
                log.warning("ckptprof: ignoring unreadable manifest %s", path)
                continue
            merged.update(one.files)
            if one.spec.get("verify") != "full":
                spec = {"verify": "size"}
        return Manifest(merged, spec=spec) if merged else None

    def commit(self, folder: str, names: Iterable[str], op: Operation | None) -> None:
        """After a save: this rank's manifest of ``names`` (sizes, xxh3 with verify='full')."""
        from ckptprof.manifest import FileEntry

        inst = self.inst
        if inst.verify == "none":
            return
        try:
            with _phase(op, Phase.COMMIT):
                entries = {}
                for name in sorted(set(names)):
                    path = os.path.join(folder, name)
                    size = os.path.getsize(path)
                    digest = _hash_file(path) if inst.verify == "full" else ""
                    entries[name] = FileEntry(size, digest, "")
                target = Path(folder) / FOLDER_MANIFEST.format(rank=inst.rank)
                tmp = target.with_name(target.name + ".partial")
                tmp.write_bytes(Manifest(entries, spec={"verify": inst.verify}).to_json())
                os.replace(tmp, target)
        except Exception as exc:  # noqa: BLE001
            inst.warn_once("commit", exc)


def timed_read(path: str, op: Operation, loader: Callable[[Any], Any]) -> Any:
    """``loader(file)`` on a file whose every read is timed: reads are ``fetch``, the
    time between them ``deserialize`` (the loader's own parsing; no extra copy)."""
    with open(path, "rb", buffering=0) as raw:
        timed_file = _TimedFile(raw)
        start = time.time_ns()
        try:
            return loader(timed_file)
        finally:
            end = time.time_ns()
            reads = timed_file.reads
            for r_start, r_end in reads:
                op.add_interval(Phase.FETCH, r_start, r_end)
            for gap in _gaps(start, end, reads):
                op.add_interval(Phase.DESERIALIZE, *gap)
            op.add_file(
                Phase.FETCH, path, timed_file.nbytes, sum(e - s for s, e in reads) / 1e9, start
            )


class TracedAdapter:
    """What every adapter answers about its last operations (mixin; has ``self._inst``)."""

    _inst: Instrumentation

    @property
    def last_restore(self) -> OperationSummary | None:
        """Summary of the last traced resume (RTO, phases), or None."""
        return self._inst.last_restore

    @property
    def last_save(self) -> OperationSummary | None:
        """Summary of the last traced save, or None."""
        return self._inst.last_save


def _hash_file(path) -> str:
    import xxhash

    h = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as handle:
        for chunk in iter(lambda: handle.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _TimedFile(io.RawIOBase):
    """A file whose every read is timed (for fetch vs deserialize inside a loader)."""

    def __init__(self, raw) -> None:
        self._raw = raw
        self.reads: list[tuple[int, int]] = []
        self.nbytes = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._raw.seek(pos, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def readinto(self, buffer) -> int:
        start = time.time_ns()
        n = self._raw.readinto(buffer)
        self.reads.append((start, time.time_ns()))
        self.nbytes += n or 0
        return n


def _gaps(start: int, end: int, intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [start, end) not covered by ``intervals``."""
    out, cursor = [], start
    for s, e in sorted(intervals):
        if s > cursor:
            out.append((cursor, s))
        cursor = max(cursor, e)
    if end > cursor:
        out.append((cursor, end))
    return out


def _phase(op: Operation | None, phase: Phase):
    return op.phase(phase) if op is not None else contextlib.nullcontext()


def timed(op: Operation | None, phase: Phase, fn: Callable, *args, **kwargs):
    """Run the framework's ``fn`` inside ``phase`` (or plainly without an operation)."""
    if op is None:
        return fn(*args, **kwargs)
    with op.phase(phase):
        return fn(*args, **kwargs)


__all__ = [
    "FolderCheckpoints",
    "FolderListing",
    "Instrumentation",
    "TracedAdapter",
    "VerifyError",
    "manifest_path",
    "timed",
    "timed_read",
]

"""The manifest written beside a checkpoint: each file's size and fast hashes.

xxh3-64 (not MD5: ~10 GB/s per core and releases the GIL) over the whole file,
and over a fixed sample of ranges for ``--verify sample``. The manifest is
written last and atomically, so a checkpoint without one is not complete.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import xxhash

from ckptprof import schema
from ckptprof.errors import CkptprofError, VerifyError
from ckptprof.phases import Phase
from ckptprof.threads import thread_pool

MANIFEST_NAME = "ckptprof-manifest.json"
#: written before a generation's first file and removed after its manifest: the files a
#: generation may own here, so an interrupted one can be replaced with --force
GENERATING_NAME = "ckptprof-generating.json"
SAMPLE_BLOCK = 1 << 20
SAMPLE_BLOCKS = 8
VERIFY_MODES = ("full", "sample", "size", "none")


def sample_ranges(size: int) -> list[tuple[int, int]]:
    """Evenly spaced ``SAMPLE_BLOCK`` ranges covering first and last block."""
    if size <= SAMPLE_BLOCK * SAMPLE_BLOCKS:
        return [(0, size)]
    step = (size - SAMPLE_BLOCK) // (SAMPLE_BLOCKS - 1)
    return [(i * step, SAMPLE_BLOCK) for i in range(SAMPLE_BLOCKS)]


def hash_full(data) -> str:
    return xxhash.xxh3_64_hexdigest(data)


def hash_sample(data) -> str:
    h = xxhash.xxh3_64()
    for offset, length in sample_ranges(len(data)):
        h.update(data[offset : offset + length])
    return h.hexdigest()


_HASH = schema.text(pattern="|[0-9a-f]{16}", expected="an xxh3 digest (16 hex digits) or ''")
MANIFEST_SCHEMA = schema.record(
    {
        "tool": schema.text(),
        "version": schema.integer(1),
        "created": schema.text(),
        "spec": schema.record({}),
        "files": schema.mapping(
            schema.relative_path(),
            schema.record(
                {"size": schema.integer(0), "xxh3": _HASH, "sample_xxh3": _HASH},
                required=("size", "xxh3", "sample_xxh3"),
            ),
        ),
    },
    required=("version", "files"),
)
GENERATING_SCHEMA = schema.record(
    {"files": schema.items(schema.relative_path())}, required=("files",)
)
MANIFEST_FIX = "regenerate the checkpoint with `ckptprof synth generate`"


def read_json(raw: bytes, where: str, check: schema.Check, what: str) -> dict:
    """Decode ``raw`` and check it against ``check``; one error line naming ``where``."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise CkptprofError(
            f"{where}: not a valid {what} (not JSON: {exc}); {MANIFEST_FIX}."
        ) from None
    schema.require(data, check, f"{where}: not a valid {what}", f"{MANIFEST_FIX}.")
    return data


@dataclass
class FileEntry:
    size: int
    xxh3: str
    sample_xxh3: str


@dataclass
class Manifest:
    files: dict[str, FileEntry]
    spec: dict = field(default_factory=dict)
    created: str = ""
    version: int = 1
    tool: str = "ckptprof"

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "tool": self.tool,
                "version": self.version,
                "created": self.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "spec": self.spec,
                "files": {p: vars(e) for p, e in sorted(self.files.items())},
            },
            indent=1,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> Manifest:
        """Parse a manifest; anything that is not one (types, paths that leave the
        checkpoint) is a :class:`CkptprofError` naming ``where`` and the field."""
        data = read_json(raw, where, MANIFEST_SCHEMA, "ckptprof manifest")
        files = {p: FileEntry(**{k: e[k] for k in _ENTRY_KEYS}) for p, e in data["files"].items()}
        return cls(files, data.get("spec", {}), data.get("created", ""), data["version"])

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())


_ENTRY_KEYS = ("size", "xxh3", "sample_xxh3")


def entry_for_bytes(data) -> FileEntry:
    return FileEntry(len(data), hash_full(data), hash_sample(data))


def entry_for_segments(segments: list) -> FileEntry:
    """The entry of a file given as its segments in order (a header, views of tensors'
    memory), as a writer is given it: hashed where they lie, nothing joined or read back."""
    views = [memoryview(s).cast("B") for s in segments]
    size = sum(v.nbytes for v in views)
    full, sample = StreamingDigest(size, "full"), StreamingDigest(size, "sample")
    offset = 0
    for view in views:
        full.feed(offset, view)
        sample.feed(offset, view)
        offset += view.nbytes
    return FileEntry(size, full.hexdigest(), sample.hexdigest())


def check_digest(where: str, want: FileEntry, mode: str, got: str) -> None:
    """``got`` (a ``full`` or ``sample`` xxh3) against the manifest; VerifyError naming it."""
    expected = want.xxh3 if mode == "full" else want.sample_xxh3
    if got != expected:
        raise VerifyError(
            f"{where}: xxh3 {got} does not match the manifest's {expected} "
            f"({mode} check): the file is corrupt; regenerate or restore it."
        )


class StreamingDigest:
    """The ``full`` (every byte) or ``sample`` (:func:`sample_ranges`) xxh3 of a file whose
    bytes arrive as ranges, in any order; hashed in file order as they become contiguous."""

    def __init__(self, size: int, mode: str) -> None:
        self.mode = mode
        self.ranges = [(0, size)] if mode == "full" else sample_ranges(size)
        self._next = 0  # index of the range (or offset within the file) hashed next
        self._position = self.ranges[0][0] if self.ranges else 0
        self._waiting: dict[int, bytes] = {}
        self._hash = xxhash.xxh3_64()
        self.hashed = 0

    @property
    def done(self) -> bool:
        return self._next >= len(self.ranges)

    @property
    def next_offset(self) -> int:
        """The file offset whose bytes are hashed next (the file's size when done)."""
        return self._position if not self.done else self.ranges[-1][0] + self.ranges[-1][1]

    def feed(self, offset: int, data) -> None:
        """Bytes ``data`` at ``offset`` of the file (only what falls in a range counts);
        bytes in order are hashed at once, others wait (copied) for their turn."""
        view = memoryview(data)
        for index, (start, length) in enumerate(self.ranges):
            if index < self._next:
                continue  # hashed already
            lo, hi = max(offset, start), min(offset + len(view), start + length)
            if index == self._next:
                lo = max(lo, self._position)  # bytes seen twice (overlapping reads) count once
            if hi <= lo:
                continue
            piece = view[lo - offset : hi - offset]
            if not self.done and lo == self._position:
                self._consume(piece)
            else:
                self._waiting[lo] = bytes(piece)
            while not self.done and self._position in self._waiting:
                self._consume(self._waiting.pop(self._position))

    def _consume(self, piece) -> None:
        self._hash.update(piece)
        self.hashed += len(piece)
        self._position += len(piece)
        start, length = self.ranges[self._next]
        if self._position >= start + length:
            self._next += 1
            if not self.done:
                self._position = self.ranges[self._next][0]

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def verify_buffers(
    buffers: dict[str, object],
    manifest: Manifest,
    mode: str,
    location: str,
    op=None,
    threads: int = 1,
) -> None:
    """Check fetched bytes against the manifest; raises VerifyError naming the file."""
    if mode not in VERIFY_MODES:
        raise CkptprofError(f"--verify {mode!r} is not valid; expected one of {VERIFY_MODES}.")

    def check(path: str) -> None:
        t0 = time.perf_counter()
        want = manifest.files[path]
        view = buffers[path].view
        if len(view) != want.size:
            raise VerifyError(
                f"{location}/{path}: {len(view)} bytes, the manifest says {want.size} "
                "(truncated or replaced); regenerate or restore the file."
            )
        if mode in ("full", "sample"):
            got = hash_full(view) if mode == "full" else hash_sample(view)
            check_digest(f"{location}/{path}", want, mode, got)
        if op is not None:
            nbytes = (
                len(view)
                if mode == "full"
                else (sum(n for _, n in sample_ranges(len(view))) if mode == "sample" else 0)
            )
            op.add_file(Phase.VERIFY, path, nbytes, time.perf_counter() - t0)

    with thread_pool(threads, "checks") as pool:
        for future in [pool.submit(check, p) for p in buffers]:
            future.result()

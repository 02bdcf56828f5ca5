"""The file objects the codecs' loaders read (over a buffer, a sparse file, a range of an
open file) behave as a file does: each checked against ``io.BytesIO`` over the same bytes."""

from __future__ import annotations

import io
import os

import pytest

from ckptprof.io.buffers import view_reader
from ckptprof.io.sparse import SparseFile
from ckptprof.storage.posix import PosixStorage
from ckptprof.synth.codecs.torch_archive import _FileRange

DATA = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes: blocks and a partial last one


def _readers(tmp_path):
    """(name, raw reader over DATA) for each kind."""
    (tmp_path / "f").write_bytes(b"head" + DATA + b"after")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    sparse = SparseFile(PosixStorage(str(tmp_path)), "f", len(DATA) + 9)
    yield "view", view_reader(memoryview(DATA)).raw
    yield "sparse", sparse.reader(4, len(DATA)).raw
    yield "file range", _FileRange(fd, 4, 4 + len(DATA))
    os.close(fd)
    sparse.close()


def test_each_reader_reads_seeks_and_refuses_as_a_file_does(tmp_path):
    steps = [("seek", 0, io.SEEK_END), ("read", 10), ("seek", -7, io.SEEK_END), ("read", 100),
             ("seek", 5000, io.SEEK_SET), ("read", 4096), ("seek", 3, io.SEEK_CUR), ("read", 1),
             ("seek", 20000, io.SEEK_SET), ("read", 5), ("seek", 0, io.SEEK_SET), ("read", 0),
             ("read", 12000)]  # fmt: skip
    for name, raw in _readers(tmp_path):
        plain = io.BytesIO(DATA)
        for step in steps:
            if step[0] == "seek":
                assert raw.seek(step[1], step[2]) == plain.seek(step[1], step[2]), (name, step)
            else:
                buf, want = bytearray(step[1]), bytearray(step[1])
                assert raw.readinto(buf) == plain.readinto(want), (name, step)
                assert buf == want, (name, step)
            assert raw.tell() == plain.tell(), (name, step)
        with pytest.raises(ValueError):
            raw.seek(-1)  # before the start: refused, as a file refuses it
        with pytest.raises(ValueError):
            raw.seek(0, 7)
        raw.seek(0)
        ints = memoryview(bytearray(8)).cast("i")  # a buffer of other items: filled as bytes
        assert raw.readinto(ints) == 8 and ints.tobytes() == DATA[:8], name

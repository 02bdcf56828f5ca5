"""The windowed executor: storage requests in flight, their bytes handed on in order.

Every strategy's reads run here (whole files into memory, ranges into the restored
state, a DCP item at a time, a download to a staging folder, pages warmed into the
cache), and a save's writes (:mod:`ckptprof.io.writes`: a request's "read" is its
write, and nothing lands), so concurrency, memory, timing and hashing work the same way
everywhere:

* ``concurrency`` requests in flight on a thread pool (backends release the GIL while
  they wait: ``preadv``, sockets);
* bytes land where :meth:`Window.run`'s ``into`` says: in place (a file's buffer, a
  tensor of the state), in one of the window's buffers (as many as the memory budget
  pays for; a request waits for a free one), or nowhere (the read only warms a cache);
* one consumer thread hands each landed request to ``land`` (copies into the state,
  ``torch.load`` of an item, a write to disk) while later requests are on the wire, and
  feeds each file's digest in file order (a buffer waits for its turn; nothing is copied
  aside), then releases the buffer;
* every request is an interval of the window's phase (``fetch``; ``write`` for a save)
  and counts in its file's clock (first start to last end: the per-file latency), and in
  the progress bar.

Buffers go to requests in plan order (:class:`OrderedSlots`), so the request a digest
waits for always gets one: the window cannot stall on itself.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, Protocol

from ckptprof.io.buffers import BufferPool, HostBuffer
from ckptprof.phases import Phase
from ckptprof.progress import bar as progress_bar
from ckptprof.threads import thread_pool, through_interrupts

POOLED = object()  # ``into`` answer: land in one of the window's buffers


class Ranged(Protocol):
    path: str
    offset: int
    length: int


def buffer_length(request) -> int:
    """The window-buffer bytes ``request`` needs: its length, or more where it says so (a
    direct write's whole blocks, ``buffer_length``)."""
    return getattr(request, "buffer_length", request.length)


class FileClocks:
    """Per file, what its requests took: first start to last end, and all their bytes
    (``ckpt.files`` and per-file latency count files, not requests)."""

    def __init__(self) -> None:
        self._clocks: dict[str, tuple[int, int, int]] = {}
        self._lock = threading.Lock()

    def note(self, path: str, start: int, end: int, nbytes: int) -> None:
        with self._lock:
            first, last, total = self._clocks.get(path, (start, end, 0))
            self._clocks[path] = (min(first, start), max(last, end), total + nbytes)

    def fold(self, run: FileClocks) -> None:
        """Another run's clocks added to these, a file's time the sum of its runs' (each
        first start to last end), not the gaps between them; its start the first's."""
        with self._lock:
            for path, (first, last, nbytes) in run._clocks.items():
                start, end, total = self._clocks.get(path, (first, first, 0))
                self._clocks[path] = (start, end + (last - first), total + nbytes)

    def record(self, op, phase: str = Phase.FETCH) -> None:
        if op is None:
            return
        for path, (first, last, nbytes) in self._clocks.items():
            op.add_file(phase, path, nbytes, (last - first) / 1e9, first)


class OrderedSlots:
    """``n`` slots handed out in ticket order (a semaphore wakes waiters in any order)."""

    def __init__(self, n: int) -> None:
        self.free = n
        self.next = 0
        self.closed = False
        self._cond = threading.Condition()

    def close(self) -> None:
        """The run is failing: every waiter returns at once (a ticket cancelled before
        its turn would otherwise hold the next for ever)."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def acquire(self, ticket: int) -> None:
        with self._cond:
            while not self.closed and (ticket != self.next or self.free == 0):
                self._cond.wait()
            self.free -= 1
            self.next += 1
            self._cond.notify_all()

    def skip(self, ticket: int) -> None:
        """Ticket ``ticket`` needs no slot: let the next one through once it is its turn."""
        with self._cond:
            while not self.closed and ticket != self.next:
                self._cond.wait()
            self.next += 1
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self.free += 1
            self._cond.notify_all()


class Window:
    """Runs requests against ``storage``, ``concurrency`` in flight (see the module)."""

    def __init__(
        self,
        storage,
        op=None,
        concurrency: int = 1,
        *,
        budget: int | None = None,
        digests: dict | None = None,
        progress: bool | None = None,
        desc: str = "fetch",
        phase: Phase = Phase.FETCH,
        buffer_type: Callable[[int, str], Any] = HostBuffer,
        clocks: FileClocks | None = None,
        pool: BufferPool | None = None,
    ) -> None:
        self.storage, self.op, self.concurrency = storage, op, max(1, concurrency)
        self.budget, self.digests = budget, digests or {}
        self.progress, self.desc, self.buffer_type = progress, desc, buffer_type
        self.phase = phase  # what each request's interval counts as: fetch, or a save's write
        self.pool = pool  # buffers lent for this run (made before it); None: its own
        self._own_clocks = clocks is None  # a caller's clocks span several runs: it records
        self.clocks = clocks or FileClocks()
        self.in_flight = self.concurrency
        self.window_bytes = 0  # what the window's buffers took (the memory it held)

    def sizes(self, requests: Sequence[Ranged]) -> tuple[int, int]:
        """``(slots, buffer size)`` for ``requests``: as many buffers as the budget pays
        for (at least one more than requests in flight), but no more than requests in
        flight and landed requests waiting can use."""
        live = [r for r in requests if not getattr(r, "resident", False)]
        part = max((buffer_length(r) for r in live), default=0) or 1
        enough = max(2, min(2 * self.concurrency + 2, len(live) + 1))
        slots = enough if self.budget is None else max(2, min(self.budget // part, enough))
        return slots, part

    def run(
        self,
        requests: Sequence[Ranged],
        *,
        into: Callable[[Any], Any] | None = None,
        read: Callable[[Any, memoryview | None], memoryview | None] | None = None,
        land: Callable[[Any, memoryview | None], None] | None = None,
        release: Callable[[Any], None] | None = None,
    ) -> None:
        """Every request read and handed on; the first failure stops the rest and is
        raised (``land``'s own errors too).

        ``into(request)``: a memoryview the bytes land in (or a list of them: the bytes
        scattered over them in order), :data:`POOLED` (a window buffer; the default) or
        None (no bytes land: the read only warms a cache). ``land`` may return a fence
        (``synchronize()``: an asynchronous copy out of the buffer, a CUDA event): the
        buffer goes back to the pool only once it has passed.
        ``read(request, view)``: the request's read (default ``storage.read_into``); it
        returns the bytes (``view``, or where they are). Resident requests (``resident``
        true: their bytes are in memory already) skip the storage: ``read(request,
        None)`` gives their bytes. ``land(request, bytes)`` runs in the consumer thread;
        ``release(request)`` once the window is done with the request's bytes."""
        _Run(self, requests, into, read, land, release).execute()

    def _read(self, request, view):
        if isinstance(view, list):
            self.storage.read_into_views(request.path, request.offset, view)
        else:
            self.storage.read_into(request.path, request.offset, view)
        return view

    def _verify_phase(self):
        import contextlib

        return self.op.phase(Phase.VERIFY) if self.op is not None else contextlib.nullcontext()


class _Run:
    """One :meth:`Window.run`: what its reading threads and its consumer thread share
    (the slots, the free buffers, the landed requests, the copies still reading a buffer,
    the first error)."""

    def __init__(self, window: Window, requests: Sequence[Ranged], into, read, land, release):
        self.window = window
        self.live = [r for r in requests if not getattr(r, "resident", False)]
        self.resident = [r for r in requests if getattr(r, "resident", False)]
        slots_n, self.part = window.sizes(requests)
        window.in_flight = max(1, min(window.concurrency, slots_n - 1))
        self.into = into or (lambda r: POOLED)
        self.read = read or window._read
        self.land, self.release = land, release
        self.slots = OrderedSlots(slots_n)
        self.free: queue.Queue = queue.Queue()
        self.made = 0  # window buffers taken (lazily: requests landing in place take none)
        self.buffers = window.pool or BufferPool(window.buffer_type)
        self.done: queue.Queue = queue.Queue()
        self.error: list[BaseException] = []
        self.fences: dict[int, Any] = {}  # id(buffer) -> the copy still reading it
        self.consumed = threading.Event()  # the consumer thread has ended
        label = f"{window.desc} x{window.concurrency}"
        self.bar = progress_bar(sum(r.length for r in self.live), label, window.progress)

    def buffer(self) -> Any:
        try:
            return self.free.get_nowait()
        except queue.Empty:
            self.made += 1
            self.window.window_bytes = self.made * self.part
            return self.buffers.take(self.part, "ckptprof-window")

    def one(self, request, ticket: int) -> None:
        """A reading thread's request: a slot (in ticket order) when it needs a buffer,
        the read, its clock; then it is the consumer's."""
        place = self.into(request)
        holds = not isinstance(place, (memoryview, list))
        if holds:
            self.slots.acquire(ticket)
        else:
            self.slots.skip(ticket)
        if self.error:
            if holds:
                self.slots.release()
            return
        buf = self.buffer() if place is POOLED else None
        view = buf.view[: buffer_length(request)] if buf is not None else place
        start = time.time_ns()
        try:
            got = self.read(request, view) if request.length or place is None else view
        except BaseException:
            self.give_back(request, buf, holds)
            raise
        end = time.time_ns()
        if self.window.op is not None:
            self.window.op.add_interval(self.window.phase, start, end)
        self.window.clocks.note(request.path, start, end, request.length)
        self.done.put((request, got, buf, holds))

    def give_back(self, request, buf, holds: bool) -> None:
        if self.release is not None:
            self.release(request)
        if buf is not None:
            fence = self.fences.pop(id(buf), None)
            if fence is not None:  # its copy to the device must finish reading it first
                fence.synchronize()
            self.free.put(buf)
        if holds:
            self.slots.release()

    def consume(self) -> None:
        """The consumer thread: each landed request handed to ``land``, then to its
        file's digest in file order (a request waits for its turn), then given back."""
        try:
            self._consume()
        finally:
            self.consumed.set()

    def _consume(self) -> None:
        waiting: dict[str, list] = {}  # path -> heap of (offset, seq, item)
        seq = 0
        while True:
            item = self.done.get()
            if item is None:
                break
            request, got, buf, holds = item
            if not getattr(request, "resident", False):
                self.bar.update(request.length)
            try:
                if not self.error and self.land is not None:
                    fence = self.land(request, got)
                    if fence is not None and buf is not None:
                        self.fences[id(buf)] = fence
            except BaseException as exc:  # noqa: BLE001 - raised by run()
                self.error.append(exc)
            digest = self.window.digests.get(request.path)
            if digest is None or self.error:
                self.give_back(request, buf, holds)
                continue
            seq += 1
            heapq.heappush(waiting.setdefault(request.path, []), (request.offset, seq, item))
            self._verify_in_order(digest, waiting[request.path])
        for heap in waiting.values():
            for *_, (req, _, b, h) in heap:
                self.give_back(req, b, h)

    def _verify_in_order(self, digest, heap: list) -> None:
        """Feed ``digest`` every waiting request that is next in its file."""
        while heap and (digest.done or heap[0][0] <= digest.next_offset):
            *_, (req, data, b, h) = heapq.heappop(heap)
            try:
                if not self.error and not digest.done and data is not None:
                    with self.window._verify_phase():
                        feed(digest, req.offset, data)
            except BaseException as exc:  # noqa: BLE001 - raised by run()
                self.error.append(exc)
            finally:
                self.give_back(req, b, h)

    def execute(self) -> None:
        window = self.window
        consumer = threading.Thread(target=self.consume, name="ckptprof-land", daemon=True)
        consumer.start()
        for request in self.resident:
            self.done.put((request, self.read(request, None), None, False))
        failure: list[BaseException] = []
        under_way = window.op.running(window.phase) if window.op is not None else nullcontext()
        what = f"{window.desc} requests"
        try:  # leaving the pool drops the requests not started; a failure closes the
            # slots first, so no request started waits for a dropped one's turn
            with under_way, thread_pool(window.in_flight, what, "ckptprof-io") as pool:
                try:
                    futures = [pool.submit(self.one, r, n) for n, r in enumerate(self.live)]
                except BaseException as exc:  # e.g. Ctrl-C while submitting: stop the rest
                    self.error.append(exc)
                    self.slots.close()
                    raise
                for future in futures:
                    try:
                        future.result()
                    except BaseException as exc:  # noqa: BLE001 - raised below
                        failure.append(exc)
                        self.error.append(exc)  # the requests started see it and return
                        self.slots.close()
                        break
        finally:
            self.done.put(None)
            through_interrupts(self.consumed.wait, what)  # a cut join would not wait again
            self.bar.close()
            if window.pool is None:
                self.buffers.close()
            else:  # every buffer is back, its copy landed: the next run's again
                self.buffers.restock()
            if window._own_clocks:
                window.clocks.record(window.op, window.phase)
        if failure:
            raise failure[0]
        if self.error:
            raise self.error[0]


def feed(digest, offset: int, data) -> None:
    """``data`` (a view, or consecutive views of a scattered read) into ``digest``."""
    for view in data if isinstance(data, list) else [data]:
        digest.feed(offset, view)
        offset += len(view)


__all__ = ["POOLED", "FileClocks", "OrderedSlots", "Window"]

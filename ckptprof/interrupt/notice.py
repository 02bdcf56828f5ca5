"""Interruption notices: signals, and (opt-in) the clouds' metadata services.

A notice only sets state; the adapter acts on it at the next step boundary, where saving
is safe. Signal handlers chain to the ones they replaced (called after the emergency save,
or at once when ckptprof cannot save), and metadata pollers run on one daemon thread with
short timeouts, so a slow or dead metadata endpoint never slows training.

ckptprof never contacts a metadata address on its own: a network source runs only when
named in ``sources`` (or ``CKPTPROF_NOTICE_SOURCES``), at ``metadata_url`` when given.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

log = logging.getLogger("ckptprof")

SOURCES_ENV = "CKPTPROF_NOTICE_SOURCES"
METADATA_URL_ENV = "CKPTPROF_METADATA_URL"
GRACE_ENV = "CKPTPROF_SIGNAL_GRACE_S"

#: how long after SIGTERM the process is killed when nothing says otherwise (Kubernetes'
#: default terminationGracePeriodSeconds; Slurm and others are configured per job)
DEFAULT_SIGNAL_GRACE_S = 30.0
POLL_INTERVAL_S = 5.0
HTTP_TIMEOUT_S = 1.0

DEFAULT_URLS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
SIGNAL_SOURCES = {"sigterm": signal.SIGTERM, "sigusr1": signal.SIGUSR1}
METADATA_SOURCES = tuple(DEFAULT_URLS)
ALL_SOURCES = (*SIGNAL_SOURCES, *METADATA_SOURCES)


@dataclass(frozen=True)
class Notice:
    """The platform said this process will be stopped.

    ``deadline_ns`` is when (epoch ns); ``deadline_assumed`` when the source gives none and
    the grace period was assumed (signals).
    """

    source: str
    received_ns: int
    deadline_ns: int | None
    deadline_assumed: bool = False
    detail: str = ""

    @property
    def seconds_left(self) -> float | None:
        if self.deadline_ns is None:
            return None
        return (self.deadline_ns - time.time_ns()) / 1e9


def parse_sources(spec: str | None) -> list[str]:
    """``"sigterm,aws"`` → ``["sigterm", "aws"]``; unknown names are a one-line error."""
    from ckptprof.errors import CkptprofError

    names = [s.strip().lower() for s in (spec or "").split(",") if s.strip()]
    unknown = [n for n in names if n not in ALL_SOURCES]
    if unknown:
        raise CkptprofError(
            f"unknown notice source {unknown[0]!r}; choose from {', '.join(ALL_SOURCES)}."
        )
    return names


def suggest_metadata_source(sources: list[str], dmi_dir=None) -> str | None:
    """A hint when local DMI strings name a cloud whose notices are not being watched
    (read from files only; nothing is contacted)."""
    from ckptprof.tracing.resource import DMI_DIR, detect_cloud_provider

    cloud = detect_cloud_provider(dmi_dir or DMI_DIR)
    if cloud not in DEFAULT_URLS or cloud in sources:
        return None
    what = {"aws": "EC2 Spot", "gcp": "GCE preemption", "azure": "Azure Scheduled Events"}[cloud]
    return (
        f"ckptprof: this machine looks like {cloud} (DMI); add '{cloud}' to the notice "
        f"sources ({SOURCES_ENV}) to see {what} notices before the signal comes"
    )


class NoticeWatcher:
    """Watches the chosen sources and keeps the first notice.

    Args:
        sources: names from :data:`ALL_SOURCES`; default ``$CKPTPROF_NOTICE_SOURCES`` or
            ``sigterm,sigusr1``. Metadata sources are never on by default.
        on_notice: called once, with the first notice, from the watcher's thread (a
            signal handler only records the notice; the thread delivers it within ~50 ms).
        metadata_url: base URL of the metadata service (tests: a server on 127.0.0.1).
        signal_grace_s: deadline assumed after a signal.
    """

    def __init__(
        self,
        sources: list[str] | str | None = None,
        on_notice: Callable[[Notice], None] | None = None,
        metadata_url: str | None = None,
        signal_grace_s: float | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        if sources is None:
            sources = os.environ.get(SOURCES_ENV, "sigterm,sigusr1")
        self.sources = parse_sources(sources) if isinstance(sources, str) else list(sources)
        parse_sources(",".join(self.sources))
        self.on_notice = on_notice
        self.metadata_url = metadata_url or os.environ.get(METADATA_URL_ENV)
        grace = signal_grace_s if signal_grace_s is not None else os.environ.get(GRACE_ENV)
        self.signal_grace_s = float(grace) if grace is not None else DEFAULT_SIGNAL_GRACE_S
        self.poll_interval_s = poll_interval_s
        self.notice: Notice | None = None
        self.signum: int | None = None  # a signal noted and not yet handed on
        self.closed = False
        self._handoff = False
        self._lock = threading.Lock()
        self._previous: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pollers = [
            _POLLERS[name](self._base_url(name)) for name in self.sources if name in _POLLERS
        ]

    def _base_url(self, name: str) -> str:
        return (self.metadata_url or DEFAULT_URLS[name]).rstrip("/")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> NoticeWatcher:
        self.closed = False
        for name in self.sources:
            signum = SIGNAL_SOURCES.get(name)
            if signum is None or signum in self._previous:
                continue
            if threading.current_thread() is not threading.main_thread():
                log.warning("ckptprof: %s notices need the main thread; not watching it", name)
                continue
            if signal.getsignal(signum) is None:
                # A handler installed from C (Python reports None): Python can never put it
                # back, so replacing it would change the job for good; passing signals on
                # or restoring SIG_DFL would both lose it. Closest to no ckptprof: leave it.
                log.warning("ckptprof: %s has a handler set outside Python; not watching it", name)
                continue
            self._previous[signum] = signal.signal(signum, self._on_signal)
        hint = suggest_metadata_source(self.sources)
        if hint:
            log.info("%s", hint)
        if (self._pollers or self.on_notice is not None) and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="ckptprof-notice", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Put back the handlers ckptprof replaced and stop polling.

        A handler another library placed over ckptprof's stays where it is, and so does
        ckptprof's under it: closed, it hands every signal straight to the handler it
        replaced (:meth:`_pass_on`), so nothing is ever swallowed.
        """
        self.closed = True
        for signum, previous in list(self._previous.items()):
            if not self._installed(signum):
                continue
            try:
                signal.signal(signum, previous)
            except (TypeError, ValueError):  # not the main thread, or no handler to put
                continue  # back (set from C): ours stays, passing signals on
            del self._previous[signum]
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=HTTP_TIMEOUT_S * 3)
            self._thread = None

    def chain(self) -> None:
        """Hand the noted signal on to the handler ckptprof replaced (after the emergency
        save; main thread). See :meth:`_pass_on`."""
        signum, self.signum = self.signum, None
        if signum is not None:
            self._pass_on(signum, None)

    def handoff(self) -> None:
        """From any thread: hand the noted signal on now (no step boundary came for the
        emergency save). The signal is raised again so that the main thread, where
        Python runs signal handlers, passes it on."""
        signum = self.signum
        if signum is not None:
            self._handoff = True
            os.kill(os.getpid(), signum)

    def resend_pending(self) -> None:
        """After :meth:`stop`: a signal that was noted but never handed on (training ended
        before a step boundary) goes to whatever handles it now — the handler ckptprof
        replaced. For the default action the process ends here, as it would have."""
        signum, self.signum = self.signum, None
        if signum is not None and not self._installed(signum):
            os.kill(os.getpid(), signum)

    def _installed(self, signum: int) -> bool:
        return signal.getsignal(signum) == self._on_signal

    def _pass_on(self, signum: int, frame) -> None:
        """What the replaced handler does with ``signum``.

        A Python handler is called. The default action (terminate) is re-raised with the
        default handler in place, so the process ends as it would have without ckptprof;
        ``SIG_IGN`` stays ignored. When a handler installed after ckptprof's wraps it
        (Lightning composes its SIGTERM handler with the existing one), that handler
        already ran and decides what happens next, so the default action is not re-raised.
        """
        previous = self._previous.get(signum, signal.SIG_DFL)
        if previous is None:  # set from C, beyond Python's reach: its default action
            previous = signal.SIG_DFL
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL and self._installed(signum):
            self._previous.pop(signum, None)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def inject(self, notice: Notice) -> None:
        """Take ``notice`` as if a source had sent it (``--simulate-interruption``, tests)."""
        self._notify(notice)

    # ------------------------------------------------------------------ sources
    def _on_signal(self, signum, frame) -> None:
        """Only plain assignments: no lock, no I/O, no callback (the thread delivers it);
        once closed, or when asked to hand a signal on, it acts as the replaced handler."""
        if self.closed or self._handoff:
            self._handoff = False
            if self.signum == signum:
                self.signum = None
            self._pass_on(signum, frame)
            return
        self.signum = signum
        if self.notice is None:
            now = time.time_ns()
            name = signal.Signals(signum).name.lower()
            self.notice = Notice(name, now, now + int(self.signal_grace_s * 1e9), True)

    def _notify(self, notice: Notice) -> None:
        with self._lock:
            if self.notice is None:
                self.notice = notice

    def _run(self) -> None:
        """Poll the metadata sources when due; hand the first notice to ``on_notice``."""
        failures: dict[str, int] = {}
        next_poll = time.monotonic()
        while not self._stop.wait(0.05):
            if self.notice is None and self._pollers and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.poll_interval_s
                self._poll_once(failures)
            if self.notice is not None:
                if self.on_notice is not None:
                    try:
                        self.on_notice(self.notice)
                    except Exception as exc:  # noqa: BLE001 - never break the job
                        log.warning("ckptprof: notice handler failed: %r", exc)
                return

    def _poll_once(self, failures: dict[str, int]) -> None:
        for poller in self._pollers:
            try:
                notice = poller.check()
            except Exception as exc:  # noqa: BLE001 - a dead endpoint is only logged
                failures[poller.name] = failures.get(poller.name, 0) + 1
                if failures[poller.name] == 1:
                    log.warning(
                        "ckptprof: %s metadata at %s not answering (%s); still polling",
                        poller.name,
                        poller.base,
                        type(exc).__name__,
                    )
                continue
            if notice is not None:
                self._notify(notice)
                return


# ---------------------------------------------------------------------- pollers
def _request(url: str, method: str = "GET", headers: dict | None = None) -> tuple[int, bytes]:
    """One HTTP request with a short timeout and no proxy (metadata is link-local)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with opener.open(req, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.read(65536)
    except urllib.error.HTTPError as err:
        return err.code, b""


def _iso_ns(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1e9)


class _AwsPoller:
    """EC2 IMDSv2: PUT a session token, then GET spot/instance-action and the rebalance
    recommendation with it (404 = nothing pending; 401 = token expired, fetch another)."""

    name = "aws"
    TOKEN_TTL_S = 21600

    def __init__(self, base: str) -> None:
        self.base = base
        self._token: str | None = None

    def _get(self, path: str) -> tuple[int, bytes]:
        for _ in range(2):
            if self._token is None:
                status, body = _request(
                    f"{self.base}/latest/api/token",
                    "PUT",
                    {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)},
                )
                if status != 200:
                    raise ConnectionError(f"IMDSv2 token request answered {status}")
                self._token = body.decode().strip()
            status, body = _request(
                f"{self.base}{path}", headers={"X-aws-ec2-metadata-token": self._token}
            )
            if status != 401:
                return status, body
            self._token = None
        return status, body

    def check(self) -> Notice | None:
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:  # received when the answer came, as for the other clouds
            action = json.loads(body)
            return Notice(
                "aws-spot", time.time_ns(), _iso_ns(action["time"]), detail=action.get("action", "")
            )
        status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200:
            notice_time = json.loads(body).get("noticeTime", "")
            return Notice("aws-rebalance", time.time_ns(), None, detail=notice_time)
        return None


class _GcpPoller:
    """GCE ``instance/preempted`` (``TRUE`` once preemption started; ~30 s remain)."""

    name = "gcp"
    GRACE_S = 30.0

    def __init__(self, base: str) -> None:
        self.base = base

    def check(self) -> Notice | None:
        status, body = _request(
            f"{self.base}/computeMetadata/v1/instance/preempted",
            headers={"Metadata-Flavor": "Google"},
        )
        if status != 200:
            raise ConnectionError(f"preempted answered {status}")
        if body.decode().strip().upper() != "TRUE":
            return None
        now = time.time_ns()
        return Notice("gcp-preempted", now, now + int(self.GRACE_S * 1e9), True)


class _AzurePoller:
    """Azure Scheduled Events: a ``Preempt`` event; ``NotBefore`` is the deadline."""

    name = "azure"

    def __init__(self, base: str) -> None:
        self.base = base

    def check(self) -> Notice | None:
        status, body = _request(
            f"{self.base}/metadata/scheduledevents?api-version=2020-07-01",
            headers={"Metadata": "true"},
        )
        if status != 200:
            raise ConnectionError(f"scheduledevents answered {status}")
        for event in json.loads(body).get("Events", []):
            if event.get("EventType") == "Preempt":
                deadline = None
                if event.get("NotBefore"):
                    parsed = email.utils.parsedate_to_datetime(event["NotBefore"])
                    deadline = int(parsed.timestamp() * 1e9)
                return Notice("azure-preempt", time.time_ns(), deadline, detail=event["EventId"])
        return None


_POLLERS = {"aws": _AwsPoller, "gcp": _GcpPoller, "azure": _AzurePoller}

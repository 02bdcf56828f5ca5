"""A stand-in for the clouds' metadata services on 127.0.0.1, for interruption tests.

Serves the documented formats: EC2 IMDSv2 (PUT /latest/api/token, then GETs that carry
the token; 401 without it), GCE ``instance/preempted`` (``Metadata-Flavor: Google``
required) and Azure Scheduled Events (``Metadata: true`` required). A notice appears
``notice_after_s`` seconds after start, or, with ``notice_after_s=None``, when the test
calls :meth:`MetadataServer.post_notice` (an event, not a race with the clock);
``delay_s`` slows every answer and clearing ``answering`` holds every answer until it is
set again (a metadata service that has stopped answering).
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class MetadataServer:
    def __init__(self, notice_after_s: float | None = 0.0, deadline_s: float = 120.0) -> None:
        self.notice_after_s = notice_after_s
        self.deadline_s = deadline_s
        self.delay_s = 0.0
        self.answering = threading.Event()  # clear it: requests are read, never answered
        self.answering.set()
        self.posted_at: float | None = None  # when post_notice() was called
        self.token = "test-imds-token"  # change it to expire the tokens handed out
        self.requests: list[tuple[str, str, dict]] = []
        self.started = time.time()
        self.first_served_ns = 0  # when a notice was first in an answer (epoch ns)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_PUT(self):
                server._record(self)
                if self.path == "/latest/api/token" and self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                ):
                    self._answer(200, server.token.encode())
                else:
                    self._answer(400, b"")

            def do_GET(self):
                server._record(self)
                noticed = server.noticed
                status, body = server._route(self.path, self.headers)
                if noticed and status == 200 and not server.first_served_ns:
                    server.first_served_ns = time.time_ns()
                self._answer(status, body)

            def _answer(self, status: int, body: bytes) -> None:
                time.sleep(server.delay_s)
                server.answering.wait(60)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> MetadataServer:
        self.started = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.answering.set()  # held requests end
        self.httpd.shutdown()
        self.httpd.server_close()

    def post_notice(self) -> None:
        """The notice appears now (for ``notice_after_s=None``)."""
        self.posted_at = time.time()

    @property
    def notice_at(self) -> float | None:
        """When the notice appears (epoch seconds); None: not yet posted."""
        if self.posted_at is not None:
            return self.posted_at
        if self.notice_after_s is None:
            return None
        return self.started + self.notice_after_s

    @property
    def noticed(self) -> bool:
        at = self.notice_at
        return at is not None and time.time() >= at

    @property
    def deadline(self) -> datetime:
        """The deadline the notice announces (sent in whole seconds, as the clouds do)."""
        at = self.notice_at
        assert at is not None, "no notice posted"
        return datetime.fromtimestamp(at + self.deadline_s, tz=timezone.utc)

    @property
    def deadline_ns(self) -> int:
        """:attr:`deadline` as it goes on the wire: whole seconds, in epoch ns."""
        return int(self.deadline.timestamp()) * 10**9

    def _record(self, handler) -> None:
        headers = {k.lower(): v for k, v in handler.headers.items()}
        self.requests.append((handler.command, handler.path, headers))

    def _route(self, path: str, headers) -> tuple[int, bytes]:
        if path.startswith("/latest/"):
            if headers.get("X-aws-ec2-metadata-token") != self.token:
                return 401, b""
            if path == "/latest/meta-data/spot/instance-action" and self.noticed:
                when = self.deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
                return 200, json.dumps({"action": "terminate", "time": when}).encode()
            return 404, b""
        if path == "/computeMetadata/v1/instance/preempted":
            if headers.get("Metadata-Flavor") != "Google":
                return 403, b""
            return 200, b"TRUE" if self.noticed else b"FALSE"
        if path.startswith("/metadata/scheduledevents"):
            if headers.get("Metadata") != "true":
                return 400, b""
            events = []
            if self.noticed:
                not_before = email.utils.format_datetime(self.deadline, usegmt=True)
                events.append(
                    {
                        "EventId": "A123BC45-1234-5678-AB90-ABCDEF123456",
                        "EventType": "Preempt",
                        "ResourceType": "VirtualMachine",
                        "Resources": ["vm0"],
                        "EventStatus": "Scheduled",
                        "NotBefore": not_before,
                        "Description": "",
                        "EventSource": "Platform",
                        "DurationInSeconds": -1,
                    }
                )
            return 200, json.dumps({"DocumentIncarnation": 1, "Events": events}).encode()
        return 404, b""

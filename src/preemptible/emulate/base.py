"""The loopback HTTP server every emulator runs on, with scripted faults.

An emulator is a real HTTP server (``ThreadingHTTPServer`` on 127.0.0.1, port 0 by default) in a named thread.
Faults are queued and consumed by matching requests: ``status`` (answer with that HTTP status), ``slow`` (wait,
then answer normally), ``hang`` (wait long, for client timeouts), ``drop`` (close the connection without an
answer) and ``malformed`` (answer 200 with a cut-off body). Control paths under ``/_emulator/`` let a person or a
drill trigger notices in a running emulator: ``POST /_emulator/notice``, ``POST /_emulator/fault?kind=status&
status=503&times=3``, ``GET /_emulator/state``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULT_KINDS = ("status", "slow", "hang", "drop", "malformed")


@dataclass
class Fault:
    kind: str
    times: int = 1  # requests it applies to; -1: until cleared
    path: str | None = None  # applies when this is a substring of the request path
    status: int = 500
    delay: float = 0.0
    method: str | None = None

    def matches(self, method: str, path: str) -> bool:
        return (self.path is None or self.path in path) and (self.method is None or self.method == method)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    headers: Message
    body: bytes
    at: float

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain"
    headers: dict[str, str] = field(default_factory=dict)


def text(body: str, status: int = 200, content_type: str = "text/plain", **headers: str) -> Reply:
    return Reply(status, body.encode(), content_type, dict(headers))


def iso_seconds(ts: float) -> str:
    return datetime.fromtimestamp(int(ts), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    emulator: Emulator

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client gave up (its timeout, or a test's): expected, not news
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the emulator keeps its own request log
        pass

    def _serve(self) -> None:
        split = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(split.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        req = Request(self.command, split.path, query, self.headers, body, time.time())
        reply = self.server.emulator.dispatch(req)
        if reply is None:  # a dropped connection: no status line at all
            self.close_connection = True
            return
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = _serve


class Emulator:
    """Base of the AWS, GCP and Azure emulators: server lifecycle, request log, faults, control paths.

    Args:
        host, port: where to listen (loopback, port 0 = any free port).
        clock: epoch seconds for notice times (injected by tests).
    """

    provider = "base"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.started_at = clock()
        self.requests: list[Request] = []
        self._faults: list[Fault] = []
        self._lock = threading.RLock()
        self.changed = threading.Condition(self._lock)
        self._server = _Server((host, port), _Handler)
        self._server.emulator = self
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> Emulator:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"preemptible-emulate-{self.provider}",
                daemon=True,
            )
            self._thread.start()
        return self

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.changed.notify_all()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # faults ------------------------------------------------------------------------------------------------
    def fault(
        self,
        kind: str,
        *,
        times: int = 1,
        path: str | None = None,
        status: int = 500,
        delay: float = 0.0,
        method: str | None = None,
    ) -> None:
        """Queue a fault for the next ``times`` requests whose path contains ``path``."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"expected a fault kind among {FAULT_KINDS}, found {kind!r}")
        with self._lock:
            self._faults.append(Fault(kind, times, path, status, delay, method))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(self, req: Request) -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.matches(req.method, req.path):
                    if f.times > 0:
                        f.times -= 1
                        if f.times == 0:
                            self._faults.remove(f)
                    return f
        return None

    # dispatch ----------------------------------------------------------------------------------------------
    def dispatch(self, req: Request) -> Reply | None:
        with self._lock:
            self.requests.append(req)
        if req.path.startswith("/_emulator/"):
            return self._control(req)
        fault = self._take_fault(req)
        if fault is not None:
            if fault.kind == "status":
                return self.error_reply(req, fault.status)
            if fault.kind == "drop":
                return None
            if fault.kind in ("slow", "hang"):
                time.sleep(fault.delay or (2.0 if fault.kind == "slow" else 30.0))
        reply = self.handle(req)
        if fault is not None and fault.kind == "malformed" and reply.status == 200:
            reply.body = reply.body[: max(1, len(reply.body) // 2)] + b"\x00{garbage"
        return reply

    def error_reply(self, req: Request, status: int) -> Reply:
        return text(f"emulated HTTP {status}\n", status)

    def handle(self, req: Request) -> Reply:
        raise NotImplementedError

    def notice(self) -> Any:
        """Deliver this provider's termination notice now."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        return {"provider": self.provider, "url": self.url, "requests": len(self.requests)}

    def _control(self, req: Request) -> Reply:
        if req.path == "/_emulator/state":
            return text(json.dumps(self.state(), default=str), content_type="application/json")
        if req.method != "POST":
            return text("control paths take POST\n", 405)
        try:
            if req.path == "/_emulator/notice":
                result = self.notice()
            elif req.path == "/_emulator/fault":
                q = req.query
                self.fault(
                    q.get("kind", "status"),
                    times=int(q.get("times", "1")),
                    path=q.get("path"),
                    status=int(q.get("status", "500")),
                    delay=float(q.get("delay", "0")),
                )
                result = "queued"
            else:
                extra = getattr(self, "control_" + req.path.removeprefix("/_emulator/").replace("-", "_"), None)
                if extra is None:
                    return text(f"unknown control path {req.path}\n", 404)
                result = extra()
        except (ValueError, TypeError) as e:
            return text(f"bad control request: {e}\n", 400)
        return text(json.dumps({"ok": True, "result": result}, default=str), content_type="application/json")

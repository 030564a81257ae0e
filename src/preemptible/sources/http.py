"""A minimal HTTP client for metadata services: stdlib only, one endpoint, no proxy, no redirects.

``http.client`` never consults proxy variables and never follows redirects, which is exactly what a metadata
client needs: a request must reach the link-local service (or the configured emulator) and nothing else. A 3xx
is an error, bodies are capped, and a request in flight can be interrupted from another thread so that
``close()`` returns at once even during a hanging GET.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from preemptible.errors import NoticeSourceError

MAX_BODY_BYTES = 1 << 20


def parse_endpoint(value: str, *, variable: str) -> tuple[str, int]:
    """``http://host[:port]`` -> (host, port). Anything else (path, query, https, credentials) is refused."""
    text = value.strip().rstrip("/")
    parsed = urllib.parse.urlsplit(text)
    problem = None
    if parsed.scheme != "http":
        problem = f"scheme {parsed.scheme or '(none)'!r}; metadata services speak plain http"
    elif not parsed.hostname:
        problem = "no host"
    elif parsed.path or parsed.query or parsed.fragment:
        problem = "a path or query; give only scheme, host and port (the provider's paths are added)"
    elif parsed.username or parsed.password:
        problem = "credentials in the URL"
    if problem is not None:
        raise NoticeSourceError(
            f"{variable}: expected scheme, host and port only, e.g. http://127.0.0.1:8080, found {value!r} ({problem})"
        )
    try:
        port = parsed.port or 80
    except ValueError as e:
        raise NoticeSourceError(f"{variable}: bad port in {value!r} ({e})") from None
    return parsed.hostname or "", port


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class MetadataError(Exception):
    """A failed or unusable metadata response.

    Attributes:
        kind: a short stable label (``http 503``, ``timeout``, ``malformed instance-action``), used to log each
            kind of problem once rather than once per poll.
        backoff: whether the poller should slow down (service trouble) or keep its pace (bad content).
    """

    def __init__(self, kind: str, message: str, *, backoff: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.backoff = backoff


class HttpClient:
    """Requests to one ``http://host:port``; thread-safe, interruptible."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._lock = threading.Lock()
        self._active: set[http.client.HTTPConnection] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"HttpClient(http://{self.host}:{self.port})"

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout: float = 2.0,
    ) -> Response:
        """One request. Raises MetadataError for transport failures and redirects; returns other statuses."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        with self._lock:
            if self._closed:
                raise MetadataError("closed", "the metadata client is closed")
            self._active.add(conn)
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
            resp = conn.getresponse()
            data = resp.read(MAX_BODY_BYTES + 1)
            if len(data) > MAX_BODY_BYTES:
                raise MetadataError("oversized", f"{method} {path}: response body over {MAX_BODY_BYTES} bytes")
            if 300 <= resp.status < 400:
                raise MetadataError(
                    f"http {resp.status}",
                    f"{method} {path}: redirect to {resp.getheader('location')!r} refused; metadata requests "
                    "never leave the configured endpoint",
                )
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
        except TimeoutError as e:
            raise MetadataError("timeout", f"{method} {path}: no answer within {timeout:g} s") from e
        except (OSError, http.client.HTTPException) as e:
            raise MetadataError(
                type(e).__name__, f"{method} http://{self.host}:{self.port}{path} failed: {e or type(e).__name__}"
            ) from e
        finally:
            with self._lock:
                self._active.discard(conn)
            conn.close()

    def interrupt(self) -> None:
        """Break every request in flight (a hanging GET) and refuse new ones."""
        with self._lock:
            self._closed = True
            active = list(self._active)
        for conn in active:
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def reopen(self) -> None:
        with self._lock:
            self._closed = False

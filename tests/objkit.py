"""Object stores on loopback, each a real server: S3 (moto's server mode), GCS (gcp-storage-emulator), Azure Blob
(Azurite, from npm; ``scripts/bootstrap`` installs it under ``tests/azurite``), and a fault-injecting HTTP proxy."""

from __future__ import annotations

import http.client
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
AZURITE = Path(__file__).resolve().parent / "azurite"
# Azurite's documented well-known development account; it accepts nothing else.
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _server(argv: list[str], port: int, name: str, log: Path) -> Iterator[None]:
    """Start ``argv`` (a server listening on ``port``), wait until it accepts connections, stop it afterwards."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{name} did not start listening on 127.0.0.1:{port}; expected a running server, "
                        f"found exit code {proc.poll()}; its output:\n{log.read_text(errors='replace')[-2000:]}"
                    ) from None
                time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def gcs_emulator(log_dir: Path) -> Iterator[str]:
    """gcp-storage-emulator in memory, in its own process; yields its ``http://127.0.0.1:port``."""
    port = _free_port()
    argv = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port)]
    with _server([*argv, "--in-memory"], port, "gcp-storage-emulator", log_dir / "gcs.log"):
        yield f"http://127.0.0.1:{port}"


def gcs_env(endpoint: str) -> dict[str, str]:
    """What points gcsfs at the emulator without credentials, in this process (via fsspec.config) or a child."""
    return {
        "STORAGE_EMULATOR_HOST": endpoint,
        "FSSPEC_GS_TOKEN": "anon",  # fsspec turns FSSPEC_<PROTOCOL>_<ARG> into a default argument
        "FSSPEC_GS_PROJECT": "test",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # else a gRPC probe per bucket that an emulator cannot answer
        "NO_GCE_CHECK": "true",  # never probe a GCE metadata server for credentials
    }


def set_gcs_env(monkeypatch: Any, endpoint: str) -> None:
    import fsspec.config

    for k, v in gcs_env(endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon", "project": "test"})


@contextmanager
def azurite(log_dir: Path) -> Iterator[str]:
    """Azurite's blob service in memory; yields a connection string for the well-known development account."""
    exe = AZURITE / "node_modules" / ".bin" / "azurite-blob"
    if not exe.exists():
        raise RuntimeError(
            f"expected Azurite at {exe}, found nothing; scripts/bootstrap installs it with npm "
            "(needs node >= 18): run scripts/bootstrap, or npm ci --prefix tests/azurite"
        )
    port = _free_port()
    argv = [str(exe), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"]
    argv += ["--skipApiVersionCheck", "--disableTelemetry", "--silent"]
    with _server(argv, port, "Azurite", log_dir / "azurite.log"):
        yield (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
        )


def make_container(url: str) -> None:
    """Create the bucket/container of ``url`` with whatever the environment points fsspec at."""
    import fsspec

    protocol, rest = url.split("://", 1)
    fsspec.filesystem(protocol, skip_instance_cache=True).mkdir(rest.split("/", 1)[0])


@contextmanager
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def make_bucket(endpoint: str, bucket: str) -> Any:
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, key="testing", secret="testing")
    fs.mkdir(bucket)
    return fs


Rule = Callable[[str, str], str | None]
"""(method, path with query) -> None to forward, "reset" to drop the connection, or "500"/"503" to answer so."""


class FaultProxy:
    """Forwards HTTP to ``target``; ``rule`` decides per request whether to inject a fault. Counts what it saw."""

    def __init__(self, target: str, rule: Rule) -> None:
        self.target = urllib.parse.urlsplit(target)
        self.rule = rule
        self.seen: list[tuple[str, str, str]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes | None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                    return b"".join(parts)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            def _forward(self) -> None:
                body = self._body()
                action = proxy.rule(self.command, self.path)
                proxy.seen.append((self.command, self.path, action or "ok"))
                if action == "reset":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if action in ("500", "503"):
                    code = "InternalError" if action == "500" else "SlowDown"
                    payload = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
                    self.send_response(int(action))
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.target.hostname, proxy.target.port, timeout=60)
                hop = ("host", "transfer-encoding", "expect")  # the proxy already answered 100-continue itself
                headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
                headers["Host"] = self.headers.get("Host", "")
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # HEAD answers carry the object's length with no body: pass it on as is
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="s3-fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def env(endpoint: str) -> dict[str, str]:
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}


def set_env(monkeypatch: Any, endpoint: str) -> None:
    for k, v in env(endpoint).items():
        monkeypatch.setenv(k, v)
    os.environ.pop("AWS_PROFILE", None)

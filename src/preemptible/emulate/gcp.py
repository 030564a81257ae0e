"""Emulator of the GCP metadata server for preemption and host maintenance.

Faithful to the reference: 403 ("Missing Metadata-Flavor:Google header.") without ``Metadata-Flavor: Google`` or
with ``X-Forwarded-For``; answers carry ``Metadata-Flavor: Google``, ``Content-Type: application/text`` and a
16-hex ``ETag``; ``?wait_for_change=true`` hangs until the value changes, returns at once when ``last_etag``
differs from the current ETag, and returns the current value after ``timeout_sec``; directories list their
entries, ``recursive=true`` returns JSON. ``instance/preempted`` is ``FALSE`` until the notice, then ``TRUE``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from preemptible.emulate.base import Emulator, Reply, Request, text

ROOT = "/computeMetadata/v1/"


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class GcpEmulator(Emulator):
    """The GCE metadata server on loopback.

    Args:
        notice_after: preempt this many seconds after start (None: only when `notice` is called).
        max_wait_s: cap on a hanging GET without ``timeout_sec``.
    """

    provider = "gcp"

    def __init__(
        self,
        *,
        notice_after: float | None = None,
        max_wait_s: float = 300.0,
        project_id: str = "preemptible-emulated",
        zone: str = "us-central1-a",
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(host=host, port=port, **({"clock": clock} if clock else {}))
        self.notice_after = notice_after
        self.max_wait_s = max_wait_s
        self.values: dict[str, str] = {
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/id": "4520031799277581759",
            "instance/name": "preemptible-emulated-vm",
            "instance/hostname": f"preemptible-emulated-vm.{zone}.c.{project_id}.internal",
            "instance/zone": f"projects/123456789012/zones/{zone}",
            "instance/scheduling/preemptible": "TRUE",
            "instance/service-accounts/default/email": f"emulated@{project_id}.iam.gserviceaccount.com",
            "instance/service-accounts/default/scopes": "https://www.googleapis.com/auth/cloud-platform",
            "project/project-id": project_id,
            "project/numeric-project-id": "123456789012",
        }

    # scenario ----------------------------------------------------------------------------------------------
    def set(self, item: str, value: str) -> None:
        with self.changed:
            self.values[item] = value
            self.changed.notify_all()

    def notice(self) -> str:
        """Preempt now: ``instance/preempted`` becomes TRUE."""
        self.set("instance/preempted", "TRUE")
        return "TRUE"

    def maintenance(self, value: str = "TERMINATE_ON_HOST_MAINTENANCE") -> str:
        self.set("instance/maintenance-event", value)
        return value

    control_maintenance = maintenance

    def state(self) -> dict[str, Any]:
        return {
            **super().state(),
            "preempted": self.values["instance/preempted"],
            "maintenance-event": self.values["instance/maintenance-event"],
        }

    # protocol ----------------------------------------------------------------------------------------------
    def _tick(self) -> None:
        if (
            self.notice_after is not None
            and self.values["instance/preempted"] != "TRUE"
            and self.clock() - self.started_at >= self.notice_after
        ):
            self.notice()

    def _reply(self, body: str, status: int = 200, content_type: str = "application/text") -> Reply:
        return text(body, status, content_type, **{"Metadata-Flavor": "Google", "ETag": etag(body)})

    def error_reply(self, req: Request, status: int) -> Reply:
        return self._reply(f"emulated HTTP {status}\n", status, "text/html")

    def handle(self, req: Request) -> Reply:
        self._tick()
        if req.header("Metadata-Flavor") != "Google" or req.header("X-Forwarded-For"):
            return text("Missing Metadata-Flavor:Google header.\n", 403, "text/html")
        if req.path in ("", "/"):
            return self._reply("computeMetadata/\n")
        if req.method not in ("GET", "HEAD"):
            return self._reply("", 405, "text/html")
        if not req.path.startswith(ROOT):
            return self._reply("", 404, "text/html")
        item = req.path.removeprefix(ROOT)
        leaf = item.rstrip("/")
        if leaf in self.values and not item.endswith("/"):
            return self._leaf(req, leaf)
        return self._directory(req, leaf)

    def _leaf(self, req: Request, item: str) -> Reply:
        if req.query.get("wait_for_change", "").lower() == "true":
            timeout = min(float(req.query.get("timeout_sec", self.max_wait_s)), self.max_wait_s)
            last = req.query.get("last_etag")
            end = time.monotonic() + timeout
            with self.changed:
                start_value = self.values[item]
                if last is None or last == etag(start_value):
                    while not self._closed:
                        self._tick()
                        if self.values[item] != start_value or time.monotonic() >= end:
                            break
                        self.changed.wait(min(0.05, max(0.0, end - time.monotonic())))
        value = self.values[item]
        if req.query.get("alt") == "json":
            return self._reply(json.dumps(value), content_type="application/json")
        return self._reply(value)

    def _directory(self, req: Request, prefix: str) -> Reply:
        base = prefix + "/" if prefix else ""
        keys = [k for k in self.values if k.startswith(base)]
        if not keys:
            return self._reply("", 404, "text/html")
        if req.query.get("recursive", "").lower() == "true":
            tree: dict[str, Any] = {}
            for k in keys:
                node = tree
                parts = k.removeprefix(base).split("/")
                for p in parts[:-1]:
                    node = node.setdefault(p, {})
                node[parts[-1]] = self.values[k]
            return self._reply(json.dumps(tree), content_type="application/json")
        names = sorted(
            {k.removeprefix(base).split("/")[0] + ("/" if "/" in k.removeprefix(base) else "") for k in keys}
        )
        return self._reply("\n".join(names) + "\n")

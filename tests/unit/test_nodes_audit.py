"""The socket audit of the multi-node harness reads /proc/net/tcp{,6} right and refuses any outside address."""

from __future__ import annotations

import ipaddress
import sys

import pytest

from preemptible.testing.nodes import parse_tcp

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def v4(addr: str, port: int) -> str:
    raw = ipaddress.IPv4Address(addr).packed
    return (raw[::-1] if sys.byteorder == "little" else raw).hex().upper() + f":{port:04X}"


def v6(addr: str, port: int) -> str:
    raw = ipaddress.IPv6Address(addr).packed
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return raw.hex().upper() + f":{port:04X}"


def table(*rows: tuple[str, str, str]) -> str:
    return HEADER + "".join(
        f"   {i}: {a} {b} {st} 00000000:00000000 00:00000000 00000000 0 0 1\n" for i, (a, b, st) in enumerate(rows)
    )


@pytest.mark.parametrize(
    ("local", "remote", "state", "allowed"),
    [
        (v4("127.0.0.1", 80), v4("0.0.0.0", 0), "0A", True),
        (v4("0.0.0.0", 80), v4("0.0.0.0", 0), "0A", True),
        (v4("10.77.0.2", 4000), v4("10.77.0.1", 29500), "01", True),
        (v4("127.0.0.1", 4000), v4("127.0.0.1", 80), "01", True),
        (v4("10.77.0.2", 4000), v4("10.77.1.1", 80), "02", False),
        (v4("192.168.1.5", 4000), v4("10.77.0.1", 80), "01", False),
        (v4("10.77.0.2", 4000), v4("169.254.169.254", 80), "02", False),
        (v6("::", 80), v6("::", 0), "0A", True),
        (v6("::1", 5), v6("::1", 6), "01", True),
        (v6("::ffff:10.77.0.1", 5), v6("::ffff:10.77.0.2", 6), "01", True),
        (v6("::ffff:10.77.0.1", 5), v6("::ffff:8.8.8.8", 53), "02", False),
        (v6("fe80::1", 5), v6("fe80::2", 6), "01", False),
    ],
)
def test_parse_and_judge(local: str, remote: str, state: str, allowed: bool) -> None:
    (sock,) = parse_tcp(table((local, remote, state)))
    assert sock.local_port == int(local.rsplit(":", 1)[1], 16)
    assert sock.listening == (state == "0A")
    assert sock.allowed() is allowed


def test_addresses_read_in_host_order() -> None:
    (sock,) = parse_tcp(table((v4("10.77.0.2", 4000), v4("10.77.0.1", 29500), "01")))
    assert (str(sock.local), sock.local_port, str(sock.remote), sock.remote_port) == (
        "10.77.0.2",
        4000,
        "10.77.0.1",
        29500,
    )

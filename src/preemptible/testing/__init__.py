"""Tools for testing preemptible itself: the crash-consistency sweep (kill -9 a saver at random instants, then
check that a restore yields a committed checkpoint holding exactly the values of its step), and simulated nodes in
network namespaces of their own (`Cluster`), for multi-node tests and drills."""

from preemptible.testing._crashkit import Sweep, check, classify, sweep, template, values, zygote_main
from preemptible.testing.nodes import Cluster, NamespacesUnavailable, Node

__all__ = [
    "Cluster",
    "NamespacesUnavailable",
    "Node",
    "Sweep",
    "check",
    "classify",
    "sweep",
    "template",
    "values",
    "zygote_main",
]

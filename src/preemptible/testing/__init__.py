"""Tools for testing preemptible itself: the crash-consistency sweep (kill -9 a saver at random instants, then
check that a restore yields a committed checkpoint holding exactly the values of its step)."""

from preemptible.testing._crashkit import Sweep, check, classify, sweep, template, values, zygote_main

__all__ = ["Sweep", "check", "classify", "sweep", "template", "values", "zygote_main"]

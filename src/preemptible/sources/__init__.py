"""Notice sources: one small class per way the end can be announced, all behind `NoticeSource`."""

from preemptible.sources.signals import SignalSource

__all__ = ["SignalSource"]

"""For the tests of `preemptible report`: a root with a preempted, a lost and a finished attempt, and a reader of
an ``--html`` page (the text of its ids, the count of its classes, anything it would fetch: a self-contained page
fetches nothing), used on the file and on the DOM a real browser made of it."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import torch

from conftest import make_model
from preemptible import Run


def attempt(root: Path, *, stop_at: int | None = None, notice_at: int | None = None) -> None:
    """One process's run of a 12-step job: a notice during step ``notice_at`` (emergency save), or the machine gone
    during step ``stop_at`` without a word (the steps since the last checkpoint are lost)."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = Run(root, model=model, optimizer=opt, save_every=4, exit_on_notice=False, async_save=False)
    for step in run.steps(12):
        run.log(loss=1.0 / (step + 1))
        if step == notice_at:
            run.guard.trigger(source="signal")
        if step == stop_at:
            break
    if stop_at is not None:  # a killed process journals nothing after its last step: drop what leaving the loop wrote
        for path in (root / "journal").glob("*.jsonl"):
            lines = path.read_text().splitlines(keepends=True)
            kept = [x for x in lines if not (json.loads(x).get("event") == "exit" and json.loads(x)["step"] == stop_at)]
            path.write_text("".join(kept))


class Page(HTMLParser):
    """What a report page holds, by element: ids' text, classes' counts, anything that would reach out."""

    def __init__(self) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self.classes: dict[str, int] = {}
        self.outside: list[str] = []
        self.tags: set[str] = set()
        self._id: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        for c in (a.get("class") or "").split():
            self.classes[c] = self.classes.get(c, 0) + 1
        for k in ("src", "href"):
            if a.get(k):
                self.outside.append(f"{tag} {k}={a[k]}")
        self._id = a.get("id")

    def handle_data(self, data: str) -> None:
        if self._id is not None:
            self.text[self._id] = self.text.get(self._id, "") + data

    def handle_endtag(self, tag: str) -> None:
        self._id = None

"""Reading a `preemptible report --html` page: the text of its ids, the count of its classes, anything it would
fetch (a self-contained page fetches nothing). Used on the file and on the DOM a real browser made of it."""

from __future__ import annotations

from html.parser import HTMLParser


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

"""mkdocs hook: renders the committed benchmark results (``benchmarks/results/*.json``) into the pages that ask.

A page asks with a marker on a line of its own, a glob over the results folder:

    <!-- results: memory-tier-*.json -->

Each file it matches becomes a section: its machine, date and command where the JSON has them, a table of its
scalar fields, and a table for each list of records (or set of named records) in it. The numbers therefore come
from the JSON at build time and cannot drift from it. A marker that matches no file, a file that is not valid JSON,
and a results file that no page shows all fail the build, with the file named.
"""

from __future__ import annotations

import fnmatch
import html
import json
import logging
import re
import shlex
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

log = logging.getLogger("mkdocs.hooks.results")

RESULTS = Path("benchmarks") / "results"
MARKER = re.compile(r"^[ \t]*<!--\s*results:\s*(\S+)\s*-->[ \t]*$", re.MULTILINE)
META = ("date", "command", "machine")
MAX_COLUMNS = 24  # a set of named records wider than this is listed field by field instead
MAX_TEXT = 240  # longer strings (log tails) are cut, with their full length said

_state: dict[str, Any] = {"dir": None, "shown": set()}


def on_config(config: Any) -> Any:
    root = Path(config.config_file_path).resolve().parent
    _state["dir"] = root / RESULTS
    _state["shown"] = set()
    if _state["dir"].is_dir():
        config.watch.append(str(_state["dir"]))  # `mkdocs serve` rebuilds when a result changes
    return config


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        return render_pattern(match.group(1), page.file.src_uri)

    return MARKER.sub(replace, markdown)


def on_env(env: Any, **_: Any) -> Any:
    folder: Path = _state["dir"]
    if folder.is_dir():
        for path in sorted(folder.glob("*.json")):
            if path.name not in _state["shown"]:
                log.warning(
                    "benchmarks/results/%s is shown on no page: add <!-- results: %s --> to one (docs/performance.md)",
                    path.name,
                    path.name,
                )
    return env


def render_pattern(pattern: str, page: str) -> str:
    folder: Path = _state["dir"]
    names = sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []
    matched = [n for n in names if fnmatch.fnmatch(n, pattern)]
    if not matched:
        raise PluginError(
            f"{page}: the marker <!-- results: {pattern} --> matches no file in {folder} "
            f"(there: {', '.join(names) or 'nothing'})"
        )
    parts = []
    for name in matched:
        try:
            data = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PluginError(f"{page}: benchmarks/results/{name} cannot be read as JSON: {e}") from e
        _state["shown"].add(name)
        parts.append(render_file(name, data))
    return "\n\n".join(parts)


def render_file(name: str, data: Any) -> str:
    out = [f"### `{name}`", ""]
    facts = []
    if isinstance(data, dict):
        if "date" in data:
            facts.append(f"<strong>Date:</strong> {_esc(cell(data['date']))}")
        if "machine" in data:
            facts.append(f"<strong>Machine:</strong> {_esc(machine(data['machine']))}")
        if "command" in data:
            facts.append(f"<strong>Command:</strong> <code>{_esc(command(data['command']))}</code>")
        body = {k: v for k, v in data.items() if k not in META}
    else:
        body = {"(the file)": data}
    facts.append(f"Rendered at build time from <code>benchmarks/results/{_esc(name)}</code>.")
    out.append("<p>" + "<br>\n".join(facts) + "</p>")
    blocks: list[Any] = []  # in the file's order: a list of (field, value) rows, or a rendered table
    walk(body, "", blocks)
    for block in blocks:
        rendered = table(["field", "value"], [[k, cell(v)] for k, v in block]) if isinstance(block, list) else block
        out += ["", rendered]
    return "\n".join(out) + "\n"


def walk(value: Any, path: str, blocks: list[Any]) -> None:
    """Scalars (and lists of them) become field rows; a list of records or a set of named records a table."""
    if path == "output" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        blocks.append("<pre><code>" + html.escape("\n".join(value)) + "</code></pre>")  # what the benchmark printed
    elif _plain(value):
        _row(blocks, path or "(value)", value)
    elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
        records = [_flat(v) for v in value]
        blocks.append(records_table(path, ["#"], [[str(i)] for i in range(len(value))], records))
    elif isinstance(value, dict) and _named_records(value):
        keys = list(value)
        records = [{k: v for k, v in value[key].items() if _plain(v)} for key in keys]
        blocks.append(records_table(path, [""], [[k] for k in keys], records))
        for key in keys:  # what does not fit a column (nested records, figures) follows the table
            for sub, v in value[key].items():
                if not _plain(v):
                    walk(v, _join(_join(path, key), sub), blocks)
    elif isinstance(value, dict):
        for key, v in value.items():
            walk(v, _join(path, str(key)), blocks)
    else:  # a list mixing records and other values
        _row(blocks, path, json.dumps(value))


def _row(blocks: list[Any], field: str, value: Any) -> None:
    if not blocks or not isinstance(blocks[-1], list):
        blocks.append([])
    blocks[-1].append((field, value))


def _named_records(value: dict[str, Any]) -> bool:
    if len(value) < 2 or not all(isinstance(v, dict) for v in value.values()):
        return False
    columns = {k for v in value.values() for k, x in v.items() if _plain(x)}
    return 0 < len(columns) <= MAX_COLUMNS


def _flat(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in record.items():
        key = _join(prefix, str(k))
        if isinstance(v, dict):
            out.update(_flat(v, key))
        elif _plain(v):
            out[key] = v
        else:
            out[key] = json.dumps(v)
    return out


def records_table(path: str, head: list[str], first: list[list[str]], records: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for r in records:
        columns += [k for k in r if k not in columns]
    body = [f + [cell(r[c]) if c in r else "" for c in columns] for f, r in zip(first, records, strict=True)]
    caption = f"<p><code>{_esc(path or '(the file)')}</code> ({len(records)} rows)</p>"
    return caption + "\n\n" + table(head + columns, body) + "\n"


def table(head: list[str], body: list[list[str]]) -> str:
    lines = ["<table>", "<thead><tr>" + "".join(f"<th>{_esc(h)}</th>" for h in head) + "</tr></thead>", "<tbody>"]
    lines += ["<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in body]
    lines += ["</tbody>", "</table>"]
    return "\n".join(lines)


def machine(value: Any) -> str:
    if not isinstance(value, dict):
        return cell(value)
    parts = []
    for k, v in value.items():
        if k.startswith("Mem") and isinstance(v, int):
            parts.append(f"{k} {v / 1e9:.1f} GB")
        else:
            parts.append(f"{k} {cell(v)}")
    return "; ".join(parts)


def command(value: Any) -> str:
    if isinstance(value, list):
        return shlex.join(str(v) for v in value)
    return cell(value)


def cell(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 100_000 else str(value)
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(cell(v) for v in value) if value else "(none)"
    text = str(value)
    if len(text) > MAX_TEXT:
        return f"{text[:MAX_TEXT]}... ({len(text)} characters in the JSON)"
    return text


def _plain(value: Any) -> bool:
    scalar = (str, int, float, bool, type(None))
    return isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(v, scalar) for v in value))


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _esc(text: str) -> str:
    return html.escape(text).replace("\n", "<br>")

"""The documentation site builds offline in strict mode, as scripts/docs builds it: every page of the nav, every
public name in the API reference, every tool's real output (scripts/docs-outputs), every committed benchmark
result. A broken link, a missing page, a docstring that does not render or a tool whose output changed shape fails
here, not on the published site."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SNIPPET = re.compile(r'--8<-- "generated/([^"]+)"')

pytestmark = pytest.mark.timeout(300)  # the build below runs every tool once: about 40 s on 2 busy cores


def mkdocs(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of docs/ and mkdocs.yml, its tools' outputs generated, built with `mkdocs build --strict`."""
    root = tmp_path_factory.mktemp("docs-site")
    shutil.copytree(REPO / "docs", root / "docs", ignore=shutil.ignore_patterns("generated"))
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    (root / "src").symlink_to(REPO / "src")
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "results").symlink_to(REPO / "benchmarks" / "results")
    outputs = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "docs-outputs"), str(root / "docs" / "generated")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert outputs.returncode == 0, f"scripts/docs-outputs failed:\n{outputs.stdout}\n{outputs.stderr}"
    built = mkdocs(root, "build", "--strict", "--site-dir", str(root / "site"))
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}\n{built.stderr}"
    return root


def nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    raise AssertionError(f"unexpected nav entry {nav!r}")


def test_every_page_of_the_nav_is_built(site: Path) -> None:
    pages = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    assert len(pages) >= 29
    missing = [p for p in pages if not (site / "site" / p.replace(".md", ".html")).is_file()]
    assert not missing, f"pages of the nav not built: {missing}"


def test_every_included_output_was_generated_and_is_on_its_page(site: Path) -> None:
    included = {
        (page.relative_to(site / "docs"), name)
        for page in (site / "docs").rglob("*.md")
        for name in SNIPPET.findall(page.read_text())
    }
    assert {name for _, name in included} >= {f"{t}.txt" for t in ("plan", "drill", "diagnose", "run", "inspect")}
    for page, name in included:
        text = (site / "docs" / "generated" / name).read_text()
        command, _, output = text.partition("\n")
        assert command.startswith("$ ") and output.strip(), f"generated/{name} is empty or has no command line"
        html = (site / "site" / page.with_suffix(".html")).read_text()
        assert command[2:].split()[1] in html and output.split("\n")[0].split()[0] in html, (page, name)


def test_every_public_name_is_in_the_api_reference(site: Path) -> None:
    import preemptible
    import preemptible.errors

    api = (site / "site" / "reference" / "api.html").read_text()
    errors = (site / "site" / "reference" / "errors.html").read_text()
    integrations = (site / "site" / "reference" / "integrations.html").read_text()
    assert not [n for n in preemptible.__all__ if f'id="preemptible.{n}"' not in api]
    assert not [n for n in preemptible.errors.__all__ if f'id="preemptible.errors.{n}"' not in errors]
    for module in ("transformers", "lightning"):
        assert f'id="preemptible.integrations.{module}.PreemptibleCallback"' in integrations


def test_every_committed_benchmark_result_is_rendered_with_its_machine(site: Path) -> None:
    html = (site / "site" / "performance.html").read_text()
    results = sorted((REPO / "benchmarks" / "results").glob("*.json"))
    assert results
    for path in results:
        doc = json.loads(path.read_text())
        assert path.name in html
        if "date" in doc:
            assert doc["date"] in html


@pytest.mark.parametrize(
    ("files", "marker", "said"),
    [
        ({"broken.json": '{"date": '}, "broken.json", "broken.json cannot be read as JSON"),
        ({"one.json": "{}"}, "missing-*.json", "matches no file"),
        ({"one.json": "{}", "two.json": "{}"}, "one.json", "two.json is shown on no page"),
    ],
)
def test_the_results_hook_fails_the_strict_build_with_the_file_named(
    tmp_path: Path, files: dict[str, str], marker: str, said: str
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(f"# Results\n\n<!-- results: {marker} -->\n")
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    for name, text in files.items():
        (results / name).write_text(text)
    hook = REPO / "docs" / "_hooks" / "results.py"
    (tmp_path / "mkdocs.yml").write_text(f"site_name: t\nhooks:\n  - {hook}\n")
    built = mkdocs(tmp_path, "build", "--strict")
    assert built.returncode != 0 and said in built.stderr, built.stderr

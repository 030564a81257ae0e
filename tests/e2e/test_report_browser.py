"""`preemptible report --html` in a real browser: headless Chromium (Debian's package, installed by the test
set-up, scripts/install-system) loads the page; the DOM it builds shows what ``--json`` says, and its screenshot
holds the timeline's spans."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from preemptible import report as report_picture
from preemptible.cli import main
from reportkit import Page, attempt

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None and os.environ.get("CI") != "true",
    reason="no Chromium: scripts/install-system installs it (as root, with apt-get; CI does)",
)


def browser(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if BROWSER is None:
        pytest.fail("the browser test must run in CI, but there is no Chromium (scripts/install-system installs it)")
    cmd = [
        BROWSER,
        "--headless",
        "--no-sandbox",  # tests run as root in CI
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_a_browser_renders_the_report_as_json_describes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    attempt(root, notice_at=2)  # an emergency checkpoint of step 3
    attempt(root, stop_at=6)  # gone without a notice: steps 4..6 lost
    attempt(root)
    page = tmp_path / "report.html"
    assert main(["report", str(root), "--json", "--html", str(page)]) == 0
    doc = json.loads(capsys.readouterr().out)

    dom = browser(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    p = Page()
    p.feed(dom.stdout)
    assert p.text["attempts"] == str(doc["attempts"]) == "3"
    assert p.text["goodput"] == f"{100 * doc['goodput']:.1f}%"
    assert p.classes["preemption"] == len(doc["preemptions"]) == 1
    assert p.classes["attempt"] == 3 and p.classes["run"] == 3 and p.classes["redone"] == 1
    assert p.classes["figure"] == len(doc["figures"]) == 1 and p.classes["series"] == 3
    assert not p.outside

    shot = tmp_path / "shot.png"
    made = browser(tmp_path, f"--screenshot={shot}", "--window-size=1100,1100", "--hide-scrollbars", page.as_uri())
    assert made.returncode == 0 and shot.exists(), made.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    rgb = {tuple(round(float(c) * 255) for c in px[:3]) for px in pixels.reshape(-1, pixels.shape[-1])}

    def color(name: str) -> tuple[int, ...]:
        return tuple(int(report_picture.COLORS[name][i : i + 2], 16) for i in (1, 3, 5))

    redone = tuple(round(0.6 * a + 0.4 * b) for a, b in zip(color("redone"), color("train"), strict=True))
    for what, want in (("training", color("train")), ("steps redone over training", redone)):
        assert any(max(abs(a - b) for a, b in zip(c, want, strict=True)) <= 4 for c in rgb), what

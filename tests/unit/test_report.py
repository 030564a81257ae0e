"""`preemptible report`: goodput and badput from the journals of a run's attempts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from preemptible import report as report_picture
from preemptible.cli import main
from reportkit import Page, attempt


def test_a_preempted_run_and_a_lost_one_are_accounted_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    attempt(tmp_path, notice_at=2)  # emergency checkpoint of step 3
    attempt(tmp_path, stop_at=6)  # periodic at 4; steps 4, 5 and 6 ran (6 logged its loss), then gone without a save
    attempt(tmp_path)  # resumes from 4, finishes
    assert main(["report", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attempts"] == 3 and doc["finished"] is True
    runs = [(r["from_step"], r["to_step"], r["kept_steps"], r["redone_steps"]) for r in doc["runs"]]
    assert runs == [(0, 3, 3, 0), (3, 7, 1, 3), (4, 12, 8, 0)]  # steps 4, 5 and 6 ran, then were lost
    (p,) = doc["preemptions"]
    assert (p["attempt"], p["step"], p["source"], p["steps_lost"], p["resumed_from"]) == (1, 3, "signal", 0, 3)
    assert p["window_s"] == 30.0 and 0 < p["window_used"] < 1
    parts = doc["goodput_s"] + sum(doc["badput_s"].values())
    assert parts == pytest.approx(doc["wall_s"], abs=0.01)  # every second of the wall time is in one place
    assert 0 < doc["goodput"] < 1 and doc["badput_s"]["redone_s"] > 0
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "attempts                   3    finished" in out and "3 redone" in out


def test_a_run_killed_without_a_word_shows_the_steps_it_ran_past_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No `run.log`, steps of 2 s (an injected clock): after `PROGRESS_QUIET_S` without an event a boundary
    journals ``progress``, so the steps a SIGKILLed attempt ran past its last checkpoint count as redone, not as
    time between attempts."""
    import torch

    from conftest import journal, make_model
    from preemptible import Run
    from preemptible.run import PROGRESS_QUIET_S

    now = [1.8e9]

    def clock() -> float:
        return now[0]

    def attempt_of(stop_at: int | None) -> None:
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run = Run(tmp_path, model=model, optimizer=opt, save_every=4, async_save=False, clock=clock, monotonic=clock)
        for step in run.steps(12):
            now[0] += 2.0
            if step == stop_at:
                break
        now[0] += 30.0  # the machine's end, a new one starting

    assert PROGRESS_QUIET_S == 5.0
    attempt_of(stop_at=11)  # saves at 4 and 8, boundaries every 2 s; steps 8, 9 and 10 ran, then gone
    for path in (tmp_path / "journal").glob("*.jsonl"):  # killed: nothing journaled after its last step
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(x for x in lines if json.loads(x)["event"] != "exit"))
    # step 1 journals the save-cadence advice (every 4 steps of 2 s is far from Young/Daly for this state): quiet
    # from there until step 4's save, then 5 s without an event at steps 7 and 11
    assert [e["step"] for e in journal(tmp_path) if e["event"] == "save_advice"] == [1]
    assert [e["step"] for e in journal(tmp_path) if e["event"] == "progress"] == [7, 11]
    attempt_of(stop_at=None)
    assert main(["report", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    runs = [(r["from_step"], r["to_step"], r["kept_steps"], r["redone_steps"]) for r in doc["runs"]]
    assert runs == [(0, 11, 8, 3), (8, 12, 4, 0)]
    assert doc["badput_s"]["redone_s"] == pytest.approx(3 * 2.0, abs=0.01)
    # after its last event: the step that was running when it was killed (2 s), then the 30 s gap
    assert doc["badput_s"]["between_attempts_s"] == pytest.approx(32.0, abs=0.01)


def test_a_root_without_a_journal_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 0
    assert "no journal" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["report", str(tmp_path / "nope")])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_html_and_png_show_what_the_json_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    attempt(root, notice_at=2)
    attempt(root, stop_at=6)
    attempt(root)
    page, picture = tmp_path / "r.html", tmp_path / "r.png"
    assert main(["report", str(root), "--json", "--html", str(page), "--png", str(picture)]) == 0
    doc = json.loads(capsys.readouterr().out)
    html = page.read_text()
    p = Page()
    p.feed(html)
    assert p.text["attempts"] == "3" and p.text["finished"] == "finished"
    assert p.text["goodput"] == f"{100 * doc['goodput']:.1f}%"
    assert p.classes["attempt"] == 3 and p.classes["preemption"] == 1 and p.classes["run"] == 3
    assert p.classes["redone"] == 1 and p.classes["notice"] == 1 and p.classes["save"] == 4
    assert p.classes["figure"] == 1 and p.classes["series"] == 3  # loss, one line per attempt
    assert p.classes["preempted-at"] == 1 and p.classes["killed"] == 1  # attempt 2 ended without a word
    assert not p.outside and "script" not in p.tags and "url(" not in html  # self-contained: nothing to fetch
    (loss,) = doc["figures"].values()
    assert sorted((s, a) for s, _, a in loss) == sorted(
        [(s, 1) for s in range(3)] + [(s, 2) for s in range(3, 7)] + [(s, 3) for s in range(4, 12)]
    )  # steps 4..6 twice: logged by the attempt that lost them and by the one that redid them
    (a2,) = [a for a in doc["timeline"] if a["attempt"] == 2]
    assert a2["redone"]["steps"] == 3 and a2["start_s"] <= a2["redone"]["start_s"] <= a2["end_s"]

    import matplotlib.image

    pixels = matplotlib.image.imread(str(picture))
    assert pixels.shape[0] > 300 and pixels.shape[1] > 800
    rgb = {tuple(round(float(c) * 255) for c in px[:3]) for px in pixels.reshape(-1, pixels.shape[-1])}

    def color(name: str) -> tuple[int, ...]:
        return tuple(int(report_picture.COLORS[name][i : i + 2], 16) for i in (1, 3, 5))

    def over(top: tuple[int, ...], alpha: float, below: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(round(alpha * a + (1 - alpha) * b) for a, b in zip(top, below, strict=True))

    # The legend shows every colour plain; these blends exist only where the spans are drawn.
    for what, want in (
        ("redone steps over training", over(color("redone"), 0.6, color("train"))),
        ("a notice's window", over(color("notice"), 0.18, (255, 255, 255))),
    ):
        assert any(max(abs(a - b) for a, b in zip(c, want, strict=True)) <= 3 for c in rgb), what


def test_an_empty_root_still_gets_a_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "r.html"
    assert main(["report", str(tmp_path), "--html", str(page)]) == 0
    p = Page()
    p.feed(page.read_text())
    assert p.text["attempts"] == "0"
    assert main(["report", str(tmp_path), "--html", str(tmp_path / "no" / "r.html")]) == 2
    assert "could not write" in capsys.readouterr().err


def test_a_figure_over_decades_is_drawn_on_a_log_scale() -> None:
    falling = [[s, 10.0 ** (-s), 1] for s in range(5)]  # 1 to 1e-4
    svg = report_picture.figure_svg("loss", falling, marks=[2])
    assert "loss (log scale)" in svg and ">1e-2<" in svg
    flat = [[s, 1.0 + s / 10, 1] for s in range(5)]
    assert "log scale" not in report_picture.figure_svg("acc", flat, marks=[])
    assert not report_picture.log_scale([0.0, 1.0, 1000.0])  # zero: no log scale


def test_png_without_matplotlib_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: importing it raises ImportError
    assert main(["report", str(tmp_path), "--png", str(tmp_path / "r.png")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'preemptible[plot]'" in err and err.count("\n") == 1
    assert not (tmp_path / "r.png").exists()


def test_a_notice_s_window_ends_with_its_attempt_and_the_png_s_legend_covers_no_axis_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two attempts, the first stopped by a notice whose 30 s window outlasts its process: the window is drawn up to
    that attempt's end, not over the next attempt; in the picture the legend's box overlaps no axis label's box."""
    from preemptible.report import _picture

    root = tmp_path / "root"
    attempt(root, notice_at=2)
    attempt(root)
    assert main(["report", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    first = doc["timeline"][0]
    (notice,) = first["notices"]
    assert notice["deadline_s"] > doc["timeline"][1]["start_s"]  # the window reaches past the next start
    drawn = _picture._timeline(doc)
    (window,) = [r for r in drawn["rows"][0]["rects"] if r["cls"] == "window"]
    left, right = 90, 20  # the timeline's margins
    end_x = left + first["end_s"] * (1000 - left - right) / max(doc["wall_s"], 1e-3)
    assert float(window["x"]) + float(window["w"]) == pytest.approx(end_x, abs=1.6)

    fig = _picture.picture(doc)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    for ax in fig.axes:
        label = ax.xaxis.label.get_window_extent(renderer)
        legend = ax.get_legend()
        assert legend is not None
        box = legend.get_window_extent(renderer)
        assert not box.overlaps(label), (ax.get_xlabel(), box, label)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
        for other in fig.axes:  # nor another panel's label
            assert not box.overlaps(other.xaxis.label.get_window_extent(renderer))


def test_a_figure_with_no_value_to_draw_gets_no_panel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from preemptible.report import _picture

    root = tmp_path / "root"
    attempt(root)
    assert main(["report", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    doc["figures"] = {"loss": doc["figures"]["loss"], "nothing": [[1, float("nan"), 1]]}
    assert len(_picture.picture(doc).axes) == 2  # the timeline and loss; no empty "nothing"
    doc["figures"] = {}
    assert len(_picture.picture(doc).axes) == 1
    assert "Figures logged" not in _picture.html(doc, str(root))

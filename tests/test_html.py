"""``ckptprof report --html``: the page is rendered in a real headless Chromium (no
network allowed) and read back from its DOM, the way a person opens the file."""

from __future__ import annotations

import pytest

from tests.conftest import LOOPBACK_ENV, run_cli

SWEEP = ["--concurrency", "1,4", "--repeat", "2", "--ceiling-gbps", "1", "--no-report"]


@pytest.fixture(scope="module")
def runs(checkpoints, tmp_path_factory):
    """A cold/hot sweep with per-file reads, an interrupted run, and a 2-rank job."""
    ckpt = str(checkpoints("safetensors", ranks=2))
    root = tmp_path_factory.mktemp("html")
    made = {
        "sweep": ["--cache", "cold,hot", *SWEEP, "--per-file-spans", "--world-size", "1"],
        "interrupted": ["--cache", "hot", "--concurrency", "1", "--repeat", "1",
                        "--simulate-interruption", "--no-report", "--world-size", "1"],
        "job": ["--cache", "cold", "--concurrency", "2", "--repeat", "1", "--no-report",
                "--ceiling-gbps", "1", "--nproc-per-node", "2"],
    }  # fmt: skip
    for name, flags in made.items():
        done = run_cli("synth", "restore", ckpt, "--out", str(root / name), *flags,
                       env=LOOPBACK_ENV, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    return root


def open_page(browser, path):
    """Load ``path``; fail on any request that leaves the file, or any console error."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))

    def only_the_file(route):
        if route.request.url == path.as_uri():
            route.continue_()
        else:
            problems.append(f"fetched {route.request.url}")
            route.abort()

    page.route("**/*", only_the_file)
    page.goto(path.as_uri())
    return page, problems


def chart(page, name: str) -> dict:
    box = page.locator(f'figure[data-chart="{name}"] svg').bounding_box()
    assert box is not None, f"no {name} chart"
    text = page.locator(f'figure[data-chart="{name}"] svg').text_content()
    return {"width": box["width"], "height": box["height"], "text": text}


def test_one_page_opens_offline_with_every_chart(runs, browser, tmp_path):
    target = tmp_path / "report.html"
    done = run_cli("report", *(str(runs / n) for n in ("sweep", "interrupted", "job")),
                   "--html", str(target))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"HTML report written to {target}" in done.stderr
    page, problems = open_page(browser, target)
    assert problems == []
    for name in ("phases", "concurrency", "timeline", "ranks"):
        drawn = chart(page, name)
        assert drawn["width"] > 300 and drawn["height"] > 100, name
    phases = chart(page, "phases")["text"]
    for phase in ("list", "fetch", "verify", "deserialize", "reshard", "first_step"):
        assert phase in phases
    assert "min–max" in phases  # the repeats' spread is drawn
    assert "ceiling 1.00 GB/s" in chart(page, "concurrency")["text"]
    timeline = chart(page, "timeline")["text"]
    assert "restore" in timeline and "fetch 0" in timeline  # per-file reads on lanes
    assert "rank 1" in chart(page, "ranks")["text"]
    cells = page.locator("table").first.locator("tbody tr")
    caches = {cells.nth(i).locator("td").nth(1).text_content() for i in range(cells.count())}
    assert caches == {"cold", "hot"}
    body = page.locator("body").text_content()
    assert "Interruptions" in body and "simulated notice" in body and "steps lost: 0" in body
    assert "Environment" in body and "storage posix" in body
    assert "What to look at" in body  # the hints, once, at the top
    page.close()


def test_html_of_a_missing_folder_is_one_clear_error(runs, tmp_path):
    from tests.test_bad_input import assert_one_line_error

    target = tmp_path / "nowhere" / "report.html"
    done = run_cli("report", str(runs / "sweep"), "--html", str(target))
    assert_one_line_error(done, f"--html {target}: folder {target.parent} does not exist")

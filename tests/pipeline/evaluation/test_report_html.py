"""The HTML report is one self-contained file of inline matplotlib SVG charts, and renders in a real headless
Chromium with its plots: every chart is laid out with a non-empty box and the expected number of series
(methods, strategies, stages).

Chromium comes from Debian's `chromium` package; the session fixture installs it when missing
(scripts/install_chromium.sh). Where that fails the test fails under CI=true, and skips with the reason
elsewhere (a developer machine without root)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html import unescape
from pathlib import Path

import pytest
from eval_fixtures import drrag_like_runs, fake_run

from pipeline.evaluation.report import render, write_report
from pipeline.evaluation.runs import load_runs

ROOT = Path(__file__).resolve().parents[3]

# appended to a copy of the report: measures every chart and its series after layout, writes JSON into the DOM
PROBE = """<script>
window.addEventListener('load', () => {
  const charts = [...document.querySelectorAll('svg.chart')].map(svg => {
    const box = svg.getBoundingClientRect();
    const series = [...svg.querySelectorAll('g.series')].map(g => {
      const b = g.getBBox();
      const marks = g.querySelectorAll('use,path:not(defs path)').length;  // markers, lines, bars
      return {name: g.dataset.series, marks, w: b.width, h: b.height};
    });
    return {id: svg.id, kind: svg.dataset.kind, w: box.width, h: box.height, series};
  });
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(charts);
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="session")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    try:  # under pytest-timeout's 900 s, so a hung install still ends with this message
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts" / "install_chromium.sh")],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=780,
        )
        found = shutil.which("chromium")
        if proc.returncode == 0 and found:
            return found
        why = f"exit {proc.returncode}: {proc.stderr[-600:]}"
    except subprocess.TimeoutExpired:
        why = "no result after 780 s"
    why = f"could not install Chromium for the report test (scripts/install_chromium.sh, {why})"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def dump_dom(chromium: str, html: Path, tmp: Path) -> str:
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={tmp / 'profile'}",
        "--virtual-time-budget=5000",
        "--dump-dom",
        html.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_report_is_one_file_of_inline_svg_charts(tmp_path):
    drrag_like_runs(tmp_path / "runs")
    text = Path(write_report([str(tmp_path / "runs")], str(tmp_path / "a.html"))).read_text(encoding="utf-8")
    svgs = re.findall(r"<svg .*?</svg>", text, re.S)
    assert len(svgs) == 12 and all(s.startswith('<svg id="') and ' class="chart"' in s[:200] for s in svgs)
    assert "<script" not in text and "http" not in text and "<image" not in text
    assert set(re.findall(r'(?:href="|url\()(.)', text)) == {"#"}  # markers and clips point into the page only
    ids = re.findall(r' id="([^"]+)"', text)
    assert len(ids) == len(set(ids))  # twelve charts in one page: no id repeats
    f1 = next(s for s in svgs if s.startswith('<svg id="f1-time-hotpotqa"'))
    assert all(f">{m}</text>" in f1 for m in ("bm25", "cfs", "no-retrieval"))  # legend entries are text
    assert ">mean seconds per question</text>" in f1 and ">F1 (%)</text>" in f1
    assert "<title>cfs-k4: 50.0 at 0.6 s/q</title>" in f1  # hovering a point names its run
    recall = next(s for s in svgs if s.startswith('<svg id="recall-k-hotpotqa"'))
    assert re.findall(r'data-series="([^"]+)"', recall) == ["bm25", "cfs"]
    assert "<title>cfs: 6 -&gt; 80</title>" in recall
    y_ticks = [int(t) for t in re.findall(r'text-anchor: end"[^>]*>(\d+)</text>', recall)]
    assert 40 <= min(y_ticks) <= 45 and 80 <= max(y_ticks) <= 85  # fitted to recall 45..80, not from 0
    assert re.findall(r'text-anchor: end"[^>]*>(\d+)</text>', f1)[0] == "0"  # quality starts at 0
    again = Path(write_report([str(tmp_path / "runs")], str(tmp_path / "b.html"))).read_text(encoding="utf-8")
    assert re.findall(r"<svg .*?</svg>", again, re.S) == svgs  # deterministic


def test_retrieval_only_runs_get_no_quality_plot(tmp_path):
    for k in (3, 4):  # generation.backend none: empty answers, EM/F1 unknown
        fake_run(tmp_path / f"bm25-k{k}", dataset="d", method="bm25", params={"k": k}, f1s=[0.0], times=[1.0])
        (tmp_path / f"bm25-k{k}" / "config.resolved.yaml").write_text("generation:\n  backend: none\n")
    text = render(load_runs([str(tmp_path)]))
    assert re.findall(r'<svg id="([^"]+)"', text) == ["recall-k-d", "llm-calls-d", "stage-time-d"]


def test_report_plots_render_in_chromium(chromium, tmp_path):
    drrag_like_runs(tmp_path / "runs")
    html = Path(write_report([str(tmp_path / "runs")], str(tmp_path / "report.html")))
    text = html.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), "the report must not fetch anything"
    probe_copy = tmp_path / "probe.html"
    probe_copy.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")

    dom = dump_dom(chromium, probe_copy, tmp_path)
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found, "the probe script did not run (page not rendered?)"
    charts = {c["id"]: c for c in json.loads(unescape(found.group(1)))}
    for ds in ("hotpotqa", "musique"):
        expected = {
            f"front-{ds}": 9,  # 3 methods in each of the 3 cost panels
            f"f1-time-{ds}": 3,
            f"em-time-{ds}": 3,
            f"recall-k-{ds}": 2,
            f"llm-calls-{ds}": 2,
            f"stage-time-{ds}": 2,
        }  # methods; strategies varied in k; call kinds; stages with time
        for chart_id, n_series in expected.items():
            chart = charts.get(chart_id)
            assert chart, f"chart {chart_id} missing from the rendered DOM (have {sorted(charts)})"
            assert chart["w"] > 100 and chart["h"] > 100, chart
            assert len(chart["series"]) == n_series, chart
            assert all(s["marks"] and s["w"] > 0 for s in chart["series"]), chart
    recall = {s["name"]: s for s in charts["recall-k-hotpotqa"]["series"]}
    assert set(recall) == {"bm25", "cfs"} and recall["cfs"]["marks"] == 4  # line + 3 points (k = 3, 4, 6)
    assert len(charts) == 12
    assert dom.count('<table class="evaluation">') == 2


def test_report_screenshot_is_not_blank(chromium, tmp_path):
    from PIL import Image

    drrag_like_runs(tmp_path / "runs")
    html = Path(write_report([str(tmp_path / "runs")], str(tmp_path / "report.html")))
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1400,1400",
            f"--screenshot={shot}",
            html.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=True,
    )
    colours = Image.open(shot).convert("RGB").getcolors(1 << 20)
    palette_blue = (0x4E, 0x79, 0xA7)  # the first series' colour fills points, lines and bars
    assert any(c == palette_blue and n > 200 for n, c in colours), "no plotted marks visible in the screenshot"


def test_pareto_front_by_hand():
    from pipeline.evaluation.charts import pareto_front

    # (2, 50) beats (3, 40); (2, 30) loses to (2, 50) at the same cost; (1, 10) and (5, 60) are on the front
    assert pareto_front([(3, 40), (1, 10), (2, 50), (5, 60), (2, 30), (6, 60)]) == [(1, 10), (2, 50), (5, 60)]
    assert pareto_front([]) == []


def test_front_chart_is_valid_svg_with_a_front_per_cost(tmp_path):
    import xml.etree.ElementTree as ET

    drrag_like_runs(tmp_path / "runs")
    text = render(load_runs([str(tmp_path / "runs")]))
    svg = re.search(r'<svg id="front-musique".*?</svg>', text, re.S)[0]
    # standalone, the inline chart is a well-formed SVG document once it names its namespaces
    root = ET.fromstring(
        svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" ', 1)
    )
    ns = {"s": "http://www.w3.org/2000/svg"}
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and len(root.get("viewBox").split()) == 4
    groups = root.findall(".//s:g[@class='series']", ns)
    assert [g.get("data-series") for g in groups] == ["bm25", "cfs", "no-retrieval"] * 3
    assert all(g.findall(".//s:use", ns) for g in groups)  # every series has its points in every panel
    fronts = [
        g for g in root.iter("{http://www.w3.org/2000/svg}g") if (g.get("id") or "").startswith("front-musique-pareto")
    ]
    assert len(fronts) == 3 and all(g.find(".//s:path", ns) is not None for g in fronts)
    for label in ("LLM calls per question", "tokens per question", "mean latency per question (s)"):
        assert f">{label}</text>" in svg
    # the tips name each run's cost: cfs-k3's mean latency is 3 x (0.3 + 0.6) / 2
    assert "<title>cfs-k3: F1 50.0 at 1.35 mean latency per question (s)</title>" in svg

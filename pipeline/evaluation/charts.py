"""The HTML report's charts, drawn with matplotlib as inline SVG: text stays text, no scripts, no external files.

Every chart is `<svg id=... class="chart" data-kind=...>` with one `<g class="series" data-series=NAME>`
per series (a method, a retrieval strategy, a time stage), so a browser test can count what rendered.
Hovering a mark shows its exact value (an SVG `<title>`).
"""

from __future__ import annotations

import io
import re
from html import escape
from typing import cast

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

# Tableau 10, then the lighter Tableau 20 tones and two darks: 20 colours before one repeats
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    "#a0cbe8",
    "#ffbe7d",
    "#8cd17d",
    "#f1ce63",
    "#86bcb6",
    "#ff9d9a",
    "#d4a6c8",
    "#d7b5a6",
    "#79706e",
    "#499894",
)
WIDTH, HEIGHT, ROW = 6.8, 3.2, 0.26  # inches (the SVG is sized in points, 72 per inch); ROW: one bar or legend entry
STYLE = {
    "svg.fonttype": "none",
    "font.size": 8,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e4e4e4",
    "axes.axisbelow": True,
    "legend.frameon": False,
}


def _chart(title: str, xlabel: str, ylabel: str, height: float, legend_items: int) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(WIDTH, max(height, 0.9 + ROW * legend_items)), layout="constrained")  # legend fits
    FigureCanvasAgg(fig)  # this figure's own Agg canvas measures the text: no pyplot, no global backend
    return fig, fig.add_subplot(title=title, xlabel=xlabel, ylabel=ylabel)


def _svg(fig: Figure, chart_id: str, kind: str, series: list[tuple[str, list[str]]], mark: str) -> str:
    """The figure as an inline `<svg>`; series: (name, hover text of each `mark` element) of artist gid `s<index>`."""
    entries = [e for ax in fig.axes for e in zip(*ax.get_legend_handles_labels())]  # every panel's series
    fig.axes[-1].legend(
        [h for h, _ in entries], [lab for _, lab in entries], loc="upper left", bbox_to_anchor=(1.01, 1)
    )
    buf = io.StringIO()
    with rc_context({"svg.hashsalt": chart_id}):  # stable ids, unique to this chart within the page
        fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = re.sub(r' id="[A-Za-z.\d]+_\d+"', "", buf.getvalue())  # matplotlib's per-figure ids would repeat
    root = cast(re.Match[str], re.search(r'<svg [^>]*?(width="[^"]+" height="[^"]+" viewBox="[^"]+")[^>]*>', text))
    label = escape(fig.axes[0].get_title("left"))
    text = (
        f'<svg id="{escape(chart_id)}" class="chart" data-kind="{kind}" {root[1]} role="img" aria-label="{label}">'
        + text[root.end() :]
    )  # no XML prolog, DOCTYPE or namespaces: HTML parses inline SVG without them
    for i, (name, tips) in enumerate(series):
        group = cast(re.Match[str], re.search(rf'( *)<g id="s{i}">(.*?)\n\1</g>', text, re.S))  # each series has one
        marks = iter(tips)
        body = re.sub(
            rf"<{mark} ([^>]*)/>",
            lambda m, marks=marks: f"<{mark} {m[1]}><title>{escape(next(marks))}</title></{mark}>",
            group[2],
        )
        text = f'{text[: group.end(1)]}<g class="series" data-series="{escape(name)}">{body}{text[group.end(2) :]}'
    return text


def _points(ax: Axes, ps: list[tuple[float, float, str]], color: str, label: str, gid: str) -> None:
    """One series' points (x, y, hover text) as round markers; points at an axis stay whole."""
    ax.plot(
        [p[0] for p in ps],
        [p[1] for p in ps],
        "o",
        ms=7,
        alpha=0.8,
        mec="white",
        mew=0.8,
        clip_on=False,
        color=color,
        label=label,
        gid=gid,
    )


@rc_context(STYLE)
def scatter(
    chart_id: str, title: str, series: dict[str, list[tuple[float, float, str]]], xlabel: str, ylabel: str
) -> str:
    """Points (x, y, hover text), one colour per series; the y axis starts at 0."""
    fig, ax = _chart(title, xlabel, ylabel, HEIGHT, len(series))
    for i, (name, ps) in enumerate(series.items()):
        _points(ax, ps, PALETTE[i % len(PALETTE)], name[:24], f"s{i}")
    ax.set_ylim(0, max(ax.get_ylim()[1], 1.0))  # from 0; all-zero scores still get a 0..1 % axis
    return _svg(fig, chart_id, "scatter", [(name, [p[2] for p in ps]) for name, ps in series.items()], "use")


@rc_context(STYLE)
def lines(chart_id: str, title: str, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str) -> str:
    """One line with point markers per series, points sorted by x; the y axis fits the data (curves differ little)."""
    fig, ax = _chart(title, xlabel, ylabel, HEIGHT, len(series))
    tips = []
    for i, (name, ps) in enumerate(series.items()):
        ps = sorted(ps)
        ax.plot(
            [x for x, _ in ps],
            [y for _, y in ps],
            "o-",
            ms=5,
            lw=2,
            color=PALETTE[i % len(PALETTE)],
            label=name[:24],
            gid=f"s{i}",
        )
        tips.append((name, [f"{name}: {x:.4g} -> {y:.4g}" for x, y in ps]))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _svg(fig, chart_id, "lines", tips, "use")


@rc_context(STYLE)
def stacked_bars(chart_id: str, title: str, bars: list[tuple[str, dict[str, float]]], xlabel: str) -> str:
    """Horizontal bars, one per label (first at the top), each split into segments (one series per segment name)."""
    segments = list(dict.fromkeys(s for _, parts in bars for s in parts))
    fig, ax = _chart(title, xlabel, "", 1.1 + ROW * len(bars), len(segments))
    tips = []
    for j, seg in enumerate(segments):
        rects, seg_tips = [], []
        for i, (label, parts) in enumerate(bars):
            start, v = sum(parts.get(s) or 0.0 for s in segments[:j]), parts.get(seg) or 0.0
            rects.append([(start, i - 0.35), (start + v, i - 0.35), (start + v, i + 0.35), (start, i + 0.35)])
            seg_tips.append(f"{label} {seg}: {v:.4g}")
        ax.add_collection(
            PolyCollection(rects, facecolor=PALETTE[j % len(PALETTE)], linewidth=0, label=seg, gid=f"s{j}")
        )
        tips.append((seg, seg_tips))
    total = max([sum(v or 0.0 for v in parts.values()) for _, parts in bars] + [0.0])
    ax.set(
        xlim=(0, 1.05 * total or 1.0),
        ylim=(len(bars) - 0.5, -0.5),
        yticks=range(len(bars)),
        yticklabels=[label[:15] for label, _ in bars],
    )
    ax.grid(axis="y", visible=False)
    return _svg(fig, chart_id, "bars", tips, "path")


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats (lower or equal x and higher or equal y, one of them strictly), by x."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


@rc_context(STYLE)
def fronts(
    chart_id: str,
    title: str,
    panels: list[tuple[str, dict[str, list[tuple[float, float, str]]]]],
    ylabel: str,
) -> str:
    """Side by side, one panel per cost (xlabel, {series: [(x, y, hover text)]}): the points, one colour per
    series in every panel, and each panel's Pareto front (`pareto_front`) as a dashed step line."""
    names = list(dict.fromkeys(name for _, series in panels for name in series))
    fig = Figure(figsize=(WIDTH * 1.6, max(HEIGHT, 0.9 + ROW * len(names))), layout="constrained")
    FigureCanvasAgg(fig)
    axes: list[Axes] = list(fig.subplots(1, len(panels), sharey=True, squeeze=False)[0])
    groups: list[tuple[str, list[str]]] = []
    for j, (ax, (xlabel, series)) in enumerate(zip(axes, panels)):
        ax.set_xlabel(xlabel)
        for name, ps in series.items():
            i = names.index(name)
            label = name[:24] if name not in (g for g, _ in groups) else "_nolegend_"  # one legend entry a name
            _points(ax, ps, PALETTE[i % len(PALETTE)], label, f"s{len(groups)}")
            groups.append((name, [p[2] for p in ps]))
        front = pareto_front([(p[0], p[1]) for ps in series.values() for p in ps])
        ax.step(
            [x for x, _ in front],
            [y for _, y in front],
            where="post",
            color="#555",
            lw=1.2,
            ls="--",
            gid=f"{chart_id}-pareto{j}",
        )
    axes[0].set_title(title)
    axes[0].set_ylabel(ylabel)
    axes[0].set_ylim(0, max(axes[0].get_ylim()[1], 1.0))
    return _svg(fig, chart_id, "front", groups, "use")

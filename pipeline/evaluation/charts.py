"""Small hand-written SVG charts for the HTML report (no plotting library, no scripts, no network).

Every chart is `<svg id=... class="chart" data-kind=...>` with one `<g class="series" data-series=NAME>`
per series (a method, a retrieval strategy, a time stage), so a browser test can count what rendered.
Hovering a mark shows its exact value (an SVG `<title>`).
"""

from __future__ import annotations

import math
from html import escape

# Tableau 10, then the lighter Tableau 20 tones and two darks: 20 colours before one repeats
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac", "#a0cbe8", "#ffbe7d", "#8cd17d", "#f1ce63", "#86bcb6", "#ff9d9a", "#d4a6c8", "#d7b5a6",
           "#79706e", "#499894")
WIDTH, LEFT, RIGHT, TOP, BOTTOM = 680, 104, 170, 34, 46
PLOT_HEIGHT = 240


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    return [round(start + i * step, 10) for i in range(int(math.ceil((hi - start) / step)) + 1)]


def _num(v: float) -> str:
    return f"{v:.4g}"


class Frame:
    """Maps data to pixels inside the plot area and draws the axes, grid and legend."""

    def __init__(self, xs: list[float], ys: list[float], height: int = PLOT_HEIGHT, zero_y: bool = True):
        self.xt = nice_ticks(min(xs), max(xs))
        self.yt = nice_ticks(min(ys + [0.0] if zero_y else ys), max(ys))
        self.height = height

    @classmethod
    def around(cls, series: dict[str, list[tuple]], zero_y: bool = True) -> "Frame":
        """The frame holding every (x, y, ...) point of every series."""
        pts = [p for ps in series.values() for p in ps]
        return cls([p[0] for p in pts], [p[1] for p in pts], zero_y=zero_y)

    def x(self, v: float) -> float:
        lo, hi = self.xt[0], self.xt[-1]
        return LEFT + (v - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT)

    def y(self, v: float) -> float:
        lo, hi = self.yt[0], self.yt[-1]
        return TOP + self.height - (v - lo) / (hi - lo) * self.height

    def axes(self, xlabel: str, ylabel: str, x_ticks: bool = True) -> str:
        right, bottom = WIDTH - RIGHT, TOP + self.height
        parts = ['<g class="axes" stroke="#ccc" font-size="11" fill="#444">']
        for t in self.yt:
            parts.append(f'<line x1="{LEFT}" x2="{right}" y1="{self.y(t):.1f}" y2="{self.y(t):.1f}"/>'
                         f'<text x="{LEFT - 6}" y="{self.y(t) + 4:.1f}" text-anchor="end" stroke="none">{_num(t)}</text>')
        for t in self.xt if x_ticks else []:
            parts.append(f'<text x="{self.x(t):.1f}" y="{bottom + 16}" text-anchor="middle" stroke="none">{_num(t)}</text>')
        parts.append(f'<line x1="{LEFT}" x2="{right}" y1="{bottom}" y2="{bottom}" stroke="#888"/>'
                     f'<text x="{(LEFT + right) / 2}" y="{bottom + 36}" text-anchor="middle" stroke="none">{escape(xlabel)}</text>'
                     f'<text transform="translate(14,{TOP + self.height / 2}) rotate(-90)" text-anchor="middle" '
                     f'stroke="none">{escape(ylabel)}</text></g>')
        return "".join(parts)


def legend(names: list[str]) -> str:
    items = [f'<g class="legend-item"><rect x="{WIDTH - RIGHT + 14}" y="{TOP + 18 * i}" width="10" height="10" '
             f'fill="{PALETTE[i % len(PALETTE)]}"/><text x="{WIDTH - RIGHT + 30}" y="{TOP + 18 * i + 9}" '
             f'font-size="11">{escape(name[:24])}</text></g>' for i, name in enumerate(names)]
    return f'<g class="legend">{"".join(items)}</g>'


def _svg(chart_id: str, kind: str, title: str, height: int, body: str, legend_items: int) -> str:
    height = max(height, TOP + 18 * legend_items + 8)  # the legend never overflows
    return (f'<svg id="{escape(chart_id)}" class="chart" data-kind="{kind}" xmlns="http://www.w3.org/2000/svg" '
            f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" role="img">'
            f'<title>{escape(title)}</title><text x="{LEFT}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>'
            f"{body}</svg>")


def scatter(chart_id: str, title: str, series: dict[str, list[tuple[float, float, str]]], xlabel: str,
            ylabel: str) -> str:
    """Points (x, y, hover text), one colour per series."""
    f = Frame.around(series)
    groups = []
    for i, (name, ps) in enumerate(series.items()):
        marks = "".join(f'<circle class="point" cx="{f.x(x):.1f}" cy="{f.y(y):.1f}" r="5" fill-opacity="0.75" '
                        f'stroke="#fff"><title>{escape(tip)}</title></circle>' for x, y, tip in ps)
        groups.append(f'<g class="series" data-series="{escape(name)}" fill="{PALETTE[i % len(PALETTE)]}">{marks}</g>')
    return _svg(chart_id, "scatter", title, TOP + PLOT_HEIGHT + BOTTOM,
                f.axes(xlabel, ylabel) + "".join(groups) + legend(list(series)), len(series))


def lines(chart_id: str, title: str, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str) -> str:
    """One polyline with point markers per series, points sorted by x."""
    f = Frame.around(series, zero_y=False)  # recall curves differ by a few points: zoom in
    groups = []
    for i, (name, ps) in enumerate(series.items()):
        color, ps = PALETTE[i % len(PALETTE)], sorted(ps)
        coords = " ".join(f"{f.x(x):.1f},{f.y(y):.1f}" for x, y in ps)
        marks = "".join(f'<circle cx="{f.x(x):.1f}" cy="{f.y(y):.1f}" r="3.5"><title>{escape(name)}: {_num(x)} -> '
                        f"{_num(y)}</title></circle>" for x, y in ps)
        groups.append(f'<g class="series" data-series="{escape(name)}" fill="{color}"><polyline points="{coords}" '
                      f'fill="none" stroke="{color}" stroke-width="2"/>{marks}</g>')
    return _svg(chart_id, "lines", title, TOP + PLOT_HEIGHT + BOTTOM,
                f.axes(xlabel, ylabel) + "".join(groups) + legend(list(series)), len(series))


def stacked_bars(chart_id: str, title: str, bars: list[tuple[str, dict[str, float]]], xlabel: str) -> str:
    """Horizontal bars, one per label, each split into segments (one series per segment name)."""
    segments = list(dict.fromkeys(s for _, parts in bars for s in parts))
    row = 22
    height = len(bars) * row
    totals = [sum(v or 0.0 for v in parts.values()) for _, parts in bars]
    f = Frame([0.0, max(totals + [0.0])], [0.0, 1.0], height=height)
    labels = "".join(f'<text x="{LEFT - 6}" y="{TOP + i * row + 15}" text-anchor="end" font-size="11">'
                     f"{escape(label[:15])}<title>{escape(label)}</title></text>" for i, (label, _) in enumerate(bars))
    groups = []
    for j, seg in enumerate(segments):
        rects = []
        for i, (label, parts) in enumerate(bars):
            start = sum(parts.get(s) or 0.0 for s in segments[:j])
            v = parts.get(seg) or 0.0
            rects.append(f'<rect x="{f.x(start):.1f}" y="{TOP + i * row + 3}" width="{max(f.x(start + v) - f.x(start), 0):.1f}" '
                         f'height="{row - 6}"><title>{escape(label)} {escape(seg)}: {_num(v)}</title></rect>')
        groups.append(f'<g class="series" data-series="{escape(seg)}" fill="{PALETTE[j % len(PALETTE)]}">{"".join(rects)}</g>')
    axis = (f'<g font-size="11" fill="#444">' + "".join(
        f'<line x1="{f.x(t):.1f}" x2="{f.x(t):.1f}" y1="{TOP}" y2="{TOP + height}" stroke="#eee"/>'
        f'<text x="{f.x(t):.1f}" y="{TOP + height + 16}" text-anchor="middle">{_num(t)}</text>' for t in f.xt)
        + f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{TOP + height + 36}" text-anchor="middle">{escape(xlabel)}</text></g>')
    return _svg(chart_id, "bars", title, TOP + height + BOTTOM,
                axis + labels + "".join(groups) + legend(segments), len(segments))

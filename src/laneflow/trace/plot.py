"""Timeline picture: one row per lane, one bar per command, coloured by op.

matplotlib is imported only here, and only when a plot is drawn; it draws on its own Agg canvas, so
the pyplot backend of the calling program is left alone.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from .events import TraceEvent

_MAX_LEGEND = 12


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("trace.plot needs matplotlib: pip install 'laneflow[bench]' "
                          "(or pip install matplotlib); trace.save() needs nothing extra") from None
    return Figure, FigureCanvasAgg


def plot(events: Iterable[TraceEvent], path: Any, title: str | None = None) -> None:
    Figure, FigureCanvasAgg = _matplotlib()
    events = list(events)
    rows = sorted({(e.device, e.stream, e.lane_index, e.lane) for e in events})
    row_of = {r[3]: k for k, r in enumerate(rows)}
    # Colour by op, the ops with the most time first (they get the legend entries).
    total: dict[str, float] = {}
    for e in events:
        total[e.op] = total.get(e.op, 0.0) + e.duration
    ops = sorted(total, key=lambda o: -total[o])
    palette = [f"C{k}" for k in range(10)] + ["#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
    colour = {op: palette[k % len(palette)] for k, op in enumerate(ops)}

    fig = Figure(figsize=(10, 1.2 + 0.45 * max(len(rows), 1)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    t0 = min((e.start for e in events), default=0.0)
    for op in ops:
        by_row: dict[int, list[tuple[float, float]]] = {}
        for e in events:
            if e.op == op:
                by_row.setdefault(row_of[e.lane], []).append(((e.start - t0) * 1e3, max(e.duration, 0.0) * 1e3))
        for r, spans in by_row.items():
            ax.broken_barh(spans, (r - 0.38, 0.76), facecolors=colour[op], edgecolor="black", linewidth=0.3,
                           label=op if r == min(by_row) else None)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r[0]} s{r[1]} lane {r[2]}" for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("time since first command (ms)")
    span = (max((e.end for e in events), default=0.0) - t0) * 1e3
    ax.set_xlim(0, span * 1.01 if span > 0 else 1.0)
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    ax.set_title(title or f"laneflow timeline: {len(events)} commands on {len(rows)} lanes, {span:.2f} ms")
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        extra = len(labels) - _MAX_LEGEND
        ax.legend(handles[:_MAX_LEGEND], labels[:_MAX_LEGEND],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
                  title=f"op (+{extra} more)" if extra > 0 else "op", title_fontsize=8)
    if not events:
        ax.text(0.5, 0.5, "no commands recorded", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(os.fspath(path))

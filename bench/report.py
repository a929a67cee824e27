"""Shared output for benchmarks: an aligned table on stdout, and JSON and a
PNG plot in bench/results/.

    from report import Column, Bars, report
    report("nbd_fio", rows, columns=[Column("point", "point"), ...],
           plots=[Bars(x="point", series=[("a_iops", "a"), ...], ylabel="IOPS")],
           meta={"load1": ...})

Run benchmarks with /usr/bin/python3, which has matplotlib and numpy.
"""

import json
import os
import time
from dataclasses import dataclass, field

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


@dataclass
class Column:
    key: str
    header: str
    fmt: str = "{}"

    def cell(self, row):
        v = row.get(self.key)
        if v is None:
            return "-"
        try:
            return self.fmt.format(v)
        except (ValueError, TypeError):
            return str(v)


@dataclass
class Bars:
    """A grouped bar chart: one group per row (labelled by `x`), one bar
    per (key, label) in `series`."""

    x: str
    series: list
    ylabel: str
    title: str = ""
    log: bool = False
    notes: list = field(default_factory=list)
    # (y, label) reference lines, e.g. a floor measured in the same run
    hlines: list = field(default_factory=list)


def table(rows, columns):
    """The rows as an aligned text table (numbers right-aligned)."""
    cells = [[c.header for c in columns]] + [[c.cell(r) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]

    def line(row, header=False):
        out = []
        for i, text in enumerate(row):
            left = i == 0 or header
            out.append(text.ljust(widths[i]) if left else text.rjust(widths[i]))
        return "  ".join(out).rstrip()

    lines = [line(cells[0], header=True), "  ".join("-" * w for w in widths)]
    lines += [line(r) for r in cells[1:]]
    return "\n".join(lines)


def plot(path, rows, plots):
    """Draw each `Bars` as a subplot into one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(plots), 1, figsize=(11, 4.2 * len(plots)), squeeze=False)
    for ax, spec in zip(axes[:, 0], plots):
        labels = [str(r.get(spec.x)) for r in rows]
        xs = np.arange(len(rows))
        width = 0.8 / max(1, len(spec.series))
        for i, (key, label) in enumerate(spec.series):
            ys = [r.get(key) or 0 for r in rows]
            ax.bar(xs + (i - (len(spec.series) - 1) / 2) * width, ys, width, label=label)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(spec.ylabel)
        if spec.log:
            ax.set_yscale("log")
        if spec.title:
            ax.set_title(spec.title, fontsize=10)
        for y, label in spec.hlines:
            ax.axhline(y, color="#c0392b", linestyle="--", linewidth=1, label=label)
        for note in spec.notes:
            ax.text(0.01, 0.97, note, transform=ax.transAxes, va="top", fontsize=8)
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(name, rows, columns, plots=(), meta=None, title=None):
    """Print the table, write results/<name>.json and results/<name>.png.
    Returns the paths written."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    if title:
        print(title)
    print(table(rows, columns))
    doc = {
        "name": name,
        "written_unix_s": int(time.time()),
        "meta": meta or {},
        "columns": [{"key": c.key, "header": c.header} for c in columns],
        "rows": rows,
    }
    json_path = os.path.join(RESULTS_DIR, name + ".json")
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    paths = [json_path]
    if plots:
        png_path = os.path.join(RESULTS_DIR, name + ".png")
        plot(png_path, rows, list(plots))
        paths.append(png_path)
    for p in paths:
        print("wrote", os.path.relpath(p))
    return paths

"""The report's chart: latency per mode per model, one panel per measure, with each model's floor drawn."""

from __future__ import annotations

import textwrap
from pathlib import Path

from reference.benchmark.results import Row, mode_order


def _text(label: str, width: int | None = None) -> str:
    """``label`` as matplotlib shows it literally: a ``$`` would start mathtext (an override's value, a GPU name),
    wrapped at ``width`` characters where given (a measure with long ``-O`` overrides as a panel's title)."""
    lines = textwrap.wrap(label, width) if width else [label]
    return "\n".join(line.replace("$", r"\$") for line in lines)  # escaped after the wrap, which could split "\$"


def latency_chart(rows: list[Row], path: Path) -> Path:
    """Write a PNG: a panel per measure (generate, decode step, ...; with its ``-O`` overrides, wrapped), bars per
    model and GPU (the GPU named under each model wherever the rows span several cards) and mode (p50, in ms), a
    black line at each floor where the rows have one. Labels are shown literally (a ``$`` is no mathtext).
    Needs matplotlib (the ``report`` extra).

    Raises:
        ImportError: matplotlib is not installed (the message says how to install it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "the chart needs matplotlib: pip install matplotlib (or the project's [test] extra)"
        ) from None
    from matplotlib.ticker import FuncFormatter

    measures = list(dict.fromkeys(r.measure_label for r in rows))
    all_modes = mode_order(rows)  # one colour per mode across the panels
    several_gpus = len({r.gpu for r in rows}) > 1  # then every group names its GPU, in every panel
    fig, axes = plt.subplots(1, len(measures), figsize=(5.5 * len(measures), 4.2), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, measure in zip(axes[0], measures):
        shown = [r for r in rows if r.measure_label == measure]
        groups = list(dict.fromkeys((r.model, r.gpu) for r in shown))  # a bar group per model and GPU
        modes = [mode for mode in all_modes if any(r.mode == mode for r in shown)]
        width = 0.8 / len(modes)
        for m, mode in enumerate(modes):
            for i, group in enumerate(groups):
                r = next((r for r in shown if (r.model, r.gpu, r.mode) == (*group, mode)), None)
                if r is not None:
                    label = _text(mode) if i == 0 else None
                    ax.bar(
                        i + (m - (len(modes) - 1) / 2) * width,
                        r.latency_s * 1e3,
                        width,
                        color=colors(all_modes.index(mode) % colors.N),
                        label=label,
                    )
        for i, group in enumerate(groups):
            floors = [r.floor_s for r in shown if (r.model, r.gpu) == group and r.floor_s]
            if floors:
                ax.hlines(
                    min(floors) * 1e3,
                    i - 0.45,
                    i + 0.45,
                    colors="black",
                    linewidth=2,
                    label="floor" if i == 0 else None,
                )
        ticks = [_text(f"{model}\n{gpu or 'cpu'}" if several_gpus else model) for model, gpu in groups]
        ax.set_xticks(range(len(groups)), ticks, fontsize="small" if several_gpus else None)
        ax.set_title(_text(measure, 48))
        ax.set_ylabel("p50 latency (ms)")
        ax.set_yscale("log")
        plain = FuncFormatter(lambda y, _: f"{y:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.grid(axis="y", which="both", alpha=0.3)
    handles = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(len(handles), 7), frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

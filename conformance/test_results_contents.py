"""What bench_latency's markdown files and the report's chart show, read back and compared with the results
they show: every cell of a latency table, every line over it, every bar and floor of the chart.

The inputs are committed results from real runs (perf/results); expected values are computed here from the
files' own numbers, so a cell that shows another field, another rounding or another unit fails.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from reference.benchmark.report import (
    EAGER_NOTE,
    markdown_header,
    markdown_report,
    markdown_table,
    write_results,
    write_whole,
)
from reference.benchmark.results import mode_order, newest, read_rows

pytestmark = pytest.mark.requires("components")

ROOT = Path(__file__).resolve().parents[1]
GENERATE = ROOT / "perf/results/llama-3.1-8b-20261201-194356.json"  # six modes, hf-eager and hf-compile
STEP = ROOT / "perf/results/step-llama-3.1-8b-decode-full-20261201.json"  # pytest-benchmark: four modes
QWEN = ROOT / "perf/results/qwen3-8b-20261201-194714.json"


def _doc(path: Path = GENERATE) -> dict:
    return json.loads(path.read_text())


def _cells(table: str) -> list[dict[str, str]]:
    """A markdown table as one {column: cell} dict per row."""
    head, rule, *body = table.splitlines()
    names = [c.strip() for c in head.strip("|").split("|")]
    assert rule == "|" + "---|" * len(names)
    return [dict(zip(names, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in body]


def test_every_cell_of_a_latency_table_shows_its_field_rounded_as_its_header_says():
    doc = _doc()
    rows = _cells(markdown_table(doc))
    baselines = [r["mode"] for r in doc["results"] if r["kind"] == "baseline"]
    assert baselines == ["hf-eager", "hf-compile"] and len(rows) == len(doc["results"])
    first = doc["results"][0]["mode"]
    for row, r in zip(rows, doc["results"]):
        lat, st = r["latency_s"], r["startup"]
        assert (row["mode"], row["avg s"], row["p50 s"], row["p90 s"]) == (
            r["mode"], f"{lat['avg']:.4f}", f"{lat['p50']:.4f}", f"{lat['p90']:.4f}"
        )  # fmt: skip
        assert (row["tok/s"], row["floor s"], row["p50/floor"]) == (
            f"{r['tokens_per_s']:.1f}", f"{r['floor_s']:.4f}", f"{r['x_floor']:.2f}"
        )  # fmt: skip
        assert row[f"same tokens as {first}"] == f"{r['same_tokens_as_first']:.0%}"
        if r["kind"] == "baseline":
            assert row["compile s"] == f"{st['first_call_s']:.2f} (first call)"
            assert row["capture s"] == row["graph GiB"] == "-" and all(row[f"vs {b}"] == "-" for b in baselines)
            continue
        compiled, captured = r["compilation_config"]["level"] > 0, bool(st["capture_sizes"])
        assert row["compile s"] == (f"{st['compile_s']:.2f}" if compiled else "-")  # eager compiles nothing
        assert row["capture s"] == (f"{st['capture_s']:.2f}" if captured else "-")
        assert row["graph GiB"] == (f"{st['graph_gib']:.3f}" if captured else "-")
        assert [row[f"vs {b}"] for b in baselines] == [f"{r['speedup_vs'][b]:.2f}x" for b in baselines]
    breakable = next(row for row in rows if row["mode"] == "breakable")
    assert breakable["capture s"] != "-"  # a mode with level 0 in its config that still captures graphs


def test_a_compile_the_compile_cache_served_reads_cached_and_eager_never_does():
    """A start the project's compile cache served compiles nothing; eager compiles nothing in any case, so its
    '-' takes no mark even where the field is set."""
    doc = _doc()
    engine = [r for r in doc["results"] if r["kind"] == "engine"]
    for r in engine:
        r["startup"]["compile_cache_hits"] = 1
    rows = {row["mode"]: row for row in _cells(markdown_table(doc))}
    for r in engine:
        compiled = r["compilation_config"]["level"] > 0
        expected = f"{r['startup']['compile_s']:.2f} (cached)" if compiled else "-"
        assert rows[r["mode"]]["compile s"] == expected
    assert any(r["compilation_config"]["level"] == 0 for r in engine)


def test_a_field_that_was_not_measured_shows_as_a_dash():
    doc = _doc()
    doc["results"][1]["floor_s"] = doc["results"][1]["x_floor"] = None  # a CPU run has no floor
    row = _cells(markdown_table(doc))[1]
    assert (row["floor s"], row["p50/floor"]) == ("-", "-")


def test_the_header_says_what_ran_and_notes_a_cpu_runs_missing_graphs_and_floor():
    doc = _doc()
    s = doc["settings"]
    assert markdown_header(doc) == (
        f"{doc['model']} on {doc['env']['gpu']}, {s['dtype']}: batch {s['batch_size']}, {s['input_len']} prompt + "
        f"{s['output_len']} generated tokens; {s['num_iters']} timed call(s) after {s['num_iters_warmup']} warm-up"
    )
    cpu = copy.deepcopy(doc)
    cpu["env"]["gpu"], cpu["bandwidth_Bps"], cpu["settings"]["tensor_parallel_size"] = None, None, 2
    lines = markdown_header(cpu).splitlines()
    assert lines[0].startswith(f"{doc['model']} on cpu ({doc['env']['cpu']}), {s['dtype']}: batch {s['batch_size']}")
    assert lines[0].endswith("warm-up; tensor parallel x2")
    assert lines[1:] == [
        "note: CUDA graphs need CUDA; on this CPU the modes with graphs ran without them",
        "note: no floor on a CPU (the floor divides weight bytes by a GPU's measured bandwidth)",
    ]
    no_graphs = copy.deepcopy(cpu)
    no_graphs["results"] = [r for r in no_graphs["results"] if r.get("compilation_config", {}).get("level") != 3]
    assert "CUDA graphs need CUDA" not in markdown_header(no_graphs)
    overridden = copy.deepcopy(doc)
    overridden["settings"]["compilation_config_overrides"] = {"compile_sizes": [8], "custom_ops": ["none"]}
    assert markdown_header(overridden).splitlines()[1:] == [
        'compiled modes\' config overrides (-O): {"compile_sizes": [8], "custom_ops": ["none"]}'
    ]


def test_the_report_file_gives_the_run_its_machine_its_floor_and_the_table():
    doc = _doc()
    env, s = doc["env"], doc["settings"]
    lines = markdown_report(doc).splitlines()
    title = f"# {doc['model']}: generate latency, batch {s['batch_size']}, {s['input_len']} in, {s['output_len']} out"
    assert lines[:2] == [title, ""]
    assert lines[2] == (
        f"- date: {env['date']}; GPU: {env['gpu']}; torch {env['torch']}; transformers {env['transformers']}; "
        f"custom-op kernels: {env['custom_op_kernels']}"
    )
    assert lines[3] == f"- dtype {s['dtype']}; {s['num_iters']} timed calls per mode after {s['num_iters_warmup']} warm-up calls"
    assert lines[4] == (
        f"- machine: {env['cpu']}, {env['threads']} torch threads of {env['cpu_count']} cores; load average at "
        f"start {env['load_avg_at_start']}; GPU clocks {env['gpu_clocks']}"
    )
    assert lines[5] == (
        f"- weights read per decode step: {doc['weight_bytes_per_decode_step']:,} bytes; bandwidth: "
        f"{doc['bandwidth_Bps']:.3e} B/s ({doc['bandwidth_method']})"
    )
    assert lines[6] == "- floor = output_len x weight bytes / bandwidth; 'vs X' = X's p50 / this mode's p50"
    assert lines[7] == f"- command: `{env['command']}`"
    assert lines[8] == EAGER_NOTE
    assert "\n".join(lines[10:]) == markdown_table(doc) and lines[9] == ""
    assert markdown_report(doc).endswith("|\n")


def test_the_report_of_a_cpu_or_tensor_parallel_run_says_so_and_one_without_eager_has_no_eager_note():
    doc = _doc()
    doc["env"] |= {"gpu": None, "gpu_clocks": None}
    doc["bandwidth_Bps"], doc["settings"]["tensor_parallel_size"] = None, 2
    doc["results"] = [r for r in doc["results"] if r["mode"] != "eager"]
    for key in ("threads", "cpu_count", "load_avg_at_start"):
        del doc["env"][key]  # files written before the tool recorded them
    text = markdown_report(doc)
    assert "GPU: none;" in text and "GPU clocks not read" in text and "? torch threads of ? cores" in text
    assert "load average at start ?" in text
    assert "- tensor parallel over 2 processes: weights and floor are one rank's (the ranks read at once)" in text
    assert "bandwidth: not measured (no GPU), no floor" in text and EAGER_NOTE not in text
    del doc["env"]["custom_op_kernels"]
    assert "custom-op kernels: not recorded" in markdown_report(doc)


def test_a_whole_write_replaces_the_file_and_leaves_no_partial_file(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old")
    write_whole(path, "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["report.md"]


# ---------------------------------------------------------------------- the chart
@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """The chart's figure as ``latency_chart`` saved it (it closes the figure after saving)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from reference.benchmark.chart import latency_chart

    figures = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self) or real_savefig(self, *a, **k))
    rows = newest(read_rows(GENERATE) + read_rows(QWEN) + read_rows(STEP))
    assert latency_chart(rows, tmp_path / "chart.png") == tmp_path / "chart.png"
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
    (figure,) = figures
    return rows, figure


def test_the_chart_has_a_panel_per_measure_with_a_bar_per_model_and_mode_at_its_p50_in_ms(drawn):
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    rows, figure = drawn
    colours = plt.get_cmap("tab10")
    measures = list(dict.fromkeys(r.measure_label for r in rows))
    axes = figure.axes
    assert [ax.get_title() for ax in axes] == measures and len(measures) == 2
    all_modes = mode_order(rows)
    for ax, measure in zip(axes, measures):
        models = list(dict.fromkeys(r.model for r in rows if r.measure_label == measure))
        modes = [m for m in all_modes if any(r.mode == m and r.measure_label == measure for r in rows)]
        assert [t.get_text() for t in ax.get_xticklabels()] == models  # one GPU: no GPU under the models
        assert (ax.get_ylabel(), ax.get_yscale()) == ("p50 latency (ms)", "log")
        width = 0.8 / len(modes)
        expected = sorted(
            (round(i + (m - (len(modes) - 1) / 2) * width, 9), round(r.latency_s * 1e3, 9), to_rgba(colours(all_modes.index(mode) % colours.N)))
            for m, mode in enumerate(modes)
            for i, model in enumerate(models)
            for r in rows
            if (r.model, r.measure_label, r.mode) == (model, measure, mode)
        )  # fmt: skip
        bars = sorted(
            (round(p.get_x() + p.get_width() / 2, 9), round(p.get_height(), 9), p.get_facecolor()) for p in ax.patches
        )
        assert bars == expected and all(abs(p.get_width() - width) < 1e-12 for p in ax.patches)


def test_the_chart_names_the_gpu_under_each_model_where_a_panel_has_runs_on_two_cards(monkeypatch, tmp_path):
    """An H100 run beside the H200's is its own bar group, never a taller bar of the same model."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from reference.benchmark.chart import latency_chart

    figures = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self) or real_savefig(self, *a, **k))
    h200 = read_rows(GENERATE)
    h100 = [dataclasses.replace(r, gpu="NVIDIA H100 80GB HBM3", latency_s=2 * r.latency_s) for r in h200]
    latency_chart(newest(h200 + h100), tmp_path / "chart.png")
    ((ax,),) = [f.axes for f in figures]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["llama-3.1-8b\nNVIDIA H200", "llama-3.1-8b\nNVIDIA H100 80GB HBM3"]
    assert len(ax.patches) == len(h200) + len(h100)


def test_the_chart_shows_labels_literally_and_names_every_groups_gpu_once_the_rows_span_two(monkeypatch, tmp_path):
    """A ``$`` in an override or a GPU name is text, not mathtext (it raised a ParseException); a panel of H100 rows
    beside panels of H200 rows names its GPU though it holds one card; a long title is wrapped."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from reference.benchmark.chart import latency_chart

    figures = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self) or real_savefig(self, *a, **k))
    h200 = read_rows(GENERATE)
    odd = '{"cache_dir":"$\\bogus{$","inductor_compile_config":{"max_autotune":true}}'
    h100 = [dataclasses.replace(r, gpu="$H100$", overrides=odd) for r in h200]
    latency_chart(newest(h200 + h100), tmp_path / "chart.png")
    ((plain, overridden),) = [f.axes for f in figures]
    assert [t.get_text() for t in plain.get_xticklabels()] == ["llama-3.1-8b\nNVIDIA H200"]
    assert [t.get_text() for t in overridden.get_xticklabels()] == [r"llama-3.1-8b" + "\n" + r"\$H100\$"]
    title = overridden.get_title()
    assert "\n" in title and "\\\n" not in title  # no line ends in half an escape
    unescaped = title.replace(r"\$", "$")
    # the wrap drops the spaces it breaks at
    assert re.sub(r"\s", "", unescaped) == re.sub(r"\s", "", h100[0].measure_label)


def test_the_chart_draws_each_models_floor_as_a_line_over_its_bars(drawn):
    rows, figure = drawn
    for ax in figure.axes:
        measure = ax.get_title()
        models = [t.get_text() for t in ax.get_xticklabels()]
        floors = {
            i: min(r.floor_s for r in rows if r.model == model and r.measure == measure and r.floor_s) * 1e3
            for i, model in enumerate(models)
            if any(r.floor_s for r in rows if r.model == model and r.measure == measure)
        }
        segments = [seg for coll in ax.collections for seg in coll.get_segments()]
        drawn_floors = {round((seg[0][0] + seg[1][0]) / 2): (seg[0][0], seg[1][0], seg[0][1]) for seg in segments}
        assert set(drawn_floors) == set(floors) and floors
        for i, (left, right, y) in drawn_floors.items():
            assert (round(left, 9), round(right, 9)) == (round(i - 0.45, 9), round(i + 0.45, 9))
            assert y == pytest.approx(floors[i])


def test_the_legend_names_every_mode_once_and_the_floor(drawn):
    rows, figure = drawn
    (legend,) = figure.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert sorted(labels) == sorted({r.mode for r in rows} | {"floor"})  # each once, from whichever panel
    import numpy as np

    import matplotlib.pyplot as plt

    tab10, modes = plt.get_cmap("tab10"), mode_order(rows)
    colours = {mode: tab10(modes.index(mode) % tab10.N) for mode in modes} | {"floor": (0.0, 0.0, 0.0, 1.0)}
    for label, handle in zip(labels, legend.legend_handles, strict=True):  # each label beside its mode's colour
        colour = handle.get_facecolor() if label != "floor" else handle.get_color()
        assert tuple(np.asarray(colour, dtype=float).reshape(-1, 4)[0]) == tuple(colours[label]), label


def test_floors_are_black_and_the_log_axis_reads_in_plain_numbers(drawn):
    from matplotlib.colors import to_rgba

    _, figure = drawn
    for ax in figure.axes:
        assert [tuple(c) for coll in ax.collections for c in coll.get_colors()] == [to_rgba("black")] * sum(
            len(coll.get_segments()) for coll in ax.collections
        )
        for axis_formatter in (ax.yaxis.get_major_formatter(), ax.yaxis.get_minor_formatter()):
            assert [axis_formatter(y, 0) for y in (0.5, 4.0, 1000.0)] == ["0.5", "4", "1000"]  # not 10^3


def test_the_legend_sits_below_every_panel_without_covering_one(drawn):
    _, figure = drawn
    figure.canvas.draw()  # positions are known after a draw
    (legend,) = figure.legends
    legend_top = legend.get_window_extent().y1
    assert all(legend_top <= ax.get_window_extent().y0 for ax in figure.axes)
    assert legend.get_window_extent().y0 >= 0  # inside the figure
    whole = figure.bbox
    for ax in figure.axes:  # each panel inside the figure, with a width and a height
        box = ax.get_window_extent()
        assert whole.x0 <= box.x0 < box.x1 <= whole.x1 and whole.y0 <= box.y0 < box.y1 <= whole.y1


def _chart(rows, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from reference.benchmark.chart import latency_chart

    figures = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self) or real_savefig(self, *a, **k))
    latency_chart(rows, tmp_path / "chart.png")
    return figures[0]


def test_a_model_without_some_mode_gets_the_bars_it_has_and_one_model_still_gets_a_floor(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    rows = newest(read_rows(STEP))
    missing = rows[-1]
    assert len({r.model for r in rows}) == 1 and any(r.floor_s for r in rows)
    other = [dataclasses.replace(r, model="other-model") for r in rows if r.mode != missing.mode]
    figure = _chart(rows + other, tmp_path, monkeypatch)
    assert len(figure.axes[0].patches) == len(rows) + len(other)
    figure = _chart(rows, tmp_path, monkeypatch)  # one model: its floor is the first (i == 0) and only one
    assert "floor" in [t.get_text() for t in figure.legends[0].get_texts()]


def test_without_matplotlib_the_chart_says_how_to_install_it(tmp_path, monkeypatch):
    from reference.benchmark.chart import latency_chart

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(ImportError) as err:
        latency_chart(read_rows(STEP), tmp_path / "chart.png")
    assert str(err.value) == "the chart needs matplotlib: pip install matplotlib (or the project's [test] extra)"


def test_results_go_to_the_json_path_and_to_a_stamped_json_and_markdown_pair_in_the_folder(tmp_path):
    doc = _doc()
    doc["model"] = str(tmp_path / "checkpoints" / "llama-3.1-8b")  # a checkpoint path: the files take its name
    out, folder = tmp_path / "a" / "b" / "run.json", tmp_path / "c" / "results"
    written = write_results(doc, out, folder)
    assert written[0] == out and json.loads(out.read_text()) == doc and out.read_text() == json.dumps(doc, indent=2)
    json_file, md_file = written[1:]
    assert json_file.parent == md_file.parent == folder and json_file.stem == md_file.stem
    assert re.fullmatch(r"llama-3\.1-8b-\d{8}-\d{6}", json_file.stem), json_file.stem
    assert (json_file.suffix, md_file.suffix) == (".json", ".md")
    assert json_file.read_text() == out.read_text() and md_file.read_text() == markdown_report(doc)
    assert sorted(p.name for p in folder.iterdir()) == sorted([json_file.name, md_file.name])  # nothing partial


def test_no_path_and_no_folder_write_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a file written to a relative default path would land here
    assert write_results(_doc(), None, None) == [] and not list(tmp_path.iterdir())


@pytest.mark.parametrize("level", [1, 2])  # Dynamo compiles at every level above 0
def test_a_level_one_or_two_mode_shows_its_compile_time(level):
    doc = _doc()
    no_inductor = next(r for r in doc["results"] if r["mode"] == "no_inductor")
    no_inductor["compilation_config"]["level"] = level
    row = next(row for row in _cells(markdown_table(doc)) if row["mode"] == "no_inductor")
    assert row["compile s"] == f"{no_inductor['startup']['compile_s']:.2f}"


def test_a_file_from_before_tensor_parallelism_reads_as_one_process():
    doc = _doc()
    del doc["settings"]["tensor_parallel_size"]  # files written before the field existed
    assert "tensor parallel" not in markdown_header(doc) and "tensor parallel" not in markdown_report(doc)


def test_results_go_into_a_folder_that_exists_already(tmp_path):
    (tmp_path / "results").mkdir()
    assert len(write_results(_doc(), None, tmp_path / "results")) == 2


def test_a_write_that_fails_before_its_file_exists_raises_its_own_error(tmp_path, monkeypatch):
    """Cleaning up a partial file that was never made must not hide why the write failed."""

    def disk_full(self, text, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        write_whole(tmp_path / "report.md", "text")

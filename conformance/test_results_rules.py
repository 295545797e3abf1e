"""Saved benchmark results read into rows (``reference.benchmark.results``) and the report's markdown tables
(``reference.benchmark.summary``), on small hand-made results files: each field a row takes from a file, each
refusal of a file, and each cell of each table.

Unlike test_results_report.py, which reads the committed runs in perf/results, these files are written here,
so that every field and every edge of a table has a known value.
"""

from __future__ import annotations

import json

import pytest

from reference.benchmark.results import ResultsError, Row, mode_order, newest, read_rows
from reference.benchmark.summary import (
    comparison_table,
    latency_table,
    sources,
    speedup_table,
    startup_table,
)

pytestmark = pytest.mark.requires("components")


# ---- hand-made files of both formats


def _bench_latency(**settings) -> dict:
    """A bench_latency document: an engine mode and a baseline, a TP-less run unless ``settings`` say."""
    return {
        "model": "tiny",
        "settings": {"batch_size": 4, "input_len": 16, "output_len": 32, **settings},
        "env": {"gpu": "H200", "torch": "2.11", "date": "2026-12-01T10:00:00+00:00"},
        "results": [
            {
                "mode": "no_inductor",
                "kind": "engine",
                "latency_s": {"p50": 0.5, "p90": 0.6},
                "floor_s": 0.25,
                "startup": {"compile_s": 1.5, "capture_s": 0.25, "graph_gib": 0.125},
            },
            {
                "mode": "hf-eager",
                "kind": "baseline",
                "latency_s": {"p50": 2.0},
                "startup": {"first_call_s": 3.0},
            },
        ],
    }


def _benchmark(name: str, median: float, iqr: float, **info) -> dict:
    return {"name": name, "stats": {"median": median, "iqr": iqr}, "extra_info": info}


def _pytest_benchmark() -> dict:
    """A pytest-benchmark document: a decode step with start-up, a chain of steps, a prefill without a floor,
    and two benchmarks that are not perf/'s step benchmarks."""
    return {
        "datetime": "2026-12-02T08:00:00",
        "machine_info": {"torch": "2.12"},
        "benchmarks": [
            _benchmark("test_decode_step_latency[inductor]", 0.004, 0.0002, model="tiny", mode="inductor",
                       batch_size=8, floor_ms=2.0, compile_s=5.0, capture_s=0.5, graph_gib=0.25,
                       device="H200"),  # fmt: skip
            _benchmark("test_decode_steps_back_to_back[eager]", 0.08, 0.004, model="tiny", mode="eager",
                       batch_size=8, floor_ms=2.0, steps_per_round=16),  # fmt: skip
            _benchmark("test_prefill_latency", 0.03, 0.001, model="tiny", mode="eager", batch_size=2),
            _benchmark("test_something_else[eager]", 1.0, 0.1, model="tiny", mode="eager", batch_size=8),
            _benchmark("test_decode_step_latency[x]", 1.0, 0.1, model="tiny", batch_size=8),  # no mode
        ],
    }


def _write(tmp_path, doc, name="run.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _row(mode="eager", latency_s=0.5, **fields) -> Row:
    values = {"model": "tiny", "measure": "decode step B=8", "mode": mode, "latency_s": latency_s,
              "floor_s": None, "startup_s": None, "graph_gib": None, "iqr_s": None, "gpu": None, "torch": None,
              "date": "2026-12-01", "source": "a.json", **fields}  # fmt: skip
    return Row(**values)


# ---- reading bench_latency files


def test_a_bench_latency_file_gives_each_results_fields_and_the_runs_environment(tmp_path):
    """Every field of a row read from bench_latency JSON: the generate measure named from the settings, the
    p50, the floor, start-up as compile + capture (engine) or the first call (baseline), graph memory,
    where and when it ran, and the file it came from."""
    path = _write(tmp_path, _bench_latency())
    engine, baseline = read_rows(path)
    common = {"model": "tiny", "measure": "generate B=4, 16+32", "iqr_s": None, "gpu": "H200", "torch": "2.11",
              "date": "2026-12-01T10:00:00+00:00", "source": str(path)}  # fmt: skip
    assert engine == Row(mode="no_inductor", latency_s=0.5, floor_s=0.25, startup_s=1.75, graph_gib=0.125, **common)
    assert baseline == Row(mode="hf-eager", latency_s=2.0, floor_s=None, startup_s=3.0, graph_gib=None, **common)
    assert engine.key == ("tiny", "H200", "generate B=4, 16+32", "", "no_inductor")
    assert engine.x_floor == 2.0 and baseline.x_floor is None


def test_a_bench_latency_file_without_gpu_or_torch_reads_them_as_unknown(tmp_path):
    """A CPU run records no GPU; such a row still reads (its GPU and torch are None, shown as cpu and ?)."""
    doc = _bench_latency()
    del doc["env"]["gpu"], doc["env"]["torch"]
    doc["results"][1]["startup"] = {}  # a baseline that recorded no first call
    rows = read_rows(_write(tmp_path, doc))
    assert [(r.gpu, r.torch) for r in rows] == [(None, None), (None, None)]
    assert rows[1].startup_s is None


@pytest.mark.parametrize("tp, suffix", [(None, ""), (1, ""), (2, ", TP=2"), (4, ", TP=4")])
def test_a_tensor_parallel_run_names_its_degree_in_the_measure(tmp_path, tp, suffix):
    """A run on several GPUs times other work than one on a single GPU: its measure says TP=N, so that the
    two are never put in one cell or compared; TP=1 (or no setting) is the single-GPU measure."""
    settings = {} if tp is None else {"tensor_parallel_size": tp}
    rows = read_rows(_write(tmp_path, _bench_latency(**settings)))
    assert {r.measure for r in rows} == {"generate B=4, 16+32" + suffix}


def test_a_run_with_config_overrides_records_them_in_its_rows_and_keys(tmp_path):
    """``-O.custom_ops='["none"]'`` times other work than the mode's defaults (the seed's order, NOTES v43): its
    rows carry the overrides as compact JSON, so that they never replace a default run's rows; a run without
    them has ''; overrides that are not a dict are refused in one line."""
    plain = read_rows(_write(tmp_path, _bench_latency(), "plain.json"))
    doc = _bench_latency(compilation_config_overrides={"use_inductor": True, "custom_ops": ["none"]})
    changed = read_rows(_write(tmp_path, doc, "changed.json"))
    assert [r.overrides for r in plain] == ["", ""]
    assert {r.overrides for r in changed} == {'{"custom_ops":["none"],"use_inductor":true}'}
    assert changed[0].key == ("tiny", "H200", "generate B=4, 16+32", changed[0].overrides, "no_inductor")
    assert len(newest(plain + changed)) == 4
    doc["settings"]["compilation_config_overrides"] = ["custom_ops"]
    with pytest.raises(ResultsError, match=r"bad\.json: compilation_config_overrides \['custom_ops'\] is not a dict$"):
        read_rows(_write(tmp_path, doc, "bad.json"))


def test_runs_on_two_gpus_are_two_keys_so_a_newer_run_on_another_card_hides_nothing(tmp_path):
    """An H100 run after an H200 run of the same work is another machine, not a newer measurement of it."""
    h200 = read_rows(_write(tmp_path, _bench_latency(), "h200.json"))
    doc = _bench_latency()
    doc["env"].update(gpu="H100", date="2026-12-07T10:00:00+00:00")
    h100 = read_rows(_write(tmp_path, doc, "h100.json"))
    assert newest(h200 + h100) == h200 + h100


@pytest.mark.parametrize("reader", ["latency", "startup", "throughput"])
def test_a_file_nested_too_deep_for_the_json_reader_is_one_line(tmp_path, reader):
    """json.loads raises RecursionError (not a ValueError) past about a thousand nested lists: a traceback from
    the report, where every other broken file is one line naming it."""
    from reference.benchmark.startup_results import read_startup_rows
    from reference.benchmark.throughput_results import read_throughput_rows

    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    read = {"latency": read_rows, "startup": read_startup_rows, "throughput": read_throughput_rows}[reader]
    with pytest.raises(ResultsError, match=r"deep\.json: not a readable JSON file \(nested too deep\)$"):
        read(path)


# ---- reading pytest-benchmark files


def test_a_pytest_benchmark_file_gives_perf_step_benchmarks_only_with_their_fields(tmp_path):
    """Rows from pytest-benchmark JSON: one per perf/ step benchmark that names its mode (others are
    skipped), per-step median and IQR, the floor from milliseconds, start-up where the benchmark recorded
    it, graph memory, device, torch and date."""
    path = _write(tmp_path, _pytest_benchmark())
    step, chain, prefill = read_rows(path)
    common = {"model": "tiny", "torch": "2.12", "date": "2026-12-02T08:00:00", "source": str(path)}
    assert step == Row(measure="decode step B=8", mode="inductor", latency_s=0.004, floor_s=0.002, startup_s=5.5,
                       graph_gib=0.25, iqr_s=0.0002, gpu="H200", **common)  # fmt: skip
    assert chain == Row(measure="decode step back to back B=8", mode="eager", latency_s=0.08 / 16,
                        floor_s=0.002, startup_s=None, graph_gib=None, iqr_s=0.004 / 16, gpu=None,
                        **common)  # fmt: skip
    assert prefill == Row(measure="prefill B=2", mode="eager", latency_s=0.03, floor_s=None, startup_s=None,
                          graph_gib=None, iqr_s=0.001, gpu=None, **common)  # fmt: skip
    assert step.x_floor == pytest.approx(2.0) and prefill.x_floor is None


def test_other_benchmarks_anywhere_in_a_file_are_skipped_and_the_step_benchmarks_after_them_kept(tmp_path):
    """A run of perf/ with other benchmarks gives the rows of every step benchmark, whichever comes first; a
    step benchmark that recorded no extra info (so no mode) is skipped like one without a mode; a parameter
    id with a bracket of its own still names the test."""
    doc = _pytest_benchmark()
    first, *_ = doc["benchmarks"]
    doc["benchmarks"] = [
        {"name": "test_prefill_latency[eager]", "stats": {"median": 1.0, "iqr": 0.1}},  # no extra_info
        _benchmark("test_something_else[eager]", 1.0, 0.1, model="tiny", mode="eager", batch_size=8),
        {**first, "name": "test_decode_step_latency[inductor-[8]]"},
    ]
    (row,) = read_rows(_write(tmp_path, doc))
    assert (row.measure, row.mode, row.latency_s) == ("decode step B=8", "inductor", 0.004)


def test_a_pytest_benchmark_file_without_machine_info_reads_torch_as_unknown(tmp_path):
    """A pytest-benchmark file without machine_info still reads; its torch version is unknown (shown as ?)."""
    doc = _pytest_benchmark()
    del doc["machine_info"]
    assert {r.torch for r in read_rows(_write(tmp_path, doc))} == {None}


def test_a_floor_of_zero_milliseconds_is_no_floor(tmp_path):
    """A floor of 0 (not measured) gives no multiple of the floor, not a division by zero."""
    doc = _pytest_benchmark()
    doc["benchmarks"][0]["extra_info"]["floor_ms"] = 0
    row = read_rows(_write(tmp_path, doc))[0]
    assert row.floor_s is None and row.x_floor is None


# ---- files that are refused


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "not a readable JSON file"),
        (b"\xff\xfe\x00garbage", "not a readable JSON file"),
        (b"[1, 2]", "neither bench_latency JSON ('settings', 'results') nor pytest-benchmark JSON ('benchmarks')"),
        (b'{"results": []}', "neither bench_latency JSON"),
        (b'{"settings": {}}', "neither bench_latency JSON"),
        (b'"benchmarks"', "neither bench_latency JSON"),
    ],
    ids=["not-json", "not-utf8", "a-list", "results-without-settings", "settings-without-results", "a-string"],
)
def test_a_file_of_neither_format_is_refused_in_one_line_naming_it(tmp_path, content, message):
    """A wrong file given to the report is one ResultsError naming the file, not a traceback."""
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ResultsError) as err:
        read_rows(path)
    assert str(err.value).startswith(f"{path}: {message}")
    assert "\n" not in str(err.value)


def test_a_missing_file_is_refused_naming_it(tmp_path):
    """A results path that does not exist (a typo on the command line) is a ResultsError naming it."""
    path = tmp_path / "absent.json"
    with pytest.raises(ResultsError, match="absent.json: not a readable JSON file"):
        read_rows(path)


@pytest.mark.parametrize(
    "make, edit, field",
    [
        (_bench_latency, lambda d: d.pop("model"), "'model'"),
        (_bench_latency, lambda d: d.pop("env"), "'env'"),
        (_bench_latency, lambda d: d["env"].pop("date"), "'date'"),
        (_bench_latency, lambda d: d["settings"].pop("batch_size"), "'batch_size'"),
        (_bench_latency, lambda d: d["results"][0].pop("startup"), "'startup'"),
        (_bench_latency, lambda d: d["results"][0]["startup"].pop("capture_s"), "'capture_s'"),
        (_bench_latency, lambda d: d["results"][0]["latency_s"].pop("p50"), "'p50'"),
        (_bench_latency, lambda d: d["results"][0].pop("kind"), "'kind'"),
        (_pytest_benchmark, lambda d: d.pop("datetime"), "'datetime'"),
        (_pytest_benchmark, lambda d: d["benchmarks"][0].pop("stats"), "'stats'"),
        (_pytest_benchmark, lambda d: d["benchmarks"][0]["extra_info"].pop("model"), "'model'"),
        (_pytest_benchmark, lambda d: d["benchmarks"][0]["extra_info"].pop("batch_size"), "'batch_size'"),
        (_pytest_benchmark, lambda d: d["benchmarks"][0]["extra_info"].pop("capture_s"), "'capture_s'"),
        (_pytest_benchmark, lambda d: d["benchmarks"][0]["stats"].pop("iqr"), "'iqr'"),
        (_pytest_benchmark, lambda d: d["benchmarks"][0].pop("name"), "'name'"),
    ],
)
def test_a_results_file_missing_a_field_is_refused_naming_the_field(tmp_path, make, edit, field):
    """A bench_latency or pytest-benchmark file cut short or hand-edited, without a field a row needs, is one
    ResultsError naming the file and the missing field."""
    doc = make()
    edit(doc)
    path = _write(tmp_path, doc, "cut.json")
    with pytest.raises(ResultsError) as err:
        read_rows(path)
    assert str(err.value) == f"{path}: a results file without the field {field}"


@pytest.mark.parametrize(
    "doc",
    [
        {**_bench_latency(), "results": [1]},
        {**_bench_latency(), "settings": ["batch_size"]},
        {**_pytest_benchmark(), "machine_info": "a string"},
        {**_pytest_benchmark(), "benchmarks": [{"name": 3}]},
    ],
    ids=["result-not-an-object", "settings-a-list", "machine-info-a-string", "name-a-number"],
)
def test_a_field_of_the_wrong_type_is_refused_naming_the_file(tmp_path, doc):
    """A field of the wrong JSON type is one ResultsError naming the file, not a TypeError traceback."""
    path = _write(tmp_path, doc, "typed.json")
    with pytest.raises(ResultsError) as err:
        read_rows(path)
    assert str(err.value).startswith(f"{path}: a results file with a field of the wrong type (")


def test_a_whole_number_latency_is_a_positive_number(tmp_path):
    """JSON writes 2.0 as 2 in some tools: an int latency is read, not refused."""
    doc = _bench_latency()
    doc["results"][1]["latency_s"]["p50"] = 2
    assert read_rows(_write(tmp_path, doc))[1].latency_s == 2


# ---- which rows and modes the report uses


def test_modes_are_ordered_as_the_projects_modes_then_the_others_as_first_seen():
    """Table columns and chart colours follow this order, whatever the order of the files."""
    rows = [_row(m) for m in ("torch-native", "inductor", "hf-eager", "eager", "inductor", "hf-compile")]
    assert mode_order(rows) == ["eager", "inductor", "torch-native", "hf-eager", "hf-compile"]
    assert mode_order([]) == []


def test_the_newest_row_of_each_key_is_kept_in_first_seen_order_and_the_later_file_wins_a_tie():
    """Where several files time one (model, measure, mode), the report uses the latest date; on the same date,
    the file given later."""
    a_old, b, a_new = _row("eager", 1.0, date="2026-01-01"), _row("inductor", 2.0), _row("eager", 3.0)
    a_tie = _row("eager", 4.0)
    assert newest([a_old, b, a_new]) == [a_new, b]
    assert newest([a_new, b, a_old]) == [a_new, b]
    assert newest([a_new, a_tie]) == [a_tie]


# ---- the latency table


def test_the_latency_table_has_the_floor_the_p50_its_multiple_and_a_dash_where_a_mode_was_not_timed():
    """One line per (model, GPU, measure, overrides), a column per mode in mode order; the floor column shows the
    smallest floor of the line; times under a second in ms, longer ones in s; a run without a GPU is cpu."""
    rows = [
        _row("inductor", 0.004, floor_s=0.002),
        _row("eager", 1.5, floor_s=0.003),
        _row("eager", 0.25, measure="prefill B=2"),
    ]
    assert latency_table(rows).splitlines() == [
        "| model | device | measure | floor | eager | inductor |",
        "|---|---|---|---|---|---|",
        "| tiny | cpu | decode step B=8 | 2.00 ms | 1.500 s (500.00x) | 4.00 ms (2.00x) |",
        "| tiny | cpu | prefill B=2 | - | 250.00 ms | - |",
    ]


def test_a_second_exactly_is_shown_in_seconds():
    """Times under a second are shown in ms (2 decimals), a second and over in s (3 decimals)."""
    assert latency_table([_row("eager", 1.0)]).splitlines()[2] == "| tiny | cpu | decode step B=8 | - | 1.000 s |"
    assert latency_table([_row("eager", 0.999)]).splitlines()[2] == "| tiny | cpu | decode step B=8 | - | 999.00 ms |"


@pytest.mark.parametrize("iqr, mark", [(None, ""), (0.05, ""), (0.1, ""), (0.1001, "*"), (0.3, "*")])
def test_a_spread_is_flagged_only_above_a_tenth_of_the_median(iqr, mark):
    """``*`` marks a cell whose interquartile range is more than 10% of its median: exactly 10% is not."""
    row = _row("eager", 1.0, iqr_s=iqr)
    assert latency_table([row]).splitlines()[2] == f"| tiny | cpu | decode step B=8 | - | 1.000 s{mark} |"


def test_the_tables_give_each_line_its_gpu_and_its_overrides():
    """The seed's order (NOTES v43): one run with ``-O.custom_ops='["none"]'`` beside a default run on the same
    card is two lines, the measure naming the overrides; the start-up table names them beside the mode; a
    comparison of runs on two cards has no line to give."""
    none = '{"custom_ops":["none"]}'
    rows = [_row("no_inductor", 0.5, gpu="H100", startup_s=1.0), _row("inductor", 0.75, gpu="H100"),
            _row("no_inductor", 1.5, gpu="H100", overrides=none, startup_s=2.0),
            _row("inductor", 1.0, gpu="H100", overrides=none)]  # fmt: skip
    assert latency_table(rows).splitlines()[2:] == [
        "| tiny | H100 | decode step B=8 | - | 500.00 ms | 750.00 ms |",
        f"| tiny | H100 | decode step B=8 -O {none} | - | 1.500 s | 1.000 s |",
    ]
    assert startup_table(rows).splitlines()[2:] == [
        "| tiny | H100 | no_inductor | 1.00 s | - |",
        f"| tiny | H100 | no_inductor -O {none} | 2.00 s | - |",
    ]
    other_card = [_row("no_inductor", 0.25, gpu="H200"), _row("inductor", 0.5, gpu="H200")]
    assert comparison_table(other_card, rows).splitlines()[2:] == []


def test_a_cpu_run_is_one_device_however_the_file_spells_it(tmp_path):
    """bench_latency writes a CPU run's GPU as null, perf/'s steps write "cpu": one key, so a CPU run's start-up
    table has one line per mode (a review found two), and "" is the same."""
    spellings = []
    for gpu in (None, "", "cpu"):
        doc = _bench_latency()
        doc["env"]["gpu"] = gpu
        spellings.append(read_rows(_write(tmp_path, doc))[0])
    assert {r.gpu for r in spellings} == {None} and len(newest(spellings)) == 1


def test_an_empty_set_of_overrides_is_none_and_other_text_stays_one_cell(tmp_path):
    """``--compilation-config '{}'`` changes nothing: its rows are the default run's. A ``|`` in an override's
    value stays inside its markdown cell; other characters are kept as they are, not escaped."""
    empty = _bench_latency(compilation_config_overrides={})
    assert [r.overrides for r in read_rows(_write(tmp_path, empty))] == ["", ""]
    odd = _bench_latency(compilation_config_overrides={"cache_dir": "a|b", "clé": "é"})
    (row, _) = read_rows(_write(tmp_path, odd))
    assert row.overrides == '{"cache_dir":"a|b","clé":"é"}'
    line = latency_table([row]).splitlines()[2]
    measure = 'generate B=4, 16+32 -O {"cache_dir":"a\\|b","clé":"é"}'
    assert line == f"| tiny | H200 | {measure} | 250.00 ms | 500.00 ms (2.00x) |"
    assert startup_table([row]).splitlines()[2].startswith('| tiny | H200 | no_inductor -O {"cache_dir":"a\\|b"')


def test_a_comparison_of_two_sets_of_overrides_is_an_ab_of_them():
    """``--compare`` between a run with ``-O.compile_sizes=[8]`` and one without, on the same card (NOTES v17),
    compares each mode and names both sets; another card still compares nothing."""
    old = [_row("inductor", 1.0, gpu="H200")]
    new = [_row("inductor", 0.5, gpu="H200", overrides='{"compile_sizes":[8]}')]
    (line,) = comparison_table(old, new).splitlines()[2:]
    measure = 'decode step B=8 → decode step B=8 -O {"compile_sizes":[8]}'
    assert line == f"| tiny | H200 | {measure} | inductor | 1.000 s | 500.00 ms | -50.0% | - |"
    assert comparison_table(old, [_row("inductor", 0.5, gpu="H100")]).splitlines()[2:] == []


# ---- the peer (speed-up) table


def test_the_speedup_table_divides_each_peers_p50_by_each_modes_and_skips_peers_with_nothing_to_compare():
    """peer p50 / mode p50 per project mode; a dash for a mode not timed on the peer's measure; a peer
    whose measure no project mode timed has no line; the baselines' own columns are not shown."""
    rows = [
        _row("eager", 0.5, source="r.json"),
        _row("inductor", 0.25, source="r.json"),
        _row("hf-eager", 1.0, source="r.json"),
        _row("hf-compile", 0.75, source="r.json"),
        _row("eager", 0.4, measure="prefill B=2", source="r.json"),
        _row("torch-native", 0.8, measure="prefill B=2", source="r.json"),
        _row("hf-eager", 1.0, measure="generate B=1", source="r.json"),  # nothing to compare with
    ]
    assert speedup_table(rows).splitlines() == [
        "| model | device | measure | peer | eager | inductor |",
        "|---|---|---|---|---|---|",
        "| tiny | cpu | decode step B=8 | hf-eager | 2.00x | 4.00x |",
        "| tiny | cpu | decode step B=8 | hf-compile | 1.50x | 3.00x |",
        "| tiny | cpu | prefill B=2 | torch-native | 2.00x | - |",
    ]


def test_a_ratio_across_two_runs_is_marked_and_a_ratio_within_one_run_uses_that_run():
    """A mode the peer's own run timed is compared within that run even when a later run is newer; a mode
    only another run timed is compared with its newest row, marked with †."""
    old = [_row("hf-eager", 1.0, source="old.json", date="2026-01-01"),
           _row("eager", 0.5, source="old.json", date="2026-01-01")]  # fmt: skip
    new = [_row("eager", 0.25, source="new.json"), _row("inductor", 0.2, source="new.json")]
    every = old + new
    table = speedup_table(newest(every), every)
    assert table.splitlines()[2] == "| tiny | cpu | decode step B=8 | hf-eager | 2.00x | 5.00x† |"
    # without every row, only the newest rows are known: both ratios cross runs
    last = "| tiny | cpu | decode step B=8 | hf-eager | 4.00x† | 5.00x† |"
    assert speedup_table(newest(every)).splitlines()[2] == last


def test_no_speedup_table_without_a_peer_or_without_a_mode():
    """The report leaves the peer table out (None) when no measure has both a peer and a project mode."""
    assert speedup_table([_row("eager"), _row("inductor")]) is None
    assert speedup_table([_row("hf-eager"), _row("torch-native")]) is None
    assert speedup_table([]) is None


# ---- the start-up table


def test_the_startup_table_takes_a_generate_row_over_a_step_row_and_else_the_first_row():
    """One line per (model, mode): a generate measure's start-up when one exists (the engine started there),
    else the first step benchmark's; rows that recorded none are left out; graph memory to 3 decimals."""
    rows = [
        _row("eager", startup_s=1.0, graph_gib=0.5),  # step, first
        _row("eager", startup_s=2.0, measure="prefill B=2"),  # step, later: not taken
        _row("inductor", startup_s=3.0, measure="generate B=8, 32+128", graph_gib=0.125),
        _row("inductor", startup_s=4.0),  # a step after a generate row: not taken
        _row("inductor", startup_s=5.0, measure="generate B=1, 8+8"),  # a second generate row: not taken
        _row("no_inductor", startup_s=None),  # recorded no start-up
        _row("breakable", startup_s=6.0),
        _row("breakable", startup_s=7.25, measure="generate B=8, 32+128"),  # generate after a step: taken
    ]
    assert startup_table(rows).splitlines() == [
        "| model | device | mode | start-up (compile + capture; baselines: first call) | graph memory |",
        "|---|---|---|---|---|",
        "| tiny | cpu | eager | 1.00 s | 0.500 GiB |",
        "| tiny | cpu | inductor | 3.00 s | 0.125 GiB |",
        "| tiny | cpu | breakable | 7.25 s | - |",
    ]


def test_a_start_up_whose_compile_the_compile_cache_served_says_so(tmp_path):
    """bench_latency's compile_cache_hits: a warm start's compile is a cache read, and the report must not show
    it as the mode's start-up cost unmarked; a file from before the field reads as a cold compile."""
    doc = _bench_latency()
    doc["results"][0]["startup"]["compile_cache_hits"] = 1
    warm, baseline = read_rows(_write(tmp_path, doc))
    assert warm.startup_cached and not baseline.startup_cached
    assert not read_rows(_write(tmp_path, _bench_latency()))[0].startup_cached
    assert startup_table([warm]).splitlines()[2] == (
        "| tiny | H200 | no_inductor | 1.75 s (compile read from the compile cache) | 0.125 GiB |"
    )


def test_graph_memory_of_zero_is_a_figure_and_a_negative_one_is_not():
    """Zero graph memory (eager: no graphs) is shown as 0.000 GiB; a negative figure as not measured."""
    rows = [_row("eager", startup_s=1.0, graph_gib=0.0), _row("inductor", startup_s=1.0, graph_gib=-0.5)]
    lines = startup_table(rows).splitlines()[2:]
    assert lines == [
        "| tiny | cpu | eager | 1.00 s | 0.000 GiB |",
        "| tiny | cpu | inductor | 1.00 s | not measured (free memory rose 0.500 GiB during capture) |",
    ]


# ---- the comparison table and the sources


def test_the_comparison_gives_old_new_and_the_change_of_the_rows_in_both_in_the_new_order():
    """--compare: one line per row in both sets, in the new set's order, with both times and new / old - 1."""
    old = [_row("eager", 0.5), _row("inductor", 2.0), _row("hf-eager", 1.0)]
    new = [_row("inductor", 1.0), _row("eager", 0.55), _row("no_inductor", 1.0)]
    assert comparison_table(old, new).splitlines() == [
        "| model | device | measure | mode | old | new | change | same tokens |",
        "|---|---|---|---|---|---|---|---|",
        "| tiny | cpu | decode step B=8 | inductor | 2.000 s | 1.000 s | -50.0% | - |",
        "| tiny | cpu | decode step B=8 | eager | 500.00 ms | 550.00 ms | +10.0% | - |",
    ]


def test_the_comparison_says_which_share_of_the_sequences_kept_their_tokens(tmp_path):
    """An A/B across two runs (an environment switch, a code change) needs what the 'same tokens' column gives
    within one run: the share of sequences whose generated tokens (their digests) are the same in both runs;
    '-' where either file predates the digests or they cover other prompts."""
    old = [_row("eager", 1.0, token_digests=("a", "b", "c", "d")), _row("inductor", 1.0, token_digests=("a", "b")),
           _row("no_inductor", 1.0)]  # fmt: skip
    new = [_row("eager", 0.5, token_digests=("a", "b", "x", "d")), _row("inductor", 0.5, token_digests=("a",)),
           _row("no_inductor", 0.5, token_digests=("a",))]  # fmt: skip
    lines = comparison_table(old, new).splitlines()
    assert lines[0] == "| model | device | measure | mode | old | new | change | same tokens |"
    assert [line.rsplit("|", 2)[1].strip() for line in lines[2:]] == ["75%", "-", "-"]
    doc = _bench_latency()
    doc["results"][0]["token_digests"] = ["00ff", "abcd"]
    engine, baseline = read_rows(_write(tmp_path, doc))
    assert (engine.token_digests, baseline.token_digests) == (("00ff", "abcd"), None)
    doc["results"][0]["token_digests"] = "00ff"
    with pytest.raises(ResultsError, match=r"mode 'no_inductor': token_digests '00ff' is not a list of strings$"):
        read_rows(_write(tmp_path, doc))


def test_the_sources_list_each_file_once_with_its_gpu_torch_and_date():
    """A file without GPU (a CPU run) shows cpu, one without torch ?, and the date to the second."""
    rows = [
        _row("eager", source="a.json", gpu="H200", torch="2.11", date="2026-12-01T10:00:00.123456+00:00"),
        _row("inductor", source="a.json", gpu="H200", torch="2.11", date="2026-12-01T10:00:00.123456+00:00"),
        _row("eager", source="b.json"),
    ]
    assert sources(rows).splitlines() == [
        "- `a.json`: H200, torch 2.11, 2026-12-01T10:00:00",
        "- `b.json`: cpu, torch ?, 2026-12-01",
    ]



@pytest.mark.parametrize("steps", [0, 0.0, -16, True, "16"])
def test_a_round_of_no_real_step_count_is_refused_in_one_line_naming_the_file(tmp_path, steps):
    """steps_per_round divides the round's time (files written before NOTES v12): 0 was a ZeroDivisionError
    traceback from `python -m reference.report`, a bool or a string a silent or a wrong-type row."""
    doc = {"datetime": "2026-12-02T08:00:00", "benchmarks": [
        {"name": "test_decode_steps_back_to_back[eager]", "stats": {"median": 0.08, "iqr": 0.004},
         "extra_info": {"model": "tiny", "mode": "eager", "batch_size": 8, "steps_per_round": steps}}]}  # fmt: skip
    path = tmp_path / "zero.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"zero\.json: .*steps_per_round"):
        read_rows(path)


def test_a_latency_of_true_is_not_a_number(tmp_path):
    """JSON true passed the positive-number check (a bool is an int in Python) and showed as 1.000 s."""
    doc = _bench_latency()
    doc["results"][0]["latency_s"]["p50"] = True
    path = tmp_path / "true.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"true\.json: mode 'no_inductor': latency True s is not a positive number"):
        read_rows(path)

"""``python -m reference.report`` over ``bench_throughput`` files: one table per workload, each row's throughput,
speed-up over static batching, step times and decode floor, the newest run of a row kept.

The inputs are the committed H200 runs in perf/results and a CPU run made here; expected cells are computed
from the files' own numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference.bench_throughput import main as throughput_main
from reference.benchmark.results import ResultsError, newest
from reference.benchmark.startup_results import read_startup_rows
from reference.benchmark.throughput_results import read_throughput_rows, throughput_table
from reference.report import main as report_main

ROOT = Path(__file__).resolve().parents[1]
# issue 23's workload at a budget of 8192 (continuous and static) and of 512 ('full' against
# 'full_and_piecewise', written before the rows recorded the graph kind asked for)
BUDGET_8192 = ROOT / "perf/results/throughput-llama-3.1-8b-h200-20261204-d6d2ea4.json"
BUDGET_512 = ROOT / "perf/results/throughput-llama-3.1-8b-h200-20261204-full.json"
# the priority policy on an H100, both schedulings (perf/NOTES v29)
PRIORITY_H100 = ROOT / "perf/results/throughput-llama-3.1-8b-h100-20261205-priority.json"
STARTUP = ROOT / "perf/results/startup-llama-3.1-8b-h200-20261203.json"
LATENCY = ROOT / "perf/results/llama-3.1-8b-20261130-045438.json"

pytestmark = pytest.mark.requires("components")


def _report(tmp_path, *files) -> str:
    out = tmp_path / "report"
    assert report_main([*map(str, files), "--out", str(out)]) == 0
    return (out / "report.md").read_text()


def _lines(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(start)]


def test_a_throughput_file_gives_one_row_per_run_with_its_own_numbers():
    doc = json.loads(BUDGET_8192.read_text())
    rows = read_throughput_rows(BUDGET_8192)
    assert [(r.mode, r.scheduling) for r in rows] == [(r["mode"], r["scheduling"]) for r in doc["rows"]]
    for row, saved in zip(rows, doc["rows"]):
        assert row.output_tokens_per_s == saved["output_tokens_per_s"]
        assert row.speedup_vs_static == saved["speedup_vs_static"]
        steps = saved["step_ms"]
        assert (row.decode_ms, row.mixed_ms) == (steps["decode"]["mean_ms"], steps["mixed"]["mean_ms"])
        assert row.decode_x_floor is None  # written before the bench measured the floor
        assert (row.gpu, row.date, row.source) == ("NVIDIA H200", doc["env"]["date"], str(BUDGET_8192))
    assert rows[0].workload == (
        "512 requests, input 32:1024, output 16:512, seed 0; max_num_seqs 256, max_num_batched_tokens 8192, "
        "max_model_len 1536, chunked prefill, scheduling_policy fcfs, bfloat16"
    )
    assert read_throughput_rows(STARTUP) is None and read_throughput_rows(LATENCY) is None
    assert read_startup_rows(BUDGET_8192) is None  # nor is a throughput file a start-up file


def test_rows_that_asked_for_no_graph_kind_are_kept_apart_by_the_kind_that_ran():
    """The 512-token file predates ``requested_cudagraph_mode``: its two rows differ only in what ran."""
    rows = newest(read_throughput_rows(BUDGET_512))
    assert [(r.requested_cudagraph_mode, r.cudagraph_mode) for r in rows] == [
        (None, "full_and_piecewise"), (None, "full"),
    ]  # fmt: skip


def test_the_start_up_and_throughput_sections_open_with_their_heading_and_what_the_numbers_are(tmp_path):
    """A reader of the report sees each section's heading, then one paragraph that says what its numbers are."""
    lines = _report(tmp_path, STARTUP, PRIORITY_H100).splitlines()
    starts, throughput = lines.index("## Cold and warm start"), lines.index("## Throughput")
    assert lines[starts + 1 : starts + 4] == [
        "",
        "`python -m reference.bench_startup`: ready = compile + capture (weights excluded), each start a fresh "
        "process; cold with every compiler cache empty, warm with what the cold start left.",
        "",
    ]
    assert lines[throughput + 1 : throughput + 4] == [
        "",
        "`python -m reference.bench_throughput`: one `generate` of the workload's requests per row; continuous "
        "batching against static batches ('vs static': static's time / the row's, same mode and graph kind asked); "
        "each kind of step's mean time; the decode steps' multiple of their floor (the weights and the KV cache they "
        "read and write / bandwidth). `-`: none to give (a static row, no static row to compare with, no step of "
        "that kind, no floor on a CPU) or not measured (a file older than the field).",
        "",
    ]


def test_the_report_gives_each_workload_its_table_beside_the_other_sections(tmp_path):
    pytest.importorskip("matplotlib")
    text = _report(tmp_path, LATENCY, STARTUP, BUDGET_8192, BUDGET_512)
    assert text.startswith("# Latency by model and mode")
    assert text.index("## Cold and warm start") < text.index("## Throughput") < text.index("## From")
    budget_lines = _lines(text, "512 requests, input 32:1024")
    assert [line.split("max_num_batched_tokens ")[1].split(",")[0] for line in budget_lines] == ["8192", "512"]
    doc = json.loads(BUDGET_8192.read_text())
    continuous = doc["rows"][0]
    line = _lines(text, "| llama-3.1-8b | NVIDIA H200 | no_inductor | (not recorded) | continuous |")
    decode, mixed = continuous["step_ms"]["decode"]["mean_ms"], continuous["step_ms"]["mixed"]["mean_ms"]
    assert line == [
        f"| llama-3.1-8b | NVIDIA H200 | no_inductor | (not recorded) | continuous | "
        f"{continuous['output_tokens_per_s']:,.0f} | {continuous['speedup_vs_static']:.2f}x | {decode:.2f} | "
        f"{mixed:.2f} | - |"
    ]
    assert len(_lines(text, "| llama-3.1-8b | NVIDIA H200 | no_inductor | full |")) == 1
    assert f"- `{BUDGET_512}`: NVIDIA H200, torch 2.11.0+cu130" in text


def test_throughput_files_alone_make_a_report_of_that_section_without_a_chart(tmp_path):
    text = _report(tmp_path, BUDGET_512)
    assert text.startswith("# Throughput by model and mode") and "## Throughput" in text
    assert "## Cold and warm start" not in text and not (tmp_path / "report" / "latency.png").exists()


@pytest.mark.eager
def test_a_cpu_run_of_the_bench_is_read_back_with_what_ran_and_the_newest_run_kept(tmp_path):
    """A run written by today's bench carries every field; a second run of the same rows replaces the first,
    another workload is a table of its own."""
    small = ["--model", "llama-tiny", "--num-prompts", "4", "--input-len", "3:6", "--output-len", "2:4", "--device",
             "cpu", "--modes", "eager", "--max-num-seqs", "2"]  # fmt: skip
    paths = [tmp_path / f"run{i}.json" for i in range(3)]
    for path, seed in zip(paths, ("0", "0", "1")):
        throughput_main([*small, "--seed", seed, "--output-json", str(path)])
    docs = [json.loads(p.read_text()) for p in paths]
    docs[1]["env"]["date"] = "2999-01-01T00:00:00+00:00"  # the later run, whatever the clock said
    paths[1].write_text(json.dumps(docs[1]))
    rows = newest([r for p in paths for r in read_throughput_rows(p)])
    kept = [(str(path), scheduling) for path in paths[1:] for scheduling in ("continuous", "static")]
    assert [(r.source, r.scheduling) for r in rows] == kept
    assert {(r.cudagraph_mode, r.requested_cudagraph_mode) for r in rows} == {("none", None)}
    assert rows[0].decode_ms == docs[1]["rows"][0]["step_ms"]["decode"]["mean_ms"] > 0
    table = throughput_table(rows)
    assert table.count("| model | device |") == 2  # the seeds draw two workloads
    assert "| llama-tiny | cpu | eager | none | static |" in table
    assert table.count("| - |") >= 4  # on a CPU no floor; on static rows no speed-up


def test_a_throughput_table_reads_as_the_file_says_each_number_rounded_once():
    """Checked by hand against the file: output 8699.7 and 8087.8 tok/s, speed-up 1.0757, decode steps 15.92 and
    13.36 ms, mixed 51.82 and 192.41 ms, decode x floor 1.198 and 1.194; the static row has no speed-up."""
    assert throughput_table(read_throughput_rows(PRIORITY_H100)).splitlines() == [
        "512 requests, input 32:1024, output 16:512, seed 0; max_num_seqs 256, max_num_batched_tokens 8192, "
        "max_model_len 1536, chunked prefill, scheduling_policy priority (longest output first), bfloat16:",
        "",
        "| model | device | mode | cudagraph_mode | scheduling | output tok/s | vs static | decode step ms | "
        "mixed step ms | decode x floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| llama-3.1-8b | NVIDIA H100 80GB HBM3 | no_inductor | piecewise | continuous | 8,700 | 1.08x | 15.92 | 51.82 "
        "| 1.20 |",
        "| llama-3.1-8b | NVIDIA H100 80GB HBM3 | no_inductor | piecewise | static | 8,088 | - | 13.36 | 192.41 | 1.19 |",
    ]


def test_a_row_whose_graph_kind_was_lowered_a_single_length_and_a_stopped_run_read_as_such(tmp_path):
    """A row that asked for 'full' and ran 'piecewise' says both; a workload whose every prompt has one length
    gives that length alone; the rows of a run Ctrl-C stopped are marked, and a line under the table (after a
    blank one) says why."""
    doc = json.loads(PRIORITY_H100.read_text())
    doc["rows"][0]["requested_cudagraph_mode"] = "full"
    doc["workload"]["input_len"] = [64, 64]
    doc["interrupted"] = "interrupted during no_inductor/static: 1 of 2 rows finished"
    doc["rows"] = doc["rows"][:1]
    path = tmp_path / "stopped.json"
    path.write_text(json.dumps(doc))
    lines = throughput_table(read_throughput_rows(path)).splitlines()
    assert lines[0].startswith("512 requests, input 64, output 16:512, seed 0;")
    assert lines[4].startswith("| llama-3.1-8b | NVIDIA H100 80GB HBM3 | no_inductor | piecewise (asked: full) | "
                               "continuous ‡ | 8,700 |")  # fmt: skip
    assert lines[5:] == ["", f"‡ from `{path}`, a run stopped early: {doc['interrupted']}"]


def test_a_number_of_0_is_read_since_the_rule_is_at_least_0(tmp_path):
    path = _spoiled(tmp_path, lambda d: d["rows"][1].update(speedup_vs_static=0))
    assert read_throughput_rows(path)[1].speedup_vs_static == 0


def _spoiled(tmp_path, spoil) -> Path:
    doc = json.loads(BUDGET_8192.read_text())
    spoil(doc)
    path = tmp_path / "spoiled.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda d: d["rows"][0].pop("scheduling"), "a throughput file without the field 'scheduling'"),
        (lambda d: d.pop("engine"), "a throughput file without the field 'engine'"),
        (lambda d: d["rows"][0].update(output_tokens_per_s=float("nan")), "output_tokens_per_s nan is not a finite"),
        (lambda d: d["rows"][0].update(output_tokens_per_s=None), "output_tokens_per_s None is not a finite number"),
        (lambda d: d["rows"][1].update(speedup_vs_static=-1),
         "speedup_vs_static -1 is not a finite number >= 0 or null"),
        (lambda d: d.update(engine=None), "engine None is not an object"),
        (lambda d: d["rows"][0]["step_ms"].update(mixed=3), "step_ms mixed 3 is not an object"),
        (lambda d: d["rows"][0]["step_ms"]["mixed"].update(mean_ms="x"),
         "mixed mean_ms 'x' is not a finite number >= 0 or null"),
        (lambda d: d["rows"][0].update(requested_cudagraph_mode=5), "requested_cudagraph_mode 5 is not a string or null"),
        (lambda d: d["rows"][0]["step_ms"]["decode"].update(mean_ms="9"), "decode mean_ms '9' is not a finite"),
        (lambda d: d["rows"][0].update(decode_floor={"x_floor": True}), "decode_floor x_floor True is not a finite"),
        (lambda d: d["workload"].update(input_len=7), "a throughput file with a workload of the wrong shape"),
        (lambda d: d["rows"][0].update(cudagraph_mode=5), "cudagraph_mode 5 is not a string or null"),
        (lambda d: d["rows"][0].update(mode=None), "mode None is not a string"),
        (lambda d: d["rows"][0].update(scheduling={"a": 1}), "scheduling {'a': 1} is not a string"),
        (lambda d: d["engine"].update(scheduling_policy="bogus"), "scheduling_policy 'bogus' is not one of"),
        (lambda d: d["engine"].update(scheduling_policy=["fcfs"]), "scheduling_policy ['fcfs'] is not one of"),
        (lambda d: d.update(model=None), "model None is not a string"),
        (lambda d: d["env"].update(gpu=3), "gpu 3 is not a string or null"),
        (lambda d: d["env"].update(torch=None), "torch None is not a string"),
        (lambda d: d["env"].update(date=None), "date None is not an ISO 8601 date"),
        (lambda d: d["env"].update(date="yesterday"), "date 'yesterday' is not an ISO 8601 date"),
        (lambda d: d["rows"][0].update(step_ms=[1]), "step_ms [1] is not an object or null"),
        (lambda d: d["rows"][0].update(decode_floor=[]), "decode_floor [] is not an object or null"),
        (lambda d: d.update(rows={"a": 1}), "rows {'a': 1} is not a list"),
        (lambda d: d.update(rows=["x"]), "a row 'x' is not an object"),
        (lambda d: d.update(interrupted=1), "interrupted 1 is not a string or null"),
    ],
)
def test_a_damaged_throughput_file_is_one_line_naming_it_and_what_is_wrong(tmp_path, spoil, message, capsys):
    path = _spoiled(tmp_path, spoil)
    with pytest.raises(ResultsError) as err:
        read_throughput_rows(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value), str(err.value)
    assert str(err.value).count(str(path)) == 1, str(err.value)
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(path), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def _a_later_run(tmp_path, name: str, **engine) -> Path:
    """BUDGET_512's run with the ``engine`` fields changed, dated after it: a run of another workload."""
    doc = json.loads(BUDGET_512.read_text())
    doc["engine"].update(engine)
    doc["env"]["date"] = "2999-01-01T00:00:00+00:00"
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def test_runs_with_and_without_chunked_prefill_are_two_workloads(tmp_path):
    """Same requests and limits, chunked prefill off in one run: two tables, neither run dropped."""
    unchunked = _a_later_run(tmp_path, "unchunked", enable_chunked_prefill=False)
    text = _report(tmp_path, BUDGET_512, unchunked)
    heads = _lines(text, "512 requests")
    assert [", no chunked prefill," in line for line in heads] == [False, True]
    assert len(_lines(text, "| llama-3.1-8b | NVIDIA H200 | no_inductor | full |")) == 2
    assert f"`{unchunked}`" in text and f"`{BUDGET_512}`" in text


def test_runs_under_the_two_scheduling_policies_are_two_workloads_and_a_file_without_one_is_fcfs(tmp_path):
    """The priority policy's run (longest output first) and fcfs's over the same requests: two tables. Files
    written before the flag existed hold no policy: they ran fcfs."""
    text = _report(tmp_path, BUDGET_512, _a_later_run(tmp_path, "priority", scheduling_policy="priority"))
    heads = _lines(text, "512 requests")
    assert [", scheduling_policy priority (longest output first)," in line for line in heads] == [False, True]
    assert [", scheduling_policy fcfs," in line for line in heads] == [True, False]


def test_the_newest_run_is_the_later_instant_whatever_each_machines_time_zone(tmp_path):
    """20:00 at UTC-5 is 01:00 UTC the next day: later than 23:00 UTC, though it sorts first as a string."""
    paths = []
    for name, date, speed in (("utc", "2026-12-04T23:00:00+00:00", 1.0), ("east", "2026-12-04T20:00:00-05:00", 2.0)):
        doc = json.loads(BUDGET_512.read_text())
        doc["env"]["date"] = date
        doc["rows"] = doc["rows"][:1]
        doc["rows"][0]["output_tokens_per_s"] = speed
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    for order in (paths, paths[::-1]):
        rows = newest([r for p in order for r in read_throughput_rows(p)])
        assert [r.output_tokens_per_s for r in rows] == [2.0]


def test_the_rows_of_a_run_stopped_early_are_marked_and_the_run_named(tmp_path):
    doc = json.loads(BUDGET_8192.read_text())
    doc["rows"] = doc["rows"][:1]
    doc["rows"][0]["speedup_vs_static"] = None
    doc["interrupted"] = "interrupted during no_inductor/static: 1 of 2 rows finished"
    stopped = tmp_path / "stopped.json"
    stopped.write_text(json.dumps(doc))
    text = _report(tmp_path, stopped, BUDGET_512)
    assert _lines(text, "| llama-3.1-8b | NVIDIA H200 | no_inductor | (not recorded) | continuous ‡ | ")
    assert f"‡ from `{stopped}`, a run stopped early: {doc['interrupted']}" in text
    assert text.count("‡") == 2  # the row and the line naming its run; BUDGET_512's rows are whole


@pytest.mark.parametrize("other", [BUDGET_512, STARTUP], ids=["throughput", "startup"])
def test_compare_takes_latency_files_only_and_says_which_kind_it_was_given(tmp_path, other, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report_main(["--compare", str(LATENCY), str(other)])
    kind = "bench_throughput" if other == BUDGET_512 else "bench_startup"
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"--compare takes bench_latency or pytest-benchmark files; {other} is a {kind} file (see --help)"
    )

"""``python -m reference.report RESULTS... --out DIR [--compare OLD NEW]``: saved results as a report.

RESULTS are ``bench_latency`` JSON files (``--output-json`` / ``--results-dir``), pytest-benchmark JSON
files of perf/ (``--benchmark-autosave`` / ``--benchmark-json``), ``bench_startup`` and ``bench_throughput``
JSON files, in any mix. DIR gets ``report.md`` (the models x modes latency table with each floor, each mode's
speed-up over each peer, start-up and graph memory, each mode's cold and warm start, each workload's
throughput per mode and scheduling, the files it came from) and ``latency.png`` (a chart of the same
latencies, the floors drawn; none without latency files).
Where several files time the same model, GPU, measure (with its ``-O`` overrides) and mode, the newest run
is used. ``--compare OLD NEW`` prints the change per row from the results file OLD to NEW (same model, GPU,
measure and mode), in percent, and the share of sequences that kept their tokens, instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reference.benchmark.cli import OneLineParser
from reference.benchmark.results import ResultsError, newest, read_rows
from reference.benchmark.startup_results import cold_warm_table, read_startup_rows
from reference.benchmark.throughput_results import read_throughput_rows, throughput_table
from reference.benchmark.summary import (
    IQR_WARNING,
    comparison_table,
    latency_table,
    sources,
    speedup_table,
    startup_table,
)


def _folder(text: str) -> Path:
    if not text.strip():  # Path("") is the current folder: an unset shell variable would write the report there
        raise argparse.ArgumentTypeError("expected a folder path, got an empty one")
    return Path(text)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m reference.report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "results", nargs="*", type=Path, help="bench_latency, pytest-benchmark, bench_startup or bench_throughput JSON"
    )
    parser.add_argument("--out", type=_folder, help="folder for report.md and latency.png (created if missing)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"), help="print the change per row")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.compare and (args.results or args.out):
        parser.error("--compare OLD NEW takes no other results and no --out")
    if not args.compare and (not args.results or args.out is None):
        parser.error("give RESULTS... and --out DIR, or --compare OLD NEW")
    try:
        if args.compare:
            for path in args.compare:  # a start-up or throughput file has no latency rows to compare
                kind = "bench_throughput" if read_throughput_rows(path) is not None else (
                    "bench_startup" if read_startup_rows(path) is not None else None)  # fmt: skip
                if kind:
                    parser.error(f"--compare takes bench_latency or pytest-benchmark files; {path} is a {kind} file")
            old, new = (newest(read_rows(p)) for p in args.compare)
            table = comparison_table(old, new)
            if len(table.splitlines()) == 2:  # the header alone
                parser.error(
                    f"--compare: {args.compare[0]} and {args.compare[1]} share no (model, GPU, measure, mode) row; "
                    "compare two runs of the same benchmark on the same GPU"
                )
            print(table)
            return 0
        every_row, every_start, every_throughput = [], [], []
        for path in args.results:
            throughputs = read_throughput_rows(path)
            starts = None if throughputs is not None else read_startup_rows(path)
            if throughputs is not None:
                every_throughput += throughputs
            elif starts is not None:
                every_start += starts
            else:
                every_row += read_rows(path)
        rows, starts, throughputs = newest(every_row), newest(every_start), newest(every_throughput)
    except ResultsError as err:
        parser.error(str(err))
    if not rows and not starts and not throughputs:
        parser.error("the files hold no latency, start-up or throughput rows")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file of that name, or no permission
        parser.error(f"--out: cannot make the folder {args.out} ({err.strerror or err})")
    from reference.benchmark.chart import latency_chart  # matplotlib only when a chart is drawn
    from reference.benchmark.report import write_whole

    title = "Latency" if rows else "Start-up" if starts else "Throughput"
    sections = [f"# {title} by model and mode"]
    chart = None
    if rows:
        try:
            chart = latency_chart(rows, args.out / "latency.png")
        except OSError as err:  # a folder that takes no files
            parser.error(f"--out: cannot write in {args.out} ({err.strerror or err})")
        peers = speedup_table(rows, every_row)
        sections += [
            f"p50 per call (per step for 'back to back' rows: a timed round of several steps / its steps), with "
            f"its multiple of the bandwidth floor (weights read / bandwidth); `*`: the timed calls' interquartile "
            f"range exceeds {IQR_WARNING:.0%} of the median. Chart: `{chart.name}`.",
            latency_table(rows),
        ]
        if peers:
            sections += [
                "## Speed-up over the peers",
                "Peer p50 / mode p50 for the same model, GPU and measure (with its overrides; above 1: the mode is "
                "faster), from the peer's own run where it timed the mode too; `†`: the mode's row comes from another "
                "run.",
                peers,
            ]
        sections += ["## Start-up and graph memory", startup_table(rows)]
    if starts:
        sections += [
            "## Cold and warm start",
            "`python -m reference.bench_startup`: ready = compile + capture (weights excluded), each start a fresh "
            "process; cold with every compiler cache empty, warm with what the cold start left.",
            cold_warm_table(starts),
        ]
    if throughputs:
        sections += [
            "## Throughput",
            "`python -m reference.bench_throughput`: one `generate` of the workload's requests per row; continuous "
            "batching against static batches ('vs static': static's time / the row's, same mode and graph kind "
            "asked); each kind of step's mean time; the decode steps' multiple of their floor (the weights and the "
            "KV cache they read and write / bandwidth). `-`: none to give (a static row, no static row to compare "
            "with, no step of that kind, no floor on a CPU) or not measured (a file older than the field).",
            throughput_table(throughputs),
        ]
    sections += [
        "## From",
        sources([*rows, *starts, *throughputs]),
        f"Written by `python -m reference.report {' '.join(str(p) for p in args.results)} --out {args.out}`.",
    ]
    text = "\n\n".join(sections)
    try:
        write_whole(args.out / "report.md", text + "\n")
    except OSError as err:
        parser.error(f"--out: cannot write in {args.out} ({err.strerror or err})")
    print(text)
    print(f"wrote {args.out / 'report.md'}" + (f" and {chart}" if chart else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

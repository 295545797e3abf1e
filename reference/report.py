"""``python -m reference.report RESULTS... --out DIR [--compare OLD NEW]``: saved results as a report.

RESULTS are ``bench_latency`` JSON files (``--output-json`` / ``--results-dir``), pytest-benchmark JSON
files of perf/ (``--benchmark-autosave`` / ``--benchmark-json``) and ``bench_startup`` JSON files, in any mix.
DIR gets ``report.md`` (the models x modes latency table with each floor, each mode's speed-up over each peer,
start-up and graph memory, each mode's cold and warm start, the files it came from) and ``latency.png`` (a
chart of the same latencies, the floors drawn; none for start-up files alone).
Where several files time the same model, measure and mode, the newest run is used. ``--compare OLD NEW``
prints the change per row from the results file OLD to NEW, in percent, instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reference.benchmark.cli import OneLineParser
from reference.benchmark.results import ResultsError, newest, read_rows
from reference.benchmark.startup_results import cold_warm_table, newest_starts, read_startup_rows
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
    parser.add_argument("results", nargs="*", type=Path, help="bench_latency or pytest-benchmark JSON files")
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
            old, new = (newest(read_rows(p)) for p in args.compare)
            if not {r.key for r in old} & {r.key for r in new}:
                parser.error(
                    f"--compare: {args.compare[0]} and {args.compare[1]} share no (model, measure, mode) row; "
                    "compare two runs of the same benchmark"
                )
            print(comparison_table(old, new))
            return 0
        every_row, every_start = [], []
        for path in args.results:
            starts = read_startup_rows(path)
            if starts is None:
                every_row += read_rows(path)
            else:
                every_start += starts
        rows, starts = newest(every_row), newest_starts(every_start)
    except ResultsError as err:
        parser.error(str(err))
    if not rows and not starts:
        parser.error("the files hold no latency or start-up rows")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file of that name, or no permission
        parser.error(f"--out: cannot make the folder {args.out} ({err.strerror or err})")
    from reference.benchmark.chart import latency_chart  # matplotlib only when a chart is drawn
    from reference.benchmark.report import write_whole

    sections = ["# Latency by model and mode"] if rows else ["# Start-up by model and mode"]
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
                "Peer p50 / mode p50 for the same model and measure (above 1: the mode is faster), from the peer's "
                "own run where it timed the mode too; `†`: the mode's row comes from another run.",
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
    sections += [
        "## From",
        sources([*rows, *starts]),
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

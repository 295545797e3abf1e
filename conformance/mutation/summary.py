"""The results files: per module, what mutmut reported, counted, with the equivalent mutants set apart.

Input is mutmut's own output: ``mutmut results --all true`` prints one ``NAME: STATUS`` line per mutant.
``conformance/mutation/equivalent.txt`` names the surviving mutants that change nothing observable, one per line:
``NAME  REASON``. The score is (killed + timeout) / (killed + timeout + survived + no tests): a mutant no
test reached counts against it, an equivalent one is left out. ``conformance/mutation/results.json`` keeps one row per
module (its date, mutmut's version, the commit); ``conformance/mutation/RESULTS.md`` is rendered from it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
EQUIVALENT = HERE / "equivalent.txt"
RESULTS_JSON = HERE / "results.json"
RESULTS_MD = HERE / "RESULTS.md"

COLUMNS = ("mutants", "killed", "timeout", "survived", "no tests", "equivalent", "other")
_LINE = re.compile(r"^\s*(\S+): (.+?)\s*$")


def parse_results(text: str) -> dict[str, str]:
    """``{mutant name: status}`` from the output of ``mutmut results --all true``."""
    return {match[1]: match[2] for line in text.splitlines() if (match := _LINE.match(line))}


def load_equivalent(path: Path = EQUIVALENT) -> dict[str, str]:
    """``{mutant name: reason}`` from ``path`` (blank lines and ``#`` comments skipped).

    Raises:
        ValueError: a line names a mutant without a reason; the message gives the line.
    """
    equivalent = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        name, _, reason = line.strip().partition(" ")
        if not reason.strip():
            raise ValueError(f"{path.name}:{number}: expected 'MUTANT_NAME  REASON', got {line.strip()!r}")
        equivalent[name] = reason.strip()
    return equivalent


def count(statuses: dict[str, str], equivalent: dict[str, str]) -> dict[str, object]:
    """One module's row: the count of each column, the score, the names still to kill, stale equivalents.

    A listed equivalent mutant counts as equivalent only while it survives; one that a test now kills is
    reported under ``stale_equivalent`` (its entry should go).
    """
    tally: Counter[str] = Counter()
    open_names = []
    for name, status in sorted(statuses.items()):
        if status == "survived" and name in equivalent:
            status = "equivalent"
        elif status in ("survived", "no tests"):
            open_names.append(f"{name}: {status}")
        tally[status if status in COLUMNS else "other"] += 1
    tally["mutants"] = len(statuses)
    reached = tally["killed"] + tally["timeout"] + tally["survived"] + tally["no tests"]
    score = (tally["killed"] + tally["timeout"]) / reached if reached else 0.0
    stale = sorted(name for name in equivalent if name in statuses and statuses[name] != "survived")
    return {**{column: tally[column] for column in COLUMNS}, "score": round(score, 4),
            "open": open_names, "stale_equivalent": stale}


def record(module: str, row: dict[str, object]) -> None:
    """Put ``row`` (with its provenance) in ``results.json`` under ``module`` and re-render ``RESULTS.md``."""
    rows = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    rows[module] = row
    rows = dict(sorted(rows.items()))
    RESULTS_JSON.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    RESULTS_MD.write_text(render(rows))


def render(rows: dict[str, dict[str, object]]) -> str:
    """``RESULTS.md``: the per-module table, then each module's surviving and unreached mutants."""
    lines = [
        "# Mutation testing results",
        "",
        "Written by `./run mutate` (conformance/mutation/summary.py) from `mutmut results`, and the row",
        "`cuda (hand-written)` by `python -m conformance.mutation.cuda` on a GPU machine; do not edit by hand.",
        "Score = (killed + timeout) / (killed + timeout + survived + no tests);",
        "equivalent mutants (conformance/mutation/equivalent.txt) are left out.",
        "",
        "| module | date (UTC) | mutmut | commit | " + " | ".join(COLUMNS) + " | score |",
        "|---" * (len(COLUMNS) + 5) + "|",
    ]
    for module, row in rows.items():
        counts = " | ".join(str(row[column]) for column in COLUMNS)
        lines.append(f"| {module} | {row['date']} | {row['mutmut']} | {row['commit']} | {counts} "
                     f"| {100 * row['score']:.1f}% |")
    for module, row in rows.items():
        if row["open"] or row["stale_equivalent"]:
            lines += ["", f"## {module}: not killed", ""]
            lines += [f"- `{entry}`" for entry in row["open"]]
            lines += [f"- `{name}`: listed as equivalent, now killed" for name in row["stale_equivalent"]]
    return "\n".join(lines) + "\n"

"""The small-M GEMM's launch configs tuned per GPU and weight shape, and the lookup the kernel makes.

``python -m reference.tune_gemm --write`` times each config of a sweep on the GPU it runs on and keeps the
fastest per (weight shape, row tile) in ``linear_configs.json`` beside this module, with a record of each run
that wrote there (GPU, torch, date, command, commit), oldest first; each config names the run that chose it
by the run's date. :func:`tuned_config` reads that table; a shape or GPU it has no entry for gets
:func:`reference.ops.linear_kernels.default_config`'s heuristic. Imports no Triton.

File layout: ``{"gpus": {GPU name: {"N x K" or "N x K gated": {row tile: {"BLOCK_N", "BLOCK_K", "SPLIT_K",
"num_warps", "us", "run"}}}}, "runs": {GPU name: [{"torch", "triton", "date", "command", "commit"}, ...]}}``,
row tiles ``"16"``, ``"32"``, ``"64"`` (the kernel's BLOCK_M: the rows padded to a power of two, at least 16);
``"us"`` (the config's microseconds in its run) and ``"run"`` (that run's ``"date"``) are optional: files
written before 2026-12-06 have no ``"run"``, and kept one record per GPU, a dict, not a list.
"""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

CONFIG_FILE = Path(__file__).with_name("linear_configs.json")
CONFIG_KEYS = ("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps")
ROW_TILES = (16, 32, 64)
WARPS = (1, 2, 4, 8, 16)  # the warps a config may launch with
MAX_BLOCK = 1024  # BLOCK_N's and BLOCK_K's largest: a [64, 1024] fp32 tile fills an SM's 256 KiB register file
MAX_SPLIT_K = 64  # the reduction adds the slices in an unrolled loop: one load per slice in the code
MAX_ROWS = ROW_TILES[-1]  # the decode-sized token counts the kernel is written for; more rows are a prefill's GEMM


def row_tile(rows: int) -> int:
    """The kernel's BLOCK_M for ``rows`` rows (1-64): the next power of two, at least 16 (``tl.dot``'s least)."""
    return max(16, 1 << max(rows - 1, 0).bit_length())


def shape_key(n: int, k: int, gated: bool) -> str:
    """The table's key of an [n, k] weight (``gated``: [2n, k], gate and up rows, for a gated epilogue)."""
    return f"{n} x {k}" + (" gated" if gated else "")


def check_config(config: object, where: str) -> dict[str, int]:
    """``config`` as a launch config, checked.

    Raises:
        ValueError: not a dict of exactly ``CONFIG_KEYS`` (plus optional ``us`` and ``run``), BLOCK_N and BLOCK_K not
            powers of two from 16 to ``MAX_BLOCK``, SPLIT_K not an int from 1 to ``MAX_SPLIT_K``, num_warps not
            one of ``WARPS``; the message starts with ``where``.
    """
    if not isinstance(config, dict) or set(config) - {"us", "run"} != set(CONFIG_KEYS):
        raise ValueError(f"{where}: expected a dict of {list(CONFIG_KEYS)}, got {config!r}")
    values = {key: config[key] for key in CONFIG_KEYS}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values.values()):
        raise ValueError(f"{where}: expected ints, got {values}")
    for key in ("BLOCK_N", "BLOCK_K"):
        if not 16 <= values[key] <= MAX_BLOCK or values[key] & (values[key] - 1):
            raise ValueError(f"{where}: {key} must be a power of two from 16 to {MAX_BLOCK}, got {values[key]}")
    if not 1 <= values["SPLIT_K"] <= MAX_SPLIT_K or values["num_warps"] not in WARPS:
        raise ValueError(
            f"{where}: SPLIT_K must be from 1 to {MAX_SPLIT_K} and num_warps one of {list(WARPS)}, got {values}"
        )
    return values


def read_table(path: Path | None = None) -> dict:
    """The whole file (module doc; default ``CONFIG_FILE``), ``{"gpus": {}, "runs": {}}`` where there is none;
    each GPU's runs as a list (an older file's single record becomes a list of one).

    Raises:
        ValueError: not JSON, an entry that is not a config (:func:`check_config`), or a GPU's runs that are
            neither a record (a dict) nor a list of them, naming the file and entry.
    """
    path = CONFIG_FILE if path is None else path
    if not path.exists():
        return {"gpus": {}, "runs": {}}
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a readable JSON file ({err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), dict) or not isinstance(doc.get("runs"), dict):
        raise ValueError(f"{path}: expected {{'gpus': {{...}}, 'runs': {{...}}}}")
    for gpu, shapes in doc["gpus"].items():
        for shape, tiles in (shapes or {}).items():
            for tile, config in (tiles or {}).items():
                if tile not in {str(t) for t in ROW_TILES}:
                    raise ValueError(f"{path}: {gpu} / {shape}: row tile {tile!r} is not one of {list(ROW_TILES)}")
                check_config(config, f"{path}: {gpu} / {shape} / {tile}")
    for gpu, records in doc["runs"].items():
        records = [records] if isinstance(records, dict) else records
        if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
            raise ValueError(f"{path}: runs / {gpu}: expected a list of run records (dicts), got {records!r}")
        doc["runs"][gpu] = records
    return doc


@functools.cache
def _gpu_table(gpu: str) -> dict:
    try:
        return read_table()["gpus"].get(gpu, {})
    except ValueError as err:  # a damaged file costs speed, not a start: one warning, the default configs
        warnings.warn(f"small-M GEMM configs not used: {err}", RuntimeWarning, stacklevel=3)
        return {}


def tuned_config(gpu: str, n: int, k: int, rows: int, gated: bool) -> dict[str, int] | None:
    """The tuned config for an [n, k] weight (gated: [2n, k]) and ``rows`` rows on ``gpu``, or None."""
    config = _gpu_table(gpu).get(shape_key(n, k, gated), {}).get(str(row_tile(rows)))
    return None if config is None else {key: config[key] for key in CONFIG_KEYS}

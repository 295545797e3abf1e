"""Tune the small-M GEMM (reference.ops.linear_kernels) for the decode GEMMs of one or more models on this GPU.

``python -m reference.tune_gemm --model llama-3.1-8b,qwen3-8b,gemma-3-4b --rows 1,8,16,64 --write``

For each weight shape the model runs on the small-M kernel (with the GEMM fusions on: qkv with the norm in
front, o and down with the residual add behind, gate_up with both the norm and the gated activation; the LM
head stays on cuBLAS and is not swept) and each row tile (the rows padded to 16, 32 or 64), every config of the
sweep is timed as the model meets it: the fused call itself, in a CUDA graph over enough distinct weights to
read each from memory (:mod:`reference.benchmark.gemm`). cuBLAS's GEMM alone (``F.linear``, without the norm or
the epilogue) on the same weights is the yardstick beside it. The table printed gives
the fastest config per shape and tile, its microseconds and TB/s, and cuBLAS's; ``--write`` keeps those
configs in ``reference/ops/linear_configs.json`` under this GPU's name (with the run: torch, Triton, date,
command, commit), where the kernel looks them up (:mod:`reference.ops.linear_configs`); ``--output-json``
writes every timing. Needs CUDA and Triton; ``--device cpu`` runs under Triton's interpreter
(``TRITON_INTERPRET=1``), for checking the tool, not for its numbers.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
from pathlib import Path

from reference.benchmark.cli import (
    OneLineParser,
    check_output_file,
    model_name,
    output_file,
    positive_int,
    usage_error,
)

from reference.ops.linear_configs import MAX_BLOCK, MAX_ROWS, MAX_SPLIT_K, WARPS

PROG = "python -m reference.tune_gemm"
DEFAULT_SPACE = {"block_n": [32, 64, 128], "block_k": [128, 256], "split_k": [1, 2, 4, 8], "num_warps": [4, 8]}


def _int_list(minimum: int, maximum: int | None = None, power_of_two: bool = False, allowed: tuple | None = None):
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
        if allowed is not None:
            bad = [v for v in values if v not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"expected some of {list(allowed)}, got {bad}")
            return values
        top = maximum if maximum is not None else max(values)
        bad = [v for v in values if not minimum <= v <= top or (power_of_two and v & (v - 1))]
        if bad:
            kind = "powers of two" if power_of_two else "ints"
            span = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
            raise argparse.ArgumentTypeError(f"expected {kind} {span}, got {bad}")
        return values

    return parse


def _rows(text: str) -> list[int]:
    values = _int_list(1)(text)
    if max(values) > MAX_ROWS:
        raise argparse.ArgumentTypeError(f"the kernel takes at most {MAX_ROWS} rows, got {max(values)}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Tune the small-M GEMM's configs for a model's decode GEMMs.")
    default = " (default: %(default)s)"
    parser.add_argument("--model", type=lambda t: [model_name(m) for m in t.split(",")], required=True,
                        help="comma-separated presets, pretrained names or checkpoint dirs")  # fmt: skip
    parser.add_argument("--rows", type=_rows, default=[1, 8, 16, 64], help="decode tokens per step, 1-64" + default)
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16", help="weights" + default)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the interpreter" + default)
    parse = {  # what a config file may hold (linear_configs.check_config)
        "block_n": _int_list(16, MAX_BLOCK, power_of_two=True),
        "block_k": _int_list(16, MAX_BLOCK, power_of_two=True),
        "split_k": _int_list(1, MAX_SPLIT_K),
        "num_warps": _int_list(1, allowed=WARPS),
    }
    for name, values in DEFAULT_SPACE.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=parse[name], default=values, help="sweep values" + default)
    parser.add_argument("--rounds", type=positive_int, default=10, help="replays timed per config" + default)
    parser.add_argument("--write", action="store_true", help="keep the fastest configs in linear_configs.json")
    parser.add_argument("--output-json", type=output_file, default=None, help="every timing")
    return parser


def sweep(args: argparse.Namespace) -> list[dict]:
    """Every (shape, row tile, config) timing and cuBLAS's per (shape, row tile): rows of dicts."""
    import torch
    import torch.nn.functional as F

    from reference.benchmark.gemm import decode_gemms, seconds_per_call, weight_copies
    from reference.ops.linear_configs import row_tile, shape_key
    from reference.ops.linear_kernels import small_m_linear
    from triton.runtime.errors import OutOfResources

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    shapes: dict[str, tuple[list[str], object]] = {}  # one sweep per weight shape, naming every model with it
    for model in args.model:
        for gemm in filter(lambda g: g.fused, decode_gemms(model)):
            shapes.setdefault(shape_key(gemm.n, gemm.k, gemm.gated), ([], gemm))[0].append(model)
    tiles = {row_tile(r): max(x for x in args.rows if row_tile(x) == row_tile(r)) for r in args.rows}
    configs = [dict(zip(("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps"), c)) for c in
               itertools.product(args.block_n, args.block_k, args.split_k, args.num_warps)]  # fmt: skip
    rows = []
    for key, (models, gemm) in shapes.items():
        weight_bytes = gemm.weight_rows * gemm.k * dtype.itemsize
        copies = weight_copies(weight_bytes, device)
        shape = (gemm.weight_rows, gemm.k)
        weights = [torch.randn(shape, device=device, dtype=dtype) * gemm.k**-0.5 for _ in range(copies)]
        norm = (torch.ones(gemm.k, device=device, dtype=dtype), 1e-6, 0.0) if gemm.norm else None
        call = " + ".join(["norm"] * gemm.norm + ["GEMM"] + [gemm.epilogue] * (gemm.epilogue != "none"))
        for tile, m in sorted(tiles.items()):
            x = torch.randn(m, gemm.k, device=device, dtype=dtype)
            residual = torch.randn(m, gemm.n, device=device, dtype=dtype) if gemm.epilogue == "residual" else None
            fused = dict(epilogue=gemm.epilogue, residual=residual, norm=norm)
            base = {"model": ", ".join(models), "gemm": gemm.name, "shape": key, "rows": m, "row_tile": tile,
                    "weight_bytes": weight_bytes}  # fmt: skip
            cublas = seconds_per_call(lambda: [F.linear(x, w) for w in weights], copies, device, args.rounds)
            rows.append({**base, "impl": "cublas", "call": "GEMM", "us": cublas * 1e6})
            for config in configs:
                if config["SPLIT_K"] > 1 and gemm.k // config["SPLIT_K"] < config["BLOCK_K"]:
                    continue  # slices narrower than one tile of K: nothing for most programs to add
                run = lambda: [small_m_linear(x, w, **fused, config=config) for w in weights]  # noqa: E731
                ours = {**base, "impl": "triton", "call": call, "config": config}
                try:
                    seconds = seconds_per_call(run, copies, device, args.rounds)
                except OutOfResources as err:  # e.g. its tiles need more shared memory than an SM has: no candidate
                    rows.append({**ours, "us": None, "skipped": str(err)})
                    continue
                rows.append({**ours, "us": seconds * 1e6})
            print(f"{key}, {tile}-row tile: done", file=sys.stderr)
    return rows


def best(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """(shape, row tile) -> ``{"triton": fastest config's row, "cublas": cuBLAS's row}``; configs that could
    not launch (``us`` None) are no candidates, and a slot where none launched has no ``"triton"``."""
    out: dict[tuple[str, int], dict] = {}
    for row in rows:
        if row["us"] is None:
            continue
        slot = out.setdefault((row["shape"], row["row_tile"]), {})
        if row["impl"] not in slot or row["us"] < slot[row["impl"]]["us"]:
            slot[row["impl"]] = row
    return out


def table(winners: dict) -> str:
    """| model | gemm | weight | rows | best config | us | TB/s | cuBLAS us | cuBLAS / ours |, the gemm cell naming
    the fused call ours times (``o: GEMM + residual``); cuBLAS's column is its GEMM alone."""
    head = "| model | gemm | weight | rows | best config | us | TB/s | cuBLAS GEMM us | cuBLAS / ours |"
    lines = [head, "|" + "---|" * 9]
    for (shape, _), slot in winners.items():
        cublas = slot["cublas"]
        if "triton" not in slot:  # every config skipped: slices too narrow for the tiles, or out of resources
            lines.append(f"| {cublas['model']} | {cublas['gemm']} | {shape} | {cublas['rows']} | no config launched | "
                         f"- | - | {cublas['us']:.1f} | - |")  # fmt: skip
            continue
        ours = slot["triton"]
        config = ", ".join(f"{k}={v}" for k, v in ours["config"].items())
        rate, speedup = ours["weight_bytes"] / ours["us"] / 1e6, cublas["us"] / ours["us"]
        lines.append(f"| {ours['model']} | {ours['gemm']}: {ours['call']} | {shape} | {ours['rows']} | {config} | "
                     f"{ours['us']:.1f} | {rate:.2f} | {cublas['us']:.1f} | {speedup:.2f} |")  # fmt: skip
    return "\n".join(lines)


def write_configs(winners: dict, env: dict, path: Path) -> None:
    """Merge the winners into the config file under ``env['gpu']`` (module doc of reference.ops.linear_configs),
    each naming this run by ``env['date']``, and append ``env``, this run's record, to the GPU's runs: configs
    of earlier runs that this one did not sweep stay, and so does the record saying how they were made.
    Written whole, through a temporary file.

    Raises:
        ValueError: the file is damaged (:func:`~reference.ops.linear_configs.read_table`).
    """
    from reference.benchmark.report import write_whole
    from reference.ops.linear_configs import read_table

    doc = read_table(path)
    gpu = doc["gpus"].setdefault(env["gpu"], {})
    for (shape, tile), slot in winners.items():
        if "triton" in slot:
            config = {**slot["triton"]["config"], "us": round(slot["triton"]["us"], 2), "run": env["date"]}
            gpu.setdefault(shape, {})[str(tile)] = config
    doc["runs"].setdefault(env["gpu"], []).append(env)
    write_whole(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point (module doc); one-line errors, exit status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.output_json is not None:
        check_output_file(parser, "--output-json", args.output_json)
    if args.write and args.device != "cuda":
        parser.error("--write keeps a GPU's timings; the interpreter's say nothing about any GPU")
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--device cpu runs the kernel under Triton's interpreter: set TRITON_INTERPRET=1")
    from reference.ops.linear_configs import CONFIG_FILE, read_table

    if args.write:
        read_table(CONFIG_FILE)  # a damaged file is refused now, not after the sweep's minutes
    import torch

    from reference.ops.library import HAS_TRITON

    if not HAS_TRITON:
        parser.error("the small-M kernel needs Triton, which is not installed")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    from reference.benchmark.machine import source_commit
    rows = sweep(args)
    winners = best(rows)
    print(table(winners))
    import triton

    env = {
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]),
        "commit": source_commit(Path(__file__).resolve().parents[1]),
    }
    if args.output_json is not None:  # whole or not at all, as the other tools write
        from reference.benchmark.report import write_whole

        try:
            args.output_json.parent.mkdir(parents=True, exist_ok=True)
            write_whole(args.output_json, json.dumps({"env": env, "rows": rows}, indent=1))
        except OSError as err:  # the disk filled or the folder went during the sweep: the table above stays
            print(f"{PROG}: error: cannot write {args.output_json} ({err.strerror or err})", file=sys.stderr)
            sys.exit(1)
        print(f"wrote {args.output_json}", file=sys.stderr)
    if args.write:
        write_configs(winners, env, CONFIG_FILE)
        print(f"wrote {CONFIG_FILE}", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:  # a damaged config file (read_table), named in one line
        print(usage_error(PROG, str(err)), file=sys.stderr)
        sys.exit(2)

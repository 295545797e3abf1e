"""What the command lines (``bench_latency``, ``bench_startup``, ``report``, the perf suite's options) share: an
argparse whose errors are one line, and the value types of their flags. Imports no torch (``--help`` must stay
fast)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

from reference.benchmark.choices import MODE_KWARGS
from reference.config import echo
from reference.cpus import thread_counts, usable_cpus  # usable_cpus: the most intra-op threads a benchmark takes


# The environment variables the implementation reads (its modules' ``ENV`` constants and ``os.environ``
# lookups; conformance/test_cli_types.py holds this list to them), as the CLIs' --help gives them. Written out here
# because --help must not import torch to ask those modules.
ENVIRONMENT = {
    "REFERENCE_PDL": "'1' launches every custom-op Triton kernel with programmatic dependent launch on compute "
    "capability 9.0+ (off by default: slower on an H100, perf/NOTES.md v42); '0' or unset: off",
    "REFERENCE_COMPILE_CACHE": "the compile cache's folder where CompilationConfig.cache_dir is empty "
    "(default ~/.cache/piecewise-reference/torch_compile_cache)",
    "REFERENCE_DISABLE_COMPILE_CACHE": "'1' turns the compile cache off (vLLM's VLLM_DISABLE_COMPILE_CACHE)",
    "REFERENCE_MODEL_CACHE": "where converted pretrained weights are kept (default ~/.cache/piecewise-reference)",
    "REFERENCE_COMMIT": "the commit the result files record (bench_latency's, bench_startup's and "
    "bench_throughput's env.commit), over what git says: a tree copied without its .git, or with another commit's",
}


def environment_help() -> str:
    """The paragraph of --help that lists :data:`ENVIRONMENT`."""
    return "Environment: " + "; ".join(f"{name}: {text}" for name, text in ENVIRONMENT.items()) + "."


def usage_error(prog: str, message: str) -> str:
    """The line of a usage error, ``PROG: error: MESSAGE (see --help)``: what :class:`OneLineParser` prints,
    and what a CLI prints for an error found after parsing that its flags can fix (a compilation config a
    model refuses, a batch no memory holds). Not for the files or the machine (a truncated checkpoint, a
    full disk), which --help cannot fix. The libraries' messages stay without the suffix."""
    return f"{prog}: error: {message} (see --help)"


def engine_sizes_hint(message: str, max_model_len: str) -> str:
    """``message`` (an engine error naming ``max_num_seqs`` and ``max_model_len``, as the memory check's do)
    with what those are in a benchmark CLI's flags: ``--batch-size``, and ``max_model_len``'s flags (e.g.
    ``'--input-len + --output-len'``). Any other message is returned as it is."""
    if "max_num_seqs" in message and "max_model_len" in message:
        return f"{message} (here max_num_seqs is --batch-size, max_model_len {max_model_len})"
    return message


# argparse's actions that collect every value given, and the ones that exit at once (argparse's own classes,
# unexported; all of them exist from Python 3.8 on)
_ANSWERS_AT_ONCE = (argparse._HelpAction, argparse._VersionAction)
_REPEATABLE = (
    argparse._AppendAction,
    argparse._AppendConstAction,
    argparse._CountAction,
    argparse._ExtendAction,
    *_ANSWERS_AT_ONCE,
)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (:func:`usage_error`) without the usage block above it; exit 2.

    Abbreviated long flags are not accepted (``allow_abbrev=False``, as vLLM's parser does): argparse would
    read ``--compilation`` as ``--compilation-config``, past the guard that refuses a config given twice. An
    option given twice is refused too, where argparse would keep the last value. Before any flag is read, a bad
    ``OMP_NUM_THREADS`` or ``TORCHINDUCTOR_COMPILE_THREADS`` is refused by name (:func:`~reference.cpus.thread_counts`):
    a flag's type may import torch, whose Inductor config reads the second with a bare ``int()``.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        try:
            thread_counts(os.environ)
        except ValueError as err:
            self.error(str(err))
        self._refuse_repeated_flags(argv)
        return super().parse_known_args(argv, namespace)

    def _refuse_repeated_flags(self, argv: list[str]) -> None:
        """Exit 2 where one option is set twice (``--n 1 --n 2``, ``--x --no-x``): argparse keeps the last value
        without a word. Options that collect their values (append, count) may repeat; nothing after ``--`` is a
        flag; with ``-h`` (or ``--version``) argparse answers that, as it would without the repeat."""
        flags = argv[: argv.index("--")] if "--" in argv else argv
        if any(isinstance(self._option_string_actions.get(arg), _ANSWERS_AT_ONCE) for arg in flags):
            return
        first: dict[argparse.Action, str] = {}  # option -> its flag as first typed
        for arg in argv:
            if arg == "--":
                return
            flag = arg.partition("=")[0] if arg.startswith("-") else arg  # argparse reads -x=1 and --x=1 alike
            action = self._option_string_actions.get(flag)
            if action is None or isinstance(action, _REPEATABLE):
                continue
            if action in first:
                self.error(
                    f"{flag} given twice; give it once"
                    if first[action] == flag
                    else f"{first[action]} and {flag} both set {action.dest}; give one"
                )
            first[action] = flag

    def error(self, message: str):
        self.exit(2, usage_error(self.prog, message) + "\n")


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an int >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {echo(text)}")
        return value

    return parse


positive_int, non_negative_int = int_at_least(1), int_at_least(0)


def thread_count(text: str) -> int:
    """argparse type: an intra-op thread count in [1, usable_cpus()]."""
    cpus = usable_cpus()
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= cpus:
        raise argparse.ArgumentTypeError(f"expected an int in [1, {cpus}] (this machine's CPUs), got {echo(text)}")
    return value


def _path_text(text: str, what: str) -> str:
    """``text`` checked as a path: not empty (``Path('')`` is the working directory, which no one means by an
    empty value) and without a NUL byte (no path can hold one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"empty; give {what}")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"{echo(text)} has a NUL byte, which no path can hold")
    return text


def non_empty_path(what: str) -> Callable[[str], Path]:
    """argparse type: a path (:func:`_path_text`), ``~`` expanded as the compile cache's ``cache_dir`` is."""

    def parse(text: str) -> Path:
        return Path(_path_text(text, what)).expanduser()

    return parse


def seed(text: str) -> int:
    """argparse type: a seed torch.manual_seed takes: an int in [0, 2**63)."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value < 2**63:  # reference.engine.arguments.SEED_LIMIT (a torch import)
        raise argparse.ArgumentTypeError(f"expected an int in [0, 2**63), got {echo(text)}")
    return value


def names_of(allowed: tuple[str, ...], kind: str) -> Callable[[str], list[str]]:
    """Parser of a comma-separated list of ``kind`` names out of ``allowed``; '' (or only commas) gives [],
    an empty name between commas is an error."""

    def parse(text: str) -> list[str]:
        if not text.replace(",", "").strip():  # '' or only commas: no names
            return []
        names = [n.strip() for n in text.split(",")]
        if "" in names:
            raise argparse.ArgumentTypeError(f"{echo(text)} has an empty name; choose from {', '.join(allowed)}")
        unknown = [n for n in names if n not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {echo(unknown)}; choose from {', '.join(allowed)} (comma-separated)"
            )
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"{echo(text)} names a {kind} twice")
        return names

    return parse


def mode_names(text: str) -> list[str]:
    """argparse type: comma-separated mode names (``MODE_KWARGS``), at least one."""
    names = names_of(tuple(MODE_KWARGS), "mode")(text)
    if not names:  # an empty list would otherwise fall back to the default, all modes
        raise argparse.ArgumentTypeError(f"no mode given in {echo(text)}; choose from {', '.join(MODE_KWARGS)}")
    return names


def model_name(text: str) -> str:
    """argparse type: a model the registry knows (preset, pretrained name, .gguf file or checkpoint dir)."""
    try:
        from reference.models import registry  # transformers: after --help

        registry.model_config(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("model: ")) from None
    return text


def device_name(text: str) -> str:
    """argparse type: ``cpu`` or ``cuda[:N]`` where this machine has it."""
    try:
        from reference.engine.arguments import resolve_device  # torch: after --help

        resolve_device(text, name="--device")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--device: ")) from None
    return text


def output_file(text: str) -> Path:
    """argparse type: a file path to write (:func:`_path_text`, ``~`` expanded). One spelled as a folder, ending
    in '/', '.' or '..', is an error: ``Path`` drops a trailing '/' or '/.' and would write a file of the
    folder's name."""
    _path_text(text, "a file path")
    ending = os.path.basename(text) or "/"  # basename is '' after a trailing '/'
    if ending in ("/", ".", ".."):
        raise argparse.ArgumentTypeError(f"{echo(text)} names a folder (it ends with {ending!r}); give a file path")
    return Path(text).expanduser()


def _refuse_unusable(parser: argparse.ArgumentParser, flag: str, path: Path) -> None:
    """Refuse (``parser.error``) a path the system cannot look up (a name too long, a folder on the way that
    cannot be searched, a loop of links); one that does not exist yet, or runs into a file, is left to the
    checks after this."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as err:
        parser.error(f"{flag}: cannot use {echo(str(path))} ({err.strerror or err})")


def check_writable_dir(parser: argparse.ArgumentParser, flag: str, directory: Path) -> None:
    """Refuse (``parser.error``) a folder this process cannot write a file in, before a run that would find
    out at its end. Nothing is made here: a missing folder is made when the file is written (a run refused
    later leaves nothing behind), so the check is on the nearest folder that exists, where it would be made."""
    _refuse_unusable(parser, flag, directory)
    existing = next(p for p in (directory, *directory.parents) if p.exists() or p.is_symlink())
    if not existing.is_dir():
        where = "" if existing == directory else f"cannot write in {echo(str(directory))}: "
        kind = "a broken symbolic link" if existing.is_symlink() and not existing.exists() else "a file"
        parser.error(f"{flag}: {where}{echo(str(existing))} is {kind}, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        reason, folder = err.strerror or str(err), echo(str(directory))
        if existing == directory:
            parser.error(f"{flag}: cannot write in {folder} ({reason})")
        parser.error(f"{flag}: cannot write in {folder}: cannot make a folder in {echo(str(existing))} ({reason})")


def check_output_file(parser: argparse.ArgumentParser, flag: str, path: Path) -> None:
    """Refuse (``parser.error``) an output file path that is a folder or whose folder cannot be written
    (:func:`check_writable_dir`)."""
    _refuse_unusable(parser, flag, path)
    if path.is_dir():
        parser.error(f"{flag}: {echo(str(path))} is a directory; give a file path")
    check_writable_dir(parser, flag, path.parent)

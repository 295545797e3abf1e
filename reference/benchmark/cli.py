"""What the two command lines (``bench_latency``, ``report``) share: an argparse whose errors are one line."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (``PROG: error: ...``) without the usage block above it; exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

"""Where this package's warnings point: the user's line, not ours and not Dynamo's.

A warning raised while a compiled model runs sits under frames of this package (``CompiledModel.__call__``, the
full-graph and breakable wrappers) and, when it comes from the backend, under Dynamo's (the backend is called
from inside Dynamo's compile of the forward). A fixed ``stacklevel`` names one of those. :func:`user_stacklevel`
counts them instead. Python 3.12's ``warnings.warn(skip_file_prefixes=...)`` does the same, but the project runs
on 3.11 too; its ``stacklevel`` counting is the same as here.
"""

import os
import sys

import torch

_SKIPPED = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,  # reference/compilation/
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,  # torch/, Dynamo's frames among them
)


def user_stacklevel() -> int:
    """The ``stacklevel`` at which a warning raised by this function's caller names the nearest line outside
    ``reference/compilation/`` and torch: the line that called the compiled model (in the engine, the runner's),
    however many of this package's wrappers and Dynamo's frames lie between. Never raises; at the stack's
    bottom it gives the outermost frame."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_SKIPPED):
        frame, level = frame.f_back, level + 1
    return level

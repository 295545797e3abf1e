"""Imported first by conformance/forked.py's fork server, and by no other process: torch then answers
``torch.cuda.is_available()`` there through NVML (``PYTORCH_NVML_BASED_CUDA_CHECK=1``, read at each call).

The server's preloaded modules ask whether CUDA is there as they are imported. torch's default answer asks the CUDA
runtime for its device count, which marks the process: a child forked from it then fails at its first CUDA call
("Cannot re-initialize CUDA in forked subprocess"; torch's ``is_available`` documents the NVML check as the one that
does not). NVML counts the devices without the runtime, so the server's children start with CUDA untouched, as a
fresh interpreter does. Where NVML cannot count them (no NVML library, MIG devices in ``CUDA_VISIBLE_DEVICES``),
torch asks the runtime after all and the server is marked; its children then start a fresh interpreter
(conformance/forked.py). A child's environment is the one its caller gives (:func:`conformance.forked.run`), so the
children themselves answer as torch does by default.
"""

import os

os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

"""Other implementations of the idea, run through this project's engine so they can be measured beside it.

:mod:`.torch_native` is torch's own piecewise path (Inductor graph partition + CUDA graph trees). The
benchmark CLI runs it as the ``torch-native`` baseline and the conformance suite checks it with
``--impl torch-native``: one adapter for both.
"""

from reference.peers.torch_native import Unsupported, compile_torch_native

__all__ = ["Unsupported", "compile_torch_native"]

"""Debug switch ``debug_cudagraph_outputs``: a graph output read after a later call overwrote it raises.

A replay returns views of graph-pool memory (:mod:`.cuda_graph`), valid until the model's next call: that
call replays graphs of the same pool, which write over them, and a caller who kept a tensor reads the
new step's values without a word. torch's CUDA graph trees catch such reads; this does the same for
the project's graphs. Each replay hands out fresh views, and the first replay of a later call makes
every view handed out before it raise on any access, with a message naming the graph and size that
produced it. Off (the default) nothing of this runs: the replay path returns its stored views.

The poisoning is torch's own (``torch._C._set_storage_data_ptr_access_error_msg``, which graph trees use),
applied to each handed-out view's private storage, so views the graphs keep stay usable.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from reference.compilation.cuda_graph import non_owning


class StaleOutputGuard:
    """Hands out graph outputs and poisons those of earlier calls; one per compiled model, since its
    pieces, breakable segments and full graphs share memory that any of their replays may overwrite."""

    def __init__(self):
        self.call = 0
        self._handed_out: list[tuple[int, Any, str]] = []  # (call, weak ref to a view's storage, what made it)

    def begin_call(self) -> None:
        """A new call of the compiled model starts."""
        self.call += 1

    def hand_out(self, output: Any, what: str) -> Any:
        """Fresh views of ``output`` (a replay's stored views) for this call; ``what``: the graph and size
        that produced them, for the message. Views handed out by earlier calls raise from now on."""
        from torch.multiprocessing.reductions import StorageWeakRef

        self._poison_earlier_calls()
        views = tree_map(non_owning, output)
        for leaf in tree_leaves(views):
            if isinstance(leaf, torch.Tensor):
                self._handed_out.append((self.call, StorageWeakRef(leaf.untyped_storage()), what))
        return views

    def _poison_earlier_calls(self) -> None:
        current = []
        for call, storage, what in self._handed_out:
            if call == self.call:
                current.append((call, storage, what))
            elif not storage.expired():
                message = (
                    f"debug_cudagraph_outputs: this tensor is the output of {what} in call {call} of the compiled "
                    f"model, and call {self.call} has replayed graphs over it since; copy (.clone()) what you need "
                    "from a graph's output before the model's next call"
                )
                torch._C._set_storage_data_ptr_access_error_msg(storage.cdata, message)
        self._handed_out = current

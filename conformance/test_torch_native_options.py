"""What the torch-native peer (reference/peers/torch_native.py) asks ``torch.compile`` for at level 3.

The peer maps a config onto Inductor's options; a user's own Inductor option must reach Inductor, and the
mode's graphs must not be turned off by it. ``torch.compile`` is replaced by a recorder: nothing compiles.
"""

from __future__ import annotations

import pytest
import torch

from reference.config import CompilationConfig
from reference.peers import compile_torch_native


@pytest.mark.parametrize(
    "fields, graphs",
    [
        ({"cudagraph_mode": "piecewise"}, True),
        ({"cudagraph_mode": "none"}, False),
        # allowed only where the mode captures none (the config's rule): Inductor's own graphs, as asked
        ({"cudagraph_mode": "none", "inductor_compile_config": {"triton.cudagraphs": True}}, True),
        ({"cudagraph_mode": "piecewise", "inductor_compile_config": {"triton.cudagraphs": False}}, True),
    ],
    ids=["mode-piecewise", "mode-none", "asked-for-by-name", "mode-wins-over-false"],
)
def test_the_peer_asks_inductor_for_graphs_where_the_mode_or_the_user_does(monkeypatch, fields, graphs):
    asked = {}
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: asked.update(kwargs) or model)
    config = CompilationConfig(level=3, use_inductor=True, **fields)
    compile_torch_native(torch.nn.Linear(2, 2), config)
    assert asked["options"]["triton.cudagraphs"] is graphs
    assert asked["options"]["graph_partition"] is True

"""Every call of a compiled model is ordered after the work queued before it on the current stream.

Pieces warm up, are captured and replay on whatever stream they like, but a caller queues its inputs on
the current stream and reads the outputs there; so a piece must start after the work queued before it
and finish before the work queued after it. Here the write of the inputs is held back on the current
stream by a kernel that spins for about 10 ms (``torch.cuda._sleep``), far longer than the host needs to
launch the whole model: a piece that does not wait reads the previous call's inputs. CUDA only (marked
gpu); the silly model's output has an exact closed form.
"""

from __future__ import annotations

import pytest
import torch

from conformance.helpers import TRACED_MODES
from reference.config import mode_config
from reference.models.silly import SILLY_SPLITTING_OPS, SillyModel, expected_output

pytestmark = pytest.mark.gpu

SPIN_CYCLES = 20_000_000  # about 10 ms at the H200's 1.98 GHz
# size 4: trace + warm-up, capture; size 2: warm-up, capture, replay; 4: replay; 3: no graph
CALL_SIZES = [4, 4, 2, 2, 2, 4, 3]


@pytest.mark.parametrize("mode", ("breakable", *TRACED_MODES))
def test_each_call_sees_the_inputs_queued_before_it_on_the_current_stream(mode, impl):
    config = mode_config(mode, splitting_ops=SILLY_SPLITTING_OPS, cudagraph_capture_sizes=[2, 4])
    compiled = impl.compile(SillyModel(), config)
    buffer = torch.zeros(4, 8, device="cuda")
    for call, size in enumerate(CALL_SIZES):
        fresh = torch.randn(size, 8, device="cuda")
        torch.cuda._sleep(SPIN_CYCLES)
        x = buffer[:size]
        x.copy_(fresh)  # queued behind the spinning kernel
        out = compiled(x)
        torch.testing.assert_close(out, expected_output(fresh), rtol=0, atol=0, msg=lambda m: f"call {call}: {m}")

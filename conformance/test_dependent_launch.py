"""Programmatic dependent launch (PDL) of the custom ops' Triton kernels (reference.ops.dependent_launch).

A kernel launched with PDL may be running while the kernel before it on the stream still runs, so it is
right only if it waits (``griddepcontrol.wait``) before its first load, store or atomic of global memory. A
kernel that read or wrote first would race the kernel before it: a wrong result now and then, which no
comparison of outputs can be trusted to catch. So the rule is read from each kernel's PTX, where it is
certain: launched with PDL, every kernel's first global memory access follows ``griddepcontrol.wait``, and
``griddepcontrol.launch_dependents`` comes after the wait; without ``REFERENCE_PDL=1`` (the default: PDL
measured slower, perf/NOTES.md v42) neither is there and the launch does not ask for PDL. Then a model's steps,
in piecewise and full graphs with the GEMM fusions on (every kernel of a Llama layer is one of ours), give the
same bits with PDL as without: the kernels do the same arithmetic either way, only when they start differs.
"""

from __future__ import annotations

import re

import pytest
import torch

from conformance.driver import prefill_and_decode
from conformance.helpers import make_runner, small_llama_config, tiny_eager_llm
from reference.config import ConfigError
from reference.ops import dependent_launch
from reference.ops.library import HAS_TRITON

FUSED = ["all", "+rms_norm_linear", "+linear_activation", "+linear_residual_add"]
D, KV_HEADS, GROUP, ROWS, MAX_LEN = 64, 2, 4, 8, 64
# An instruction's opcode (after an optional predicate): any of them on the .global state space reads or writes
# global memory (ld.global.nc, cp.async.cg.shared.global, atom.global.gpu.acq_rel, ld.acquire.gpu.global, ...),
# except a prefetch (no data reaches the program) and the address conversions.
_OPCODE = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w:.]*)", re.MULTILINE)
_NOT_ACCESSES = ("prefetch", "cvta", "isspacep")

hopper = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= dependent_launch.MIN_CAPABILITY),
    reason="PDL needs a GPU of compute capability 9.0 or more",
)


def _on_hopper_kernels(test):
    """Marks for a test that launches the kernels: the GPU suite's, on a GPU with PDL and Triton."""
    for mark in (pytest.mark.gpu, pytest.mark.requires("components"), hopper,
                 pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")):  # fmt: skip
        test = mark(test)
    return test


def _set_switch(monkeypatch, value: str | None) -> None:
    """``$REFERENCE_PDL`` set to ``value``, or unset for None."""
    if value is None:
        monkeypatch.delenv(dependent_launch.ENV, raising=False)
    else:
        monkeypatch.setenv(dependent_launch.ENV, value)


@pytest.mark.parametrize("value", ["yes", "2", "true", " 1"])
def test_a_switch_that_is_neither_0_nor_1_is_one_line_naming_it(monkeypatch, value):
    monkeypatch.setenv(dependent_launch.ENV, value)
    expected = rf"^REFERENCE_PDL: expected '0' or '1', got {re.escape(repr(value))}$"
    with pytest.raises(ConfigError, match=expected):
        dependent_launch.enabled(torch.device("cpu"))


@pytest.mark.parametrize("value", [None, "", "0", "1"])
def test_a_cpu_never_launches_with_pdl(monkeypatch, value):
    _set_switch(monkeypatch, value)
    assert dependent_launch.enabled(torch.device("cpu")) is False


@pytest.mark.parametrize("value, expected", [(None, False), ("", False), ("0", False), ("1", True)])
def test_the_switch_reads_1_as_on_and_0_or_nothing_as_off(monkeypatch, value, expected):
    _set_switch(monkeypatch, value)
    assert dependent_launch.switched_on() is expected


@pytest.mark.parametrize(
    "device, interpret, capable, expected",
    [
        ("cuda:1", None, True, True),
        ("cuda", None, True, True),  # no index: the current device's capability
        ("cuda:1", None, False, False),
        ("cuda:1", "1", True, False),  # Triton's interpreter runs no inline PTX
        ("cuda:1", "true", True, False),
        ("cuda:1", "0", True, True),
    ],
)
def test_a_cuda_device_launches_with_pdl_where_its_capability_allows(monkeypatch, device, interpret, capable, expected):
    """Without a GPU: the capability query and the current device stand in (the GPU rule below asks the card)."""
    asked = []
    monkeypatch.setenv(dependent_launch.ENV, "1")
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    monkeypatch.setattr(dependent_launch, "_capable", lambda d: asked.append(d) or capable)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert dependent_launch.enabled(torch.device(device)) is expected
    reaches_the_card = interpret not in ("1", "true")
    assert asked == ([torch.device("cuda", 1)] if reaches_the_card else [])


@pytest.mark.parametrize("value", [None, "", "0"])
def test_pdl_is_off_unless_asked_for_even_where_the_card_has_it(monkeypatch, value):
    """The default, as measured: PDL made the 8B step slower on an H100 (perf/NOTES.md v42)."""
    _set_switch(monkeypatch, value)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(dependent_launch, "_capable", lambda d: True)
    assert dependent_launch.enabled(torch.device("cuda", 0)) is False


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("value, expected", [(None, False), ("", False), ("0", False), ("1", True)])
def test_a_hopper_gpu_launches_with_pdl_only_when_it_is_switched_on(monkeypatch, value, expected):
    _set_switch(monkeypatch, value)
    assert dependent_launch.enabled(torch.device("cuda")) is expected


def test_the_runner_refuses_a_bad_switch_before_it_runs_anything(monkeypatch, impl):
    monkeypatch.setenv(dependent_launch.ENV, "on")
    with pytest.raises(ConfigError, match=r"^REFERENCE_PDL: expected '0' or '1', got 'on'$"):
        make_runner(impl, "no_inductor", small_llama_config())


def test_llm_refuses_a_bad_switch_before_it_loads_weights(monkeypatch):
    from reference.models import registry

    monkeypatch.setenv(dependent_launch.ENV, "TRUE")
    monkeypatch.setattr(registry, "build_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    with pytest.raises(ConfigError, match=r"^REFERENCE_PDL: expected '0' or '1', got 'TRUE'$"):
        tiny_eager_llm()


def test_the_benchmarks_record_whether_the_kernels_launched_with_pdl(monkeypatch):
    from reference.benchmark import machine

    for answer in (True, False):
        monkeypatch.setattr(dependent_launch, "enabled", lambda device, answer=answer: answer)
        assert machine.machine_info(torch.device("cpu"))["dependent_launch"] is answer


# ------------------------------------------------------------------------------------------- the PTX rule
def _launches():
    """(name, kernel, launch) for every custom-op kernel: ``launch()`` calls its wrapper once on small inputs."""
    from reference.ops import graph_attention_kernels as graph
    from reference.ops import linear_kernels, triton_kernels

    dt = torch.bfloat16
    cache = torch.zeros(2, ROWS, MAX_LEN, KV_HEADS, D, device="cuda", dtype=dt)
    qkv = torch.randn(4, (KV_HEADS * GROUP + 2 * KV_HEADS) * D, device="cuda", dtype=dt)
    q, k, v = qkv.split([KV_HEADS * GROUP * D, KV_HEADS * D, KV_HEADS * D], dim=-1)
    out = torch.empty_like(q)
    hidden = torch.randn(4, 256, device="cuda", dtype=dt)
    norm_w = torch.ones(256, device="cuda", dtype=dt)
    ints = lambda values: torch.tensor(values, dtype=torch.int64, device="cuda")  # noqa: E731
    weight = torch.randn(2 * 128, 256, device="cuda", dtype=dt)
    split = {"BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 2, "num_warps": 4}
    return [
        ("rms_norm", triton_kernels._rms_norm_kernel,
         lambda: triton_kernels.rms_norm(hidden, norm_w, 1e-6, 0.0, hidden)),
        ("gated_activation", triton_kernels._gated_kernel, lambda: triton_kernels.gated_activation(hidden, False)),
        ("rotary", triton_kernels._rotary_kernel,
         lambda: triton_kernels.rotary(ints([0, 1, 2, 3]), q, k, torch.randn(MAX_LEN, D, device="cuda"), D)),
        ("decode_attention", triton_kernels._decode_attention_kernel,
         lambda: triton_kernels.decode_attention(q, k, v, cache, ints([0, 1]), ints([3, 5]), out, D**-0.5, None, None)),
        ("prefill_attention", triton_kernels._prefill_attention_kernel,
         lambda: triton_kernels.prefill_attention(q, cache, ints([0, 2, 2, 2, 2, 2, 0, 1]).view(4, 2), 2, out,
                                                  D**-0.5, None, None)),
        ("write_kv_cache", graph._write_kv_cache_kernel,
         lambda: graph.write_kv_cache(k, v, cache, ints([0, MAX_LEN, -1, 2 * MAX_LEN]))),
        ("varlen_attention", graph._varlen_attention_kernel,
         lambda: graph.varlen_attention(q, cache, ints([0, 1, 3]), ints([1, 2]), ints([0, 1]), 4, out, D**-0.5,
                                        None, None)),
        ("small_m_linear gated, split-K", linear_kernels._small_m_linear_kernel,
         lambda: linear_kernels.small_m_linear(hidden, weight, epilogue="silu_and_mul", norm=(norm_w, 1e-6, 0.0),
                                               config=split)),
        ("small_m_linear residual, one slice", linear_kernels._small_m_linear_kernel,
         lambda: linear_kernels.small_m_linear(hidden, weight[:256], epilogue="residual", residual=hidden,
                                               config={**split, "SPLIT_K": 1})),
        ("small_m_linear fp32, split-K", linear_kernels._small_m_linear_kernel,
         lambda: linear_kernels.small_m_linear(hidden.float(), weight.float(), config=split)),
    ]  # fmt: skip


def _compiled_by(monkeypatch, kernel, launch):
    """The compiled kernel that ``launch()`` ran ``kernel`` (a ``triton.JITFunction``) as."""
    seen, run = [], kernel.run

    def spy(*args, **kwargs):
        seen.append(run(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(kernel, "run", spy)
    launch()
    torch.cuda.synchronize()
    monkeypatch.setattr(kernel, "run", run)
    assert seen, "the wrapper never launched its kernel"
    return seen[-1]


def _body(compiled) -> str:
    ptx = compiled.asm["ptx"]
    return ptx[ptx.index(".entry") :]


def _first_global_access(body: str) -> tuple[int, str] | None:
    """(offset, opcode) of the first instruction of ``body`` (PTX) that accesses global memory, or None."""
    for match in _OPCODE.finditer(body):
        op = match.group(1)
        if ".global" in op and not op.startswith(_NOT_ACCESSES):
            return match.start(1), op
    return None


@pytest.mark.parametrize(
    "ptx, expected",
    [
        ("cvta.to.global.u64 %rd1, %rd2;\n prefetch.global.L2 [%rd1];\n mov.b32 %r1, 0;", None),
        ("mov.b32 %r1, 0;\n @%p1 cp.async.cg.shared.global [ %r2 + 0 ], [ %rd3 + 0 ], 0x10, %r4;",
         "cp.async.cg.shared.global"),
        ("@!%p2 ld.global.nc.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd5 + 0 ];", "ld.global.nc.v4.b32"),
        ("ld.acquire.gpu.global.b32 %r1, [%rd1];", "ld.acquire.gpu.global.b32"),
        ("atom.global.gpu.acq_rel.add.u32 %r1, [%rd1], 1;", "atom.global.gpu.acq_rel.add.u32"),
        ("cp.async.bulk.tensor.2d.shared::cluster.global.tile [%r1], [%rd1, {%r2, %r3}], [%r4];",
         "cp.async.bulk.tensor.2d.shared::cluster.global.tile"),
        ("red.global.add.f32 [%rd1], %f1;", "red.global.add.f32"),
        (".extern .shared .align 16 .b8 global_smem[];\n mov.u32 %r1, global_smem;", None),
    ],
)
def test_the_ptx_reading_finds_every_kind_of_global_access(ptx, expected):
    found = _first_global_access(ptx)
    assert (found and found[1]) == expected


@_on_hopper_kernels
@pytest.mark.parametrize("index", range(10), ids=lambda i: ["rms_norm", "gated", "rotary", "decode", "prefill",
                                                             "write_kv", "varlen", "small_m", "small_m_residual",
                                                             "small_m_fp32"][i])  # fmt: skip
@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "default"])
def test_a_kernel_launched_with_pdl_waits_before_it_touches_global_memory(monkeypatch, index, pdl):
    if pdl:
        monkeypatch.setenv(dependent_launch.ENV, "1")
    else:
        monkeypatch.delenv(dependent_launch.ENV, raising=False)
    name, kernel, launch = _launches()[index]
    compiled = _compiled_by(monkeypatch, kernel, launch)
    body = _body(compiled)
    wait, handoff = body.find("griddepcontrol.wait"), body.find("griddepcontrol.launch_dependents")
    if not pdl:
        assert compiled.metadata.launch_pdl is False, f"{name}: launched with PDL although nobody asked for it"
        assert wait < 0 and handoff < 0, f"{name}: griddepcontrol in a kernel launched without PDL"
        return
    assert compiled.metadata.launch_pdl is True, f"{name}: not launched with PDL on a GPU that has it"
    assert wait >= 0, f"{name}: launched with PDL but never waits for the kernel before it"
    first = _first_global_access(body)
    assert first is None or first[0] > wait, f"{name}: {first[1]} before griddepcontrol.wait: it may race its elder"

    assert handoff > wait, f"{name}: launch_dependents missing or before the wait"


@_on_hopper_kernels
@pytest.mark.parametrize("mode", ["no_inductor", "no_inductor_full"])
def test_steps_give_the_same_bits_with_and_without_pdl(monkeypatch, impl, mode):
    """Each runner is built, warmed up (its graphs captured) and run under one setting, one after the other,
    because eager launches (attention between piecewise graphs) read the switch at each launch."""
    logits = {}
    for setting in ("0", "1"):
        monkeypatch.setenv(dependent_launch.ENV, setting)
        runner = make_runner(
            impl, mode, small_llama_config(), device="cuda", dtype=torch.bfloat16, max_num_seqs=4,
            cudagraph_capture_sizes=[1, 2, 4, 8, 16], custom_ops=FUSED,
        )  # fmt: skip
        runner.warm_up()
        prompts = [[1, 5, 9], [2, 6], [3, 7, 11, 13], [4]]
        logits[setting] = prefill_and_decode({"run": runner}, prompts, 6, leader="run")["run"]
        del runner
    for step, (without, with_pdl) in enumerate(zip(logits["0"], logits["1"])):
        assert torch.equal(with_pdl, without), f"{mode}: step {step} differs with PDL on"


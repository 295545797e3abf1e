"""Continuous batching with chunked prefill, as properties over random arrivals, lengths, budgets and ends.

The scheduler's rules (reference/engine/scheduler.py) checked step by step on the pure-Python scheduler,
hundreds of random workloads: every step fits the token budget; running requests never exceed
``max_num_seqs`` and hold distinct rows; every running request whose prompt is cached decodes in every
step (decodes first, none starves); prompt chunks continue where the last one ended, in arrival order, and
only the last chunk of a step may be cut short, when the budget is spent; a step leaves budget unused only
when no waiting request could use it; without chunked prefill every prompt runs whole; static scheduling
admits only into an empty engine; every request ends, having run its prompt once and one decode per
later token.

Then the engine on the tiny model under random arrivals (requests added between steps through
``llm_engine.add_requests``), budgets and stops: each request's greedy tokens equal those it generates
alone (test_generate_batching.py says why exact equality is the rule on CPU float32); and ``no_inductor``
bitwise equal to eager in every step of one continuous schedule.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.helpers import tiny_eager_llm, token_ids
from reference.benchmark.choices import MODE_KWARGS
from reference.engine.llm import LLM
from reference.engine.requests import Request
from reference.engine.sampling import SamplingParams
from reference.engine.scheduler import Scheduler

pytestmark = pytest.mark.requires("components")

# A workload: requests (prompt length, tokens to sample, the step before which it arrives).
WORKLOADS = st.lists(
    st.tuples(st.integers(1, 24), st.integers(1, 6), st.integers(0, 12)), min_size=1, max_size=12
)


def _request(i: int, prompt_len: int, priority: int = 0) -> Request:
    params = SamplingParams(temperature=0, max_tokens=8)
    return Request(str(i), None, list(range(prompt_len)), params, None, [], priority=priority)


def _check_step(sched: Scheduler, step, before: dict[int, int], static: bool) -> None:
    """The rules of one step (module doc); ``before``: ``num_cached`` at the step's start of each request
    running then, by ``id``."""
    assert step.num_tokens <= sched.budget
    assert len(sched.running) <= sched.max_num_seqs
    rows = [r.row for r in sched.running]
    assert len(set(rows)) == len(rows) and all(0 <= row < sched.max_num_seqs for row in rows)
    cached = [id(r) for r in sched.running if before.get(id(r)) == len(r.prompt_token_ids)]
    assert [id(r) for r in step.decodes] == cached, "a cached request did not decode, or out of order"
    order = [id(r) for r in sched.running]
    chunk_order = [order.index(id(r)) for r, _, _ in step.chunks]
    assert chunk_order == sorted(chunk_order), "chunks out of arrival order"
    for k, (r, start, length) in enumerate(step.chunks):
        assert start == before.get(id(r), 0) and length >= 1, "a chunk does not continue where the last ended"
        whole = start + length == len(r.prompt_token_ids)
        if not sched.chunked:
            assert start == 0 and whole, "a prompt cut into chunks without chunked prefill"
        if not whole:
            assert k == len(step.chunks) - 1 and step.num_tokens == sched.budget, "a chunk cut short needlessly"
    admitted = [r for r, _, _ in step.chunks if id(r) not in before]
    if static:
        assert not admitted or not before, "static scheduling admitted beside running requests"
    elif sched.waiting and sched.free_rows and step.num_tokens < sched.budget:
        # a request left waiting although the step had budget and a row: only a prompt that does not fit whole
        left = sched.budget - step.num_tokens
        assert not sched.chunked and len(sched.waiting[0].prompt_token_ids) > left, "budget and a row unused"


def _check_admissions(admitted: list[Request], waiting: list[Request], rank) -> None:
    """The requests a step admits (in admission order) come in ``rank`` order, and none ranks after a request
    left in ``waiting`` (the queue at the step's start, as the test keeps it)."""
    assert [rank(r) for r in admitted] == sorted(rank(r) for r in admitted), "admitted out of the policy's order"
    left = [rank(w) for w in waiting if not any(w is r for r in admitted)]
    assert not admitted or not left or rank(admitted[-1]) < min(left), "a request jumped the policy's queue"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    workload=WORKLOADS,
    max_num_seqs=st.integers(1, 4),
    extra_budget=st.integers(0, 20),
    chunked=st.booleans(),
    static=st.booleans(),
    priorities=st.lists(st.integers(-2, 2), min_size=12, max_size=12),
    policy=st.sampled_from(["fcfs", "priority"]),
)
def test_every_step_keeps_the_scheduling_rules_and_every_request_ends(
    workload, max_num_seqs, extra_budget, chunked, static, priorities, policy
):
    """Besides the module doc's rules: requests are admitted by the policy's order, arrival order under
    ``fcfs``, and under ``priority`` the lowest priority value first, ties in arrival order (vLLM's)."""
    budget = max_num_seqs + extra_budget
    if not chunked:  # a prompt longer than the budget is refused at add (test_llm.py checks the message)
        workload = [(min(p, budget), n, t) for p, n, t in workload]
    sched = Scheduler(
        max_num_seqs, budget, enable_chunked_prefill=chunked, scheduling="static" if static else "continuous",
        scheduling_policy=policy,
    )  # fmt: skip
    requests = [(_request(i, p, priorities[i]), n, t) for i, (p, n, t) in enumerate(workload)]
    arrived: list[Request] = []  # in arrival order; the test's own view of the queue
    admitted_ids: set[int] = set()

    def rank(r: Request) -> tuple[int, int]:
        return (r.priority if policy == "priority" else 0, next(i for i, q in enumerate(arrived) if q is r))
    tokens = {id(r): 0 for r, _, _ in requests}  # tokens each request ran: its prompt, then its decodes
    sampled = {id(r): 0 for r, _, _ in requests}
    done = []
    # every step with a running request runs a token of it, and only an empty engine idles until an arrival
    most_steps = sum(p + n for p, n, _ in workload) + max(t for _, _, t in workload) + 1
    for step_index in range(most_steps + 1):
        for r, _, arrival in requests:
            if arrival == step_index:
                sched.add(r)
                arrived.append(r)
        if not sched.has_unfinished() and step_index > max(t for _, _, t in workload):
            break
        before = {id(r): r.num_cached for r in sched.running}
        step = sched.schedule()
        _check_step(sched, step, before, static)
        admitted = [r for r in sched.running if id(r) not in before]  # running keeps admission order
        _check_admissions(admitted, [r for r in arrived if id(r) not in admitted_ids], rank)
        admitted_ids |= {id(r) for r in admitted}
        for r in step.decodes:
            tokens[id(r)] += 1
        for r, _, length in step.chunks:
            tokens[id(r)] += length
        for r in step.samplers:  # the engine's part: sample, and finish at the last token
            sampled[id(r)] += 1
            target = next(n for q, n, _ in requests if q is r)
            if sampled[id(r)] == target:
                sched.finish(r)
                done.append(r)
    else:
        pytest.fail(f"the workload never ended: {len(sched.waiting)} waiting, {len(sched.running)} running")
    assert sorted(id(r) for r in done) == sorted(id(r) for r, _, _ in requests)
    for r, n, _ in requests:  # the prompt once, then a decode for every sampled token but the last
        assert tokens[id(r)] == len(r.prompt_token_ids) + n - 1
    assert sorted(sched.free_rows) == list(range(max_num_seqs))


def test_finishing_a_request_that_is_not_running_is_an_error():
    sched = Scheduler(2, 4)
    with pytest.raises(ValueError, match=r"^request 0 is not running$"):
        sched.finish(_request(0, 3))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(scheduling="fifo"), r"^scheduling: expected one of \['continuous', 'static'\], got 'fifo'$"),
        (
            dict(scheduling_policy="lifo"),
            r"^scheduling_policy: expected one of \['fcfs', 'priority'\], got 'lifo'$",
        ),
        (
            dict(max_num_batched_tokens=1),
            r"^max_num_batched_tokens \(1\) must be >= max_num_seqs \(2\): every running request decodes one "
            r"token per step$",
        ),
    ],
)
def test_bad_scheduler_arguments_are_one_line_errors(kwargs, message):
    args = {"max_num_seqs": 2, "max_num_batched_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        Scheduler(args.pop("max_num_seqs"), args.pop("max_num_batched_tokens"), **args)


def test_by_default_prompts_are_chunked_and_without_chunking_one_past_the_budget_is_refused_at_add():
    """vLLM's defaults: chunked prefill and continuous batching (a second request joins a running one)."""
    sched = Scheduler(2, 3)
    sched.add(_request(0, 5))
    assert [(start, length) for _, start, length in sched.schedule().chunks] == [(0, 3)]
    sched.add(_request(1, 1))
    assert [(start, length) for _, start, length in sched.schedule().chunks] == [(3, 2), (0, 1)]
    unchunked = Scheduler(2, 3, enable_chunked_prefill=False)
    unchunked.add(_request(2, 3))
    with pytest.raises(ValueError, match=r"^request 3: its prompt \(4 tokens\) exceeds max_num_batched_tokens \(3\) "
                       r"and enable_chunked_prefill is False: it can never run; enable chunked prefill or raise "
                       r"max_num_batched_tokens$"):  # fmt: skip
        unchunked.add(_request(3, 4))
    assert [r.request_id for r in unchunked.waiting] == ["2"]


def test_the_priority_policy_admits_the_lowest_value_first_and_ties_in_arrival_order():
    """vLLM's ``scheduling_policy='priority'``: a lower value is served earlier; equal values first come, first
    served. One row, so each request is admitted alone, when the one before it has finished."""
    sched = Scheduler(1, 8, scheduling_policy="priority")
    for i, priority in enumerate([2, 0, 1, 0, -1]):
        sched.add(_request(i, 3, priority))
    order = []
    while sched.has_unfinished():
        step = sched.schedule()
        order += [r.request_id for r, start, _ in step.chunks if start == 0]
        sched.finish(sched.running[0])
    assert order == ["4", "1", "3", "2", "0"]
    fcfs = Scheduler(1, 8)
    for i, priority in enumerate([2, 0]):
        fcfs.add(_request(i, 3, priority))
    assert [r.request_id for r, _, _ in fcfs.schedule().chunks] == ["0"]  # fcfs ignores the priority


# ---------------------------------------------------------------------- the engine, on the model
@pytest.fixture(scope="module")
def engines():
    """One engine per (max_num_seqs, budget, chunked) that the examples draw from, built once."""
    built = {}

    def get(max_num_seqs, budget, chunked):
        key = (max_num_seqs, budget, chunked)
        if key not in built:
            built[key] = tiny_eager_llm(
                max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked
            )
        return built[key]

    return get


@pytest.mark.eager
@settings(
    max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    workload=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 5), st.integers(0, 6)), min_size=2, max_size=6),
    config=st.sampled_from([(2, 2, True), (2, 5, True), (3, 12, False), (3, 4, True)]),
    stop_after=st.integers(1, 4),
)
def test_under_random_arrivals_each_request_generates_what_it_generates_alone(engines, workload, config, stop_after):
    """A request arrives before a given step; each may also stop early on a stop token (the token its
    alone run generates at position ``stop_after``, when that token does not come earlier)."""
    llm = engines(*config)
    if not config[2]:
        workload = [(min(p, config[1]), n, t) for p, n, t in workload]
    prompts = [token_ids(p, llm.vocab_size, seed=30 + i) for i, (p, _, _) in enumerate(workload)]
    free = [
        llm.generate([p], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)[0]
        for p, (_, n, _) in zip(prompts, workload)
    ]
    params = []
    for out, (_, n, _) in zip(free, workload):
        tokens = out.outputs[0].token_ids
        stop = tokens[stop_after] if stop_after < n and tokens[stop_after] not in tokens[:stop_after] else None
        stops = [] if stop is None else [stop]
        params.append(SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, stop_token_ids=stops))
    alone = [llm.generate([p], [sp], use_tqdm=False)[0].outputs[0] for p, sp in zip(prompts, params)]
    engine, ids, outputs = llm.llm_engine, {}, {}
    step_index = 0
    while len(ids) < len(workload) or engine.has_unfinished_requests():
        for i, (_, _, arrival) in enumerate(workload):
            # arrives now, or earlier than planned when the engine would otherwise idle
            if i not in ids and (arrival == step_index or not engine.has_unfinished_requests()):
                (ids[i],) = engine.add_requests([prompts[i]], [params[i]])
        outputs.update((o.request_id, o.outputs[0]) for o in engine.step())
        step_index += 1
    together = [outputs[ids[i]] for i in range(len(workload))]
    assert [(o.token_ids, o.finish_reason, o.stop_reason) for o in together] == [
        (o.token_ids, o.finish_reason, o.stop_reason) for o in alone
    ]


@pytest.mark.eager
@pytest.mark.no_inductor
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_no_inductor_is_bitwise_equal_to_eager_in_every_step_of_a_continuous_schedule(device):
    """The same workload, scheduled alike (3 rows, budget 4: mixed steps of decodes and prompt chunks, rows
    reused), in eager and ``no_inductor`` (float32): every step's logits equal bitwise. Both run the same
    custom ops and attention kernels on the same shapes; on CUDA ``no_inductor`` replays its pieces as CUDA
    graphs of the kernels eager launches. It captures every token count a step can have (1-4), so no step is
    padded: padding would run the GEMMs over more rows than eager, which some CPU BLAS round differently
    (conformance/oracle.py's bitwise rule says why that is held to the fp32 rules instead)."""
    sizes = [1, 2, 3, 4]
    runs = {}
    for mode, kwargs in {
        "eager": dict(enforce_eager=True),
        "no_inductor": dict(compilation_config={**MODE_KWARGS["no_inductor"]["compilation_config"],
                                                "cudagraph_capture_sizes": sizes}),  # fmt: skip
    }.items():
        limits = dict(max_num_seqs=3, max_num_batched_tokens=4)
        llm = LLM("llama-tiny", device=device, dtype="float32", use_tqdm=False, **limits, **kwargs)
        steps = []
        real_step = llm.runner.step

        def spy(new_tokens, context_lens, rows, fed=None, real_step=real_step, steps=steps):
            logits = real_step(new_tokens, context_lens, rows, fed=fed)
            mixed = fed is not None and len(new_tokens) > 0  # decodes and prompt chunks in one step
            steps.append(((list(context_lens), list(rows), mixed), logits.clone()))
            return logits

        llm.runner.step = spy
        prompts = [token_ids(n, llm.vocab_size, seed=40 + n) for n in (5, 2, 7, 1, 3)]
        params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (3, 5, 2, 4, 3)]
        runs[mode] = (steps, [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
    (eager, eager_tokens), (piecewise, piecewise_tokens) = runs["eager"], runs["no_inductor"]
    assert any(mixed for (_, _, mixed), _ in eager), "no mixed step"
    assert [s for s, _ in piecewise] == [s for s, _ in eager] and piecewise_tokens == eager_tokens
    for i, ((_, a), (_, b)) in enumerate(zip(piecewise, eager)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"step {i}: {m}")

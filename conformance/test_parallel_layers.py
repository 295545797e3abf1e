"""reference/parallel in this process: the sharded layers, the sharding of full tensors and the group's checks.

conformance/test_tensor_parallel.py runs whole models over gloo in torchrun's processes; these tests run the
same layers with the ranks as threads of this process, so a mutation tool (which sees one process only) and
a quick ``-k parallel`` both reach them. torch's functional collectives are replaced for the test by
:class:`SimulatedGroup`: each rank's thread hands its tensor in and gets back what the real collective
gives (the sum; the rank-major concatenation along dim 0), and the op, group name and size are checked.
"""

from __future__ import annotations

import os
import re
import threading

import pytest
import torch
from torch import nn

from reference import parallel
from reference.parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallel,
    TensorSplit,
    VocabParallelEmbedding,
    copy_full_into,
    full_shape,
    split_of,
    use,
)

pytestmark = pytest.mark.requires("components")

GROUP = "simulated-tp"


class SimulatedGroup:
    """``size`` ranks, one thread each, and the two functional collectives the layers call, done by exchange."""

    def __init__(self, size: int):
        self.size, self.calls = size, []
        self._barrier, self._slots, self._local = threading.Barrier(size, timeout=30), [None] * size, threading.local()

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        self._slots[self._local.rank] = x
        self._barrier.wait()
        everyone = list(self._slots)
        self._barrier.wait()  # no rank writes its next tensor before every rank has read this round
        return everyone

    def all_reduce(self, x: torch.Tensor, op: str, group_name: str) -> torch.Tensor:
        assert (op, group_name) == ("sum", GROUP), (op, group_name)
        self.calls.append("all_reduce")
        return torch.stack(self._exchange(x.clone())).sum(0)

    def all_gather_into_tensor(self, x: torch.Tensor, size: int, group_name: str) -> torch.Tensor:
        assert (size, group_name) == (self.size, GROUP), (size, group_name)
        assert x.is_contiguous()
        self.calls.append("all_gather")
        return torch.cat(self._exchange(x.clone()))  # [size * N, ...], rank-major, as torch's

    def run(self, build, forward, monkeypatch) -> list:
        """``forward(build(tp))`` of every rank, the forwards at once; each rank's result. ``build`` runs in
        this thread, rank after rank, inside ``use(tp)``: the group layers are built for is one per process."""
        namespace = torch.ops._c10d_functional
        monkeypatch.setattr(namespace, "all_reduce", self.all_reduce)
        monkeypatch.setattr(namespace, "all_gather_into_tensor", self.all_gather_into_tensor)
        monkeypatch.setattr(namespace, "wait_tensor", lambda x: x)
        built, results, errors = [], [None] * self.size, []
        for r in range(self.size):
            with use(TensorParallel(r, self.size, GROUP)) as tp:
                built.append(build(tp))

        def rank(r: int) -> None:
            self._local.rank = r
            try:
                with torch.no_grad():
                    results[r] = forward(built[r])
            except BaseException as err:  # noqa: BLE001 (re-raised below, in the test's thread)
                errors.append(err)
                self._barrier.abort()

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results


def _full_linear(in_features: int, out_features: int, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias)


# ---------------------------------------------------------------------- layers
@pytest.mark.parametrize("size", [2, 4])
def test_a_fused_column_parallel_linear_holds_its_share_of_every_part_and_gathers_the_whole(size, monkeypatch):
    parts = [16, 8, 8]  # q, k, v rows
    full, x = _full_linear(12, sum(parts), True, seed=0), torch.randn(3, 12)  # x: [T, in]
    expected = full(x).detach()  # [3, 32]

    def build(tp):
        layers = [ColumnParallelLinear(12, parts, bias=True, gather_output=gather) for gather in (False, True)]
        for layer in layers:
            copy_full_into(layer.weight, full.weight)
            copy_full_into(layer.bias, full.bias)
        return layers

    group = SimulatedGroup(size)
    results = group.run(build, lambda layers: (layers[0](x), layers[1](x)), monkeypatch)
    for r, (local, gathered) in enumerate(results):
        mine = torch.cat([part.chunk(size, 1)[r] for part in expected.split(parts, 1)], 1)  # r's share of q, k, v
        torch.testing.assert_close(local, mine, rtol=0, atol=0)  # the same dot products, one by one
        assert gathered.shape == (3, sum(parts) // size * size)
        # rank-major: rank r's columns at [r * local, (r + 1) * local), bitwise what each rank computed
        torch.testing.assert_close(gathered, torch.cat([res[0] for res in results], 1), rtol=0, atol=0)
    assert group.calls.count("all_gather") == size and "all_reduce" not in group.calls


@pytest.mark.parametrize("bias", [True, False])
def test_a_row_parallel_linear_sums_its_partial_products_and_adds_the_bias_once(bias, monkeypatch):
    size, full = 2, _full_linear(12, 5, bias, seed=1)
    x = torch.randn(4, 12)  # [T, in]; rank r gets columns [6r, 6r + 6)
    expected = full(x).detach()

    def build(tp):
        layer = RowParallelLinear(12, 5, bias=bias)
        copy_full_into(layer.weight, full.weight)
        if bias:
            copy_full_into(layer.bias, full.bias)
        return layer, x.chunk(tp.size, 1)[tp.rank]

    group = SimulatedGroup(size)
    for out in group.run(build, lambda built: built[0](built[1]), monkeypatch):
        # fp32: the two halves are summed apart and then added, one GEMM sums them in another order
        torch.testing.assert_close(out, expected, rtol=1.3e-6, atol=1e-6)
    assert group.calls == ["all_reduce"] * size


@pytest.mark.parametrize("size", [2, 4])
def test_a_vocab_parallel_embedding_looks_up_every_id_once_across_the_ranks(size, monkeypatch):
    vocab = 16
    torch.manual_seed(2)
    full = nn.Embedding(vocab, 6)
    per_rank = vocab // size
    ids = torch.tensor([0, per_rank - 1, per_rank, vocab - 1, 5, 5, 11])  # both sides of every rank's boundary

    def build(tp):
        layer = VocabParallelEmbedding(vocab, 6)
        copy_full_into(layer.weight, full.weight)
        assert layer.vocab_start == tp.rank * per_rank
        return layer

    for out in SimulatedGroup(size).run(build, lambda layer: layer(ids), monkeypatch):
        torch.testing.assert_close(out, full(ids).detach(), rtol=0, atol=0)  # one non-zero row per id: exact


def test_a_layer_without_bias_has_none_on_any_rank():
    """Llama's and Qwen3's projections have no bias: a stray one would be random numbers added to every output."""
    for tp in (parallel.SINGLE, TensorParallel(1, 2, GROUP)):
        with use(tp):
            layers = ColumnParallelLinear(4, [4, 2, 2], bias=False), RowParallelLinear(4, 4, bias=False)
        assert all(layer.bias is None for layer in layers)


def test_in_one_process_every_layer_is_the_plain_layer_and_calls_no_collective(monkeypatch):
    def no_collective(*args):
        raise AssertionError("a collective was called with one process")

    for name in ("all_reduce", "all_gather_into_tensor"):
        monkeypatch.setattr(torch.ops._c10d_functional, name, no_collective)
    torch.manual_seed(3)
    column, row = ColumnParallelLinear(4, [6, 2], bias=True, gather_output=True), RowParallelLinear(8, 4, bias=True)
    embedding, x = VocabParallelEmbedding(10, 4), torch.randn(2, 4)
    assert column.weight.shape == (8, 4) and row.weight.shape == (4, 8) and embedding.weight.shape == (10, 4)
    assert split_of(column.weight) is None and full_shape(row.weight) == (4, 8)
    with torch.no_grad():
        torch.testing.assert_close(column(x), nn.functional.linear(x, column.weight, column.bias))
        torch.testing.assert_close(row(column(x)), nn.functional.linear(column(x), row.weight, row.bias))
        torch.testing.assert_close(embedding(torch.tensor([0, 9])), embedding.weight[[0, 9]])


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: ColumnParallelLinear(4, [6, 3], False), "tensor_parallel_size=2 must divide the output width (3)"),
        (lambda: RowParallelLinear(5, 4, bias=False), "tensor_parallel_size=2 must divide the input width (5)"),
        (lambda: VocabParallelEmbedding(7, 4), "tensor_parallel_size=2 must divide the vocabulary (7)"),
    ],
    ids=["column", "row", "vocab"],
)
def test_a_width_the_group_does_not_divide_is_refused_naming_it(build, message):
    with use(TensorParallel(0, 2, GROUP)), pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build()


# ---------------------------------------------------------------------- sharding
def test_each_rank_holds_its_share_of_each_fused_part_and_the_shards_make_the_whole():
    parts, size = (4, 2, 2), 2
    full = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)  # rows q0..q3, k0 k1, v0 v1
    shards = []
    for rank in range(size):
        target = torch.zeros(4, 3)
        target.tp_split = TensorSplit(0, parts, rank, size)
        assert full_shape(target) == (8, 3) and split_of(target) is target.tp_split
        copy_full_into(target, full)
        shards.append(target)
    q, k, v = full.split(parts)
    assert torch.equal(shards[0], torch.cat([q[:2], k[:1], v[:1]]))
    assert torch.equal(shards[1], torch.cat([q[2:], k[1:], v[1:]]))


def test_two_fused_parts_are_sharded_part_by_part_too():
    """gate_up_proj: [gate; up], each rank its share of each."""
    full = torch.arange(8 * 2, dtype=torch.float32).view(8, 2)  # rows gate0..gate3, up0..up3
    gate, up = full.split(4)
    for rank in range(2):
        target = torch.zeros(4, 2)
        target.tp_split = TensorSplit(0, (4, 4), rank, 2)
        region, piece = parallel.shard(target, full)
        assert region is target and torch.equal(piece, torch.cat([gate.chunk(2)[rank], up.chunk(2)[rank]]))


def test_fused_parts_split_along_the_columns_stay_columns():
    """``shard`` is written for either dimension; its parts, chunks and concatenation follow ``dim``."""
    full = torch.arange(2 * 6, dtype=torch.float32).view(2, 6)  # columns a0 a1, b0 b1 b2 b3
    target = torch.zeros(2, 3)
    target.tp_split = TensorSplit(1, (2, 4), 1, 2)
    _, piece = parallel.shard(target, full)
    assert torch.equal(piece, torch.cat([full[:, 1:2], full[:, 4:6]], 1))


def test_the_region_of_a_whole_copy_is_the_target_itself():
    for split in (None, TensorSplit(0, (4,), 0, 2)):
        target = torch.zeros(2, 3)
        if split is not None:
            target.tp_split = split
        region, piece = parallel.shard(target, torch.ones(4 if split else 2, 3))
        assert region is target and piece.shape == target.shape


def test_one_part_of_a_fused_shard_goes_to_its_local_rows():
    """A checkpoint with separate q/k/v tensors fills the fused shard part by part (``rows``)."""
    parts, size, rank = (4, 2, 2), 2, 1
    target = torch.zeros(4, 3)
    target.tp_split = TensorSplit(0, parts, rank, size)
    k = torch.arange(2 * 3, dtype=torch.float32).view(2, 3)  # full rows 4..6 of the fused weight
    copy_full_into(target, k, rows=slice(4, 6))
    assert torch.equal(target[2:3], k[1:]) and not target[:2].any() and not target[3:].any()


def test_a_column_split_shards_the_input_columns():
    target = torch.zeros(2, 3)
    target.tp_split = TensorSplit(1, (6,), 1, 2)
    full = torch.arange(12, dtype=torch.float32).view(2, 6)
    copy_full_into(target, full)
    assert torch.equal(target, full[:, 3:]) and full_shape(target) == (2, 6)


def test_an_unsplit_or_one_process_tensor_is_copied_whole():
    replicated, single = torch.zeros(2, 2), torch.zeros(2, 2)
    single.tp_split = TensorSplit(0, (2,), 0, 1)
    for target in (replicated, single):
        assert split_of(target) is None and full_shape(target) == (2, 2)
        copy_full_into(target, torch.ones(2, 2))
        assert target.eq(1).all()
    rows = torch.zeros(4, 2)
    copy_full_into(rows, torch.ones(2, 2), rows=slice(2, 4))
    assert not rows[:2].any() and rows[2:].eq(1).all()


def test_a_part_the_group_does_not_divide_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^tensor_parallel_size=2 must divide every fused part, not \[3\]$"):
        TensorSplit(0, (4, 3), 0, 2)


# ---------------------------------------------------------------------- the group
def test_use_builds_for_its_group_inside_the_block_only_even_when_the_block_fails():
    tp = TensorParallel(1, 2, GROUP)
    assert parallel.current() is parallel.SINGLE
    with pytest.raises(RuntimeError), use(tp) as inside:
        assert inside is tp and parallel.current() is tp
        raise RuntimeError
    assert parallel.current() is parallel.SINGLE


@pytest.mark.parametrize("field", ["num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"])
def test_a_size_that_does_not_divide_a_field_is_refused_naming_the_field(field):
    config = type("Config", (), dict.fromkeys(["num_attention_heads", "num_key_value_heads", "intermediate_size",
                                               "vocab_size"], 12))()  # fmt: skip
    parallel.check_divisible(config, 4)
    setattr(config, field, 10)
    message = f"tensor_parallel_size=4 does not divide the model's {field} (10); choose a divisor of 10"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parallel.check_divisible(config, 4)


def test_one_process_needs_no_group_and_keeps_its_device():
    device = torch.device("cpu")
    assert parallel.init_tensor_parallel(1, device) == (parallel.SINGLE, device)


def test_a_world_of_another_size_is_refused_naming_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # not started by torchrun: a world of one
    message = (
        "tensor_parallel_size=2 needs 2 processes, one per device, but this process is one of 1 (WORLD_SIZE); "
        "start the script with: torchrun --nproc-per-node 2 SCRIPT ..."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parallel.init_tensor_parallel(2, torch.device("cpu"))
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"but this process is one of 3 \(WORLD_SIZE\)"):
        parallel.init_tensor_parallel(2, torch.device("cpu"))


class _Distributed:
    """What init_tensor_parallel asks of torch.distributed, recorded: the group it would join."""

    def __init__(self, monkeypatch, initialized: bool):
        self.joined, self.devices = [], []
        monkeypatch.setattr(torch.distributed, "is_initialized", lambda: initialized)
        monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, device_id: self.joined.append(
            (backend, device_id)))  # fmt: skip
        monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
        monkeypatch.setattr(torch.distributed, "group", type("Groups", (), {"WORLD": type("World", (), {
            "group_name": "world-7"})}))  # fmt: skip
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "set_device", self.devices.append)
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_RANK", "1")
        for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):  # set by the call: undone after
            monkeypatch.setenv(name, "unset")
            monkeypatch.delenv(name)


def test_on_cuda_a_rank_binds_its_local_gpu_and_joins_nccl_with_multicast_off(monkeypatch):
    distributed = _Distributed(monkeypatch, initialized=False)
    tp, device = parallel.init_tensor_parallel(2, torch.device("cuda"))
    assert tp == TensorParallel(1, 2, "world-7") and device == torch.device("cuda", 1)
    assert distributed.devices == [device] and distributed.joined == [("nccl", device)]
    assert (os.environ["NCCL_NVLS_ENABLE"], os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"]) == ("0", "1")


def test_without_local_rank_a_rank_takes_the_first_gpu(monkeypatch):
    distributed = _Distributed(monkeypatch, initialized=False)
    monkeypatch.delenv("LOCAL_RANK")
    assert parallel.init_tensor_parallel(2, torch.device("cuda"))[1] == torch.device("cuda", 0)
    assert distributed.devices == [torch.device("cuda", 0)]


def test_a_users_nccl_setting_stands(monkeypatch):
    _Distributed(monkeypatch, initialized=False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    parallel.init_tensor_parallel(2, torch.device("cuda"))
    assert os.environ["NCCL_NVLS_ENABLE"] == "1"


def test_on_the_cpu_a_rank_joins_gloo_and_keeps_its_device(monkeypatch):
    distributed = _Distributed(monkeypatch, initialized=False)
    tp, device = parallel.init_tensor_parallel(2, torch.device("cpu"))
    assert tp == TensorParallel(1, 2, "world-7") and device == torch.device("cpu")
    assert distributed.joined == [("gloo", None)] and distributed.devices == []


def test_a_process_already_in_a_group_does_not_join_again(monkeypatch):
    distributed = _Distributed(monkeypatch, initialized=True)
    assert parallel.init_tensor_parallel(2, torch.device("cpu"))[0] == TensorParallel(1, 2, "world-7")
    assert distributed.joined == []


def test_more_ranks_than_cuda_devices_is_refused_naming_both(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    message = "tensor_parallel_size=4 exceeds the 2 CUDA device(s) of this machine"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parallel.init_tensor_parallel(4, torch.device("cuda"))

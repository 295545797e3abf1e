"""The tensor-parallel group a model is built for: one process per GPU (or CPU rank), started by torchrun.

Layers read :func:`current` when they are built, so a model is built for a group by building it inside
``with use(tp):``; outside it every layer is a plain single-process layer (``SINGLE``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

# NVLink multicast (NVLS) and symmetric-memory multicast can take a host's GPUs out of service on the
# lent multi-GPU machines (../shared/GPU.md); a user who wants them sets these variables first.
_SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


@dataclass(frozen=True)
class TensorParallel:
    """One rank's view of its tensor-parallel group.

    Attributes:
        rank: this process's index in the group, 0 <= rank < size.
        size: processes in the group (``tensor_parallel_size``); 1 means no parallelism.
        group_name: the ``torch.distributed`` process group's name, which the functional collectives take
            (a string, so Dynamo keeps it as a constant of the traced graph); ``""`` when ``size == 1``.
    """

    rank: int = 0
    size: int = 1
    group_name: str = ""


SINGLE = TensorParallel()
_current = SINGLE


def current() -> TensorParallel:
    """The group layers being built now are sharded for (``SINGLE`` outside :func:`use`)."""
    return _current


@contextlib.contextmanager
def use(tp: TensorParallel) -> Iterator[TensorParallel]:
    """Build the layers made inside this block for ``tp``."""
    global _current
    previous, _current = _current, tp
    try:
        yield tp
    finally:
        _current = previous


def check_divisible(config, size: int) -> None:
    """``size`` splits the model's heads, KV heads, MLP width and vocabulary evenly.

    The KV cache is sharded by KV heads, so a group larger than ``num_key_value_heads`` (which would need
    replicated KV heads) is refused too.

    Raises:
        ValueError: one line naming ``tensor_parallel_size`` and the first config field it does not divide.
    """
    for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        value = getattr(config, field)
        if value % size:
            raise ValueError(
                f"tensor_parallel_size={size} does not divide the model's {field} ({value}); "
                f"choose a divisor of {value}"
            )


def init_tensor_parallel(size: int, device: torch.device) -> tuple[TensorParallel, torch.device]:
    """Join the process group this process was started in and return its view and its device.

    ``size == 1`` needs no group (``SINGLE``, ``device`` unchanged). Otherwise the process must have been
    started by ``torchrun --nproc-per-node SIZE`` (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``
    in its environment): the group is the whole world, NCCL on CUDA (rank r on ``cuda:LOCAL_RANK``, NVLink
    multicast off unless the environment says otherwise) and gloo on the CPU.

    Raises:
        ValueError: one line naming ``tensor_parallel_size``: the world has another size (e.g. the script
            was not started by torchrun), or there are fewer CUDA devices than ``size``.
    """
    if size == 1:
        return SINGLE, device
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != size:
        raise ValueError(
            f"tensor_parallel_size={size} needs {size} processes, one per device, but this process is one of "
            f"{world} (WORLD_SIZE); start the script with: torchrun --nproc-per-node {size} SCRIPT ..."
        )
    if device.type == "cuda":
        if size > torch.cuda.device_count():
            raise ValueError(
                f"tensor_parallel_size={size} exceeds the {torch.cuda.device_count()} CUDA device(s) of this machine"
            )
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        for name, value in _SAFE_NCCL_ENV.items():
            os.environ.setdefault(name, value)
    if not dist.is_initialized():
        # on CUDA, device_id binds the rank to its GPU and creates NCCL's communicator now, eagerly, rather
        # than at the first collective (which may be the one a CUDA-graph warm-up runs)
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    return TensorParallel(dist.get_rank(), size, dist.group.WORLD.group_name), device

"""The checks of a step's new tokens, before the runner copies them into its input buffers.

Checked on the host because on CUDA a bad id would be a device-side assert in the embedding (a crashed
CUDA context), and a refused step must leave nothing in the buffers that later steps read as padding.
Each refusal is one line naming ``new_tokens[i]`` or ``new_tokens[i][j]``.
"""

from __future__ import annotations

import numbers

import torch

from reference.config.parsing import echo


def check_host_tokens(new_tokens, vocab_size: int) -> None:
    """Host lists: a non-empty list per sequence of int ids (numpy's too) in ``0..vocab_size - 1``.

    Raises:
        ValueError: a sequence that is no list or is empty, an id that is no int (a float would be
            truncated to another id without a word), or an id outside the vocabulary.
    """
    for i, seq in enumerate(new_tokens):
        if not isinstance(seq, (list, tuple)):
            raise ValueError(f"new_tokens[{i}]: expected a list of token ids, got {echo(seq)}")
        if not seq:
            raise ValueError(f"new_tokens[{i}]: empty; a sequence takes at least one new token per step")
        if all(type(t) is int for t in seq) and min(seq) >= 0 and max(seq) < vocab_size:
            continue  # the usual case, without a Python check per token
        for j, token in enumerate(seq):
            if isinstance(token, bool) or not isinstance(token, numbers.Integral):
                raise ValueError(f"new_tokens[{i}][{j}]: expected an int token id, got {echo(token)}")
            if not 0 <= token < vocab_size:
                raise ValueError(_outside(f"new_tokens[{i}][{j}]", token, vocab_size))


def check_device_tokens(
    tokens: torch.Tensor, num_seqs: int, vocab_size: int, device: torch.device, name: str = "new_tokens"
) -> None:
    """Device-fed decode tokens (``step``'s token tensor or its ``fed``, named ``name`` in messages):
    [num_seqs] int64 on ``device``; on a CPU also inside the vocabulary (checked where it costs no wait; on
    CUDA the ids are a sampler's, and reading them would wait for it).

    Raises:
        ValueError: naming what differs, or the first id outside the vocabulary and its index.
    """
    if not isinstance(tokens, torch.Tensor):
        raise ValueError(f"{name}: expected a [{num_seqs}] int64 token tensor on {device}, got {echo(tokens)}")
    if tokens.shape != (num_seqs,) or tokens.dtype != torch.int64 or tokens.device != device:
        raise ValueError(
            f"{name}: a token tensor must be [{num_seqs}] (one per sequence) int64 on {device}, got "
            f"{list(tokens.shape)} {str(tokens.dtype).removeprefix('torch.')} on {tokens.device}"
        )
    if tokens.device.type == "cpu" and len(tokens) and not (0 <= tokens.min() and tokens.max() < vocab_size):
        i = int(((tokens < 0) | (tokens >= vocab_size)).nonzero()[0])
        raise ValueError(_outside(f"{name}[{i}]", int(tokens[i]), vocab_size))


def _outside(where: str, token: int, vocab_size: int) -> str:
    return f"{where}: token id {token} is outside the vocabulary, expected an int in 0..{vocab_size - 1}"

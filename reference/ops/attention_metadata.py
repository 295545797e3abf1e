"""Where one step's tokens come from and go to: the attention metadata the runner builds per step.

Tokens are laid out sequence by sequence in one flat batch. KV cache layout per layer:
``[2, rows, max_model_len, Hkv, D]`` (keys, values); sequence ``i`` of a batch owns row ``rows[i]`` and
its token at position ``p`` lives at ``[:, rows[i], p]``. A contiguous row per sequence is the simplest
cache that serves static batches; paged caches are out of scope.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class GraphTables:
    """A full graph's view of any step (prefill, mixed or decode): what attention reads inside it, from
    static device buffers the runner rewrites before every replay. The shapes depend only on the graph's
    padded token count ``T`` and its sequence capacity ``S`` (``min(T, max_num_seqs)``), as the grids of the
    kernels that read them do (:mod:`reference.ops.graph_attention_kernels`).

    The step's leading one-token sequences (its decodes, ``d`` of them) go to the decode kernel, whose
    program ``i`` serves token row ``i``; the rest to the variable-length kernel, whose first entry is a
    gap over the decodes' rows (``d`` queries, length 0: skipped), so its offsets stay token rows.

    Attributes:
        slots: [T] int64, the cache slot of each token row (``row * max_model_len + position``), -1 for a
            padding row.
        decode_seq_lens, decode_rows: [S] int64, the decodes' lengths after the step and cache rows, then 0
            (padding, which the decode kernel neither writes nor reads).
        cu_query_lens: [S + 2] int64, entry ``e`` of the variable-length kernel holds token rows ``cu[e] ..
            cu[e + 1] - 1``: entry 0 the gap (rows ``0 .. d - 1``), then each other sequence; padding entries
            repeat the real token count (no tokens).
        seq_lens, rows: [S + 1] int64, each entry's length after the step (0 for the gap and padding) and
            cache row (0 for them).
    """

    slots: torch.Tensor
    decode_seq_lens: torch.Tensor
    decode_rows: torch.Tensor
    cu_query_lens: torch.Tensor
    seq_lens: torch.Tensor
    rows: torch.Tensor

    @property
    def num_tokens(self) -> int:
        """T, the graph's padded token count."""
        return self.slots.shape[0]

    @staticmethod
    def flat_len(num_tokens: int, capacity: int) -> int:
        """Ints in the flat form of a graph's tables (:meth:`host_list`, :meth:`from_flat`)."""
        return num_tokens + 5 * capacity + 4

    @staticmethod
    def host_list(
        query_lens: list[int], seq_lens: list[int], rows: list[int], slots: list[int], num_tokens: int, capacity: int
    ) -> list[int]:
        """A step's tables padded to ``num_tokens`` rows and ``capacity`` sequences, flat in the order
        :meth:`from_flat` reads (slots, decode_seq_lens, decode_rows, cu_query_lens, seq_lens, rows):
        :meth:`flat_len` ints. ``query_lens``, ``seq_lens`` and ``rows``: one entry per sequence, as in
        :class:`AttentionMetadata`; ``slots``: one per token (``AttentionMetadata.slot_mapping_list``).

        Raises:
            ValueError: the step has more tokens or sequences than the graph, or lists of different lengths.
        """
        if not len(query_lens) == len(seq_lens) == len(rows) or sum(query_lens) != len(slots):
            raise ValueError(
                f"query_lens ({len(query_lens)}), seq_lens ({len(seq_lens)}) and rows ({len(rows)}) need one entry per "
                f"sequence and slots ({len(slots)}) one per token ({sum(query_lens)})"
            )
        n, num_seqs = len(slots), len(rows)
        if n > num_tokens or num_seqs > capacity:
            raise ValueError(
                f"a step of {n} tokens in {num_seqs} sequences does not fit a graph of {num_tokens} tokens and "
                f"{capacity} sequences"
            )
        d = count_leading_single_tokens(query_lens)
        decodes = [*seq_lens[:d], *[0] * (capacity - d), *rows[:d], *[0] * (capacity - d)]
        padding = capacity - (num_seqs - d)  # varlen entries: the gap, the other sequences, padding
        cu = [0, *itertools.accumulate([d, *query_lens[d:]]), *[n] * padding]
        varlen = [*cu, 0, *seq_lens[d:], *[0] * padding, 0, *rows[d:], *[0] * padding]
        return [*slots, *[-1] * (num_tokens - n), *decodes, *varlen]

    @classmethod
    def from_flat(cls, flat: torch.Tensor, num_tokens: int, capacity: int) -> "GraphTables":
        """Views of ``flat`` ([>= :meth:`flat_len`] int64, laid out as :meth:`host_list` writes).

        Raises:
            ValueError: ``flat`` is shorter than :meth:`flat_len`.
        """
        if flat.shape[0] < cls.flat_len(num_tokens, capacity):
            raise ValueError(
                f"flat: {flat.shape[0]} ints, a graph of {num_tokens} tokens and {capacity} sequences needs "
                f"{cls.flat_len(num_tokens, capacity)}"
            )
        s = capacity
        parts = flat[: cls.flat_len(num_tokens, s)].split([num_tokens, s, s, s + 2, s + 1, s + 1])
        return cls(*parts)


@dataclass
class AttentionMetadata:
    """Where one step's tokens come from and go to. Built by the runner, read by the attention op.

    Tokens are laid out sequence by sequence: sequence ``i`` contributes ``query_lens[i]`` consecutive
    tokens. Tokens past ``num_actual_tokens`` are padding up to a CUDA-graph capture size; attention
    neither reads nor writes their rows.

    Attributes:
        query_lens: new tokens per sequence this step (1 for every sequence in decode).
        seq_lens: tokens per sequence in the cache after this step (context + new).
        rows: KV-cache row of each sequence.
        slot_mapping: [num_actual_tokens] int64 on the model's device; flat ``row * max_model_len + pos``.
        seq_lens_tensor: [>= num_seqs] int64 on the device. For a full-graph step it is a view of the
            runner's static buffer, padded to the graph's size with length 0: an entry of length 0 is
            padding, which attention neither reads nor writes.
        rows_tensor: [like seq_lens_tensor] int64 on the device (padding entries hold row 0).
        is_decode: every sequence adds exactly one token.
        rows_index: ``rows`` as a slice when they are consecutive (cache views instead of gathers).
        num_leading_single_tokens: how many sequences, from the first, add one token each (a
            continuous-batching step puts its decodes first; a one-token prompt chunk counts too: attention
            treats it as a decode). Counted once per step: every layer's attention call reads it.
        graph_tables: for a step that a full graph of any step kind serves (``cudagraph_mode='full'``), the
            static tables attention reads inside the graph; None otherwise (the host lists and the tensors
            above serve every other step, and the CPU, where nothing is captured).
    """

    query_lens: list[int]
    seq_lens: list[int]
    rows: list[int]
    slot_mapping: torch.Tensor
    seq_lens_tensor: torch.Tensor
    rows_tensor: torch.Tensor
    is_decode: bool
    rows_index: slice | list[int]
    num_leading_single_tokens: int
    graph_tables: GraphTables | None = None
    _per_step: dict = field(default_factory=dict, repr=False)  # device tensors built once, shared by all layers

    @staticmethod
    def slot_mapping_list(query_lens: list[int], seq_lens: list[int], rows: list[int], max_model_len: int) -> list[int]:
        """The KV-cache slot of every new token (flat ``row * max_model_len + position``), checked.

        Raises:
            ValueError: lists of different lengths, a query longer than its sequence, or a sequence
                longer than ``max_model_len``.
        """
        if not (len(query_lens) == len(seq_lens) == len(rows)) or not rows:
            raise ValueError("query_lens, seq_lens and rows must have one entry per sequence (at least one)")
        slots = []
        for ql, sl, row in zip(query_lens, seq_lens, rows):
            if not 0 < ql <= sl <= max_model_len:
                raise ValueError(f"need 0 < query_len ({ql}) <= seq_len ({sl}) <= max_model_len ({max_model_len})")
            slots.extend(range(row * max_model_len + sl - ql, row * max_model_len + sl))
        return slots

    @classmethod
    def from_device(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        rows: list[int],
        slot_mapping: torch.Tensor,
        seq_lens_tensor: torch.Tensor,
        rows_tensor: torch.Tensor,
        graph_tables: GraphTables | None = None,
    ) -> "AttentionMetadata":
        """Metadata from host lists and their device tensors, staged by the caller (the runner stages
        them with the step's token ids in one copy; see :func:`int_lists_to_device`)."""
        rows, query_lens = list(rows), list(query_lens)
        consecutive = rows == list(range(rows[0], rows[0] + len(rows)))
        leading = count_leading_single_tokens(query_lens)
        return cls(
            query_lens=query_lens,
            seq_lens=list(seq_lens),
            rows=rows,
            slot_mapping=slot_mapping,
            seq_lens_tensor=seq_lens_tensor,
            rows_tensor=rows_tensor,
            is_decode=leading == len(query_lens),
            rows_index=slice(rows[0], rows[0] + len(rows)) if consecutive else rows,
            num_leading_single_tokens=leading,
            graph_tables=graph_tables,
        )

    @classmethod
    def build(
        cls, query_lens: list[int], seq_lens: list[int], rows: list[int], max_model_len: int, device
    ) -> "AttentionMetadata":
        """Metadata for sequences that each append ``query_lens[i]`` tokens ending at ``seq_lens[i]``,
        staged with one asynchronous host-to-device copy. Raises as :meth:`slot_mapping_list`."""
        slots = cls.slot_mapping_list(query_lens, seq_lens, rows, max_model_len)
        return cls.from_device(query_lens, seq_lens, rows, *int_lists_to_device([slots, seq_lens, rows], device))

    @property
    def num_actual_tokens(self) -> int:
        return len(self.slot_mapping)

    def varlen_tensor(self, device, first: int = 0) -> torch.Tensor:
        """[4, num_seqs - first] int64 on ``device``: per sequence from ``first`` on, its first token's index
        in the batch, its query length, its length after this step and its cache row (what the
        variable-length prefill kernel reads). Staged once per step, without waiting for the device, and
        shared by all layers."""
        key = ("varlen", first)
        if key not in self._per_step:
            starts = [0, *itertools.accumulate(self.query_lens)][first:-1]
            columns = [starts, self.query_lens[first:], self.seq_lens[first:], self.rows[first:]]
            table = int_lists_to_device([[x for column in columns for x in column]], device)[0]
            self._per_step[key] = table.view(4, len(self.rows) - first)
        return self._per_step[key]

    def decode_mask(self, sliding_window: int | None, device) -> torch.Tensor | None:
        """[B, 1, 1, max(seq_lens)] bool, True where a decode query may attend; None if it may attend all.

        Built once per step and window size, shared by all layers.
        """
        key = sliding_window
        if key not in self._per_step:
            max_len = max(self.seq_lens)
            needs_mask = min(self.seq_lens) != max_len or (sliding_window is not None and max_len > sliding_window)
            mask = None
            if needs_mask:
                kpos = torch.arange(max_len, device=device)[None, :]  # [1, L]
                lens = self.seq_lens_tensor[: len(self.seq_lens), None]  # [B, 1], without a full graph's padding
                mask = kpos < lens
                if sliding_window is not None:
                    mask &= kpos > lens - 1 - sliding_window
                mask = mask[:, None, None, :]
            self._per_step[key] = mask
        return self._per_step[key]


def count_leading_single_tokens(query_lens: list[int]) -> int:
    """How many of ``query_lens``, from the first, are 1 (the sequences attention treats as decodes)."""
    return next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens))


def int_lists_to_device(lists: list[list[int]], device) -> list[torch.Tensor]:
    """int64 device tensors for ``lists`` via one pinned host buffer and one non-blocking copy.

    A plain ``torch.tensor(..., device='cuda')`` copies from pageable memory and waits for the GPU to
    drain; per step that would serialise the host with the device several times.
    """
    device = torch.device(device)
    flat = [x for values in lists for x in values]
    host = torch.tensor(flat, dtype=torch.int64, pin_memory=device.type == "cuda")
    staged = host.to(device, non_blocking=True)
    return list(staged.split([len(values) for values in lists]))

"""What the runner hands attention per step (:mod:`reference.ops.attention_metadata`), checked where it is
built, on the host: the slot of each new token and the refusals, the fields a step's metadata carries (the
ones only the CUDA kernels read included), the device tensors it stages, and a full graph's flat tables in
the documented layout.

The kernels that read the tables and the tensors run on CUDA only (conformance/test_triton_kernels.py), so
what they are given is pinned here, on every machine.
"""

from __future__ import annotations

import pytest
import torch

from reference.ops.attention_metadata import AttentionMetadata, GraphTables, int_lists_to_device

pytestmark = pytest.mark.requires("components")


def test_a_full_graphs_tables_follow_the_documented_layout():
    """Two decodes, then sequences of 3 and 2 new tokens: 7 tokens in a graph of 8 tokens and 5 sequences.
    The layout of GraphTables' docstring, written out: slots then -1 per padding row; the decodes' lengths and
    rows, then 0; the variable-length offsets (the gap over the decodes' rows 0-1, then 3 and 2 tokens, then
    the padding entries repeating the token count); their lengths and rows (0 for the gap and padding)."""
    query_lens, seq_lens, rows = [1, 1, 3, 2], [5, 7, 3, 4], [2, 0, 1, 3]
    slots = AttentionMetadata.slot_mapping_list(query_lens, seq_lens, rows, 16)
    assert slots == [2 * 16 + 4, 0 * 16 + 6, 16 + 0, 16 + 1, 16 + 2, 3 * 16 + 2, 3 * 16 + 3]
    flat = GraphTables.host_list(query_lens, seq_lens, rows, slots, 8, 5)
    t = GraphTables.from_flat(torch.tensor(flat), 8, 5)
    assert t.slots.tolist() == [*slots, -1]
    assert (t.decode_seq_lens.tolist(), t.decode_rows.tolist()) == ([5, 7, 0, 0, 0], [2, 0, 0, 0, 0])
    assert t.cu_query_lens.tolist() == [0, 2, 5, 7, 7, 7, 7]
    assert (t.seq_lens.tolist(), t.rows.tolist()) == ([0, 3, 4, 0, 0, 0], [0, 1, 3, 0, 0, 0])
    assert t.num_tokens == 8 and len(flat) == GraphTables.flat_len(8, 5) == 8 + 5 * 5 + 4


@pytest.mark.parametrize(
    "query_lens, seq_lens, rows, message",
    [
        ([], [], [], "query_lens, seq_lens and rows must have one entry per sequence (at least one)"),
        ([1, 1], [2], [0, 1], "query_lens, seq_lens and rows must have one entry per sequence (at least one)"),
        ([0], [3], [0], "need 0 < query_len (0) <= seq_len (3) <= max_model_len (8)"),
        ([4], [3], [0], "need 0 < query_len (4) <= seq_len (3) <= max_model_len (8)"),
        ([1], [9], [0], "need 0 < query_len (1) <= seq_len (9) <= max_model_len (8)"),
    ],
    ids=["no-sequence", "unequal-lists", "empty-query", "query-past-sequence", "sequence-past-max_model_len"],
)
def test_slots_of_a_step_no_cache_can_hold_are_refused_in_one_line(query_lens, seq_lens, rows, message):
    with pytest.raises(ValueError) as err:
        AttentionMetadata.slot_mapping_list(query_lens, seq_lens, rows, 8)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "rows, index",
    [([3, 4, 5], slice(3, 6)), ([0, 1], slice(0, 2)), ([4, 3], [4, 3]), ([2, 4], [2, 4]), ([5], slice(5, 6))],
)
def test_consecutive_rows_are_a_slice_of_the_cache_and_others_a_list(rows, index):
    """A slice makes the torch path's cache reads views instead of gathers; any other rows stay a list."""
    md = AttentionMetadata.build([1] * len(rows), [3] * len(rows), rows, 8, "cpu")
    assert md.rows_index == index and type(md.rows_index) is type(index)


@pytest.mark.parametrize("query_lens, is_decode, leading", [([1, 1], True, 2), ([1, 2], False, 1), ([3, 1], False, 0)])
def test_a_step_is_a_decode_when_every_sequence_adds_one_token(query_lens, is_decode, leading):
    md = AttentionMetadata.build(query_lens, [4, 4], [0, 1], 8, "cpu")
    assert (md.is_decode, md.num_leading_single_tokens) == (is_decode, leading)


def test_metadata_from_device_tensors_keeps_the_tensors_and_tables_it_is_given():
    """The fields only the CUDA kernels read (the rows tensor, a full graph's tables) are the caller's own
    buffers, not copies: a full graph's replay reads what the runner rewrote in place."""
    slots, lens, rows = int_lists_to_device([[0, 9], [1, 2], [0, 1]], "cpu")
    tables = GraphTables.from_flat(torch.zeros(GraphTables.flat_len(4, 2), dtype=torch.int64), 4, 2)
    md = AttentionMetadata.from_device([1, 1], [1, 2], [0, 1], slots, lens, rows, graph_tables=tables)
    assert md.slot_mapping is slots and md.seq_lens_tensor is lens and md.rows_tensor is rows
    assert md.graph_tables is tables
    assert AttentionMetadata.from_device([1], [1], [0], slots[:1], lens[:1], rows[:1]).graph_tables is None


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_staged_lists_are_int64_on_the_device_asked_for_even_when_empty(device):
    """``meta`` stands for a device other than the host's: a copy left on the host would show."""
    staged = int_lists_to_device([[3, 1], [], [7]], device)
    assert [t.dtype for t in staged] == [torch.int64] * 3
    assert {t.device for t in staged} == {torch.device(device)} and [t.shape[0] for t in staged] == [2, 0, 1]
    if device == "cpu":
        assert [t.tolist() for t in staged] == [[3, 1], [], [7]]
    assert int_lists_to_device([[]], device)[0].dtype == torch.int64  # torch.tensor([]) alone is float32


def test_a_decode_mask_is_built_on_the_steps_device():
    md = AttentionMetadata.build([1, 1], [3, 5], [0, 1], 8, "meta")
    mask = md.decode_mask(None, "meta")
    assert mask.device.type == "meta" and mask.shape == (2, 1, 1, 5)


def test_equal_lengths_exactly_at_the_window_need_no_mask():
    """Every key of a sequence no longer than the window is in it: None, the documented 'may attend all'
    (a mask of all True would cost a masked attention for nothing). One past the window needs one."""
    md = AttentionMetadata.build([1, 1], [4, 4], [0, 1], 8, "cpu")
    assert md.decode_mask(4, "cpu") is None and md.decode_mask(None, "cpu") is None
    mask = md.decode_mask(3, "cpu")
    assert mask[:, 0, 0].tolist() == [[False, True, True, True]] * 2


def test_a_steps_varlen_table_and_its_masks_are_kept_apart():
    """Both are built once per step and kept in one place: asking for one must not return the other."""
    md = AttentionMetadata.build([1, 3], [2, 5], [1, 0], 8, "cpu")
    mask = md.decode_mask(None, "cpu")
    table = md.varlen_tensor("cpu")
    assert table.shape == (4, 2) and mask.shape == (2, 1, 1, 5)
    assert md.decode_mask(None, "cpu") is mask and md.varlen_tensor("cpu", first=1).tolist() == [[1], [3], [5], [0]]

"""CompilationConfig rules that mutation testing (./run mutate config) found unguarded: whole error lines, the
edges of the checks, what for_eager drops, and the named modes.

An error line is the interface of a refused config (the CLI prints it as is), so the lines below are compared
whole: a word dropped or a wrong value echoed is a failure, not only a missing field name.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference.config import MODES, CompilationConfig, ConfigError, mode_config, mode_of
from reference.config.parsing import echo

pytestmark = pytest.mark.requires("components")

SPLITTING_AT_LEVEL_2 = (
    "splitting_ops only apply at level=3 (piecewise) or to breakable graphs (level=0 with cudagraph_mode "
    "'piecewise' or 'full_and_piecewise'), got level=2, cudagraph_mode='none'; remove splitting_ops or use one of those"
)
# (keywords of CompilationConfig, the whole error line)
REFUSED = {
    "piecewise_at_level_2": (
        {"level": 2, "cudagraph_mode": "piecewise"},
        "cudagraph_mode='piecewise' needs level=3 (the piecewise backend) or level=0 (breakable graphs of the eager "
        "model), got level=2, which compiles one whole graph; use level 0 or 3, or cudagraph_mode='none' or "
        "'full_decode_only'",
    ),
    "inductor_config_not_a_dict": (
        {"inductor_compile_config": [1]},
        "inductor_compile_config: expected a dict with string keys (Inductor config names), got [1]",
    ),
    "empty_sizes_with_max": (
        {"cudagraph_mode": "none", "cudagraph_capture_sizes": [], "max_cudagraph_capture_size": 16},
        "cudagraph_capture_sizes (largest none: the list is empty) and max_cudagraph_capture_size (16) disagree; "
        "give one of them, or make the largest size equal the maximum",
    ),
    "graphs_without_sizes": (
        {"cudagraph_capture_sizes": []},
        "cudagraph_capture_sizes is empty but cudagraph_mode='piecewise'; give at least one size or set "
        "cudagraph_mode='none'",
    ),
    "inductor_config_without_inductor": (
        {"use_inductor": False, "inductor_compile_config": {"max_autotune": True}},
        "inductor_compile_config is set but use_inductor=False; drop one of them",
    ),
    "inductor_config_at_level_0": (
        {"level": 0, "cudagraph_mode": "piecewise", "inductor_compile_config": {"max_autotune": True}},
        "inductor_compile_config is set but level=0 compiles nothing; drop it or use level >= 1",
    ),
    "splitting_ops_at_level_2": ({"level": 2, "splitting_ops": []}, SPLITTING_AT_LEVEL_2),
    "unqualified_splitting_op": (
        {"splitting_ops": ["attention"]},
        "splitting_ops: 'attention' is not a qualified op name; expected 'namespace::op', e.g. 'reference::attention'",
    ),
    "all_and_none": ({"custom_ops": ["all", "none"]}, "custom_ops: 'all' and 'none' contradict each other; keep one"),
    "bad_entry_after_all": (
        {"custom_ops": ["all", "rms_norm"]},
        "custom_ops: 'rms_norm' is not valid; expected 'all', 'none', or '+name'/'-name' with name a custom op "
        "(reference.ops.registered_custom_ops())",
    ),
    "custom_ops_not_a_list": ({"custom_ops": 5}, "custom_ops: expected a list of strings, got 5"),
    "no_close_inductor_option": (
        {"inductor_compile_config": {"zzqqxx_nothing": 1}},
        "inductor_compile_config: 'zzqqxx_nothing' is not an Inductor config option; see torch._inductor.config",
    ),
    "three_close_inductor_options": (
        {"inductor_compile_config": {"max_autotun": 1}},
        "inductor_compile_config: 'max_autotun' is not an Inductor config option; did you mean "
        "['max_autotune', 'max_autotune_gemm', 'max_autotune_pointwise']?",
    ),
    "bool_for_int_option": (
        {"inductor_compile_config": {"max_fusion_size": True}},
        "inductor_compile_config: 'max_fusion_size' expects int (default 64), got True",
    ),
    "bool_for_float_option": (
        {"inductor_compile_config": {"cpu_gpu_bw": True}},
        "inductor_compile_config: 'cpu_gpu_bw' expects float (default 50.0), got True",
    ),
}


@pytest.mark.parametrize("settings, line", REFUSED.values(), ids=REFUSED)
def test_a_refused_config_says_exactly_what_and_how_to_resolve(settings, line):
    with pytest.raises(ConfigError) as err:
        CompilationConfig(**settings)
    assert str(err.value) == line


@pytest.mark.parametrize(
    "text, line",
    [
        ("{'mode': 7}", "mode: expected 0-3 or one of ['NONE', 'STOCK_TORCH_COMPILE', 'DYNAMO_TRACE_ONCE', "
         "'VLLM_COMPILE'], got 7"),
        ("[1, 2]", "compilation config: expected a dict, a JSON or Python-literal string, or a level digit; "
         "got '[1, 2]', a list"),
        ("{1: }", "compilation config: '{1: }' is neither JSON, a Python literal nor a level digit (SyntaxError)"),
    ],
    ids=["vllm_mode", "not_a_dict", "not_a_literal"],
)  # fmt: skip
def test_a_refused_config_string_echoes_what_was_given(text, line):
    with pytest.raises(ConfigError) as err:
        CompilationConfig.parse(text)
    assert str(err.value) == line


@pytest.mark.parametrize(
    "settings, line",
    [
        ({"level": 3}, "enforce_eager=True contradicts compilation_config level=3; drop enforce_eager or set level=0"),
        ({"cudagraph_mode": "piecewise"}, "enforce_eager=True contradicts cudagraph_mode='piecewise'; "
         "drop enforce_eager or set cudagraph_mode='none'"),
    ],
    ids=["level", "cudagraph_mode"],
)  # fmt: skip
def test_for_eager_refuses_with_the_way_out(settings, line):
    with pytest.raises(ConfigError) as err:
        CompilationConfig(**settings).for_eager()
    assert str(err.value) == line


# ---------------------------------------------------------------------- edges of the checks
@pytest.mark.parametrize(
    "settings",
    [
        {"max_cudagraph_capture_size": 65536},  # the bound itself is allowed
        {"custom_ops": ["none"]},
        {"custom_ops": ["+rms_norm", "-silu_and_mul"]},  # different ops may take different signs
        {"inductor_compile_config": {"max_fusion_size": 32}},  # an int for an int option
        {"inductor_compile_config": {"cpu_gpu_bw": 40}},  # an int for a float option
        # only bool/int/float/str options are type-checked; a list option's value is Inductor's to judge
        {"inductor_compile_config": {"custom_should_partition_ops": ("reference::attention",)}},
    ],
    ids=["largest_size", "custom_ops_none", "plus_and_minus_of_two_ops", "int_option", "int_for_float_option",
         "tuple_for_list_option"],
)
def test_values_at_the_edge_of_a_check_are_accepted(settings):
    config = CompilationConfig(**settings)
    for key, value in settings.items():
        assert config.describe()[key] == value


def test_no_graphs_need_no_sizes_and_then_the_largest_size_is_0():
    config = CompilationConfig(cudagraph_mode="none", cudagraph_capture_sizes=[])
    assert config.cudagraph_capture_sizes == () and config.max_cudagraph_capture_size == 0


def test_the_inductor_config_is_a_copy_of_the_callers_dict():
    patches = {"max_autotune": True}
    config = CompilationConfig(inductor_compile_config=patches)
    patches["max_autotune"] = "changed later"
    assert config.inductor_compile_config == {"max_autotune": True}


def test_describe_gives_lists_not_tuples():
    described = CompilationConfig(custom_ops=("+rms_norm",), cudagraph_capture_sizes=(1, 2)).describe()
    assert type(described["custom_ops"]) is list and type(described["cudagraph_capture_sizes"]) is list


def test_for_eager_drops_a_default_levels_inductor_config():
    eager = CompilationConfig(inductor_compile_config={"max_autotune": True}).for_eager()
    assert eager.level == 0 and eager.inductor_compile_config == {}


def test_echo_cuts_after_200_characters_and_gives_the_digits_of_a_huge_int():
    assert echo("x" * 198) == repr("x" * 198)  # 200 characters with the quotes: kept whole
    assert echo("x" * 199) == repr("x" * 199)[:200] + "... (201 characters)"
    assert echo(10**5000) == "an int of about 5000 digits"


def test_echo_is_one_line_for_a_value_whose_repr_spans_several():
    """A 2-d tensor's or array's repr breaks its rows over lines; a message that quotes it stays one line, and
    a string's own spaces are kept (its repr never holds a raw line break)."""
    assert echo(torch.tensor([[1], [2]])) == "tensor([[1], [2]])"
    assert echo(np.array([[1], [2]])) == "array([[1], [2]])"
    assert echo("a  b\n  c") == repr("a  b\n  c")


# ---------------------------------------------------------------------- the named modes
@pytest.mark.parametrize("mode", MODES)
def test_each_modes_config_runs_that_mode(mode):
    assert mode_of(mode_config(mode)) == mode


@pytest.mark.parametrize(
    "settings",
    [{"level": 1}, {"level": 2}, {"level": 0, "cudagraph_mode": "full_decode_only"},
     {"level": 3, "cudagraph_mode": "full_decode_only"}],
    ids=["level1", "level2", "level0_full_decode_only", "level3_full_decode_only"],
)  # fmt: skip
def test_configs_no_mode_names_have_no_mode(settings):
    assert mode_of(CompilationConfig(**settings)) is None


def test_mode_config_applies_overrides_and_refuses_an_unknown_mode():
    assert mode_config("no_inductor", cudagraph_capture_sizes=[1, 2]).cudagraph_capture_sizes == (1, 2)
    assert mode_config("eager", custom_ops=["none"]).custom_ops == ("none",)
    with pytest.raises(ConfigError) as err:
        mode_config("fast")
    modes = "['eager', 'breakable', 'no_inductor', 'inductor', 'no_inductor_full', 'inductor_full']"
    assert str(err.value) == f"mode: expected one of {modes}, got 'fast'"

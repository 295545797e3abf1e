"""CompilationConfig: parsing, validation with field-naming errors, resolved defaults, enforce_eager."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reference.config import CompilationConfig, ConfigError, default_capture_sizes

# The reference's own components (not the compilation mechanism): skipped for other --impl.
pytestmark = pytest.mark.requires("components")

NO_INDUCTOR_ALL_OPS = CompilationConfig(use_inductor=False, custom_ops=("all",))


# ---------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "value",
    [
        {"use_inductor": False, "custom_ops": ["all"]},
        '{"use_inductor": false, "custom_ops": ["all"]}',
        "{'use_inductor': False, 'custom_ops': ['all']}",
        "  {'use_inductor': False, 'custom_ops': ('all',)}\n",
        NO_INDUCTOR_ALL_OPS,
    ],
    ids=["dict", "json", "python_literal", "python_literal_tuple_padded", "config"],
)
def test_every_input_form_parses_to_the_same_config(value):
    assert CompilationConfig.parse(value) == NO_INDUCTOR_ALL_OPS


@pytest.mark.parametrize("value", ["0", "1", " 2 ", "3", 0, 1, 2, 3])
def test_a_bare_level_means_that_level_with_defaults(value):
    level = int(value)
    assert CompilationConfig.parse(value) == CompilationConfig(level=level)


def test_none_gives_the_defaults():
    config = CompilationConfig.parse(None)
    assert config == CompilationConfig()
    assert (config.level, config.use_inductor, config.cudagraph_mode) == (3, True, "piecewise")
    assert config.splitting_ops is None  # vLLM's spelling of "the attention ops": the tagged splitting ops
    assert config.max_cudagraph_capture_size == 512


def test_parsing_never_evaluates_code(tmp_path):
    marker = tmp_path / "evaluated"
    for text in (
        f"__import__('os').system('touch {marker}')",
        f"open({str(marker)!r}, 'w')",
        f"{{'level': __import__('os').system('touch {marker}')}}",
    ):
        with pytest.raises(ConfigError, match="neither JSON, a Python literal nor a level digit"):
            CompilationConfig.parse(text)
    assert not marker.exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("{'level': 3", "neither JSON, a Python literal nor a level digit"),
        ("level=3", "neither JSON, a Python literal nor a level digit"),
        ("{level: 3}", "neither JSON, a Python literal nor a level digit"),
        ("[1, 2]", r"expected a dict, a JSON or Python-literal string, or a level digit; got '\[1, 2\]', a list"),
        ("3.0", "expected a dict, a JSON or Python-literal string, or a level digit; got '3.0', a float"),
        # '+3' reads as the int 3: the message said "or a level digit; got int: 3", as if 3 were no level
        ("+3", r"or a level digit; got '\+3', an int \(a level is a bare digit: 3\)"),
        ("-1", r"level: expected one of \[0, 1, 2, 3\], got -1"),
        ("7", r"level: expected one of \[0, 1, 2, 3\], got 7"),
        # literal_eval raises TypeError (not ValueError) for unhashable dict keys and set items
        ("{['level']: 3}", "neither JSON, a Python literal nor a level digit"),
        ("{1, [2]}", "neither JSON, a Python literal nor a level digit"),
        # json and literal_eval recurse; absurd nesting must still be a ConfigError
        ("[" * 100_000, "neither JSON, a Python literal nor a level digit"),
        # JSON only (false is no Python literal): the repeated key must be named, not "neither JSON ..."
        ('{"level": 3, "level": 2, "use_inductor": false}', "key 'level' given twice"),
    ],
    ids=[
        "unclosed",
        "assignment",
        "unquoted_key",
        "list",
        "float",
        "plus_sign",
        "negative",
        "level_out_of_range",
        "unhashable_key",
        "unhashable_set_item",
        "deep_nesting",
        "json_key_twice",
    ],
)
def test_malformed_strings_raise_config_error(text, message):
    with pytest.raises(ConfigError, match=message):
        CompilationConfig.parse(text)


def test_unknown_keys_are_named_with_the_known_keys():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['levle'\]; known keys: \[.*'level'.*'use_inductor'"):
        CompilationConfig.parse({"levle": 3, "use_inductor": False})


def test_non_string_keys_are_reported_as_unknown():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \[('levle', 1|1, 'levle')\]"):
        CompilationConfig.parse("{1: 2, 'levle': 3}")


def test_a_non_dict_value_is_rejected_naming_its_type_and_value():
    with pytest.raises(ConfigError, match=r"got list: \[\('level', 3\)\]$"):
        CompilationConfig.parse([("level", 3)])
    # a string is echoed as typed, with its type's article
    with pytest.raises(ConfigError, match=r"got '\[1\]', a list$"):
        CompilationConfig.parse("[1]")
    with pytest.raises(ConfigError, match=r"got '\(1,\)', a tuple$"):
        CompilationConfig.parse("(1,)")
    with pytest.raises(ConfigError, match=r"got '\+3', an int \(a level is a bare digit: 3\)$"):
        CompilationConfig.parse("+3")


@pytest.mark.parametrize(
    "value, message",
    [
        ({"backend": [1]}, r"^backend: expected one of \['inductor', 'eager'\], got \[1\]$"),  # was: unhashable type
        ({"mode": {"a": 1}}, r"^mode: expected 0-3 or one of"),
        ({"cudagraph_mode": ["piecewise"]}, r"^cudagraph_mode: expected one of"),
    ],
    ids=["backend_list", "mode_dict", "cudagraph_mode_list"],
)
def test_an_unhashable_value_of_a_vllm_spelling_names_its_field(value, message):
    with pytest.raises(ConfigError, match=message):
        CompilationConfig.parse(value)


HUGE = "9" * 5000  # more digits than Python converts to an int by default (4300)


@pytest.mark.parametrize(
    "value",
    [
        f'{{"level": {HUGE}}}',
        f"{{'level': {HUGE}}}",
        {"cudagraph_capture_sizes": [2**20000]},
        {"level": 2**20000},
        {"compile_sizes": {2**20000}},  # a set is no list: echoed whole, it would print the int
    ],
    ids=["json", "python_literal", "huge_int_in_a_list", "huge_int", "huge_int_in_a_set"],
)
def test_a_value_of_thousands_of_digits_is_a_short_config_error(value):
    """json refuses such an int with a bare ValueError, and repr() of one (for the message) raises too."""
    with pytest.raises(ConfigError) as err:
        CompilationConfig.parse(value)
    assert len(str(err.value)) < 400, str(err.value)[:500]


def test_a_container_holding_an_int_too_long_to_print_is_named_by_its_type():
    with pytest.raises(ConfigError, match=r"got a set holding an int of more digits than Python prints$"):
        CompilationConfig(compile_sizes={2**20000})



# ---------------------------------------------------------------------- field types and values
GRAPH_MODES_ALLOWED = (
    r"cudagraph_mode: expected one of \['none', 'piecewise', 'full_decode_only', 'full_and_piecewise', 'full'\]"
)
WRONG_VALUES = [
    ("level", True, r"level: expected one of \[0, 1, 2, 3\], got True"),
    ("level", "3", r"level: expected one of \[0, 1, 2, 3\], got '3'"),
    ("level", 3.0, r"level: expected one of \[0, 1, 2, 3\], got 3.0"),
    ("level", 4, r"level: expected one of \[0, 1, 2, 3\], got 4"),
    ("use_inductor", "false", "use_inductor: expected bool, got str 'false'"),
    ("use_inductor", 1, "use_inductor: expected bool, got int 1"),
    ("debug_cudagraph_addresses", 1, "debug_cudagraph_addresses: expected bool"),
    # numpy 2's bool is named bool too: "expected bool, got bool" read as a contradiction
    ("debug_cudagraph_outputs", np.bool_(True), r"debug_cudagraph_outputs: expected bool, got numpy.bool np.True_"),
    ("custom_ops", "all", "custom_ops: expected a list of strings, got 'all'"),
    ("custom_ops", ["all", 1], "custom_ops: expected a list of strings, got item 1"),
    ("splitting_ops", "reference::attention", "splitting_ops: expected a list of strings"),
    ("splitting_ops", ["attention"], "splitting_ops: 'attention' is not a qualified op name; expected 'namespace::op'"),
    ("splitting_ops", ["a::b::c"], "splitting_ops: 'a::b::c' is not a qualified op name"),
    ("splitting_ops", ["::attention"], "splitting_ops: '::attention' is not a qualified op name"),
    # a name given twice is a merge gone wrong (or a typo for another op), not a second cut
    ("splitting_ops", ["reference::attention", "reference::attention"],
     r"^splitting_ops: 'reference::attention' is given twice; name each op once$"),
    ("cudagraph_mode", "fulll", GRAPH_MODES_ALLOWED + ", got 'fulll'"),
    ("cudagraph_mode", False, GRAPH_MODES_ALLOWED + ", got False"),
    ("cudagraph_capture_sizes", "1,2,4", "cudagraph_capture_sizes: expected a list of positive ints, got '1,2,4'"),
    ("cudagraph_capture_sizes", 8, "cudagraph_capture_sizes: expected a list of positive ints, got 8"),
    ("cudagraph_capture_sizes", [1, "2"], "cudagraph_capture_sizes: expected an int in 1..65536, got '2'"),
    ("cudagraph_capture_sizes", [0, 1], "cudagraph_capture_sizes: expected an int in 1..65536, got 0"),
    ("cudagraph_capture_sizes", [1, True], "cudagraph_capture_sizes: expected an int in 1..65536, got True"),
    ("cudagraph_capture_sizes", [1, 2.0], "cudagraph_capture_sizes: expected an int in 1..65536, got 2.0"),
    ("max_cudagraph_capture_size", 0, "max_cudagraph_capture_size: expected an int in 1..65536, got 0"),
    ("max_cudagraph_capture_size", "8", "max_cudagraph_capture_size: expected an int in 1..65536, got '8'"),
    ("max_cudagraph_capture_size", 8.0, "max_cudagraph_capture_size: expected an int in 1..65536, got 8.0"),
    ("cudagraph_num_of_warmups", -1, "cudagraph_num_of_warmups: expected an int >= 0, got -1"),
    ("cudagraph_num_of_warmups", 1.5, "cudagraph_num_of_warmups: expected an int >= 0, got 1.5"),
    ("inductor_compile_config", "max_autotune", "inductor_compile_config: expected a dict with string keys"),
    ("inductor_compile_config", {1: True}, "inductor_compile_config: expected a dict with string keys"),
    ("cache_dir", 5, r"^cache_dir: expected str, got int 5$"),
    ("cache_dir", "  ", r"^cache_dir: expected a folder path \(or '' for the default\), got '  ': a path holds no NUL "
     "character and is not only spaces$"),
    ("cache_dir", "a\0b", r"^cache_dir: expected a folder path \(or '' for the default\), got 'a\\x00b': a path"),
    ("compile_sizes", [0], r"compile_sizes: expected a list whose items are ints in 1\.\.65536 \(token counts\) or "
     r"the string 'cudagraph_capture_sizes' \(every capture size\), got item 0"),
    ("compile_sizes", "8", r"compile_sizes: expected a list whose items are ints in 1\.\.65536 .*, got '8'$"),
    ("compile_sizes", "cudagraph_capture_sizes", r"compile_sizes: expected a list .*, got 'cudagraph_capture_sizes'; "
     r"write \['cudagraph_capture_sizes'\]$"),
    ("compile_sizes", [True], r"compile_sizes: expected .*, got item True"),
    ("compile_sizes", [65537], r"compile_sizes: expected .*, got item 65537"),
    ("compile_sizes", ["all"], r"compile_sizes: expected .*, got item 'all'"),
]


@pytest.mark.parametrize(
    "field, value, message", [pytest.param(*case, id=f"{case[0]}={case[1]!r}") for case in WRONG_VALUES]
)
def test_a_wrong_type_or_value_names_the_field_and_what_is_allowed(field, value, message):
    with pytest.raises(ConfigError, match=message):
        CompilationConfig.parse({field: value})
    with pytest.raises(ConfigError, match=message):  # the constructor validates the same way
        CompilationConfig(**{field: value})


# ---------------------------------------------------------------------- contradictions
@pytest.mark.parametrize(
    "settings, message",
    [
        ({"level": 2, "cudagraph_mode": "piecewise"}, r"'piecewise' needs level=3.*or level=0.*got level=2"),
        (
            {"level": 1, "cudagraph_mode": "full_and_piecewise"},
            r"cudagraph_mode='full_and_piecewise' needs level=3.*got level=1",
        ),
        ({"cudagraph_capture_sizes": []}, r"cudagraph_capture_sizes is empty but cudagraph_mode='piecewise'"),
        (
            {"level": 0, "cudagraph_mode": "full_decode_only", "cudagraph_capture_sizes": []},
            r"cudagraph_capture_sizes is empty but cudagraph_mode='full_decode_only'",
        ),
        ({"level": 0, "splitting_ops": []}, r"splitting_ops only apply at level=3 .* or to breakable graphs.*level=0"),
        (
            {"use_inductor": False, "inductor_compile_config": {"max_autotune": True}},
            "inductor_compile_config is set but use_inductor=False",
        ),
        (
            {"level": 0, "cudagraph_mode": "piecewise", "inductor_compile_config": {"max_autotune": True}},
            "inductor_compile_config is set but level=0 compiles nothing",
        ),
        ({"level": 2, "splitting_ops": []}, r"splitting_ops only apply at level=3.*got level=2"),
        ({"level": 1, "splitting_ops": ["reference::silly_attention"]}, r"splitting_ops only apply at level=3"),
        (
            {"cudagraph_capture_sizes": [1, 2, 4], "max_cudagraph_capture_size": 8},
            r"cudagraph_capture_sizes \(largest 4\) and max_cudagraph_capture_size \(8\) disagree",
        ),
        (
            {"cudagraph_capture_sizes": [1, 16], "max_cudagraph_capture_size": 8},
            r"cudagraph_capture_sizes \(largest 16\) and max_cudagraph_capture_size \(8\) disagree",
        ),
        (
            # no sizes at all cannot have a largest size of 16
            {"cudagraph_mode": "none", "cudagraph_capture_sizes": [], "max_cudagraph_capture_size": 16},
            r"cudagraph_capture_sizes .* and max_cudagraph_capture_size \(16\) disagree",
        ),
        (
            {"use_inductor": False, "compile_sizes": [8]},
            r"^compile_sizes is set but use_inductor=False: static-shape compiles are Inductor's \(without it a piece "
            r"is the same FX code at every size\); drop compile_sizes or set use_inductor=True$",
        ),
        (
            {"compile_sizes": ["cudagraph_capture_sizes"], "cudagraph_mode": "none"},
            r"^compile_sizes: 'cudagraph_capture_sizes' names the sizes CUDA graphs capture, but cudagraph_mode='none' "
            r"captures none; list the token counts instead$",
        ),
        (
            {"level": 1, "cache_dir": "x"},
            r"^cache_dir is set but level=1; the compile cache serves levels 2 and 3 \(traced once\), level 1 uses "
            r"torch's own caches; drop cache_dir or use level 2 or 3$",
        ),
        (
            {"level": 1, "compile_sizes": [8]},
            r"^compile_sizes is set but level=1: static-shape compiles sit beside the one symbolic-shape trace of "
            r"levels 2-3; drop compile_sizes or use level 2 or 3 with Inductor$",
        ),
        ({"level": 0, "compile_sizes": [8], "use_inductor": False}, r"^compile_sizes is set but level=0: "),
        (
            {"use_inductor": False, "use_inductor_graph_partition": True},
            r"^use_inductor_graph_partition=True needs level=3 and use_inductor=True \(Inductor partitions the graph "
            r"it compiles whole\), got level=3, use_inductor=False; drop it or use those$",
        ),
        (
            {"level": 2, "use_inductor_graph_partition": True, "cudagraph_mode": "none"},
            r"^use_inductor_graph_partition=True needs level=3 and use_inductor=True .*, got level=2, "
            r"use_inductor=True;",
        ),
        (
            {"use_inductor_graph_partition": True, "splitting_ops": []},
            r"^use_inductor_graph_partition=True with splitting_ops=\[\]: \[\] asks for one uncut graph, but "
            r"Inductor's partition always cuts at the ops tagged cudagraph_unsafe; drop one of them$",
        ),
        (
            {"use_inductor_graph_partition": True, "inductor_compile_config": {"graph_partition": False,
                                                                               "post_grad_custom_pre_pass": None}},
            r"^inductor_compile_config sets \['graph_partition', 'post_grad_custom_pre_pass'\], which "
            r"use_inductor_graph_partition=True sets itself \(its partitions, and a pre-pass keying whether they "
            r"are wrapped: pytorch#165471\); drop them from inductor_compile_config$",
        ),
        (  # Inductor's own graphs would be captured inside ours, or replace the pieces' (a new user's try)
            {"cudagraph_mode": "full_and_piecewise", "inductor_compile_config": {"triton.cudagraphs": True}},
            # no mode named: the CLIs check overrides on the default config first, whatever --modes says
            r"^inductor_compile_config: 'triton.cudagraphs'=True has Inductor capture CUDA graphs of its own inside "
            r"the ones cudagraph_mode captures; keep one owner of the graphs: drop it, or set cudagraph_mode='none'$",
        ),
        ({"use_inductor_graph_partition": 1}, r"^use_inductor_graph_partition: expected bool, got int 1$"),
        ({"custom_ops": ["all", "none"]}, "custom_ops: 'all' and 'none' contradict each other"),
        ({"custom_ops": ["+rms_norm", "-rms_norm"]}, r"custom_ops: '\+rms_norm' and '-rms_norm' contradict each other"),
        (
            {"custom_ops": ["rms_norm"]},
            r"custom_ops: 'rms_norm' is not valid; expected 'all', 'none', or '\+name'/'-name'",
        ),
        ({"custom_ops": ["+"]}, r"custom_ops: '\+' is not valid; expected 'all', 'none'"),
        ({"custom_ops": ["ALL"]}, r"custom_ops: 'ALL' is not valid; expected 'all', 'none'"),
        ({"custom_ops": ["*rms_norm"]}, r"custom_ops: '\*rms_norm' is not valid"),
    ],
    ids=[
        "piecewise_at_level2",
        "full_and_piecewise_at_level1",
        "piecewise_without_sizes",
        "full_without_sizes",
        "splitting_ops_at_level0_without_graphs",
        "inductor_config_with_inductor_off",
        "inductor_config_at_level0",
        "splitting_ops_at_level2",
        "splitting_ops_at_level1",
        "sizes_below_max",
        "sizes_above_max",
        "empty_sizes_with_max",
        "compile_sizes_without_inductor",
        "compile_sizes_naming_capture_sizes_without_graphs",
        "cache_dir_at_level1",
        "compile_sizes_at_level1",
        "compile_sizes_at_level0",
        "graph_partition_without_inductor",
        "graph_partition_at_level2",
        "graph_partition_with_no_splitting_op",
        "graph_partition_settings_overridden",
        "inductors_own_graphs_inside_ours",
        "graph_partition_not_a_bool",
        "all_and_none",
        "plus_and_minus",
        "op_without_sign",
        "sign_without_op",
        "uppercase_all",
        "bad_sign",
    ],
)
def test_contradictions_raise_and_say_how_to_resolve(settings, message):
    with pytest.raises(ConfigError, match=message):
        CompilationConfig.parse(settings)


# ---------------------------------------------------------------------- capture sizes
@pytest.mark.parametrize(
    "max_size, expected",
    [(1, (1,)), (3, (1, 2, 3)), (8, (1, 2, 4, 8)), (20, (1, 2, 4, 8, 16, 20)), (33, (1, 2, 4, 8, 16, 24, 32, 33))],
)
def test_default_capture_sizes_are_vllms_list_with_the_maximum_kept(max_size, expected):
    assert default_capture_sizes(max_size) == expected
    config = CompilationConfig(max_cudagraph_capture_size=max_size)
    assert (config.cudagraph_capture_sizes, config.max_cudagraph_capture_size) == (expected, max_size)


@pytest.mark.parametrize("max_size", [5, 7, 9, 15, 16, 17, 63, 64, 100, 512, 513])
def test_default_capture_sizes_pad_any_step_by_at_most_seven_tokens(max_size):
    """What the list is for: every step of n <= max_size tokens finds a size >= n wasting < 8 tokens,
    and the small decode batches 1, 2 and 4 waste none."""
    sizes = default_capture_sizes(max_size)
    assert list(sizes) == sorted(set(sizes)) and sizes[-1] == max_size
    for n in range(1, max_size + 1):
        padded = min(s for s in sizes if s >= n)
        assert padded - n < 8, (n, padded)
    assert {1, 2, 4} <= set(sizes)


def test_a_maximum_that_is_not_a_multiple_of_8_is_kept():
    assert CompilationConfig(max_cudagraph_capture_size=100).cudagraph_capture_sizes[-3:] == (88, 96, 100)


def test_default_sizes_go_up_to_512():
    sizes = CompilationConfig().cudagraph_capture_sizes
    assert sizes[:5] == (1, 2, 4, 8, 16)
    assert sizes[-1] == 512 and len(sizes) == 3 + 512 // 8


def test_explicit_sizes_are_deduplicated_and_sorted_and_set_the_maximum():
    config = CompilationConfig(cudagraph_capture_sizes=[8, 2, 8, 1, 24])
    assert config.cudagraph_capture_sizes == (1, 2, 8, 24)
    assert config.max_cudagraph_capture_size == 24
    agreeing = CompilationConfig(cudagraph_capture_sizes=[4, 2], max_cudagraph_capture_size=4)
    assert agreeing.cudagraph_capture_sizes == (2, 4)


def test_cudagraph_mode_defaults_to_piecewise_only_at_level_3():
    assert [CompilationConfig(level=level).cudagraph_mode for level in range(4)] == ["none"] * 3 + ["piecewise"]
    assert CompilationConfig(level=3, cudagraph_mode="none").cudagraph_mode == "none"


@pytest.mark.parametrize(
    "level, mode, piecewise, full, breakable",
    [
        (0, "none", False, False, False),
        (0, "piecewise", True, False, True),
        (0, "full_decode_only", False, True, False),
        (0, "full_and_piecewise", True, True, True),
        (1, "full_decode_only", False, True, False),
        (2, "full_decode_only", False, True, False),
        (3, "piecewise", True, False, False),
        (3, "full_decode_only", False, True, False),
        (3, "full_and_piecewise", True, True, False),
    ],
)
def test_each_level_and_cudagraph_mode_says_which_graphs_it_keeps(level, mode, piecewise, full, breakable):
    config = CompilationConfig(level=level, cudagraph_mode=mode)
    assert (config.piecewise_graphs, config.full_graphs, config.breakable) == (piecewise, full, breakable)


def test_breakable_graphs_take_splitting_ops_at_level_0():
    config = CompilationConfig(level=0, cudagraph_mode="piecewise", splitting_ops=["reference::attention"])
    assert config.splitting_ops == ("reference::attention",)


def test_describe_round_trips_through_json():
    config = CompilationConfig.parse(
        {
            "use_inductor": True,
            "custom_ops": ["+rms_norm"],
            "max_cudagraph_capture_size": 40,
            "inductor_compile_config": {"max_autotune": False},
        }
    )
    assert CompilationConfig.parse(json.dumps(config.describe())) == config


# ---------------------------------------------------------------------- enforce_eager
def test_for_eager_turns_off_compilation_and_graphs_and_keeps_the_rest():
    config = CompilationConfig.parse({"use_inductor": False, "custom_ops": ["-rms_norm"], "splitting_ops": []})
    eager = config.for_eager()
    assert (eager.level, eager.cudagraph_mode) == (0, "none")
    assert eager.custom_ops == ("-rms_norm",) and eager.use_inductor is False
    assert eager.splitting_ops is None  # splitting is meaningless without compilation
    assert eager.for_eager() == eager


def test_for_eager_switches_the_custom_op_default_to_all():
    """Inductor at level 3 means custom ops default to none; without compilation they default to all."""
    config = CompilationConfig(use_inductor=True)
    assert config.custom_ops_default is False
    assert config.for_eager().custom_ops_default is True


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"level": 3}, r"enforce_eager=True contradicts compilation_config level=3"),
        ({"level": 1}, r"enforce_eager=True contradicts compilation_config level=1"),
        ({"cudagraph_mode": "piecewise"}, r"enforce_eager=True contradicts cudagraph_mode='piecewise'"),
    ],
    ids=["explicit_level3", "explicit_level1", "explicit_piecewise"],
)
def test_for_eager_refuses_explicit_compilation_settings(settings, message):
    with pytest.raises(ConfigError, match=message):
        CompilationConfig.parse(settings).for_eager()


def test_for_eager_accepts_explicit_eager_settings():
    assert CompilationConfig.parse({"level": 0}).for_eager().level == 0
    assert CompilationConfig.parse({"cudagraph_mode": "none"}).for_eager().level == 0


@pytest.mark.parametrize(
    "patches, message",
    [
        ({"no_such_option": 1}, "'no_such_option' is not an Inductor config option"),
        ({"max_autotun": True}, "did you mean"),
        ({"max_autotune": "yes"}, "'max_autotune' expects bool"),
    ],
    ids=["unknown_key", "misspelt_key", "wrong_type"],
)
def test_inductor_compile_config_is_checked_against_inductor_options(patches, message):
    with pytest.raises(ConfigError, match=message):
        CompilationConfig(inductor_compile_config=patches)


def test_valid_inductor_compile_config_passes():
    config = CompilationConfig(inductor_compile_config={"max_autotune": True, "triton.cudagraphs": False})
    assert config.inductor_compile_config == {"max_autotune": True, "triton.cudagraphs": False}


def test_inductors_own_graphs_are_allowed_where_the_project_captures_none():
    config = CompilationConfig(cudagraph_mode="none", inductor_compile_config={"triton.cudagraphs": True})
    assert config.inductor_compile_config == {"triton.cudagraphs": True}


@pytest.mark.parametrize("field", ["max_cudagraph_capture_size", "cudagraph_capture_sizes"])
def test_capture_sizes_are_bounded(field):
    value = 10**9 if field == "max_cudagraph_capture_size" else [1, 10**9]
    with pytest.raises(ConfigError, match=f"{field}: expected an int in 1..65536"):
        CompilationConfig(**{field: value})


@pytest.mark.parametrize("text", ["²", "٣"])
def test_only_ascii_digits_are_levels(text):
    with pytest.raises(ConfigError, match="neither JSON"):
        CompilationConfig.parse(text)


def test_error_messages_cut_long_input():
    with pytest.raises(ConfigError) as err:
        CompilationConfig.parse("x" * 100_000)
    assert len(str(err.value)) < 400


# ---------------------------------------------------------------------- vLLM's current spellings
@pytest.mark.parametrize(
    "vllm, seed",
    [
        ({"mode": 3}, {"level": 3}),
        ({"mode": "VLLM_COMPILE"}, {"level": 3}),
        ({"mode": "DYNAMO_TRACE_ONCE"}, {"level": 2}),
        ({"mode": "NONE"}, {"level": 0}),
        ({"backend": "eager"}, {"use_inductor": False}),
        ({"backend": "inductor", "mode": 3, "level": 3}, {"use_inductor": True, "level": 3}),  # agreeing: fine
        ({"cudagraph_mode": "PIECEWISE"}, {"cudagraph_mode": "piecewise"}),
        ({"mode": 3, "cudagraph_mode": "NONE"}, {"level": 3, "cudagraph_mode": "none"}),
        ({"cudagraph_mode": "FULL_AND_PIECEWISE"}, {"cudagraph_mode": "full_and_piecewise"}),
        ({"mode": "NONE", "cudagraph_mode": "FULL_DECODE_ONLY"}, {"level": 0, "cudagraph_mode": "full_decode_only"}),
        ({"cudagraph_mode": "FULL"}, {"cudagraph_mode": "full"}),
    ],
    ids=[
        "mode-3",
        "mode-name",
        "mode-trace-once",
        "mode-none",
        "backend-eager",
        "both-spellings-agree",
        "capital-piecewise",
        "capital-none",
        "capital-full-and-piecewise",
        "capital-full-decode-only",
        "capital-full",
    ],
)
def test_vllms_current_names_mean_the_seeds(vllm, seed):
    assert CompilationConfig.parse(vllm) == CompilationConfig.parse(seed)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"mode": 3, "level": 2}, r"mode=3 and level=2 disagree; they are two spellings of one setting"),
        ({"backend": "eager", "use_inductor": True}, r"backend='eager' and use_inductor=True disagree"),
        ({"mode": 4}, r"mode: expected 0-3 or one of \['NONE', 'STOCK_TORCH_COMPILE'"),
        ({"mode": True}, r"mode: expected 0-3"),
        ({"backend": "aot_eager"}, r"backend: expected one of \['inductor', 'eager'\], got 'aot_eager'"),
    ],
    ids=["mode-vs-level", "backend-vs-use_inductor", "mode-out-of-range", "mode-bool", "unknown-backend"],
)
def test_two_spellings_that_disagree_or_a_bad_new_spelling_is_an_error(fields, message):
    with pytest.raises(ConfigError, match=message):
        CompilationConfig.parse(fields)


# ---------------------------------------------------------------------- compile sizes
def test_compile_sizes_are_sorted_deduplicated_and_may_name_the_capture_sizes():
    config = CompilationConfig(compile_sizes=[16, "cudagraph_capture_sizes", 3, 16], cudagraph_capture_sizes=[4, 16])
    assert config.compile_sizes == (3, 4, 16)
    assert CompilationConfig(compile_sizes=(1, 65536), level=2).compile_sizes == (1, 65536)
    assert CompilationConfig().compile_sizes == ()
    assert CompilationConfig.parse('{"compile_sizes": [2, 2]}').describe()["compile_sizes"] == [2]


# ---------------------------------------------------------------------- the compile cache's folder
def test_cache_dir_is_kept_as_a_string_and_serves_levels_2_and_3(tmp_path):
    assert CompilationConfig(cache_dir=tmp_path / "c").cache_dir == str(tmp_path / "c")  # a path object
    assert CompilationConfig(cache_dir="c", level=2, cudagraph_mode="none").cache_dir == "c"
    assert CompilationConfig(cache_dir="c").describe()["cache_dir"] == "c"


def test_enforce_eager_drops_the_settings_only_compilation_uses_and_refuses_compile_sizes():
    eager = CompilationConfig(cache_dir="c", inductor_compile_config={"max_autotune": True}).for_eager()
    assert (eager.cache_dir, eager.inductor_compile_config, eager.level) == ("", {}, 0)
    with pytest.raises(ConfigError, match=r"^enforce_eager=True contradicts compile_sizes=\[4, 8\] \(Inductor's "
                       r"static-shape compiles\); drop one of them$"):
        CompilationConfig(compile_sizes=[8, 4]).for_eager()
    with pytest.raises(ConfigError, match=r"^enforce_eager=True contradicts use_inductor_graph_partition=True "
                       r"\(Inductor's partitions of a compiled graph\); drop one of them$"):
        CompilationConfig(use_inductor_graph_partition=True).for_eager()

"""Settings, at the bottom of the house: they import nothing from ops, models or compilation.

:mod:`.compilation` defines ``CompilationConfig``, :mod:`.modes` the named model modes, :mod:`.parsing`
how user strings become values and how bad values are reported.
"""

from reference.config.compilation import (
    CUDAGRAPH_MODES,
    DEFAULT_MAX_CAPTURE_SIZE,
    LEVELS,
    CompilationConfig,
    default_capture_sizes,
)
from reference.config.modes import BASE_MODE, MODES, mode_config, mode_of
from reference.config.parsing import ConfigError, config_fields, echo, parse_config_text

__all__ = [
    "BASE_MODE",
    "CUDAGRAPH_MODES",
    "DEFAULT_MAX_CAPTURE_SIZE",
    "LEVELS",
    "MODES",
    "CompilationConfig",
    "ConfigError",
    "config_fields",
    "default_capture_sizes",
    "echo",
    "mode_config",
    "mode_of",
    "parse_config_text",
]

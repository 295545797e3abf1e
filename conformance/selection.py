"""``--impl NAME``: the shipped implementations and anyone's own (see conformance/implementation.py)."""

from __future__ import annotations

import importlib

from conformance.faults import fault_implementation
from conformance.implementation import CAPABILITIES, Implementation, ReferenceImplementation
from conformance.torch_native import TorchNativeImplementation


def load_implementation(spec: str) -> Implementation:
    """The implementation named by ``--impl``: ``reference``, ``torch-native``, ``fault:ID`` or
    ``MODULE:FACTORY``.

    Raises:
        ValueError: an unknown name, a module or factory that cannot be found, or an object lacking the
            interface (the message says which).
    """
    if spec == "reference":
        return ReferenceImplementation()
    if spec == "torch-native":
        return TorchNativeImplementation()
    if spec.startswith("fault:"):
        return fault_implementation(spec.removeprefix("fault:"))
    module_name, _, factory_name = spec.partition(":")
    if not factory_name:
        raise ValueError(f"--impl: expected 'reference', 'torch-native', 'fault:ID' or 'MODULE:FACTORY', got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--impl {spec!r}: cannot load {factory_name} from {module_name} ({err})") from None
    if not callable(factory):
        raise ValueError(
            f"--impl {spec!r}: {factory_name} in {module_name} is not callable (a {type(factory).__name__}); name a "
            "class or function that returns the implementation"
        )
    try:
        impl = factory()
    except Exception as err:  # the user's factory: whatever it raises, say so in one line
        raise ValueError(f"--impl {spec!r}: {factory_name}() raised {type(err).__name__}: {err}") from None
    missing = [a for a in ("name", "capabilities", "compile", "activate") if not hasattr(impl, a)]
    unknown = set(getattr(impl, "capabilities", ())) - set(CAPABILITIES)
    if missing or unknown:
        raise ValueError(
            f"--impl {spec!r}: the object lacks {missing} or declares unknown capabilities {sorted(unknown)}; "
            f"see conformance/implementation.py (capabilities: {sorted(CAPABILITIES)})"
        )
    return impl


def check_impl_tests_only(impl: Implementation) -> None:
    """``--impl-tests-only`` is for an implementation that declares ``reached_only_through_impl``.

    Raises:
        ValueError: one line naming the implementation, when it does not (a fault's run, or an implementation
            of the user's that does not say so).
    """
    if not getattr(impl, "reached_only_through_impl", False):
        raise ValueError(
            f"--impl-tests-only: {impl.name} does not declare reached_only_through_impl = True, so tests without "
            "the impl fixture may run its code (a fault's patches reach every test); run without the option"
        )

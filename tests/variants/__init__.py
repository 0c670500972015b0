"""Variant suites: tests/variants/<exercise>.py holds CORRECT = {name: source} and WRONG = {name: (source, must_fail)}.

``must_fail`` lists phrases of the check titles a wrong variant must fail, or is ``EVERY_CHECK`` when the
submission must earn nothing at all (a constant, a function that does nothing).
"""
import pytest

EVERY_CHECK = "every check"

HELD_OUT_SALTS = (1, 2)  # any non-zero salt works; every variant meets one of them, each salt half of the variants
SALTS = (0, *HELD_OUT_SALTS)


def variant_salts(module, kind: str, index: int, name: str) -> tuple[int, ...]:
    """Salt 0 (the notebook's self-check) and one held-out salt, taking turns between the two across a suite's
    variants. A suite's optional PUBLIC_ONLY names slow variants (a deadlock costs the launch timeout in every
    scenario) graded under salt 0 only."""
    if name in getattr(module, "PUBLIC_ONLY", ()):
        return (0,)
    return (0, HELD_OUT_SALTS[(index + (kind == "WRONG")) % len(HELD_OUT_SALTS)])


def variant_marks(module, kind: str, index: int, name: str, salt: int) -> list:
    """The fast tier (``make test-fast``) grades every variant on the public scenarios; held-out salts and the
    variants that deadlock (they cost the launch timeout in every scenario) run in the full tier. A wrong variant
    is marked ``one_level`` with its index: tests/any_cpu.py grades it under one of the other kernel levels, not
    under each (conftest.pytest_collection_modifyitems; any_cpu.py's docstring says why that suffices)."""
    marks = [pytest.mark.slow] if salt or name in getattr(module, "PUBLIC_ONLY", ()) else []
    return marks + [pytest.mark.one_level(index)] * (kind == "WRONG")

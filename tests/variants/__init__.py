"""Variant suites: tests/variants/<exercise>.py holds CORRECT = {name: source} and WRONG = {name: (source, must_fail)}.

``must_fail`` lists phrases of the check titles a wrong variant must fail, or is ``EVERY_CHECK`` when the
submission must earn nothing at all (a constant, a function that does nothing).
"""
EVERY_CHECK = "every check"

"""Predict, then run: compare what a student wrote down before a measurement with what it measured.

Every lesson section asks a short question, gives a cell with ``my_… = None  # e.g. 4`` for the answer,
runs the measurement, then calls ``compare(prediction, measured, …)``. Ungraded, and it never raises:
a blank (None) or unreadable prediction just prints what was measured, so Run All and Validate work
whether or not the student wrote anything.
"""
import math
import numbers
import re

_NUMBER = re.compile(r"[-+]?(?:\d+(?:[.,]\d*)*|\.\d+)(?:[eE][-+]?\d+)?")
_YES, _NO = {"yes", "true", "y", "same", "equal"}, {"no", "false", "n", "different", "differ"}


def _as_number(value) -> float | None:
    """A number from a prediction: 4, 4.0, "4", "about 4 MiB", "1,024"; None when there is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        found = _NUMBER.search(value)
        if found:
            try:
                return float(found.group(0).replace(",", ""))
            except ValueError:
                return None
    return None


def _as_answer(value):
    """A yes/no or word answer in one spelling: True/False for yes/no words, else the lower-cased text."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return True if text in _YES else False if text in _NO else text


def _show(value, unit: str) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Real):
        return f"{value:.3g}{' ' + unit if unit else ''}"
    return f"{value!r}"


ROUND_OFF = 1e-6  # magnitude comparisons: anything this small counts as "zero, to float32 round-off"


def _decade(value: float) -> float | None:
    """log10 of |value|, or None for a value at round-off level (zero included)."""
    return None if abs(value) <= ROUND_OFF else math.log10(abs(value))


def compare(prediction, measured, *, unit: str = "", tolerance: float = 0.25, why: str = "",
            magnitude: bool = False) -> bool | None:
    """Print how ``prediction`` compares with ``measured``; return True (close), False (not) or None (blank).

    Numbers count as close within ``tolerance`` relative to the measurement (0.25: ±25 %); a measurement of
    zero needs a prediction within ``tolerance`` of zero; ``tolerance=0`` asks for the exact value. With
    ``magnitude=True`` (round-off gaps, quantities that span decades) they count as close within a factor of
    ten, and any two values at most ``ROUND_OFF`` (zero included) agree. True/False and words compare as
    answers ("yes", "same" and True agree). ``why`` is one sentence on what sets the result, printed either
    way: the point of predicting is to find out which part of your picture was right.
    """
    shown = _show(measured, unit)
    if prediction is None:
        print(f"No prediction written: measured {shown}. (Write yours in the cell above and run both again.)")
        verdict = None
    elif isinstance(measured, numbers.Real) and not isinstance(measured, bool):
        guess = _as_number(prediction)
        if guess is None:
            print(f"Could not read {prediction!r} as a number: measured {shown}.")
            verdict = None
        elif magnitude:
            mine, real = _decade(guess), _decade(measured)
            verdict = mine is None and real is None or (mine is not None and real is not None and abs(mine - real) <= 1)
            how = (f"both at round-off level, at most {ROUND_OFF:.0e}" if real is None and verdict
                   else "within a factor of ten")
            print(f"{'✓ Close' if verdict else '✗ Not this time'}: you predicted {_show(guess, unit)}, measured "
                  f"{shown}" + (f" ({how})." if verdict else " (compared by order of magnitude)."))
        else:
            verdict = abs(guess - measured) <= tolerance * (abs(measured) if measured else 1.0)
            if verdict:
                print(f"✓ Close: you predicted {_show(guess, unit)}, measured {shown} (within ±{tolerance:.0%}).")
            else:
                ratio = (f" ({guess / measured:.2g}× the measurement)"
                         if measured and guess and math.copysign(1, guess) == math.copysign(1, measured) else "")
                print(f"✗ Not this time: you predicted {_show(guess, unit)}, measured {shown}{ratio}.")
    else:
        verdict = _as_answer(prediction) == _as_answer(measured)
        print(f"{'✓ Right' if verdict else '✗ Not this time'}: you predicted {_show(prediction, unit)}, "
              f"measured {shown}.")
    if why:
        print(f"Why: {why}")
    return verdict

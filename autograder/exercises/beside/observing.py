"""The observing side: runs next to the student's code (in a grading worker, or in the student's kernel).

``observe(exercise, fn, salt=...)`` loads the exercise's observer module (``Exercise.observer``, the only part of
an exercise that imports torch) and returns its observation: plain JSON-like data in one shape, built by
``observation``::

    {"salt": 0,
     "scenarios": {"k2": {"case": {"what": "called with accumulation_steps=2", ...}, ...measured values},
                   "k3": {"case": {...}, "error": "ValueError: ..."}},    # the function raised there
     ...}                                                                 # extras only the reference needs

An observer module defines ``observe(fn, *, salt=0)`` and, when the reference needs more than that (an accepted
variant's outcome, a ground truth computed with torch's own implementation), ``observe_reference``.
"""
import importlib
import numbers
from collections.abc import Callable

from autograder.exercises.beside.define import cell_line


def observer_of(exercise):
    return importlib.import_module(exercise.observer)


def observe(exercise, fn, *, salt: int = 0, as_reference: bool = False) -> dict:
    """The exercise's observation of ``fn`` (the reference's adds what only the reference needs)."""
    module = observer_of(exercise)
    run = getattr(module, "observe_reference", module.observe) if as_reference else module.observe
    found = run(fn, salt=salt)
    return _without_lines(found) if as_reference else found


def _without_lines(value):
    """The reference's observation without the lines of its cell that an expected error (a ValueError it must
    raise) came from: references ship to students, and a line of the solution must not."""
    if isinstance(value, dict):
        drop = ("cell", "line", "code") if isinstance(value.get("error"), str) else ()
        return {k: _without_lines(v) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [_without_lines(v) for v in value]
    return value


def observation(salt: int, cases: dict[str, dict], run: Callable[[dict], dict]) -> dict:
    """The one shape of an observation: ``run(case)`` for every case, each recorded with its case.

    ``cases`` maps a scenario key to the scenario's inputs, JSON-like, with ``"what"``: the words that
    finish "Your function raised ... when ...". An exception in one scenario costs only that scenario.
    """
    return {"salt": salt,
            "scenarios": {key: {"case": case, **run_scenario(lambda case=case: run(case))}
                          for key, case in cases.items()}}


def run_scenario(call: Callable[[], dict]) -> dict:
    """Run one scenario; an exception becomes ``{"error": ...}`` so other scenarios still count. The error
    carries the line of the student's cell it came from (``define.cell_line``: words for the feedback only, which
    the parse boundary drops before any check reads the scenario)."""
    try:
        return call()
    except OSError as exc:
        if exc.errno == 27:  # EFBIG: the sandbox's file-size limit is also the output limit
            return {"error": "too much output (it printed more than the grader allows)"}
        return {"error": describe_exception(exc), **cell_line(exc)}
    except Exception as exc:
        return {"error": describe_exception(exc), **cell_line(exc)}


def describe_exception(exc: BaseException) -> str:
    return (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)[:300]


def plain(value, *, sizes: tuple[int, ...] = (64, 64, 64)):
    """A returned value as plain data: numbers, short strings, None, and nested lists for sequences, at most
    ``sizes[d]`` items at nesting depth ``d`` (deeper: a description). Anything else becomes ``"<type name>"``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value[:40]
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):
            pass
    elif isinstance(value, (list, tuple)) and sizes:
        return [plain(v, sizes=sizes[1:]) for v in list(value)[:sizes[0]]]
    return f"<{type(value).__name__}>"


def tensor_data(t) -> list[float]:
    """A tensor as a flat list of Python floats (plain data for the verdict)."""
    return [float(v) for v in t.detach().to("cpu").double().flatten().tolist()]


def float32_data(t) -> list[float]:
    """A float32 tensor as plain floats with 9 significant digits: exactly its float32 values, in half the
    characters of ``tensor_data`` (the reference observations ship with the student kit)."""
    return [float(f"{v:.9g}") for v in t.detach().float().flatten().tolist()]


SKETCH_SIZE = 8    # projections per sketch: a tensor computed only in part points elsewhere in 8 dimensions
SKETCH_PIECE = 1 << 14  # elements projected at a time: the grader's vectors stay a few hundred KiB


def sketch(t, seed: int) -> list[float]:
    """The evidence that a large tensor was computed whole: its projections onto SKETCH_SIZE random vectors drawn
    from ``seed`` (the scenario's own, secret under a class's held-out salt). A fixed slice of a tensor, such as its
    first rows, can be computed alone, without the method; a projection needs every element. Each vector is a
    product of Gaussian factors, one within a piece of SKETCH_PIECE elements and one weight per piece: an error
    moves a projection by its norm on average, as on a fully Gaussian vector, for 8 random numbers per piece instead
    of 8 per element (drawing those cost 0.15 CPU-s per million elements, most of a ring rank's time)."""
    import torch

    flat = t.detach().reshape(-1)
    generator = torch.Generator().manual_seed(seed)
    within = torch.randn(SKETCH_SIZE, SKETCH_PIECE, generator=generator, dtype=torch.float64)
    total = torch.zeros(SKETCH_SIZE, dtype=torch.float64)
    for start in range(0, flat.numel(), SKETCH_PIECE):
        piece = flat[start:start + SKETCH_PIECE].to("cpu", torch.float64)
        weights = torch.randn(SKETCH_SIZE, generator=generator, dtype=torch.float64)
        total += weights * (within[:, :piece.numel()] @ piece)
    return [float(v) for v in total]


def projections(tensors: list, seed: int, count: int = 2) -> list[list[float] | None]:
    """Each tensor projected onto ``count`` random ±1 vectors drawn from ``seed`` (one set per length, float64):
    where ``sketch`` costs too much (millions of elements), a cheap sign that every element has its value to
    float32's precision. A projection moves by about the error's norm, so values rounded to 16 bits (3 significant
    digits) show; a plain sum does not (rounding errors cancel in it). None stays None."""
    import torch

    signs: dict[int, torch.Tensor] = {}
    found = []
    for t in tensors:
        if t is None:
            found.append(None)
            continue
        flat = t.detach().reshape(-1).to("cpu", torch.float64)
        if flat.numel() not in signs:
            generator = torch.Generator().manual_seed(seed * 7919 + flat.numel())
            signs[flat.numel()] = torch.randint(0, 2, (count, flat.numel()), generator=generator,
                                                dtype=torch.int8).double().mul_(2).sub_(1)
        found.append([float(v) for v in signs[flat.numel()] @ flat])
    return found


def params_data(model) -> list[float]:
    """All parameters of a model, flattened in registration order."""
    return [v for p in model.parameters() for v in tensor_data(p)]


def gloo_events(prof) -> list[tuple[str, list]]:
    """Every gloo operation a torch.profiler saw, in the order they started: (kind, the shapes of its inputs). Read
    from the profiler's own results: ``prof.events()`` first builds a Python record and a tree of every operation
    (10 to 40 ms in a rank), and finds the same operations (the events it keeps are these, sorted so)."""
    found = [e for e in prof.profiler.kineto_results.events()
             if e.name().startswith("gloo:") and not e.is_hidden_event()]
    found.sort(key=lambda e: (e.start_ns(), -e.end_ns()))
    return [(e.name().removeprefix("gloo:"), e.shapes()) for e in found]


def collective_counts(prof, leave_out: tuple[str, ...] = ()) -> list[list]:
    """Every gloo operation a torch.profiler saw, by kind, as sorted [kind, count] pairs (``leave_out``: kinds not
    counted, e.g. point-to-point). Pairs, not a record: a record of the observation has the reference's keys
    (parse.py), and a student's kinds are not the reference's."""
    counts: dict[str, int] = {}
    for kind, _ in gloo_events(prof):
        if kind not in leave_out:
            counts[kind] = counts.get(kind, 0) + 1
    return [[kind, count] for kind, count in sorted(counts.items())]

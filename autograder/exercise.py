"""What an exercise is, for the grader: how to observe a function, and how to judge it.

Grading is split in two halves that never share a process in class grading:

* ``observe(fn)`` calls the function under test on small seeded problems and returns
  *plain data* (numbers, lists, strings): final parameters, return values, counters.
  It runs wherever the student's code runs (their kernel, or a sandboxed worker).
* each ``Check`` compares the student's observation with the reference solution's and
  returns ``None`` (pass) or one plain sentence saying what is wrong and where to look.
  Checks only read JSON-like data, so nothing the student's code patched can reach them.
"""
import math
from collections.abc import Callable
from dataclasses import dataclass, field

Observation = dict  # JSON-like: str/int/float/bool/None, lists and dicts of those


class ScenarioError(Exception):
    """A check cannot run because the function failed in the scenario it needs."""


@dataclass(frozen=True)
class Check:
    title: str                                         # what is checked, in plain words
    points: float
    test: Callable[[Observation, Observation], str | None]  # (student, reference) -> None or why it failed


@dataclass(frozen=True)
class CheckResult:
    title: str
    points: float
    score: float
    feedback: str  # empty when passed

    @property
    def passed(self) -> bool:
        return self.score == self.points


@dataclass(frozen=True)
class Exercise:
    name: str                 # the function's name = the solution cell's nbgrader grade_id
    notebook: str             # released notebook file the exercise lives in
    observe: Callable[[Callable], Observation]
    checks: list[Check] = field(default_factory=list)
    timeout_s: float = 60.0   # default wall-time limit for one observation in class grading
    # The reference may need more than ``observe`` gives, e.g. every accepted variant's outcome.
    observe_reference: Callable[[Callable], Observation] | None = None

    def observe_as_reference(self, fn) -> Observation:
        return (self.observe_reference or self.observe)(fn)

    @property
    def max_score(self) -> float:
        return sum(c.points for c in self.checks)

    def grade(self, student: Observation, reference: Observation) -> list[CheckResult]:
        results = []
        for check in self.checks:
            try:
                problem = check.test(student, reference)
            except ScenarioError as exc:
                problem = str(exc)
            except Exception as exc:  # malformed observation: never trust its shape
                problem = f"The grader could not read your function's results for this check ({type(exc).__name__})."
            results.append(CheckResult(check.title, check.points, 0.0 if problem else check.points, problem or ""))
        return results


# ---- helpers the exercise modules share --------------------------------------------------

def run_scenario(call: Callable[[], Observation]) -> Observation:
    """Run one scenario; an exception becomes ``{"error": ...}`` so other scenarios still count."""
    try:
        return call()
    except OSError as exc:
        if exc.errno == 27:  # EFBIG: the sandbox's file-size limit is also the output limit
            return {"error": "too much output (it printed more than the grader allows)"}
        return {"error": describe_exception(exc)}
    except Exception as exc:
        return {"error": describe_exception(exc)}


def describe_exception(exc: BaseException) -> str:
    return (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)[:500]


NOT_DONE = "Your function still raises NotImplementedError: replace that line with your code."


def scenario(observation: Observation, key: str, what: str) -> Observation:
    """The named scenario's data, or a ScenarioError that says the function failed there."""
    data = observation.get("scenarios", {}).get(key)
    if data is None:
        raise ScenarioError(f"No result for {what}: the grader's observation is incomplete.")
    if "error" in data:
        if data["error"].startswith("NotImplementedError"):
            raise ScenarioError(NOT_DONE)
        raise ScenarioError(f"Your function raised {data['error']} when {what}.")
    return data


def tensor_data(t) -> list[float]:
    """A tensor as a flat list of Python floats (plain data for the verdict)."""
    return [float(v) for v in t.detach().to("cpu").double().flatten().tolist()]


def params_data(model) -> list[float]:
    """All parameters of a model, flattened in registration order."""
    return [v for p in model.parameters() for v in tensor_data(p)]


def max_abs_diff(a: list, b: list) -> float:
    """Largest absolute difference; infinite when shapes differ or a value is not finite."""
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        x, y = float(x), float(y)
        if not (math.isfinite(x) and math.isfinite(y)):
            if x != y:
                return math.inf
            continue
        worst = max(worst, abs(x - y))
    return worst


def parallel(a: list, b: list, *, min_cos: float = 1 - 1e-6) -> bool:
    """a = c·b for some c > 0, up to ``min_cos`` (cosine similarity): the same direction, any scale.

    The exercises use it as *evidence* that a function really computed something from the seeded data
    (e.g. its first update points the reference's way), which an impostor observation cannot invent.
    """
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b) or not a:
        return False
    dot = sum(float(x) * float(y) for x, y in zip(a, b))
    na, nb = math.sqrt(sum(float(x) ** 2 for x in a)), math.sqrt(sum(float(y) ** 2 for y in b))
    return na > 0 and nb > 0 and math.isfinite(dot) and dot / (na * nb) > min_cos


def close(a: list, b: list, *, atol: float, rtol: float = 0.0) -> bool:
    """Elementwise |a-b| <= atol + rtol*|b|, written in plain Python."""
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        x, y = float(x), float(y)
        if math.isnan(x) or math.isnan(y) or abs(x - y) > atol + rtol * abs(y):
            return False
    return True

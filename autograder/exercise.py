"""What an exercise is, for the grader: how to observe a function, and how to judge it.

Grading is split in two halves that never share a process in class grading:

* ``observe(fn, *, salt=0)`` calls the function under test in small seeded *scenarios* and returns plain
  data (numbers, strings, lists, dicts), always in one shape, built by ``observation``::

      {"salt": 0,
       "scenarios": {"k2":  {"case": {"what": "called with accumulation_steps=2", "k": 2, "seed": 2, ...},
                             "steps": 4, "params": [...], ...},            # what was measured
                     "k3":  {"case": {...}, "error": "ValueError: ..."},   # the function raised there
                     ...},
       ...}                                                                # extras only the reference needs

  ``salt=0`` gives the *public* scenarios: the notebook's self-check and the reference results shipped to
  students use them. Any other salt gives *held-out* scenarios derived from it (other seeds, other sizes),
  which only the instructor's class grader uses, so replaying the shipped reference results earns nothing.
* each ``Check`` compares the student's observation with the reference solution's and returns ``None``
  (pass) or one plain sentence saying what is wrong and where to look. Checks read JSON-like data only,
  and take every scenario's inputs (its ``case``) from the *reference* observation: the student's
  observation is produced next to the student's code, so it may be invented.
* the evidence rule, applied by ``Exercise.grade``: a count, a flag, a type or an exception is easy to
  claim, so a check that reads such values names the scenarios it reads in ``Check.evidence``, and its pass
  counts only when each of them also carries *data evidence*, values that only the real computation on the
  seeded data produces (``Exercise.evidence`` says which). A constant or do-nothing function earns nothing.
"""
import math
import numbers
import random
from collections.abc import Callable
from dataclasses import dataclass, field

Observation = dict  # {"salt": int, "scenarios": {key: scenario}, ...}: JSON-like values only
Scenario = dict     # {"case": {"what": str, ...inputs}, ...measured values} or {"case": ..., "error": str}
NOT_DONE = "Your function still raises NotImplementedError: replace that line with your code."
DEADLOCK = "deadlock"  # the error of a rank-spawning scenario whose ranks waited for each other until stopped


class ScenarioError(Exception):
    """A check cannot run because the function failed in the scenario it needs; the message says so."""


@dataclass(frozen=True)
class Check:
    title: str                                               # what is checked, in plain words
    points: float
    test: Callable[[Observation, Observation], str | None]  # (student, reference) -> None or why it failed
    # The evidence rule: scenarios (names, see scenario_keys) that must carry data evidence before a pass counts.
    # Needed by every check that reads counts, flags, types or exceptions, or that a do-nothing function passes.
    evidence: tuple[str, ...] = ()


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
    observe: Callable[..., Observation]  # observe(fn, *, salt=0)
    checks: list[Check] = field(default_factory=list)
    # (student's scenario, reference's scenario) -> None when the student's data shows the real computation,
    # else the end of a sentence saying what does not. Required when a check names evidence scenarios.
    evidence: Callable[[Scenario, Scenario], str | None] | None = None
    timeout_s: float = 60.0   # default wall-time limit for one observation in class grading
    # The reference may need more than ``observe`` gives, e.g. every accepted variant's outcome.
    observe_reference: Callable[..., Observation] | None = None

    def __post_init__(self):
        if any(check.evidence for check in self.checks) and self.evidence is None:
            raise ValueError(f"{self.name}: a check names evidence scenarios, so the exercise needs an evidence test")

    def observe_as_reference(self, fn, *, salt: int = 0) -> Observation:
        return (self.observe_reference or self.observe)(fn, salt=salt)

    @property
    def max_score(self) -> float:
        return sum(c.points for c in self.checks)

    def grade(self, student: Observation, reference: Observation) -> list[CheckResult]:
        results = []
        for check in self.checks:
            try:
                problem = check.test(student, reference) or self.missing_evidence(check, student, reference)
            except ScenarioError as exc:
                problem = str(exc)
            except Exception as exc:  # malformed observation: never trust its shape
                problem = f"The grader could not read your function's results for this check ({type(exc).__name__})."
            results.append(CheckResult(check.title, check.points, 0.0 if problem else check.points, problem or ""))
        return results

    def missing_evidence(self, check: Check, student: Observation, reference: Observation) -> str | None:
        """The evidence rule: None when every scenario the check names carries data evidence, else why not."""
        for key in scenario_keys(reference, check.evidence):
            problem = self.evidence(scenario(student, key, what(reference, key)), reference["scenarios"][key])
            if problem:
                return f"This could not be confirmed: {problem}"
        return None


# ---- observing: scenarios, salts, plain data ---------------------------------------------------

def observation(salt: int, cases: dict[str, dict], run: Callable[[dict], dict]) -> Observation:
    """The one shape of an observation: ``run(case)`` for every case, each recorded with its case.

    ``cases`` maps a scenario key to the scenario's inputs, JSON-like, with ``"what"``: the words that
    finish "Your function raised ... when ...". An exception in one scenario costs only that scenario.
    """
    return {"salt": salt,
            "scenarios": {key: {"case": case, **run_scenario(lambda case=case: run(case))}
                          for key, case in cases.items()}}


def salted_seed(seed: int, salt: int) -> int:
    """``seed`` itself for the public scenarios (salt 0); for any other salt a seed derived from both."""
    return seed if salt == 0 else held_out_rng(salt, f"seed {seed}").randrange(1_000_000, 2**31)


def held_out_rng(salt: int, purpose: str) -> random.Random:
    """A generator for drawing held-out scenarios: the same (salt, purpose), the same draws, on any machine."""
    return random.Random(f"{purpose} / salt {salt}")  # a str seed is hashed with SHA-512: no PYTHONHASHSEED


def run_scenario(call: Callable[[], dict]) -> dict:
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
    return (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)[:300]


def run_on_ranks(rank_fn, world_size: int, *args, timeout: float) -> dict:
    """Observe one scenario on ``world_size`` forked local ranks (gloo): ``{"ranks": [what each rank returned]}``.

    ``rank_fn(rank, world_size, *args)`` is the grader's code for one rank and calls the student's code through
    ``student_call``. When the ranks fail this returns ``{"error": ...}``: ``DEADLOCK`` when they waited for each
    other until ``timeout`` (a collective only some ranks called), else what the student's code raised. No
    process is left behind either way (``coursekit.dist.launch``).
    """
    from coursekit.dist import RankFailed, RanksTimedOut, launch  # forks ranks: only the observing side needs it

    try:
        ranks = launch(rank_fn, world_size, *args, backend="gloo", timeout=timeout)
    except RanksTimedOut:
        return {"error": DEADLOCK}
    except RankFailed as exc:
        text = str(exc)
        if _STUDENT_RAISED not in text:  # the grader's own code in the rank failed: the traceback's last line
            return {"error": text.strip().splitlines()[-1][:300]}
        raised = " ".join(text.split(_STUDENT_RAISED, 1)[1].splitlines()[0].split())[:200]
        if any(s in raised for s in ("Timed out", "timed out", "closed by peer", "Connection reset", "Broken pipe")):
            return {"error": DEADLOCK}  # a collective timed out, or its peer rank was stopped
        return {"error": raised}
    return {"ranks": ranks}


_STUDENT_RAISED = "the student's code raised: "


class StudentCodeFailed(RuntimeError):
    """The student's code raised inside a rank; the message carries its words after a mark run_on_ranks finds."""


def student_call(fn, *args, **kwargs):
    """Call the student's code inside a rank, so that what it raises reaches the feedback in its own words."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # keep only the student's words; the rank's traceback is noise here
        raise StudentCodeFailed(_STUDENT_RAISED + describe_exception(exc).replace("\n", " ")) from None


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


def params_data(model) -> list[float]:
    """All parameters of a model, flattened in registration order."""
    return [v for p in model.parameters() for v in tensor_data(p)]


# ---- checking: reading an observation (plain Python only: no torch from here on) ---------------

def scenario(observation: Observation, key: str, what: str) -> Scenario:
    """The named scenario's data, or a ScenarioError that says the function failed there (``what``: when)."""
    data = observation.get("scenarios", {}).get(key)
    if not isinstance(data, dict):
        raise ScenarioError(f"No result for {what}: the grader's observation is incomplete.")
    if "error" in data:
        if str(data["error"]).startswith("NotImplementedError"):
            raise ScenarioError(NOT_DONE)
        if data["error"] == DEADLOCK:
            raise ScenarioError(f"When {what}, a rank waited in a collective that another rank never called (the "
                                "grader stopped them): every rank must call the same collectives, in the same order, "
                                "on tensors of the same shape.")
        raise ScenarioError(f"Your function raised {str(data['error']).rstrip('.')} when {what}.")
    return data


def case(reference: Observation, key: str) -> dict:
    """A scenario's inputs, as the reference observed it (never the student's copy)."""
    return reference["scenarios"][key]["case"]


def what(reference: Observation, key: str) -> str:
    """A scenario in words, for "when ...": e.g. "called with accumulation_steps=2"."""
    return case(reference, key)["what"]


def scenario_keys(reference: Observation, names) -> list[str]:
    """The reference's scenario keys for ``names``, in observation order.

    A scenario observed on another device has the key ``name@device`` (e.g. ``bf16@cuda``) and belongs to ``name``.
    One the reference itself could not run there (CUDA failed to start in the grader's sandbox) cannot be judged,
    so it is left out and costs nothing. A CPU scenario the reference could not run stays in: that is a bug.
    """
    return [key for key in reference["scenarios"] if key.partition("@")[0] in names
            and not ("@" in key and "error" in reference["scenarios"][key])]


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


def off_by(got: float, want: float) -> str:
    """How far a student's number is from the reference's, too coarse to recover the reference's value from.

    Feedback says "off by about 28%", never the reference's digits: those could be copied into a function
    that returns a constant.
    """
    if not (math.isfinite(got) and math.isfinite(want)) or want == 0:
        return "not the expected value"
    error = abs(got - want) / abs(want)
    return ("off by less than 1%" if error < 0.01 else f"off by about {error:.0%}" if error < 10
            else "off by more than a factor of 10")

"""What an exercise is, for the grader: how to observe a function, and how to judge it.

Grading is split in two halves that never share a process in class grading:

* the exercise's observer module (``Exercise.observer``: the only part of an exercise that imports torch, loaded
  only where student code runs, by ``observing.observe``) calls the function under test in small seeded
  *scenarios* (``Exercise.cases(salt)``) and returns plain data (numbers, strings, lists, dicts), always in one
  shape, built by ``observing.observation``::

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
from collections.abc import Callable
from dataclasses import dataclass, field

from .judging.checking import ScenarioError, scenario, scenario_keys, what
from .judging.parse import parse_observation

FEEDBACK_CHARS = 1000  # one check's sentence: the checks' own words, with at most a short quote of the student's
# The evidence rule's sentence: the check's own measurement is right (say so: credit what is right), but it counts
# only with right values, since a function that computes nothing or computes wrong would pass it too.
UNCONFIRMED = ("What this check measures is right here, but it counts only when the same run's results are right "
               "(a function that computes nothing, or computes wrong values, would pass it too):")

Observation = dict  # {"salt": int, "scenarios": {key: scenario}, ...}: JSON-like values only
Scenario = dict     # {"case": {"what": str, ...inputs}, ...measured values} or {"case": ..., "error": str}


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
    cases: Callable[[int], dict[str, dict]]  # cases(salt): every scenario's inputs, JSON-like (pure Python)
    observer: str             # the module that observes it next to the student's code (imports torch)
    checks: list[Check] = field(default_factory=list)
    # (student's scenario, reference's scenario) -> None when the student's data shows the real computation,
    # else the end of a sentence saying what does not. Required when a check names evidence scenarios.
    evidence: Callable[[Scenario, Scenario], str | None] | None = None
    timeout_s: float = 60.0   # default wall-time limit for one observation in class grading
    # Observed on forked ranks (ranks.py): the grading worker's task process then runs no student code itself,
    # and an unprivileged grader without one identity per worker grades these one student at a time.
    ranks: bool = False
    # Libraries other exercises forbid (grader/sandbox/forbidden.FORBIDDEN entries) that this one's own method uses
    # (Lesson 9's checkpoints shard with FSDP2): its tasks run in a worker without those stubs.
    needs_libraries: tuple[str, ...] = ()
    # The ranks' own method shares files (Lesson 9's checkpoints: every rank writes its shards into one folder, and a
    # restart reads them): graded in a worker whose ranks keep the sandbox's /tmp in common instead of one each.
    ranks_share_files: bool = False

    def __post_init__(self):
        if any(check.evidence for check in self.checks) and self.evidence is None:
            raise ValueError(f"{self.name}: a check names evidence scenarios, so the exercise needs an evidence test")

    @property
    def package(self) -> str:
        """The exercise's package, e.g. ``autograder.exercises.bucketed_ddp``."""
        return self.observer.rpartition(".")[0]

    @property
    def max_score(self) -> float:
        return sum(c.points for c in self.checks)

    def grade(self, student: Observation, reference: Observation) -> list[CheckResult]:
        """Every check's result on the student's observation, parsed first against the reference's (parse.py)."""
        student = parse_observation(student, reference)
        results = []
        for check in self.checks:
            try:
                problem = check.test(student, reference) or self.missing_evidence(check, student, reference)
            except ScenarioError as exc:
                problem = str(exc)
            except Exception as exc:  # malformed observation: never trust its shape
                problem = f"The grader could not read your function's results for this check ({type(exc).__name__})."
            problem = (problem or "")[:FEEDBACK_CHARS]
            results.append(CheckResult(check.title, check.points, 0.0 if problem else check.points, problem))
        return results

    def missing_evidence(self, check: Check, student: Observation, reference: Observation) -> str | None:
        """The evidence rule: None when every scenario the check names carries data evidence, else why not —
        after the check's own test passed, so the sentence says first that what it measures is right."""
        for key in scenario_keys(reference, check.evidence):
            problem = self.evidence(scenario(student, key, what(reference, key)), reference["scenarios"][key])
            if problem:
                return f"{UNCONFIRMED} {problem}"
        return None



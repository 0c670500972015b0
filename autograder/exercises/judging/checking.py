"""Reading an observation: plain Python only, no torch (the trusted side of every exercise).

Checks take every scenario's inputs (its ``case``) from the *reference* observation and never trust the shape of
the student's: ``scenario`` turns a failed or missing scenario into a ``ScenarioError`` with one sentence for
the student, and the comparisons below treat a wrong shape or a non-finite value as a mismatch.
"""
import math
from collections.abc import Callable

NOT_DONE = "Your function still raises NotImplementedError: replace that line with your code."
DEADLOCK = "deadlock"  # the error of a rank-spawning scenario whose ranks waited for each other until stopped
ABORTED = "aborted"   # the error of a rank scenario where gloo killed a rank (SIGABRT): a message of the wrong size
MISSING = "no result"  # the error of a scenario the student's observation lacks (parse.py)
MALFORMED = "malformed: "  # the start of the error of a scenario whose results do not parse (parse.py)
DIFFERENT = "different: "  # the start of the error of a scenario whose results are shaped otherwise (parse.py)


class ScenarioError(Exception):
    """A check cannot run because the function failed in the scenario it needs; the message says so."""


def scenario(observation: dict, key: str, what: str) -> dict:
    """The named scenario's data, or a ScenarioError that says the function failed there (``what``: when)."""
    data = observation.get("scenarios", {}).get(key)
    if not isinstance(data, dict) or data.get("error") == MISSING:
        raise ScenarioError(f"No result for {what}: the grader's observation is incomplete.")
    if "error" in data:
        if str(data["error"]).startswith(MALFORMED):
            raise ScenarioError(f"The grader could not read the results of your code when {what}: "
                                f"{str(data['error'])[len(MALFORMED):].rstrip('.')}.")
        if str(data["error"]).startswith(DIFFERENT):
            raise ScenarioError(f"When {what}, your code's results are shaped differently from the reference's: "
                                f"{str(data['error'])[len(DIFFERENT):].rstrip('.')}.")
        if str(data["error"]) == "NotImplementedError":  # the blank scaffold's bare raise (nn.Module's has words)
            raise ScenarioError(NOT_DONE)
        if data["error"] == ABORTED:
            raise ScenarioError(f"When {what}, gloo killed a rank (SIGABRT): a message arrived with another size than "
                                "the rank receiving it expected. Every rank must send and receive tensors of the same "
                                "shapes as its peers expect.")
        if data["error"] == DEADLOCK:
            raise ScenarioError(f"When {what}, a rank waited in a collective that another rank never called (the "
                                "grader stopped them): every rank must call the same collectives, in the same order, "
                                "on tensors of the same shape.")
        raise ScenarioError(f"Your function raised {str(data['error']).rstrip('.')} when {what}.")
    return data


def case(reference: dict, key: str) -> dict:
    """A scenario's inputs, as the reference observed it (never the student's copy)."""
    return reference["scenarios"][key]["case"]


def what(reference: dict, key: str) -> str:
    """A scenario in words, for "when ...": e.g. "called with accumulation_steps=2"."""
    return case(reference, key)["what"]


def scenario_keys(reference: dict, names) -> list[str]:
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


def relative_error(got, want) -> float:
    """max |got − want| / max |want|; infinite when the lengths differ or a value is not finite."""
    if not isinstance(got, list) or not isinstance(want, list) or len(got) != len(want) or not want:
        return math.inf
    worst = 0.0
    for x, y in zip(got, want):
        x = float(x)
        if not math.isfinite(x):
            return math.inf
        worst = max(worst, abs(x - float(y)))
    scale = max(abs(float(y)) for y in want)
    return worst / scale if scale else worst


def guarded_values_problem(student, reference, key: str, names, rtol: float, *, words: dict, sentinel: float) -> str | None:
    """The first of ``names`` that is off by more than ``rtol`` in a scenario whose outputs the grader filled with
    ``sentinel`` before a kernel wrote them (``kernel_launch.GuardedBuffer``), in ``words`` (no fix)."""
    got, want = scenario(student, key, what(reference, key)), reference["scenarios"][key]["truth"]
    for name in names:
        if isinstance(got.get(name), list) and sentinel in got[name]:
            return (f"When {what(reference, key)}, {words[name]} was not written everywhere (the grader's marker "
                    "is still there)")
        error = relative_error(got.get(name), want[name])
        if error > rtol:
            how = ("holds NaN or inf" if error == math.inf else
                   f"is off by {error:.1e} relative to its largest value, more than the {rtol:.0e} allowed")
            return f"When {what(reference, key)}, {words[name]} {how}"
    return None


def advice(problem: str | None, hint: str) -> str | None:
    """A problem found, followed by what to look at."""
    return None if problem is None else f"{problem}: {hint}"


def sketch_error(got, want) -> float:
    """How far two sketches (``observing.sketch``) of one tensor are apart, relative to the larger projection of
    ``want``; infinite when ``got`` is not a sketch of as many finite projections."""
    if not isinstance(got, list) or not isinstance(want, list) or len(got) != len(want) or not want:
        return math.inf
    try:
        pairs = [(float(x), float(y)) for x, y in zip(got, want)]
    except (TypeError, ValueError):
        return math.inf
    if not all(math.isfinite(x) for x, _ in pairs):
        return math.inf
    scale = max(abs(y) for _, y in pairs)
    worst = max(abs(x - y) for x, y in pairs)
    return worst / scale if scale else worst


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


# ---- rank exercises ----------------------------------------------------------------------------

def rank_results(student: dict, reference: dict, key: str, *, forbidden: str = "",
                 reword: Callable[[str], str] | None = None) -> list[dict]:
    """A rank scenario's per-rank records, confirmed present: one record for each of the scenario's ranks.

    Otherwise a ScenarioError with one sentence: the student's code raised (``reword`` may turn a known message
    into better advice), a rank flagged the use of what the exercise forbids (``forbidden`` says why that earns
    nothing), or the ranks' results are missing (never read as "nothing wrong").
    """
    when = what(reference, key)
    try:
        ranks = scenario(student, key, when).get("ranks")
    except ScenarioError as exc:
        if reword:
            raise ScenarioError(reword(str(exc))) from None
        raise
    world_size = case(reference, key)["world_size"]
    if not isinstance(ranks, list) or len(ranks) != world_size or not all(
            isinstance(r, dict) and isinstance(r.get("forbidden"), bool) for r in ranks):
        raise ScenarioError(f"When {when}, the grader did not get a result from each of the {world_size} ranks.")
    if any(r["forbidden"] for r in ranks):
        raise ScenarioError(forbidden or "Your code uses what this exercise asks you to write yourself.")
    return ranks


def flat(grads) -> list:
    """Per-parameter gradient lists joined into one, None (no gradient) left out."""
    return [v for g in grads if g is not None for v in g] if isinstance(grads, list) else []


def scale_factor(got: list[float], want: list[float]) -> float | None:
    """c minimising |got − c·want| (how many times the reference's value the student's is)."""
    denominator = sum(w * w for w in want)
    return sum(g * w for g, w in zip(got, want)) / denominator if denominator else None


# ---- measurements at gates (meter.py's gate policies) -----------------------------------------------

def gate_digests(meter: dict, rank: int) -> list:
    """Rank ``rank``'s digests at its gates, in order ([sum, sum of squares] of the gradient reaching each)."""
    return [record["digest"] for record in meter["gates"]["records"] if record["rank"] == rank]


def expected_at_gates(meter: dict, key: str):
    """What the launcher's recomputation (meter.GatePolicy.expect) says ``key`` must be; None where it has none."""
    expected = meter["gates"].get("expected")
    return expected.get(key) if isinstance(expected, dict) else None


def gate_problem(meter: dict, rank: int, gates: int, reference_meter: dict,
                 words: tuple[str, str] = ("its model's backward reaches", "a gradient its backward does not give")
                 ) -> str | None:
    """Whether rank ``rank`` passed exactly its model's ``gates`` gates, each with the gradient the grader's own
    backward computes there under the seeds the launcher answered (meter.GatePolicy): the words that finish
    "rank 0 ..." when not. A rank that asks at a gate before its backward reaches it, or more often than the model
    has gates, fails here. The first gate's gradient comes before any seed, so the recomputation's must be the
    reference's: a record of another scenario (the shipped public one, replayed) is not this one's. ``words``: how
    the scenario reaches its gates, and what a wrong digest is, in its own terms."""
    asked = len(gate_digests(meter, rank)) + int((meter["gates"].get("refused") or [0] * (rank + 1))[rank] or 0)
    if asked != gates:
        return f"asked at the grader's pauses {asked} times where {words[0]} {gates}"
    want, theirs = expected_at_gates(meter, "digests"), expected_at_gates(reference_meter, "digests")
    if not isinstance(want, list) or rank >= len(want) or not isinstance(want[rank], list) or not want[rank]:
        return "could not be checked at the grader's pauses (the grader's own recomputation failed)"
    if not isinstance(theirs, list) or rank >= len(theirs) or not digests_close(want[rank][:1], theirs[rank][:1], 1e-3):
        return "has a record of the grader's pauses from another scenario than this one"
    for index, (got, right) in enumerate(zip(gate_digests(meter, rank), want[rank])):
        if not digests_close([got], [right], 1e-3):
            return (f"reached the grader's pause {index + 1} of {gates} with {words[1]} "
                    "there (asked early, or with other data)")
    return None


def held_at_gates(meter, world_size: int) -> list[list[float]] | None:
    """Each rank's readings of what it held at the grader's gates (taken by the launcher, outside the rank:
    meter.py), in order; None when the meter has no gate records."""
    gates = meter.get("gates") if isinstance(meter, dict) else None
    records = gates.get("records") if isinstance(gates, dict) else None
    if not isinstance(records, list):
        return None
    held = [[] for _ in range(world_size)]
    for record in records:
        rank, value = record.get("rank"), record.get("held_bytes")
        if isinstance(rank, int) and 0 <= rank < len(held) and isinstance(value, int | float):
            held[rank].append(float(value))
    return held


def digests_close(got: list, want: list, rtol: float) -> bool:
    """Two lists of [sum, sum of squares] that agree: the same data, up to float32 round-off."""
    if not isinstance(got, list) or not isinstance(want, list) or len(got) != len(want):
        return False
    return all(isinstance(g, list) and len(g) == 2 and all(
        math.isfinite(float(a)) and abs(float(a) - float(b)) <= rtol * (abs(float(b)) + 1e-12) + 1e-9
        for a, b in zip(g, w)) for g, w in zip(got, want))


def evidence_close(got: list, want: list, rtol: float, precision: float) -> bool:
    """Two lists of [sum, sum of squares, projections...] (``observing.projections``) of the same tensors: the
    digests within ``rtol``, each projection within ``precision`` times the tensor's norm (a projection of a vector
    off by e moves by about |e|, so 16-bit round-off shows at precision 1e-5 and float32's does not)."""
    if not isinstance(got, list) or not isinstance(want, list) or len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if not (isinstance(g, list) and isinstance(w, list) and len(g) == len(w) >= 2):
            return False
        if not digests_close([g[:2]], [w[:2]], rtol):
            return False
        norm = math.sqrt(max(float(w[1]), 0.0))
        if not all(math.isfinite(float(a)) and abs(float(a) - float(b)) <= precision * norm + 1e-12
                   for a, b in zip(g[2:], w[2:])):
            return False
    return True


def measured_privately(*meters) -> bool:
    """True when every meter counted the bytes of a loopback that carried only its ranks' traffic (the grader's
    sandbox has a network namespace of its own). Elsewhere (a student's kernel, next to a browser and a database)
    other processes' traffic lands in the count: a byte check then judges nothing, rather than judge wrongly."""
    return all(isinstance(m, dict) and m.get("private_network") is True for m in meters)


def sent_beyond(student_meter: dict, reference_meter: dict) -> int | None:
    """How many bytes more than the reference's the student's ranks sent on their loopback (negative: fewer), when
    both were measured on a private loopback (the grader's sandbox); else None."""
    mine, theirs = student_meter.get("lo_bytes"), reference_meter.get("lo_bytes")
    if not (measured_privately(student_meter, reference_meter) and isinstance(mine, int) and isinstance(theirs, int)):
        return None
    return mine - theirs


def sent_too_much(student_meter: dict, reference_meter: dict, factor: float) -> float | None:
    """How many times the reference's loopback bytes the student's ranks sent, when that is more than ``factor``
    and both were measured on a private loopback (the grader's sandbox); else None."""
    mine, theirs = student_meter.get("lo_bytes"), reference_meter.get("lo_bytes")
    if not (measured_privately(student_meter, reference_meter) and mine and theirs):
        return None
    return mine / theirs if mine > factor * theirs else None

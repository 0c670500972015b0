"""Localisation: which result is wrong, where it first goes wrong, by what factor or pattern, and what is right.

A catalogue (``mistakes.py``) names the mistakes someone foresaw; students make others. Whatever the mistake, the
grader already holds the student's observation and the reference's, value by value. This one engine compares them
and says, in the student's terms, what differs: "dk is √d times too large in every scenario; o, dq and dv are
right". Each exercise declares, next to its ``MISTAKES``, a ``LOCATE = Locate(...)``: what its observed values are
called in the exercise's words, which keys are method evidence rather than results, and which factors a plausible
mistake scales a result by (√d, world_size, accumulation steps...). Plain Python, no torch.

It never quotes a reference value precise enough to copy: a named factor, a pattern (zeros, unchanged, not finite,
shifted by one, transposed) or "off by about 30 %".
"""
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from numbers import Real

from .checking import DIFFERENT, MALFORMED, MISSING

RTOL = 1e-3                     # a value is right within this fraction of its largest magnitude (the checks: 1e-4..)
FIT = 2e-3                      # a factor or pattern fits when the rest is within this fraction
SKIP = ("case", "truth", "meter", "error", "not_done")  # never results: the inputs, the ground truth, outside measurements
GENERIC_FACTORS = {"2": 2.0, "−1": -1.0}
SHOWN_RIGHT = 6                 # right quantities named, at most
POSITIONS = {"ranks": "rank {i}", "steps": "step {n}", "calls": "call {n}", "step_grads": "step {n}",
             "updates": "step {n}", "step_grad_norms": "step {n}", "losses": "step {n}",
             "grad_norms": "step {n}"}


@dataclass(frozen=True)
class Locate:
    names: dict[str, str] = field(default_factory=dict)   # observed key -> the exercise's word for it ("dk", "o")
    ignore: tuple[str, ...] = ()                          # keys that are method evidence, not results
    factors: Callable[[dict], dict[str, float]] = lambda case: {}   # case -> {"√d": 2.83, "world_size": 2}
    unchanged: dict[str, str] = field(default_factory=dict)  # key -> sibling key of its value before (params)
    # list key -> words of an index in it: a template ("parameter {n}") or the items' names in order
    positions: dict[str, str | tuple[str, ...]] = field(default_factory=dict)
    whole: dict[str, str] = field(default_factory=dict)  # key -> word of its items: compared item by item, whole
    entries: dict[str, str] = field(default_factory=dict)  # whole key -> word of an item's entries ("stage {n}")
    by_position: tuple[str, ...] = ("steps", "step_grads", "calls", "updates", "losses", "step_grad_norms", "grad_norms")
    series: tuple[str, ...] = ("losses", "step_grad_norms", "grad_norms")  # one number per step: step by step
    tolerance: Callable[[dict], float] = lambda case: RTOL  # case -> what "right" allows (bf16 scenarios: more)
    counts: tuple[str, ...] = ()  # factors that are counts a result is divided by: also tried off by one (N ± 1)
    inner: dict[str, str] = field(default_factory=dict)  # list key -> words of the index inside each of its items
    # (wrong, right quantities) -> a sentence of what the right ones rule out, in the exercise's terms ("o, dq and dv
    # are right, so p and ds are: the error is in dk's own sum"), or "": where a wrong value first comes from
    deduce: Callable[[frozenset, frozenset], str] = lambda wrong, right: ""
    # keys whose wrong values are searched among the right values of their siblings (another rank, step or
    # parameter): "one step late", "holds parameter 2's values" -- a shifted offset, a broadcast before the step
    across: tuple[str, ...] = ()
    # key -> case -> (rows along the sequence, row width, the word of a row): a flat (..., rows, width) result whose
    # wrong part is said by rows ("wrong from query row 17 on"): an online softmax's merge goes wrong at a tile;
    # rows 0: as many as the result holds (a rank's own token count)
    rows: dict[str, Callable[[dict], tuple[int, int, str]]] = field(default_factory=dict)
    # (parsed student, reference) -> a sentence of what the observation rules in or out where a relation spans
    # scenarios, ranks or results (the chunks a rank merges, the gradient at fc2's bias), or "": said with deduce's
    narrow: Callable[[dict, dict], str] = lambda student, reference: ""


@dataclass(frozen=True)
class Finding:
    quantity: str       # the student's word for it
    scenario: str       # the scenario's key
    where: str          # "rank 1, step 2" or ""
    pattern: str        # "√d times too large", "zeros", "off by about 30 %"
    short: str          # "×√d", "zeros", "off"
    order: int | None = None  # the index along a time-ordered list (step, call), when it sits in one
    size: str = ""            # "larger" or "smaller" (by its magnitude) than the right value, when clearly one


@dataclass(frozen=True)
class Localisation:
    wrong: tuple[str, ...]            # one sentence per wrong quantity
    right: tuple[str, ...]            # quantities right everywhere they were observed
    crashed: str = ""                 # where the function raised, once, in the student's words
    short: str = ""                   # grades.csv's `cause` when no catalogue cause fits: "dk ×√d"
    wrong_quantities: tuple[str, ...] = ()
    follow: tuple[str, ...] = ()      # wrong only after the first wrong step: consequences, not where it goes wrong
    signs: tuple[str, ...] = ()       # "dk: ×√d", "o: off", "raised": every kind of wrongness seen, to compare
    places: tuple[str, ...] = ()      # "dk @ causal": each quantity wrong in each scenario (the calibration's)
    raised_in: tuple[str, ...] = ()   # the scenarios that raised
    sizes: tuple[str, ...] = ()       # "dk: larger": each wrong quantity larger or smaller than it should be
    right_places: tuple[str, ...] = ()  # "dk @ causal": each quantity right everywhere it was observed in a scenario
    parts: tuple[str, ...] = ()       # "the bytes per rank @ stage 2": each quantity wrong at a position (not a time)
    right_parts: tuple[str, ...] = ()  # each quantity observed at a position (not a time) and right there everywhere
    deduced: str = ""                 # what the right results rule out (Locate.deduce)

    def lines(self) -> list[str]:
        out = ([self.crashed] if self.crashed else []) + ([DEDUCED + self.deduced] if self.deduced else []) + list(self.wrong)
        if self.follow:
            out.append("Later values differ as a consequence: " + ", ".join(self.follow[:SHOWN_RIGHT]) + ".")
        if self.right and (self.wrong or self.crashed):
            more = len(self.right) - SHOWN_RIGHT
            # after a crash, right only in the scenarios that ran: say so, or it reads as right everywhere
            out.append(("Right where it ran without raising: " if self.crashed else "Right: ")
                       + ", ".join(self.right[:SHOWN_RIGHT]) + (f" and {more} more" if more > 0 else "") + ".")
        return out

    @property
    def empty(self) -> bool:
        return not (self.wrong or self.crashed)


def localise(spec: Locate, student: dict, reference: dict) -> Localisation:
    """Compare the parsed student observation with the reference's, scenario by scenario (see the module)."""
    findings, right, errors, right_at, seen_right, right_in = [], set(), [], {}, set(), {}
    for key, ref in reference.get("scenarios", {}).items():
        got = student.get("scenarios", {}).get(key)
        if not isinstance(ref, dict) or "error" in ref:
            continue
        if not isinstance(got, dict) or isinstance(got.get("error"), str):
            errors.append((key, *_blame(student, key), str(got.get("error", "")) if isinstance(got, dict) else ""))
            continue
        case = ref.get("case", {})
        factors = {**GENERIC_FACTORS, **_safe_factors(spec, case)}
        truth = ref.get("truth") if isinstance(ref.get("truth"), dict) else {}
        rtol = _safe_tolerance(spec, case)
        leaves = list(_leaves(spec, ref, got, truth))
        wants = {path: want for path, want, _, _ in leaves} if spec.across else {}
        befores = {path: before for path, _, _, before in leaves if _numbers(before)}
        for path, want, have, before in leaves:
            if isinstance(have, dict) and isinstance(have.get("error"), str):
                errors.append((key, _where(spec, path), _blame(student, key, path)[1], have["error"]))
                continue
            verdict = _compare(want, have, before, factors, rtol, _safe_rows(spec, path, case, want))
            if verdict is not None and verdict[1] == "off" and any(k in spec.across for k in path):
                verdict = _moved(spec, path, want, have, wants, rtol) or verdict
            if verdict is not None and verdict[1] == "off" and befores:
                verdict = _reduced(path, want, have, befores, rtol) or verdict
            name = _quantity(spec, path)
            if verdict is None:
                right.add(name)
                right_at.setdefault(name, set()).add(_where(spec, path))
                right_in.setdefault((name, key), set()).add(_where(spec, path))
                seen_right.add(f"{name} @ {key}")
            else:
                findings.append(Finding(name, key, _where(spec, path), *verdict, order=_order(spec, path),
                                        size=_size(want, have)))
    found = _summarise(spec, reference, findings, right, errors, right_at, seen_right, right_in)
    if not findings:
        return found
    try:
        narrowed = spec.narrow(student, reference)
    except Exception:  # a rule that cannot read this observation says nothing
        narrowed = ""
    if not isinstance(narrowed, str) or not narrowed:
        return found
    return replace(found, deduced=f"{found.deduced} {narrowed}".strip())


def _moved(spec: Locate, path: tuple, want, have, wants: dict, rtol: float) -> tuple[str, str] | None:
    """A wrong vector that holds a sibling's right values (its first ones, when the lengths differ): the same path
    with one index changed (another rank, step or parameter). Along steps, one step late or early."""
    if not (_numbers(want) and _numbers(have)) or len(have) < 2 or len(wants) > 5000:
        return None
    for at, index in enumerate(path):
        if not isinstance(index, int) or at == 0:
            continue
        reach = 1 if isinstance(path[at - 1], str) and path[at - 1] in spec.by_position else 32  # time: a step
        for other in sorted(range(max(index - reach, 0), index + reach + 1), key=lambda i: (abs(i - index), i)):
            sibling = wants.get(path[:at] + (other,) + path[at + 1:]) if other != index else None
            if not _numbers(sibling) or len(sibling) < 2:
                continue
            m = min(len(have), len(sibling))
            scale = max(max(abs(v) for v in sibling[:m]), 1e-12)
            if not any(abs(v) > rtol * scale for v in sibling[:m]) or _close(sibling[:m], want[:m], rtol, scale) \
                    or not _close(have[:m], sibling[:m], rtol, scale):
                continue
            parent = path[at - 1]
            timed = isinstance(parent, str) and parent in spec.by_position
            before = wants.get(path[:at] + (other - 1,) + path[at + 1:]) if timed else None
            if timed and not (_numbers(before) and len(before) >= m and not _close(before[:m], sibling[:m], rtol, scale)):
                continue  # a step's values that are the step before's too (nothing moved then): no sign of lateness
            word = spec.positions.get(parent) or POSITIONS.get(parent) or "item {n}" if isinstance(parent, str) \
                else spec.inner.get(path[at - 2], "item {n}") if at > 1 and isinstance(path[at - 2], str) else "item {n}"
            where = _word(word, other)
            if timed and abs(other - index) == 1:
                late = other < index
                return (f"one {where.split()[0]} {'late' if late else 'early'}: the right values of {where}",
                        f"one {where.split()[0]} {'late' if late else 'early'}")
            first = f" (its first {m})" if m < len(sibling) else ""
            return f"the right values of {where}{first}", "another's values"
    return None


def _reduced(path: tuple, want, have, befores: dict, rtol: float) -> tuple[str, str] | None:
    """A wrong result after a collective that is, element by element, the largest or the smallest of the ranks'
    values before the call, or one rank's own values before it: the reduction's operation or its source is off."""
    at = next((i for i, (parent, index) in enumerate(zip(path, path[1:]), 1)
               if parent == "ranks" and isinstance(index, int)), None)
    if at is None or not (_numbers(want) and _numbers(have)) or len(have) < 2:
        return None
    ranks = []
    while len(ranks) < 1024 and _numbers(befores.get(path[:at] + (len(ranks),) + path[at + 1:])):
        ranks.append(befores[path[:at] + (len(ranks),) + path[at + 1:]])
    if len(ranks) < 2 or any(len(r) != len(have) for r in ranks):
        return None
    scale = max(max(abs(w) for w in want), 1e-12)
    for word, op, pick in (("largest", "MAX", max), ("smallest", "MIN", min)):
        values = [pick(col) for col in zip(*ranks)]
        if _close(have, values, rtol, scale) and not _close(values, want, rtol, scale):
            return (f"element by element the {word} of the ranks' values before the call (a {op} reduction), not their "
                    "average", f"the ranks' {op}")
    for r, values in enumerate(ranks):
        if _close(have, values, rtol, scale) and not _close(values, want, rtol, scale):
            return f"rank {r}'s values from before the call", f"rank {r}'s values"
    return None


def _safe_factors(spec: Locate, case: dict) -> dict[str, float]:
    try:
        found = spec.factors(case)
    except Exception:  # a case without the key: no exercise factors there
        return {}
    named = {k: float(v) for k, v in found.items() if isinstance(v, Real) and v not in (0, 1)}
    # a declared count off by one where it divides: "(world_size + 1)/world_size", "world_size/(world_size − 1)"
    shifted = {}
    for k in spec.counts:
        v = named.get(k)
        if v is not None and v == int(v) and v > 2:
            shifted.update({f"({k} + 1)/{k}": (v + 1) / v, f"{k}/({k} − 1)": v / (v - 1)})
        elif v == 2:
            shifted[f"({k} + 1)/{k}"] = 1.5
    return {**named, **{f"{k}²": v * v for k, v in named.items() if not k.startswith("√")},  # a factor applied twice
            **shifted}


def _safe_tolerance(spec: Locate, case: dict) -> float:
    try:
        return float(spec.tolerance(case))
    except Exception:  # a case without the key: the default
        return RTOL


def _leaves(spec: Locate, ref, got, truth, path=()):
    """(path, expected, student's, student's value before) for each result in the reference's scenario."""
    if isinstance(ref, dict):
        if isinstance(got, dict) and isinstance(got.get("error"), str) and "error" not in ref:
            yield path, ref, got, None
            return
        for k, v in ref.items():
            if k in SKIP or k in spec.ignore or not isinstance(got, dict):
                continue
            sub_truth = truth.get(k) if isinstance(truth, dict) else None
            before = got.get(spec.unchanged[k]) if k in spec.unchanged else None
            if k in spec.series and _numbers(v) and _numbers(got.get(k)) and len(got[k]) == len(v):
                want = sub_truth if _numbers(sub_truth) and len(sub_truth) == len(v) else v
                for i, w in enumerate(want):  # the first wrong step, and the factor there
                    yield path + (k, i), w, got[k][i], None
            elif k in spec.whole:
                yield path + (k,), _Whole(sub_truth if sub_truth is not None else v, spec.whole[k],
                                            spec.entries.get(k, "its entry {n}")), got.get(k), None
            elif k in spec.unchanged and isinstance(v, list) and v and all(isinstance(x, list) for x in v):
                have, was, want = got.get(k), before, sub_truth if isinstance(sub_truth, list) else v
                for i, w in enumerate(want):  # a list of vectors, each against its own value before
                    yield (path + (k, i), w, have[i] if isinstance(have, list) and i < len(have) else None,
                           was[i] if isinstance(was, list) and i < len(was) else None)
            elif k in spec.unchanged:
                yield path + (k,), sub_truth if sub_truth is not None else v, got.get(k), before
            else:
                yield from _leaves(spec, v, got.get(k), sub_truth, path + (k,))
    elif isinstance(ref, list) and ref and not _numbers(ref):
        if not isinstance(got, list):
            yield path, ref, got, None
            return
        for i, v in enumerate(ref):
            sub_truth = truth[i] if isinstance(truth, list) and i < len(truth) else None
            yield from _leaves(spec, v, got[i] if i < len(got) else None, sub_truth, path + (i,))
    elif isinstance(ref, (list, Real, str, bool)) or ref is None:
        yield path, truth if truth is not None and type(truth) is type(ref) else ref, got, None


def _numbers(values) -> bool:
    return isinstance(values, list) and all(isinstance(v, Real) and not isinstance(v, bool) for v in values)


@dataclass(frozen=True)
class _Whole:
    """A structured value (a table) compared item by item: only where it first differs is said."""
    items: list
    word: str
    entry: str = "its entry {n}"


def _entry(have: list, want: list, at: int, word: str) -> str:
    """Which entry of the first differing item (a row of a table) differs, and what the student's holds there
    (their own value, never the reference's): ": at stage 2 (of 3) yours holds ('F', 3)"."""
    if not (at < len(have) and at < len(want) and isinstance(have[at], list) and isinstance(want[at], list)
            and len(have[at]) == len(want[at])):
        return ""
    cells = [j for j, (h, w) in enumerate(zip(have[at], want[at])) if h != w]
    if not cells:
        return ""
    j = cells[0]
    held = "nothing (None)" if have[at][j] is None else repr(tuple(have[at][j]) if isinstance(have[at][j], list)
                                                             else have[at][j])[:40]
    more = f"; {len(cells)} of its {len(want[at])} entries differ" if len(cells) > 1 else ""
    return f": at {word.format(i=j, n=j + 1)} (of {len(want[at])}) yours holds {held}{more}"


def _same_rows(have: list, want: _Whole) -> tuple[str, str] | None:
    """Every item (row) of the student's table is one and the same, and holds something, where the right ones differ:
    what one list object reused for every row gives (``[[None] * p] * n``), each row holding what was written last
    anywhere (empty rows everywhere are a table nothing was written to, not this)."""
    if len(have) < 2 or not isinstance(have[0], list) or all(e is None for e in have[0]) \
            or any(h != have[0] for h in have[1:]) \
            or all(w == want.items[0] for w in want.items[1:]):
        return None
    head = want.word.split(" {")[0] if "{" in want.word else want.word
    return (f"every {head}'s row is the same (one row, repeated), as when one list object is "
            "reused for every row ([row] * n): a write to one row is a write to all", "every row the same")


def _safe_rows(spec: Locate, path: tuple, case: dict, want) -> tuple[int, int, str] | None:
    """The declared row shape of the result at ``path``, when its length fits it (else None: element words)."""
    key = next((k for k in reversed(path) if isinstance(k, str)), None)
    if key not in spec.rows or not isinstance(want, list):
        return None
    try:
        count, width, word = spec.rows[key](case)
        count, width = int(count), int(width)
        count = count or (len(want) // width if width > 0 else 0)  # 0: as many as the result holds (per rank)
    except Exception:  # a case without the keys: elements, not rows
        return None
    return (count, width, str(word)) if count > 1 and width > 0 and want and len(want) % (count * width) == 0 else None


def _row_list(bad: list[int], count: int, word: str, onwards: bool = True) -> str:
    """Rows (1-based, sorted) in words: "from query row 17 on", "query rows 1 to 16", "3 query rows (1, 5, 9)";
    a word with a tail ("query row of the rank's chunk") puts the numbers before it ("query row 1 of ...")."""
    head, sep, tail = word.partition(" of ")
    tail = f"{sep}{tail}" if sep else ""
    if onwards and bad == list(range(bad[0], count + 1)) and bad[0] > 1:
        return f"from {head} {bad[0]}{tail} on"
    if bad[-1] - bad[0] + 1 == len(bad):
        return f"{head}s {bad[0]} to {bad[-1]}{tail}" if len(bad) > 1 else f"{head} {bad[0]}{tail}"
    return f"{len(bad)} {head}s ({', '.join(map(str, bad[:4]))}" + (", ..." if len(bad) > 4 else "") + f"){tail}"


def _nonfinite_rows(have, rows) -> str:
    """Where the non-finite values are, by rows, when not everywhere: "; at query rows 1 to 16 (of 32) only"."""
    if not rows:
        return ""
    count, width, word = rows
    bad = sorted({(i // width) % count + 1 for i, h in enumerate(have) if not math.isfinite(h)})
    return "" if len(bad) == count else f"; at {_row_list(bad, count, word)} (of {count}) only, the others finite"


def _row_relation(have, want, rtol, scale, shape, bad: list[int]) -> str:
    """How the wrong rows relate to the right ones, tested per row: zeros, the opposite sign, or each row scaled
    by a factor of its own (a per-row normalisation -- a softmax's sum or max -- is off)."""
    count, width, _ = shape
    ratios, zeros = [], True
    wrong = set(bad)
    for start in range(0, len(want), width):  # each row of each batch and head
        if (start // width) % count + 1 not in wrong:
            continue
        h, w = have[start:start + width], want[start:start + width]
        if all(abs(x - y) <= rtol * scale for x, y in zip(h, w)):
            continue
        zeros = zeros and all(x == 0 for x in h)
        r = _fit(h, w, max(max(abs(x) for x in w), 1e-12))
        ratios.append(r)
    if zeros:
        return ": zeros there"
    if any(r is None for r in ratios):
        return ""
    if all(abs(r + 1) < 0.01 for r in ratios):
        return ": the right values with the opposite sign there"
    if max(ratios) - min(ratios) > 0.01 * max(abs(r) for r in ratios) and all(r > 0 for r in ratios):
        return (f": each wrong {shape[2].partition(' of ')[0]} is the right one times a factor of its own (between "
                f"{min(ratios):.2g} and {max(ratios):.2g}): a number computed once per row (a softmax's sum or max, "
                "a gate, a normaliser) is off")
    return ""


def _rows(have, want, rtol, scale, shape) -> str:
    """Which rows of a (..., rows, width) result are wrong, when not all: "; wrong from query row 17 on (of 32)";
    which columns, when only some are; and how the wrong rows relate to the right ones."""
    count, width, word = shape
    wrong = [i for i, (h, w) in enumerate(zip(have, want)) if abs(h - w) > rtol * scale]
    bad = sorted({(i // width) % count + 1 for i in wrong})
    if not bad:
        return ""
    relation = _row_relation(have, want, rtol, scale, shape, bad)
    columns = sorted({i % width + 1 for i in wrong})
    across = f"; only {_row_list(columns, width, 'column', onwards=False)} (of {width}) of each" if len(columns) < width else ""
    if len(bad) == count:  # every row: which columns, how they relate
        return f"; in every {word.partition(' of ')[0]}{across}{relation}" if relation or across else ""
    at = _row_list(bad, count, word)
    if relation or across:
        return f"; wrong {'at ' if not at.startswith('from') else ''}{at} (of {count}), the others right{across}{relation}"
    if at.startswith("from"):
        return f"; wrong {at} (of {count}), right before it"
    if bad == list(range(1, bad[-1] + 1)):
        head, sep, tail = word.partition(" of ")
        return f"; wrong up to {head} {bad[-1]}{sep}{tail} (of {count}), right after it"
    return f"; wrong at {at} of {count}, the others right"


def _compare(want, have, before, factors, rtol, rows=None) -> tuple[str, str] | None:
    """None when right, else (pattern in words, short form)."""
    if isinstance(want, _Whole):
        if not isinstance(have, list):
            return "missing", "missing"
        if have == want.items:
            return None
        same = _same_rows(have, want)
        if same:
            return same
        first = next((i for i, (h, w) in enumerate(zip(have, want.items)) if h != w), min(len(have), len(want.items)))
        at = want.word.format(i=first, n=first + 1) if "{" in want.word else f"{want.word} {first + 1}"
        return f"differs from {at} on{_entry(have, want.items, first, want.entry)}", f"differs at {at}"
    if isinstance(want, int) and isinstance(have, int) and not isinstance(want, bool) and not isinstance(have, bool) \
            and 0 < abs(have - want) <= 2:
        n = abs(have - want)
        return (f"off by {'one' if n == 1 else 'two'} ({'too many' if have > want else 'too few'})",
                f"{'+' if have > want else '−'}{n}")
    if isinstance(want, Real) and not isinstance(want, bool):
        want = [want]
        have = [have] if isinstance(have, Real) and not isinstance(have, bool) else have
        before = [before] if isinstance(before, Real) else before
    if not _numbers(want):
        if have == want or not isinstance(want, (bool, str)) or (isinstance(want, str) and len(want) > 40):
            return None
        return (f"is {have!r} where {want!r} is expected", "differs") if isinstance(want, bool) or \
            (isinstance(want, str) and want.isidentifier()) else ("differs", "differs")
    if not _numbers(have) or len(have) != len(want):
        got = "missing" if have is None else "of another length" if _numbers(have) else "not numbers"
        return ("missing (None: nothing reached it)" if have is None else got), got
    if not want:
        return None
    scale = max(max(abs(w) for w in want), 1e-12)
    if not all(math.isfinite(h) for h in have):
        return "not finite (NaN or inf)" + _nonfinite_rows(have, rows), "not finite"
    if _close(have, want, rtol, scale):
        return None
    first = next(i for i, (h, w) in enumerate(zip(have, want)) if abs(h - w) > rtol * scale)
    at = f" from element {first + 1} on" if first and len(want) > 1 else ""
    if all(h == 0 for h in have):
        return "all zeros", "zeros"
    if _numbers(before) and len(before) == len(have) and _close(have, before, rtol, scale):
        return "unchanged (the same as before)", "unchanged"
    ratio = _fit(have, want, scale)
    named = _name_factor(ratio, factors if len(want) >= 4 else {k: v for k, v in factors.items() if ")/" not in k}) \
        if ratio is not None and abs(ratio - 1) > 0.01 else None  # one number fits some ratio: N ± 1 needs many
    if named:
        return named
    for shift in (1, -1):
        if len(want) > 2 and _close(have[max(shift, 0):len(have) + min(shift, 0)],
                                    want[max(-shift, 0):len(want) + min(-shift, 0)], rtol, scale):
            return f"shifted by one position (off by one){at}", "shifted by one"
    offset = _offset(have, want, rtol, scale)
    integers = all(float(v).is_integer() for v in (*have, *want))
    if offset and integers and abs(have[0] - want[0]) <= 2:  # ranks, counts: one more than right, not ×1.5
        return offset, "off"
    if ratio is not None and abs(ratio - 1) > 0.1 and abs(ratio) > 1e-6:
        if 0 < ratio < 1:  # "4 times too small" reads better than "0.25 times the right value"
            return f"about {1 / ratio:.2g} times too small (no factor of the exercise)", f"÷{1 / ratio:.2g}"
        return f"{ratio:.2g} times the right value", f"×{ratio:.2g}"
    n = math.isqrt(len(want))
    if n > 1 and n * n == len(want) and _close(have, [want[j * n + i] for i in range(n) for j in range(n)], rtol, scale):
        return "transposed", "transposed"
    if offset and len(want) > 1 and ratio is None:
        return offset, "off"
    off = max(abs(h - w) for h, w in zip(have, want)) / scale
    size = (f"off by about {off:.1%}" if off < 0.1 else f"off by about {off:.0%}" if off < 10
            else f"off by about {off:.0f} times its size")
    part = _rows(have, want, rtol, scale, rows) if rows else f"{at}{_part(have, want, rtol, scale)}"
    return (f"{size} (relative to its largest value){part}" if len(want) > 1 else size), "off"


def _offset(have, want, rtol, scale) -> str:
    """"every value more than the right one by the same 1", when the difference is one constant (a bias, an index)."""
    diffs = [h - w for h, w in zip(have, want)]
    if max(diffs) - min(diffs) > rtol * scale or abs(diffs[0]) <= rtol * scale:
        return ""
    c = sum(diffs) / len(diffs)
    return f"every value {'more' if c > 0 else 'less'} than the right one by the same {abs(c):.3g}"


def _part(have, want, rtol, scale) -> str:
    """Which of a vector's values are wrong, when only some are: a block, or every other one, is a pattern."""
    bad = [i for i, (h, w) in enumerate(zip(have, want)) if abs(h - w) > rtol * scale]
    if len(bad) > 0.75 * len(want):  # nearly all wrong: not a pattern
        return ""
    block = bad[-1] - bad[0] + 1 == len(bad)
    span = f", elements {bad[0] + 1} to {bad[-1] + 1}" if block and len(bad) > 1 else ""
    return f"; only {len(bad)} of its {len(want)} values are wrong{span}, the others right"


def _close(a, b, rtol, scale) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rtol * scale for x, y in zip(a, b))


def _fit(have, want, scale) -> float | None:
    """The scalar r with have ≈ r × want, when one fits."""
    norm = sum(w * w for w in want)
    if norm == 0:
        return None
    r = sum(h * w for h, w in zip(have, want)) / norm
    if all(abs(h - r * w) <= FIT * max(abs(r), 1e-12) * scale + 1e-12 for h, w in zip(have, want)):
        return r
    return None


def _name_factor(ratio: float, factors: dict[str, float]) -> tuple[str, str] | None:
    for name, value in sorted(factors.items(), key=lambda kv: kv[0] in GENERIC_FACTORS):
        for v, large in ((value, True), (1 / value, False)):
            if abs(ratio - v) <= 0.01 * abs(v):
                if name == "−1" or value < 0:
                    return "the right value with the opposite sign (× −1)", "× −1"
                return (f"{name} times too large", f"×{name}") if large else (f"{name} times too small", f"÷{name}")
    return None


def _quantity(spec: Locate, path: tuple) -> str:
    """The student's word for the value at ``path``: its keys' declared words, inner ones filling a "{}" in an
    outer one ("the dtype of {}" around "dk"), positions (rank, step) left out."""
    keys = [p for p in path if isinstance(p, str) and (p in spec.names or p not in POSITIONS and p not in spec.positions)]
    words = ""
    for k in reversed(keys):
        word = spec.names.get(k, k)
        words = word.format(words).strip() if "{}" in word else f"{word} {words}".strip()
    return words or "the result"


def _word(template: str | tuple[str, ...], index: int) -> str:
    """The words of a position: a template's ("step {n}"), or the name of the item at that index."""
    if isinstance(template, tuple):
        return template[index] if index < len(template) else f"item {index + 1}"
    return template.format(i=index, n=index + 1)


def _where(spec: Locate, path: tuple) -> str:
    words = []
    for at, (parent, index) in enumerate(zip(path, path[1:])):
        if isinstance(index, int) and isinstance(parent, str):
            template = spec.positions.get(parent) or POSITIONS.get(parent)
            if template:
                words.append(_word(template, index))
        elif isinstance(index, int) and isinstance(parent, int) and at and path[at - 1] in spec.inner:
            words.append(spec.inner[path[at - 1]].format(i=index, n=index + 1))  # a parameter inside a step
    return ", ".join(words)


def _scenario(reference: dict, key: str) -> str:
    what = reference["scenarios"][key].get("case", {}).get("what")
    return what if isinstance(what, str) else key


def _summarise(spec, reference, findings, right, errors, right_at=None, seen_right=(), right_in=None) -> Localisation:
    crashed = _crashed(reference, errors) if errors else ""
    wrong_parts = {f"{f.quantity} @ {part}" for f in findings for part in _parts(f.where)}
    fine_parts = {f"{q} @ {part}" for q, wheres in (right_at or {}).items() for w in wheres for part in _parts(w)}
    signs = tuple(sorted({f"{f.quantity}: {_kind(f.short)}" for f in findings} | ({"raised"} if errors else set())))
    everything = findings
    findings, follow = _first_wrong(findings)
    by_quantity: dict[str, list[Finding]] = {}
    for f in findings:
        by_quantity.setdefault(f.quantity, []).append(f)
    scenarios = [k for k in reference.get("scenarios", {})]
    wrong, shorts = [], []
    for quantity, found in by_quantity.items():
        patterns = {}
        for f in found:
            patterns.setdefault(f.pattern, f)
        earliest = min((f.order for f in found if f.order is not None), default=None)
        first = [f for f in found if f.order == earliest] or found  # where it first goes wrong says most

        def weight(pattern: str) -> tuple:
            return (sum(f.pattern == pattern for f in first), -_telling(patterns[pattern].short))

        main = max(patterns, key=weight)
        keys = [k for k in scenarios if any(f.scenario == k for f in found)]
        where = _first_place(found)
        fine = _right_places(found, (right_at or {}).get(quantity, set()))
        for key in keys if not fine else ():  # right somewhere in one scenario: rank 0 of a causal ring
            fine = _right_places([f for f in found if f.scenario == key], (right_in or {}).get((quantity, key), set()))
            fine = f"{fine} when {_scenario(reference, key)}" if fine else ""
            if fine:
                break
        everywhere = quantity not in right and len(keys) > 1
        place = ("in every scenario" if everywhere else f"when {_scenario(reference, keys[0])}"
                 + (f" (and in {len(keys) - 1} more scenario{'s' if len(keys) > 2 else ''})" if len(keys) > 1 else ""))
        others = sorted((p for p in patterns if p != main), key=lambda p: _telling(patterns[p].short))
        ways = {f.size for f in found if f.short == "off"}
        said = main
        if patterns[main].short == "off" and len(ways) == 1 and "" not in ways:  # a direction is a pattern too
            said += f", too {'large' if ways == {'larger'} else 'small'} in size wherever it is wrong"
        wrong.append((_telling(patterns[main].short), f"{quantity}: wrong {place}"
                      f"{', first at ' + where if where else ''}: {said}"
                      + (f" (elsewhere: {others[0]})" if others else "") + (f"; right {fine}" if fine else "") + "."))
        shorts.append((_telling(patterns[main].short), f"{quantity} {patterns[main].short}"))
    right_only = tuple(sorted(q for q in right if q not in by_quantity and q not in follow))
    wrong = [w for _, w in sorted(wrong, key=lambda x: x[0])]  # a named factor or pattern says most: first
    shorts = [w for _, w in sorted(shorts, key=lambda x: x[0])]
    raised = ("" if not errors else f"stopped ({errors[0][3]})" if errors[0][3] in STOPPED
              else _not_raised(errors[0][3])[1] or f"raised {errors[0][3].split(':', 1)[0][:40]}")
    short = "; ".join(([raised] if raised else []) + shorts[:3 - bool(raised)])
    places = tuple(sorted({f"{f.quantity} @ {f.scenario}" for f in everything}))
    # a direction the calibration compares only where a ratio fits (a scale is systematic; a plain difference's
    # direction changes with the data)
    sizes = tuple(sorted({f"{f.quantity}: {f.size}" for f in everything if f.size and f.short[:1] in "×÷"}))
    try:
        deduced = spec.deduce(frozenset(by_quantity), frozenset(right_only)) if by_quantity else ""
    except Exception:  # a rule that cannot read these sets says nothing
        deduced = ""
    return Localisation(tuple(wrong), right_only, crashed, short, tuple(by_quantity), tuple(follow), signs, places,
                        tuple(dict.fromkeys(e[0] for e in errors)), sizes, tuple(sorted(set(seen_right) - set(places))),
                        tuple(sorted(wrong_parts)), tuple(sorted(fine_parts - wrong_parts)),
                        deduced if isinstance(deduced, str) else "")


def _parts(where: str) -> list[str]:
    """The positions of a place that are no time ("stage 2", "rank 1", "parameter 3"; not "step 2"): a mistake's
    named variants are wrong or right there whatever the data."""
    return [part for part in (where or "").split(", ") if part and part.split(" ")[0] not in TIME_WORDS]


def _kind(short: str) -> str:
    """A short form without the numbers that vary from run to run: an unnamed ratio ("×1.8") is just "off",
    "differs at step 3" -> "differs"; named factors ("×√d", "÷world_size") and words ("zeros") stay."""
    if short.startswith("differs"):
        return "differs"
    return "off" if short.startswith(("×", "÷")) and short[1:2] in "0123456789-" else short


def _first_wrong(findings: list[Finding]) -> tuple[list[Finding], list[str]]:
    """Where results are recorded step by step, what goes wrong first is the mistake and the rest follows from it:
    keep the quantities wrong at the first wrong step; the others (wrong only later, or only at the end) are
    consequences."""
    ordered = [f.order for f in findings if f.order is not None]
    if not ordered:
        return findings, []
    leading = {f.quantity for f in findings if f.order == min(ordered)}
    if min(ordered) > 0:  # the series go wrong only later: a result held once (the first update) that is wrong by an
        # exact relation (× −1, zeros) says where it goes wrong first
        leading |= {f.quantity for f in findings if f.order is None and _exact(f.short)}
    return [f for f in findings if f.quantity in leading], sorted({f.quantity for f in findings} - leading)


def _exact(short: str) -> bool:
    """A named factor or pattern (× −1, ÷world_size, zeros, unchanged...), not a plain difference or a count."""
    return _telling(short) == 0 and _kind(short) != "off" and not short.startswith(("+", "−", "missing", "of another"))


def _order(spec: Locate, path: tuple) -> int | None:
    for parent, index in zip(path, path[1:]):
        if isinstance(index, int) and parent in spec.by_position:
            return index
    return None


def _telling(short: str) -> int:
    """0 for a named factor or pattern, 1 for "differs", 2 for a plain "off": the order the lines are shown in."""
    return 2 if short == "off" else 1 if short == "differs" else 0


def _first_place(found: list[Finding]) -> str:
    """The first position (the earliest step, then the lowest rank...) among the wrong values, when they have one."""
    placed = sorted((f for f in found if f.where), key=lambda f: (f.order is None, f.order or 0, _place_key(f.where)))
    return placed[0].where if placed else ""


def _place_key(where: str) -> list[tuple]:
    return [(0, int(w), "") if w.isdigit() else (1, 0, w) for part in where.split(", ") for w in part.split()]




def _right_places(found: list[Finding], right_places: set[str]) -> str:
    """Along each kind of position (rank, parameter, step...), the ones where a partly wrong quantity is right
    everywhere: "right on parameter 1 and 3 (wrong on parameter 2 and 4)", "right on rank 0 (wrong on rank 1)" --
    weights right but biases not, one rank right."""
    earliest = min((f.order for f in found if f.order is not None), default=None)
    first = [f for f in found if f.order == earliest]
    time = {part for f in first for part in f.where.split(", ") if part.split(" ")[0] in TIME_WORDS}
    if earliest is not None and time:  # at the first wrong step or call: later ones differ as a consequence
        found, right_places = first, {w for w in right_places if time <= set(w.split(", "))}
    wrong, right = _by_dimension(f.where for f in found), _by_dimension(right_places)
    out = []
    for word, bad in wrong.items():
        good = sorted(right.get(word, set()) - bad, key=_number)
        if good:
            out.append(f"on {word} {_listed(good)} (wrong on {word} {_listed(sorted(bad, key=_number))})")
    return "; ".join(out[:2])


def _by_dimension(places) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for where in places:
        for part in (where or "").split(", "):
            word, _, index = part.rpartition(" ")
            if word and index:
                out.setdefault(word, set()).add(index)
    return out


def _number(index: str) -> tuple:
    return (0, int(index), "") if index.isdigit() else (1, 0, index)


def _listed(items: list[str]) -> str:
    shown = items[:4] + ([f"{len(items) - 4} more"] if len(items) > 4 else [])
    return ", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0]


TIME_WORDS = ("step", "call")
DEDUCED = "Ruled out by what is right: "  # the line of Locate.deduce, labelled apart from the wrong results


# The launcher's words for ranks that never raised in Python (checking.ABORTED, checking.DEADLOCK), as a crash's
# sentence: what happened, in place of "Your function raised ..."
STOPPED = {"aborted": "gloo stopped a rank (SIGABRT): a message arrived with another size than the rank receiving it "
                      "expected (the ranks sent or reduced tensors of different shapes)",
           "deadlock": "the ranks waited for each other until the time limit (a collective, send or receive that "
                       "another rank never reached)"}
CASE_SKIP = ("what", "seed", "model_seed", "data_seed", "lead")


def _blame(student: dict, key: str, path: tuple = ()) -> tuple[str, str]:
    """The rank that raised a scenario's error (or the error at ``path`` inside it) and the line of the cell it
    raised at, as the student's process reported them (ranks.py, observing.run_scenario; the unparsed scenario):
    ("rank 1", "line 23 of your cell: `out = ...`"), or blanks. Words only, from the student's own processes:
    they never reach a score."""
    raw = student.get("raw")
    data = raw.get("scenarios", {}).get(key) if isinstance(raw, dict) and isinstance(raw.get("scenarios"), dict) else None
    for step in path[:8]:
        data = (data.get(step) if isinstance(data, dict) and isinstance(step, str) else
                data[step] if isinstance(data, list) and isinstance(step, int) and 0 <= step < len(data) else None)
    if not isinstance(data, dict):
        return "", ""
    rank, line, cell, code = data.get("rank"), data.get("line"), data.get("cell"), data.get("code")
    where = f"rank {rank}" if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1024 else ""
    if not (isinstance(line, int) and not isinstance(line, bool) and 0 < line < 100_000 and isinstance(cell, str)):
        return where, ""
    code = " ".join(code.split())[:100] if isinstance(code, str) else ""
    return where, f"line {line} of {' '.join(cell.split())[:60]}" + (f": `{code.replace('`', chr(39))}`" if code else "")


def _crashed(reference: dict, errors: list[tuple[str, str, str, str]]) -> str:
    """The crash, once: the student's exception, where (a rank, a step, the line of their cell), which scenarios
    raised and which did not, and what the raising ones have in common ("only when stage=3", "only on rank 1")."""
    scenarios = {k: v for k, v in reference.get("scenarios", {}).items() if isinstance(v, dict) and "error" not in v}
    key, where, at, error = errors[0]
    first = error.strip().split(".  ")[0].split("\n")[0][:160].rstrip(".")
    raised = list(dict.fromkeys(e[0] for e in errors))
    ran = [k for k in scenarios if k not in raised]
    returned = _not_raised(first)[0]
    line = (returned or (f"Your function raised {first}" if first not in STOPPED else f"Nothing raised, but {STOPPED[first]},")) \
        + f" when {_scenario(reference, key)}" + (f" (on {where})" if where else "")
    lines, verb = {e[2] for e in errors}, "raised" if first not in STOPPED and not returned else "happened"
    if at:
        line += f", at {at}" if len(lines) == 1 else f", first at {at}"
    others = sorted({e[3].strip().split(":", 1)[0][:40] for e in errors} - {first.split(":", 1)[0]})
    positions = {e[1] for e in errors}
    same_place = f", each time on {where}" if len(positions) == 1 and where and len(errors) > 1 else ""
    if not ran:
        line += f"; it {verb} in every scenario ({len(raised)}){same_place}" if len(raised) > 1 else ""
    else:
        common = _in_common(scenarios, raised, ran) if not same_place else ""
        line += (f"; it {verb} in {len(raised)} of {len(scenarios)} scenarios{same_place}"
                 + (f", only {common}" if common else "")
                 + f"; it ran without {'raising' if verb == 'raised' else 'it' if not returned else 'that'} when "
                 f"{_scenario(reference, ran[0])}"
                 + (f" and in {len(ran) - 1} more" if len(ran) > 1 else ""))
    wheres = sorted({e[1] for e in errors if e[1]}, key=_place_key)
    if len(wheres) > 1 and verb == "raised":  # which rank a deadlock or an abort reached first is timing, not code
        line += f"; it {verb} on {', '.join(wheres[:4])}"
        if all(e[1].startswith("rank ") for e in errors) and "rank 0" not in wheres:
            line += ", never on rank 0"
    return line + (f" (elsewhere also {', '.join(others)})" if others else "") + "."


def _not_raised(error: str) -> tuple[str, str]:
    """A scenario's error that is no exception (parse.py's words for results it could not take): the crash line's
    start and the short form, in what the function did; ("", "") for an exception."""
    if error.startswith(DIFFERENT):
        return (f"Your function returned results shaped otherwise than the reference's "
                f"({error.removeprefix(DIFFERENT)[:120]})", "returned another shape")
    if error.startswith(MALFORMED):
        return f"Your function's results could not be read ({error.removeprefix(MALFORMED)[:120]})", "unreadable results"
    if error == MISSING:
        return "Your function gave no result", "no result"
    return "", ""


def _in_common(scenarios: dict, raised: list[str], ran: list[str]) -> str:
    """A setting every raising scenario has and no scenario that ran has: "when world_size=3"."""
    def value(key, name):
        v = scenarios[key].get("case", {}).get(name)
        return v if isinstance(v, (str, int, float, bool)) or v is None else repr(v)

    names = [n for n in scenarios[raised[0]].get("case", {}) if n not in CASE_SKIP and "seed" not in n]
    for name in names:
        values = {value(k, name) for k in raised}
        if len(values) == 1 and not values & {value(k, name) for k in ran}:
            v = values.pop()
            return f"when {name}={v}" if not isinstance(v, bool) else f"when {name} is {v}"
    for name in names:  # never with the value every scenario that ran has
        values = {value(k, name) for k in ran}
        if len(values) == 1 and not values & {value(k, name) for k in raised}:
            return f"when {name} is not {values.pop()}"
    return ""


def _size(want, have) -> str:
    """"larger" or "smaller" when the value's magnitude clearly is (by 5 %), else "": a mistake's direction (a
    norm clipped too hard is smaller, never clipped larger) holds whatever the data."""
    if isinstance(want, Real) and isinstance(have, Real):
        want, have = [want], [have]
    if not (_numbers(want) and _numbers(have)) or len(want) != len(have) or not all(math.isfinite(h) for h in have):
        return ""
    a, b = sum(abs(h) for h in have), sum(abs(w) for w in want)
    return "larger" if a > 1.05 * b else "smaller" if a < 0.95 * b else ""

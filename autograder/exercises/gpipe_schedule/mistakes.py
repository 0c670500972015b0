"""The known mistakes of ``gpipe_schedule`` and their fingerprints in the returned tables (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/gpipe_schedule.py (tests/exercises/test_diagnosis.py).
A fingerprint reads the raw table of the lesson's example (main_0) or of every main scenario, never trusting its shape.
"""
from ..judging.diagnosis import EVERY, Mistake, ran, raw_text
from ..judging.localise import Locate
from .cases import EDGES, MAIN


def _pm(reference, key):
    c = reference["scenarios"][key]["case"]
    return c["num_stages"], c["num_microbatches"]


def _table(student, key) -> list:
    data = ran(student, key)
    if data.get("type") != "list" or not isinstance(data.get("table"), list):
        raise KeyError(key)
    return data["table"]


def _op(slot):
    """('F', j) or ('B', j) from a well-formed slot, else None."""
    if isinstance(slot, list) and len(slot) == 2 and slot[0] in ("F", "B") and type(slot[1]) is int:
        return slot[0], slot[1]
    return None


def _start(table, stage, op):
    for t, step in enumerate(table):
        if isinstance(step, list) and stage < len(step) and _op(step[stage]) == op:
            return t
    return None


def _every_main(student, reference, test) -> str | None:
    """test(table, p, m) -> words for the lesson's example, when it holds in every main scenario."""
    seen = None
    for key in MAIN:
        p, m = _pm(reference, key)
        found = test(_table(student, key), p, m)
        if not found:
            return None
        seen = seen or f"with num_stages={p}, num_microbatches={m} {found}"
    return seen


def one_stage_too_many(student, reference):
    return _every_main(student, reference, lambda t, p, m: all(isinstance(s, list) and len(s) == p + 1 for s in t)
                       and f"each time step holds {p + 1} slots, one more than the stages")


def one_stage_too_few(student, reference):
    def test(t, p, m):
        idle = all(isinstance(s, list) and len(s) == p and s[p - 1] is None for s in t)
        busy = any(_op(slot) for s in t for slot in s[:p - 1])
        return idle and busy and f"the last stage (stage {p - 1}) never runs anything"
    return _every_main(student, reference, test)


def too_long_by_one(student, reference):
    return _every_main(student, reference, lambda t, p, m: len(t) == 2 * (m + p - 1) + 1
                       and f"the table has {len(t)} time steps, one more than 2(m + p - 1)")


def backward_overwrites_last_forward(student, reference):
    def test(t, p, m):
        early = all(_start(t, s, ("B", j)) == m + p - 2 + (p - 1 - s) + j for s in range(p) for j in range(1, m))
        return (p > 1 and m > 1 and early and _start(t, p - 1, ("B", 0)) is None and _start(t, 0, ("F", 0)) == 0
                and f"every backward runs one step early, so on the last stage the forward of micro-batch {m - 1} "
                    "lands on the step of the backward of micro-batch 0 and overwrites it")
    return _every_main(student, reference, test)


def backward_starts_same_step_everywhere(student, reference):
    def test(t, p, m):
        starts = {_start(t, s, ("B", 0)) for s in range(p)}
        return (p > 1 and len(starts) == 1 and None not in starts
                and f"every stage starts its backwards at the same step ({starts.pop()})")
    return _every_main(student, reference, test)


def forward_without_stage_offset(student, reference):
    def test(t, p, m):
        return (p > 1 and all(_start(t, s, ("F", 0)) == 0 for s in range(p))
                and "every stage runs the forward of micro-batch 0 at step 0, before the stage before it")
    return _every_main(student, reference, test)


def one_f_one_b_order(student, reference):
    def test(t, p, m):
        for stage in range(p):
            kinds = [_op(step[stage])[0] for step in t if isinstance(step, list) and stage < len(step) and _op(step[stage])]
            if "B" in kinds and "F" in kinds[kinds.index("B"):]:
                return f"stage {stage} runs a forward after it has started its backwards (1F1B's order)"
        return None
    for key in MAIN:  # in some main scenario (with m <= p - 1 the two orders coincide)
        p, m = _pm(reference, key)
        found = test(_table(student, key), p, m)
        if found:
            return f"with num_stages={p}, num_microbatches={m} {found}"
    return None


def stages_as_rows(student, reference):
    return _every_main(student, reference, lambda t, p, m: len(t) == p and p != 2 * (m + p - 1)
                       and all(isinstance(r, list) and len(r) == 2 * (m + p - 1) for r in t)
                       and f"the table has {p} rows of {2 * (m + p - 1)} entries: one row per stage, not per time step")


def strings_instead_of_tuples(student, reference):
    return _every_main(student, reference, lambda t, p, m: any(
        isinstance(slot, str) and slot[:1] in ("F", "B") for s in t if isinstance(s, list) for slot in s)
        and "the slots are strings such as 'F0', not pairs ('F', 0)")


def microbatches_from_one(student, reference):
    def test(t, p, m):
        js = {_op(slot)[1] for s in t if isinstance(s, list) for slot in s if _op(slot)}
        return js == set(range(1, m + 1)) and f"the micro-batches are numbered 1 to {m}, not 0 to {m - 1}"
    return _every_main(student, reference, test)


def sequential_no_pipelining(student, reference):
    def test(t, p, m):
        one_at_a_time = all(isinstance(s, list) and sum(_op(x) is not None for x in s) <= 1 for s in t)
        return (p > 1 and len(t) == 2 * p * m and one_at_a_time
                and f"only one stage works at each of the {len(t)} time steps: the micro-batches run one after another")
    return _every_main(student, reference, test)


def breaks_with_one_stage(student, reference):
    main_ok = all(_table(student, key) in reference["accepted"][key] for key in MAIN)
    for key in EDGES:
        p, m = _pm(reference, key)
        if p == 1 and _table(student, key) not in reference["accepted"][key]:
            return main_ok and f"the main cases are right, but with num_stages=1, num_microbatches={m} the table is not"
    return None


def returns_a_dict(student, reference):
    types = {raw_text(student, key, "type") for key in MAIN}
    return types == {"dict"} and "your function returned a dict, not a list of time steps"


def returns_an_empty_table(student, reference):
    return _every_main(student, reference, lambda t, p, m: not t and "your function returned an empty list")


def all_idle(student, reference):
    return _every_main(student, reference, lambda t, p, m: t and all(
        isinstance(s, list) and all(x is None for x in s) for s in t) and f"all {len(t)} time steps are idle")


MISTAKES = [
    Mistake("one_stage_too_many", "Your table has a slot for one stage more than num_stages.",
            "Each time step must hold exactly one slot per stage.", "Make each time step [None] * num_stages.",
            one_stage_too_many),
    Mistake("one_stage_too_few", "You fill the slots of num_stages - 1 stages only.",
            "The last stage then never runs its forwards and backwards.",
            "Loop over range(num_stages) stages.", one_stage_too_few),
    Mistake("too_long_by_one", "Your table has one time step too many.",
            "GPipe's schedule takes 2(m + p - 1) steps; an extra idle step adds to the bubble.",
            "Make the table 2 * (num_microbatches + num_stages - 1) steps long.", too_long_by_one),
    Mistake("backward_overwrites_last_forward", "Your backwards start one step too early on the last stage.",
            "The last stage's first backward then lands on the step of its last forward and overwrites it.",
            "Start the last stage's backward of micro-batch 0 right after its forward of micro-batch m - 1.",
            backward_overwrites_last_forward),
    Mistake("backward_starts_same_step_everywhere", "Every stage starts its backwards at the same time step.",
            "A stage's backward needs the gradient from the stage after it: backwards flow from the last stage down.",
            "Offset stage s's backwards by (p - 1 - s) steps.", backward_starts_same_step_everywhere),
    Mistake("forward_without_stage_offset", "Every stage starts its forwards at step 0.",
            "A stage's forward needs the previous stage's output: forwards flow from stage 0 up, one step apart.",
            "Run the forward of micro-batch j on stage s at step s + j.", forward_without_stage_offset),
    Mistake("one_f_one_b_order", "You interleave forwards and backwards on a stage (the 1F1B schedule).",
            "GPipe runs every forward of a stage before any of its backwards; 1F1B is another schedule.",
            "Finish all forwards on each stage before starting its backwards.", one_f_one_b_order),
    Mistake("stages_as_rows", "Your table has one row per stage, each a list of time steps (the transpose).",
            "The contract is one entry per time step, each holding one slot per stage.",
            "Return the transpose: a list of time steps, each a list of num_stages slots.", stages_as_rows),
    Mistake("strings_instead_of_tuples", "Your slots are strings such as 'F0'.",
            "A slot must be None or a pair ('F', j) / ('B', j).", "Put ('F', j) and ('B', j) tuples in the slots.",
            strings_instead_of_tuples),
    Mistake("microbatches_from_one", "You number the micro-batches from 1.",
            "Micro-batches are numbered 0 to num_microbatches - 1.", "Use j in range(num_microbatches).",
            microbatches_from_one),
    Mistake("sequential_no_pipelining", "You run the micro-batches one after another through all stages.",
            "Then only one stage works at a time: no pipelining, a bubble of (p - 1)/p.",
            "Start micro-batch j on stage s at step s + j, so stages work on different micro-batches at once.",
            sequential_no_pipelining, includes=("one_f_one_b_order",)),
    Mistake("breaks_with_one_stage", "Your function treats num_stages=1 as a special case, and gets it wrong.",
            "With one stage the general formula already gives the right table (m forwards, then m backwards).",
            "Drop the special case, or make it return the general formula's table.", breaks_with_one_stage,
            explains=("edge cases",)),
    Mistake("returns_a_dict", "Your function returns a dict.", "The contract is a list of time steps.",
            "Return a list with one entry per time step.", returns_a_dict),
    Mistake("returns_an_empty_table", "Your function returns an empty list.",
            "Every forward and backward of every micro-batch must appear in the table.",
            "Build the table with 2(m + p - 1) time steps.", returns_an_empty_table, includes=EVERY),
    Mistake("all_idle", "Your table has the right number of time steps, but every slot is None.",
            "Every forward and backward of every micro-batch must appear in the table.",
            "Fill the slots with ('F', j) and ('B', j).", all_idle, includes=EVERY,
            variants=("idle_steps_of_the_right_length",)),
]


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
# time steps and stages numbered from 0, as the exercise text and the checks number them
LOCATE = Locate(names={"length": "the schedule's length", "table": "the schedule table", "type": "the returned type"},
                whole={"table": "time step {i}"}, entries={"table": "stage {i}"})

"""The checks of ``gpipe_schedule``: they parse the returned table themselves, never trusting its shape."""
from ..judging.checking import ScenarioError, case, scenario
from .cases import EDGES, MAIN, MAX_STEPS, _what


def sizes(reference, key) -> tuple[int, int]:
    """(num_stages, num_microbatches) of a scenario, as the reference observed it."""
    c = case(reference, key)
    return c["num_stages"], c["num_microbatches"]


def read_table(student, reference, key):
    """The student's table for the scenario as a list of steps of (kind, j) / None, or a ScenarioError."""
    p, m = sizes(reference, key)
    data = scenario(student, key, f"called with {_what(p, m)}")
    if data.get("type") != "list":
        raise ScenarioError(f"With {_what(p, m)} your function returned a {data.get('type')}, "
                            "not a list of time steps.")
    if data["length"] > MAX_STEPS:
        raise ScenarioError(f"With {_what(p, m)} your table has {data['length']} time steps, far more than "
                            f"a schedule needs.")
    table = []
    for t, step in enumerate(data["table"]):
        if not isinstance(step, list) or len(step) != p:
            size = f"{len(step)} slots" if isinstance(step, list) else f"a {type(step).__name__}"
            raise ScenarioError(f"With {_what(p, m)} time step {t} holds {size}; each time step must be a list "
                                f"with one slot per stage ({p}).")
        row = []
        for s, slot in enumerate(step):
            if slot is None:
                row.append(None)
                continue
            ok = (isinstance(slot, list) and len(slot) == 2 and slot[0] in ("F", "B")
                  and isinstance(slot[1], int) and not isinstance(slot[1], bool) and 0 <= slot[1] < m)
            if not ok:
                raise ScenarioError(f"With {_what(p, m)} the slot of stage {s} at time step {t} is {repr(slot)[:60]}; "
                                    f"a slot must be None, ('F', j) or ('B', j) with 0 <= j < {m}.")
            row.append((slot[0], slot[1]))
        table.append(row)
    return table


def when_ops_run(table, p, m):
    """{(kind, stage, j): [time steps]} for every operation in the table."""
    times = {(kind, s, j): [] for kind in "FB" for s in range(p) for j in range(m)}
    for t, step in enumerate(table):
        for s, slot in enumerate(step):
            if slot is not None:
                times[(slot[0], s, slot[1])].append(t)
    return times


# ---- the checks ----------------------------------------------------------------------------

def all_ops_appear(got: dict, want: dict) -> str | None:
    """The evidence: the table holds the forward and the backward of every micro-batch of this scenario (on some
    stage). A constant table, or none, cannot: it shows the function worked from num_microbatches."""
    m = want["case"]["num_microbatches"]
    table = got.get("table") if got.get("type") == "list" else None
    seen = {(slot[0], slot[1]) for step in table if isinstance(step, list) for slot in step
            if isinstance(slot, list) and len(slot) == 2 and type(slot[1]) is int} if isinstance(table, list) else set()
    if all((kind, j) in seen for kind in "FB" for j in range(m)):
        return None
    return f"when {want['case']['what']}, your table does not hold the forward and the backward of every micro-batch."


def check_format(student, reference):
    for key in MAIN + EDGES:
        read_table(student, reference, key)
    return None


def check_every_op_once(student, reference):
    for key in MAIN:
        p, m = sizes(reference, key)
        times = when_ops_run(read_table(student, reference, key), p, m)
        for (kind, s, j), ts in times.items():
            if len(ts) != 1:
                word = "never runs" if not ts else f"runs {len(ts)} times (at steps {ts[:4]})"
                return (f"With {_what(p, m)} the {'forward' if kind == 'F' else 'backward'} of micro-batch {j} "
                        f"on stage {s} {word}; each must run exactly once on every stage.")
    return None


def check_dependencies(student, reference):
    for key in MAIN:
        p, m = sizes(reference, key)
        times = when_ops_run(read_table(student, reference, key), p, m)
        first = {op: min(ts) for op, ts in times.items() if ts}
        for (kind, s, j), t in sorted(first.items(), key=lambda item: item[1]):
            needs = []
            if kind == "F" and s > 0:
                needs.append((("F", s - 1, j), f"the forward of micro-batch {j} on stage {s - 1} (its input)"))
            if kind == "B" and s < p - 1:
                needs.append((("B", s + 1, j), f"the backward of micro-batch {j} on stage {s + 1} (its gradient)"))
            if kind == "B":
                needs.append((("F", s, j), "its own forward (the saved activations)"))
            for op, what in needs:
                if op not in first or first[op] >= t:
                    name = "forward" if kind == "F" else "backward"
                    return (f"With {_what(p, m)} the {name} of micro-batch {j} on stage {s} runs at step {t}, but "
                            f"{what} has not run on an earlier step: an operation needs its inputs first.")
    return None


def check_gpipe_order(student, reference):
    for key in MAIN:
        p, m = sizes(reference, key)
        table = read_table(student, reference, key)
        for s in range(p):
            kinds = [step[s][0] for step in table if step[s] is not None]
            if "B" in kinds and "F" in kinds[kinds.index("B"):]:
                t = [t for t, step in enumerate(table) if step[s] is not None and step[s][0] == "F"][-1]
                return (f"With {_what(p, m)} stage {s} runs a forward at step {t} after it has started backwards: "
                        "that is 1F1B's order; in GPipe every stage finishes all forwards before any backward.")
    return None


def check_minimal_length(student, reference):
    for key in MAIN:
        p, m = sizes(reference, key)
        table = read_table(student, reference, key)
        want = 2 * (m + p - 1)
        if len(table) != want:
            return (f"With {_what(p, m)} your table has {len(table)} time steps; the shortest GPipe schedule has "
                    f"2(m + p - 1) = {want}: start every operation as early as its inputs allow.")
    return None


def check_bubble(student, reference):
    for key in MAIN:
        p, m = sizes(reference, key)
        table = read_table(student, reference, key)
        idle = sum(slot is None for step in table for slot in step)
        busy = sum(slot is not None for step in table for slot in step)
        fraction = idle / (idle + busy) if idle + busy else 1.0
        want = (p - 1) / (m + p - 1)
        if busy != 2 * p * m or abs(fraction - want) > 1e-12:
            return (f"With {_what(p, m)} {fraction:.3f} of the stage-steps in your table are idle; the GPipe bubble "
                    f"is (p - 1)/(m + p - 1) = {want:.3f}, with 2m busy steps per stage.")
    return None


def _matches(student, reference, keys):
    for key in keys:
        p, m = sizes(reference, key)
        table = [[list(slot) if slot else None for slot in step] for step in read_table(student, reference, key)]
        if table not in reference["accepted"][key]:
            ref = reference["accepted"][key][0]
            for t, (got, want) in enumerate(zip(table, ref)):
                if got != want:
                    shown = [tuple(x) if x else None for x in got]
                    return (f"With {_what(p, m)} your table first departs from the reference schedule at time "
                            f"step {t}, where it runs {shown}: take the micro-batches in order and start each "
                            "operation as early as possible.")
            return f"With {_what(p, m)} your table has {len(table)} time steps; the reference has {len(ref)}."
    return None


def check_reference(student, reference):
    return _matches(student, reference, MAIN)


def check_edges(student, reference):
    return _matches(student, reference, EDGES)

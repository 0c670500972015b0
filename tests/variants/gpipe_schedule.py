"""Submissions for `gpipe_schedule`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell. A wrong entry names the checks (by a
phrase of their title) that must fail for it.
"""
from variants import EVERY_CHECK

CORRECT = {
    "closed_form": '''
def gpipe_schedule(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    table = [[None] * p for _ in range(2 * (m + p - 1))]
    for s in range(p):
        for j in range(m):
            table[s + j][s] = ("F", j)
            table[m + p - 1 + (p - 1 - s) + j][s] = ("B", j)
    return table
''',
    "backward_last_microbatch_first": '''
def gpipe_schedule(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    T = 2 * (m + p - 1)
    table = [[None for _ in range(p)] for _ in range(T)]
    for s in range(p):
        for j in range(m):
            table[s + j][s] = ("F", j)
            table[T - 1 - s - j][s] = ("B", j)   # mirror image of the forward wave
    return table
''',
    "lists_instead_of_tuples": '''
def gpipe_schedule(num_stages, num_microbatches):
    steps = []
    T = 2 * (num_microbatches + num_stages - 1)
    for t in range(T):
        row = []
        for s in range(num_stages):
            j_fwd = t - s
            j_bwd = t - (num_microbatches + num_stages - 1) - (num_stages - 1 - s)
            if 0 <= j_fwd < num_microbatches:
                row.append(["F", j_fwd])
            elif 0 <= j_bwd < num_microbatches:
                row.append(["B", j_bwd])
            else:
                row.append(None)
        steps.append(row)
    return steps
''',
    "event_simulation": '''
def gpipe_schedule(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    orders = [[("F", j) for j in range(m)] + [("B", j) for j in range(m)] for _ in range(p)]
    done, table, pos = {}, [], [0] * p
    while any(pos[s] < 2 * m for s in range(p)):
        t, step = len(table), [None] * p
        for s in range(p):
            if pos[s] == 2 * m:
                continue
            kind, j = orders[s][pos[s]]
            if kind == "F":
                ready = s == 0 or done.get(("F", s - 1, j), t) < t
            else:
                ready = done.get(("F", s, j), t) < t and (s == p - 1 or done.get(("B", s + 1, j), t) < t)
            if ready:
                step[s] = (kind, j)
                pos[s] += 1
        for s, op in enumerate(step):
            if op:
                done[(op[0], s, op[1])] = t
        table.append(step)
    return table
''',
    "tuple_of_tuples_and_prints": '''
def gpipe_schedule(num_stages, num_microbatches):
    import sys
    p, m = num_stages, num_microbatches
    grid = {}
    for s in range(p):
        for j in range(m):
            grid[(s + j, s)] = ("F", j)
            grid[(2 * (m + p - 1) - 1 - s - (m - 1 - j), s)] = ("B", j)
    print("schedule for", p, "stages", file=sys.stderr)
    return tuple(tuple(grid.get((t, s)) for s in range(p)) for t in range(2 * (m + p - 1)))
''',
}

_CLOSED = '''
def gpipe_schedule(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    table = [[None] * p for _ in range({length})]
    for s in range({stages}):
        for j in range(m):
            table[{fwd}][s] = ("F", j)
            table[{bwd}][s] = ("B", j)
    return table
'''


def _closed(length="2 * (m + p - 1)", stages="p", fwd="s + j", bwd="m + p - 1 + (p - 1 - s) + j"):
    return _CLOSED.format(length=length, stages=stages, fwd=fwd, bwd=bwd)


WRONG = {
    "one_stage_too_many": (_closed(length="2 * (m + p)", fwd="s + j", bwd="m + p + (p - s) + j").replace(
        "[None] * p", "[None] * (p + 1)").replace("range(p):", "range(p + 1):"), ["documented table"]),
    "one_stage_too_few": (_closed(stages="p - 1"), ["exactly once", "bubble", "reference"]),
    "too_long_by_one": (_closed(length="2 * (m + p - 1) + 1"), ["as short", "bubble", "reference"]),
    "backward_overwrites_last_forward": (_closed(bwd="m + p - 2 + (p - 1 - s) + j"), ["exactly once", "reference"]),
    "backward_starts_same_step_everywhere": (_closed(bwd="m + p - 1 + j", length="2 * (m + p - 1)"),
                                             ["dependencies", "reference"]),
    "forward_without_stage_offset": (_closed(fwd="j", bwd="m + p - 1 + (p - 1 - s) + j"),
                                     ["dependencies", "reference"]),
    "one_f_one_b_order": ('''
def gpipe_schedule(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    orders = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        order, f = [("F", j) for j in range(warm)], warm
        for b in range(m):
            if f < m:
                order.append(("F", f))
                f += 1
            order.append(("B", b))
        orders.append(order)
    done, table, pos = {}, [], [0] * p
    while any(pos[s] < 2 * m for s in range(p)):
        t, step = len(table), [None] * p
        for s in range(p):
            if pos[s] == 2 * m:
                continue
            kind, j = orders[s][pos[s]]
            if kind == "F":
                ready = s == 0 or done.get(("F", s - 1, j), t) < t
            else:
                ready = done.get(("F", s, j), t) < t and (s == p - 1 or done.get(("B", s + 1, j), t) < t)
            if ready:
                step[s] = (kind, j)
                pos[s] += 1
        for s, op in enumerate(step):
            if op:
                done[(op[0], s, op[1])] = t
        table.append(step)
    return table
''', ["GPipe's order", "reference"]),
    "stages_as_rows": ('''
def gpipe_schedule(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    rows = [[None] * (2 * (m + p - 1)) for _ in range(p)]
    for s in range(p):
        for j in range(m):
            rows[s][s + j] = ("F", j)
            rows[s][m + p - 1 + (p - 1 - s) + j] = ("B", j)
    return rows
''', ["documented table"]),
    "strings_instead_of_tuples": (_closed().replace('("F", j)', 'f"F{j}"').replace('("B", j)', 'f"B{j}"'),
                                  ["documented table"]),
    "microbatches_from_one": (_closed().replace('("F", j)', '("F", j + 1)').replace('("B", j)', '("B", j + 1)'),
                              ["documented table"]),
    "sequential_no_pipelining": ('''
def gpipe_schedule(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    table = []
    for j in range(m):
        for s in range(p):
            step = [None] * p
            step[s] = ("F", j)
            table.append(step)
        for s in reversed(range(p)):
            step = [None] * p
            step[s] = ("B", j)
            table.append(step)
    return table
''', ["GPipe's order", "as short", "bubble"]),
    "breaks_with_one_stage": ('''
def gpipe_schedule(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    if p == 1:
        return [[("F", j)] for j in range(m)] + [[("B", m - 1 - j)] for j in range(m)][1:]
    table = [[None] * p for _ in range(2 * (m + p - 1))]
    for s in range(p):
        for j in range(m):
            table[s + j][s] = ("F", j)
            table[m + p - 1 + (p - 1 - s) + j][s] = ("B", j)
    return table
''', ["edge cases"]),
    "returns_a_dict": ('''
def gpipe_schedule(num_stages, num_microbatches):
    return {(s, j): s + j for s in range(num_stages) for j in range(num_microbatches)}
''', ["documented table", "reference"]),
    "returns_an_empty_table": ('''
def gpipe_schedule(num_stages, num_microbatches):
    return []
''', EVERY_CHECK),
    "idle_steps_of_the_right_length": ('''
def gpipe_schedule(num_stages, num_microbatches):
    return [[None] * num_stages for _ in range(2 * (num_microbatches + num_stages - 1))]
''', EVERY_CHECK),
    "not_implemented": ('''
def gpipe_schedule(num_stages, num_microbatches):
    # YOUR CODE HERE
    raise NotImplementedError()
''', ["documented table", "reference", "edge cases"]),
}

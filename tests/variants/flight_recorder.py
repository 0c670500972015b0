"""Submissions for `FlightRecorder` (Lesson 9): valid styles and the classic mistakes of finding a hang from the store.

Each source is a student's exercise cell, run after the notebook's setup cells in every rank.
"""
from variants import EVERY_CHECK

MISSING = "Names every rank"
WAITS = "Waits up to the deadline"
RETURNS = "Returns by its deadline"
LAST = "last collective"
GROUPS = "process group's sequence numbers"

# Every deadlocking variant costs the launch timeout in each scenario with a held rank: public scenarios only.
PUBLIC_ONLY = {"blocks_forever", "gets_without_checking"}

# The reference's shape; REPORT is the body of report() after `last` is read (each variant says how it decides).
_BODY = '''
import time


class FlightRecorder:
    def __init__(self, store, group, name):
        self.store, self.name = store, name
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.seq = 0

    def record(self, kind):
        self.seq += 1
        self.store.set(f"{self.name}/last/{self.rank}", f"{self.seq} {kind}")

    def entries(self):
        last = []
        for rank in range(self.world_size):
            key = f"{self.name}/last/{rank}"
            if self.store.check([key]):
                seq, kind = self.store.get(key).decode().split(" ", 1)
                last.append([int(seq), kind])
            else:
                last.append(None)
        return last

    def report(self, deadline_s):
        end = time.monotonic() + deadline_s
        while True:
            last = self.entries()
            behind = [rank for rank, entry in enumerate(last) if entry is None or entry[0] < self.seq]
REPORT
            time.sleep(0.01)
'''


def _variant(report: str, body: str = _BODY) -> str:
    return body.replace("REPORT\n", report)


CORRECT = {
    "counters_and_one_key_per_collective": '''
import time


class FlightRecorder:
    """Sequence numbers as store counters (add), the kind under a key per collective; prints what it finds."""

    def __init__(self, store, group, name):
        self.store, self.prefix = store, f"fr/{name}"
        self.rank, self.size = group.rank(), group.size()
        self.entered = 0

    def record(self, kind):
        self.entered += 1
        self.store.set(f"{self.prefix}/{self.rank}/{self.entered}", kind)
        self.store.add(f"{self.prefix}/{self.rank}/seq", 1)

    def last_of(self, rank):
        seq = self.store.add(f"{self.prefix}/{rank}/seq", 0)  # 0 when it never checked in: add() never waits
        return (seq, self.store.get(f"{self.prefix}/{rank}/{seq}").decode()) if seq else None

    def report(self, deadline_s):
        give_up = time.time() + deadline_s
        while True:
            last = [self.last_of(r) for r in range(self.size)]
            missing = tuple(r for r in range(self.size) if last[r] is None or last[r][0] < self.entered)
            if not missing or time.time() > give_up:
                print(f"rank {self.rank}: waiting for {missing}")
                return {"last": last, "missing": missing}
            time.sleep(0.005)
''',
    "wait_with_timeout_json": '''
import json
import time
from datetime import timedelta


class FlightRecorder:
    """One key per (collective, rank) that the report waits on with the store's own timed wait; JSON entries."""

    def __init__(self, store, group, name):
        self.store, self.name = store, name
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.count = 0

    def record(self, kind):
        self.count += 1
        self.store.set(f"{self.name}:last:{self.rank}", json.dumps([self.count, kind]))
        self.store.set(f"{self.name}:{self.count}:{self.rank}", "in")  # last: once seen, the entry is there

    def report(self, deadline_s):
        here = [f"{self.name}:{self.count}:{r}" for r in range(self.world)]
        try:
            self.store.wait(here, timedelta(seconds=deadline_s))
        except Exception:  # the deadline passed: someone is missing
            pass
        missing = [r for r, key in enumerate(here) if not self.store.check([key])]
        last = [json.loads(self.store.get(f"{self.name}:last:{r}")) if self.store.check([f"{self.name}:last:{r}"])
                else None for r in range(self.world)]
        return dict(missing=missing, last=last)
''',
    "reference_shape_sorted_set": _variant('''
            if not behind or time.monotonic() >= end:
                return {"missing": sorted(set(behind)), "last": [tuple(e) if e else None for e in last]}
'''),
}

WRONG = {
    "only_first_missing": (_variant('''
            if not behind or time.monotonic() >= end:
                return {"missing": behind[:1], "last": last}
'''), [MISSING]),
    "blames_rank_0": (_variant('''
            if not behind or time.monotonic() >= end:
                return {"missing": [0] if behind else [], "last": last}
'''), [MISSING]),
    "never_waits": (_variant('''
            return {"missing": behind, "last": last}
'''), [WAITS]),
    "blocks_forever": (_variant('''
            if not behind:
                return {"missing": behind, "last": last}
'''), [RETURNS]),
    "gets_without_checking": (_BODY.replace("            if self.store.check([key]):", "            if True:").replace(
        "REPORT\n", '''            if not behind or time.monotonic() >= end:
                return {"missing": behind, "last": last}
'''), [RETURNS]),
    "one_counter_for_all_groups": (_variant('''
            if not behind or time.monotonic() >= end:
                return {"missing": behind, "last": last}
''', _BODY.replace("        self.seq = 0\n", "").replace("    def record(self, kind):\n        self.seq += 1\n",
                                                            "    seq = 0\n\n    def record(self, kind):\n"
                                                            "        FlightRecorder.seq += 1\n"
                                                            "        self.seq = FlightRecorder.seq\n")), [GROUPS]),
    "ignores_group_name": (_variant('''
            if not behind or time.monotonic() >= end:
                return {"missing": behind, "last": last}
''', _BODY.replace('f"{self.name}/last/', 'f"last/')), [GROUPS]),
    "does_nothing": ('''
class FlightRecorder:
    def __init__(self, store, group, name):
        pass

    def record(self, kind):
        pass

    def report(self, deadline_s):
        return {"missing": [], "last": []}
''', EVERY_CHECK),
    "not_implemented": ('''
class FlightRecorder:
    def __init__(self, store, group, name):
        # YOUR CODE HERE
        raise NotImplementedError()

    def record(self, kind):
        # YOUR CODE HERE
        raise NotImplementedError()

    def report(self, deadline_s):
        # YOUR CODE HERE
        raise NotImplementedError()
''', EVERY_CHECK),
}

"""Observing ``gpipe_schedule``: the returned table as plain lists (pure Python: no torch)."""
from ..beside.observing import observation, plain
from .cases import MAX_STEPS, cases


def _call(fn, case):
    table = fn(case["num_stages"], case["num_microbatches"])
    if not isinstance(table, (list, tuple)):
        return {"type": type(table).__name__}
    return {"type": "list", "length": len(table), "table": plain(table, sizes=(MAX_STEPS, 64, 64))}


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: _call(fn, case))


def _relabel_backward(table, m):
    """The same table with backward micro-batches taken in the other order (last first)."""
    return [[["B", m - 1 - slot[1]] if isinstance(slot, list) and slot[0] == "B" else slot for slot in step]
            for step in table]


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["accepted"] = {key: [data["table"], _relabel_backward(data["table"], data["case"]["num_microbatches"])]
                          for key, data in result["scenarios"].items()}
    return result

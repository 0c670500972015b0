"""Observing ``zero_memory_per_rank``: numbers and exception names only (pure arithmetic: no torch)."""
from ..beside.define import cell_line
from ..beside.observing import describe_exception, observation, plain
from .cases import STAGES, cases


def _call(fn, case, stage):
    args = (case["num_params"], case["world_size"], stage)
    layout = case["bytes_per_param"]
    try:
        value = fn(*args) if layout is None else fn(*args, bytes_per_param=tuple(layout))
    except Exception as exc:
        return {"error": describe_exception(exc), "value_error": isinstance(exc, ValueError),
                "not_done": isinstance(exc, NotImplementedError), **cell_line(exc)}
    data = plain(value)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return {"value": float(data), "type": type(value).__name__}
    return {"value": None, "type": type(value).__name__, "text": data if isinstance(data, str) else ""}


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: {
        "calls": [_call(fn, case, stage) for stage in case.get("stages", STAGES)]})

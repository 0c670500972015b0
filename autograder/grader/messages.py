"""What the grader and a worker say to each other, as typed data with bounds (parse, don't validate).

The grader sends JSON jobs on the worker's stdin, one a line: ``{"as_reference", "tasks": [Task...]}``;
a task is written as its dataclass fields, so adding a field to ``Task`` (e.g. a scenario salt) reaches the
worker without touching the format. The worker answers with JSON lines: ``{"key", "event": "start"}``
before each task, then a ``TaskResult``; after a job's last result, ``{"event": "ready", "peak_kib"}`` when it
is fresh for another student's job (a sandbox of its own emptied: sandbox/reset.py).

Everything a worker sends back passed through submitted code (an observation is whatever ``observe``
returned, a reason may hold an exception's message), so every line is parsed here, once, into a
``TaskResult`` or rejected: bounded size and nesting depth, known keys and statuses, text without control
characters, truncated to what the reports show.
"""
from dataclasses import asdict, dataclass, fields

from ..exercises.judging.parse import BadMessage, loads_bounded, within_depth
from .escape import strip_controls

__all__ = ["BadMessage", "Task", "TaskResult", "failed", "clean_text", "loads_bounded", "parse_line", "parse_ready",
           "within_depth"]

LINE_LIMIT = 4 << 20       # bytes of one result line: ten times the largest honest observation
REASON_CHARS = 600
OUTPUT_CHARS = 2000


@dataclass(frozen=True)
class Task:
    key: str                          # unique within one run, e.g. "01_x.ipynb::train_with_accumulation"
    exercise: str
    cells: tuple[tuple[str, str], ...]
    timeout: float
    salt: int = 0                     # which scenarios to observe: 0 the public ones, else held-out ones

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> "Task":
        """The worker's side: the grader's own job, so only shapes are restored (tuples), extra fields kept."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        values["cells"] = tuple(tuple(c) for c in raw["cells"])
        return cls(**values)


@dataclass(frozen=True)
class TaskResult:
    key: str
    status: str                       # "ok" or "failed"
    observation: dict | None          # plain JSON data when ok
    reason: str = ""                  # for the student, when failed
    output: str = ""                  # what the code printed (first lines)


def failed(key: str, reason: str, output: str = "") -> TaskResult:
    return TaskResult(key, "failed", None, clean_text(reason, REASON_CHARS), clean_text(output, OUTPUT_CHARS))


def clean_text(text, limit: int) -> str:
    """Text from submitted code, safe to put anywhere: no control characters or escape sequences, bounded."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    return strip_controls(text[: 4 * limit])[:limit]  # bounded before the regexes run


def parse_line(line: bytes, keys: set[str]) -> TaskResult | str:
    """A worker's line: a TaskResult, or the key of a task that starts (str). Raises BadMessage."""
    message = loads_bounded(line, limit=LINE_LIMIT)
    if not isinstance(message, dict):
        raise BadMessage("not an object")
    key = message.get("key")
    if not isinstance(key, str) or key not in keys:
        raise BadMessage("unknown key")
    if message.get("event") == "start":
        return key
    status, observation = message.get("status"), message.get("observation")
    if status == "ok" and isinstance(observation, dict):
        return TaskResult(key, "ok", observation, "", clean_text(message.get("output"), OUTPUT_CHARS))
    if status == "failed":
        reason = clean_text(message.get("reason"), REASON_CHARS) or "Your code stopped without a result."
        return TaskResult(key, "failed", None, reason, clean_text(message.get("output"), OUTPUT_CHARS))
    raise BadMessage("no valid status")


def parse_ready(line: bytes) -> int | None:
    """The worker's "ready" line: its peak memory so far (KiB), or None for any other line."""
    try:
        message = loads_bounded(line, limit=LINE_LIMIT)
    except BadMessage:
        return None
    if not isinstance(message, dict) or message.get("event") != "ready":
        return None
    peak = message.get("peak_kib")
    return peak if isinstance(peak, int) and 0 <= peak < 1 << 40 else 0

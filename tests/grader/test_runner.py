"""grader.runner's reading of a worker's lines, on a real pipe."""
import json
import os
from types import SimpleNamespace

import pytest

from autograder.grader.runner import _collect


@pytest.mark.parametrize("until_ready", [False, True])
def test_a_ready_line_read_with_the_last_result_keeps_the_worker_only_when_asked(until_ready):
    """On a loaded machine the worker's last result and its "ready" line arrive in one read. A worker that is not to
    be reused (one identity: until_ready False) must then be stopped, not parked idle: CI once found one kept."""
    read_fd, write_fd = os.pipe()
    worker = SimpleNamespace(read_fd=read_fd, buffer=b"", jobs=1, peak_kib=0)
    lines = [{"key": "a", "status": "ok", "observation": {}}, {"event": "ready", "peak_kib": 7}]
    os.write(write_fd, b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    try:
        results, in_flight, stopped = _collect(worker, {"a": None}, until_ready=until_ready)
    finally:
        os.close(read_fd), os.close(write_fd)
    assert results["a"].status == "ok" and in_flight is None
    assert (stopped, worker.peak_kib) == (("ready", 7) if until_ready else ("done", 0))

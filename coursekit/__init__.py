"""Small helpers the lessons share: devices, data, launching ranks, memory, timing, plots.

The teaching code lives in the notebooks; this package only holds the plumbing a
reader should not have to scroll past (process launch, profiler bookkeeping, plot style).
"""
import os

# torch's profiler back end (kineto) prints "USDT: profiler_start" lines to stderr at its
# default log level. nbgrader scores any cell that writes to stderr as 0, so keep it quiet.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

from .device import describe_device, pick_device  # noqa: E402

__all__ = ["pick_device", "describe_device"]

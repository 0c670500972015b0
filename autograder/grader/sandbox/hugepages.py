"""Cheaper forks of the grading worker: its imported heap moved into huge pages once, before any fork.

The zygote holds about 200 MiB of anonymous memory after importing torch, dynamo and the observers. Each fork copies
a page-table entry per 4 KiB page of it and each exit tears them down again, tens of milliseconds per process on a
busy machine, and a student's worker forks over a hundred (a task per exercise, every rank of every scenario).
``MADV_COLLAPSE`` (Linux 6.1) moves those pages into 2 MiB huge pages in place: a fork then copies one entry per
2 MiB. What a process holds stays the same (the pages are still counted in ``RssAnon``, and a child that writes one
gets a 4 KiB copy, as before), and only this zygote's existing memory is collapsed: the memory each rank allocates
later comes in the system's usual pages, so the meter's readings of a rank keep their granularity.

Where the kernel cannot collapse (older than 6.1, huge pages switched off), nothing changes.
"""
import ctypes

MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _anonymous_writable(maps: str) -> list[tuple[int, int]]:
    """The heap and the unnamed private writable mappings of a ``/proc/<pid>/maps`` text (never the stack)."""
    found = []
    for line in maps.splitlines():
        parts = line.split()
        if len(parts) < 5 or not parts[1].startswith("rw") or parts[1][3] != "p":
            continue
        if len(parts) > 5 and parts[5] != "[heap]":
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        found.append((start, end))
    return found


def collapse_anonymous_memory() -> int:
    """Collapse this process's heap and anonymous mappings into huge pages; returns the bytes collapsed (0 where the
    kernel cannot). Call it in the zygote only, once its imports are done and before it forks."""
    with open("/proc/self/maps") as f:
        regions = _anonymous_writable(f.read())
    collapsed = 0
    for start, end in regions:
        first, last = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
        if last > first and _libc.madvise(first, last - first, MADV_COLLAPSE) == 0:
            collapsed += last - first
    return collapsed

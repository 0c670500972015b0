"""The grading worker's heap in huge pages (``hugepages.py``): forks get cheaper, and nothing the meter reads changes.

What must hold on every machine: what a process holds (RssAnon) stays what it was, a process forked afterwards
still counts what it allocates in small pages (the memory checks' margins depend on it), and torch still works in
forked children. Whether the kernel collapses anything at all depends on it (Linux >= 6.1, huge pages not switched
off); the speed itself is a benchmark's business (bench/grading.py), not a test's.
"""
import json
import subprocess
import sys
from pathlib import Path

from autograder.grader.sandbox.hugepages import _anonymous_writable

MAPS = """\
55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 131  /usr/bin/python3.11
55d0c1000000-55d0c7000000 rw-p 00000000 00:00 0    [heap]
7f0000000000-7f0000800000 rw-p 00000000 00:00 0
7f0000800000-7f0000900000 rw-s 00000000 00:01 7    /dev/zero (deleted)
7f0000900000-7f0000a00000 rw-p 00100000 08:01 200  /usr/lib/libtorch_cpu.so
7f0000a00000-7f0000b00000 r--p 00000000 00:00 0
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0    [stack]
"""

CHILD = r"""
import json, os
import torch
from autograder.exercises.beside.meter import status_bytes
from autograder.exercises.beside.ranks import return_freed_memory
from autograder.grader.sandbox.hugepages import collapse_anonymous_memory

def heap_eligible():
    lines, heap = open("/proc/self/smaps").read().splitlines(), False
    for line in lines:
        if line.endswith("[heap]"):
            heap = True
        elif heap and line.startswith("THPeligible:"):
            return int(line.split()[1])
    return None

before = status_bytes(os.getpid())
collapsed = collapse_anonymous_memory()
after = status_bytes(os.getpid())
huge = sum(int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages:")) * 1024
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # like a rank: small allocations, then a tensor, counted as the meter counts them
    return_freed_memory()
    start = status_bytes(os.getpid())
    block = bytearray(3 << 20)
    grown = status_bytes(os.getpid()) - start
    ok = bool(torch.allclose(torch.ones(64, 64) @ torch.ones(64, 64), torch.full((64, 64), 64.0)))
    os.write(write, json.dumps({"grown": grown, "torch_ok": ok}).encode())
    os._exit(0)
os.close(write)
child = json.loads(os.read(read, 4096))
os.waitpid(pid, 0)
thp = "/sys/kernel/mm/transparent_hugepage/enabled"  # absent where the kernel has no transparent huge pages
mode = open(thp).read() if os.path.exists(thp) else "[never]"
print(json.dumps({"before": before, "after": after, "collapsed": collapsed, "huge": huge, "mode": mode,
                  "heap_eligible": heap_eligible(), **child}))
"""


def test_only_the_heap_and_unnamed_private_writable_mappings_are_collapsed():
    assert _anonymous_writable(MAPS) == [(0x55d0c1000000, 0x55d0c7000000), (0x7f0000000000, 0x7f0000800000)]


def test_collapsing_changes_nothing_the_meter_reads():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # holes in a collapsed range are filled: a few MiB at most over ~200 MiB, never a different order
    assert abs(found["after"] - found["before"]) < 0.05 * found["before"] + (8 << 20)
    if found["collapsed"]:
        assert found["huge"] > 0
    if "[madvise]" in found["mode"]:  # the heap is not marked for huge pages: what grows later grows in small ones
        assert found["heap_eligible"] == 0
    if "[always]" not in found["mode"]:
        assert (3 << 20) <= found["grown"] < (3 << 20) + (1 << 20)
    assert found["torch_ok"]

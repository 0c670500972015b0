"""A rank cannot change the scheduling of the processes that measure it (issue 37).

The launcher samples each rank's memory every few milliseconds (exercises/beside/meter.py). A process may lower the
priority of any other process of its uid: a rank could renice its launcher to 19, make it ``SCHED_IDLE``, or pin it
to one CPU that the rank floods with busy children, and the sampler would not wake during the rank's peak. So every
rank gets, before any submitted code, a seccomp filter (kept by every process it starts) that refuses with EPERM:
``setpriority``/``ioprio_set`` of anything but a single process (a process group or a user would include the
launcher), and ``setpriority``, ``ioprio_set``, ``sched_setparam``, ``sched_setscheduler``, ``sched_setaffinity``
and ``sched_setattr`` aimed at a protected pid (the launcher, the zygote). A rank still sets its own threads' and
children's scheduling, as OpenMP and gloo may.

What it cannot stop: CPU contention itself (a rank's busy children share the CPUs with the launcher at equal
weight); docs/grading.md says so.
"""
import ctypes
import errno
import platform

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
X32_BIT = 0x40000000
# per architecture: (AUDIT_ARCH_*, {syscall: (argument holding the pid, argument holding "which" or None, the
# "which" of a single process)})
ARCHES = {
    "x86_64": (0xC000003E, {141: (1, 0, 0), 251: (1, 0, 1), 142: (0, None, 0), 144: (0, None, 0),
                            203: (0, None, 0), 314: (0, None, 0)}),
    "aarch64": (0xC00000B7, {140: (1, 0, 0), 30: (1, 0, 1), 118: (0, None, 0), 119: (0, None, 0),
                             122: (0, None, 0), 274: (0, None, 0)}),
}

_libc = ctypes.CDLL(None, use_errno=True)


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Instruction))]


def _arg(index: int) -> int:
    """Offset of the low 32 bits of a syscall argument in ``struct seccomp_data`` (little-endian)."""
    return 16 + 8 * index


def program(protected: list[int], machine: str | None = None) -> list[tuple[int, int, int, int]] | None:
    """The filter as (code, jt, jf, k) instructions; None on an architecture this module does not know."""
    arch, calls = ARCHES.get(machine or platform.machine(), (None, None))
    if arch is None:
        return None
    # Symbolic jumps ("allow", "deny", or the next syscall's block) resolved once the layout is known.
    code: list[tuple] = [(LD_W_ABS, 0, 0, 4), (JEQ_K, 0, "allow", arch), (LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64" or (machine is None and platform.machine() == "x86_64"):
        code.append((JGE_K, "deny", 0, X32_BIT))
    for i, (nr, (pid_arg, which_arg, single)) in enumerate(calls.items()):
        block = [(JEQ_K, 0, f"next{i}", nr)]
        if which_arg is not None:
            block += [(LD_W_ABS, 0, 0, _arg(which_arg)), (JEQ_K, 0, "deny", single)]
        block.append((LD_W_ABS, 0, 0, _arg(pid_arg)))
        block += [(JEQ_K, "deny", 0, pid) for pid in protected]
        block.append((RET_K, 0, 0, RET_ALLOW))
        code += [(f"label next{i - 1}",)] if i else []
        code += block
    code += [(f"label next{len(calls) - 1}",), ("label allow",), (RET_K, 0, 0, RET_ALLOW), ("label deny",),
             (RET_K, 0, 0, RET_EPERM)]
    labels, out = {}, []
    for item in code:
        if len(item) == 1:
            labels[item[0].removeprefix("label ")] = len(out)
        else:
            out.append(item)
    resolved = []
    for position, (op, jt, jf, k) in enumerate(out):
        jump = [labels[j] - position - 1 if isinstance(j, str) else j for j in (jt, jf)]
        resolved.append((op, *jump, k))
    return resolved


def protect_from_rescheduling(protected: list[int]) -> bool:
    """In a rank, before submitted code: refuse changes to the scheduling of ``protected`` pids (and of process groups
    and users). False where this architecture or kernel offers no seccomp filter (the rank goes on)."""
    return install_filter(program(protected))


def install_filter(instructions: list[tuple[int, int, int, int]] | None) -> bool:
    """Put a seccomp filter of (code, jt, jf, k) instructions on this process and every one it forks from now on;
    False where there is none (an architecture the caller does not know) or the kernel refuses it."""
    if instructions is None:
        return False
    array = (_Instruction * len(instructions))(*[_Instruction(*i) for i in instructions])
    prog = _Program(len(instructions), array)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0:
        return False
    return _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0

"""No task can use the kernel's keyrings: ``add_key``, ``request_key`` and ``keyctl`` fail with EPERM.

Keys outlive their processes, and a uid's user keyring is one for every process of that uid: under the grader's own
uid (one identity) it is shared by every sandbox, the ones graded at the same time included, and by the grader's
own login (its keys could be read). Nothing the course uses needs a key, so the zygote installs this seccomp filter
on itself before any task: every process it forks keeps it, and the sweep has no key to look for.
"""
import errno
import platform

from .scheduling import JEQ_K, JGE_K, LD_W_ABS, RET_K, X32_BIT, install_filter

RET_ALLOW, RET_EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
# per architecture: (AUDIT_ARCH_*, the numbers of add_key, request_key, keyctl)
ARCHES = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219))}


def program(machine: str | None = None) -> list[tuple[int, int, int, int]] | None:
    """The filter as (code, jt, jf, k) instructions; None on an architecture this module does not know."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    arch, calls = ARCHES[machine]
    # another architecture's numbers (i386's int 0x80 on x86_64) and x32's: refused as a whole
    x32 = [(JGE_K, len(calls) + 1, 0, X32_BIT)] if machine == "x86_64" else []
    checks = [(JEQ_K, len(calls) - i, 0, nr) for i, nr in enumerate(calls)]    # each jumps to "deny"
    return [(LD_W_ABS, 0, 0, 4), (JEQ_K, 0, len(x32) + len(checks) + 2, arch), (LD_W_ABS, 0, 0, 0), *x32, *checks,
            (RET_K, 0, 0, RET_ALLOW), (RET_K, 0, 0, RET_EPERM)]


def deny_keyrings() -> bool:
    """In the zygote, before any task: True once the filter is in place (False on an unknown architecture or a
    kernel without seccomp: the zygote then grades one student only)."""
    return install_filter(program())

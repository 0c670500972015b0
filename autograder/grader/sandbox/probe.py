"""What a student's worker can rely on here, proved once by a worker started exactly like one.

Two things depend on this installation and kernel, and both fail for every student at once if they do not hold:

* **the stubs** (``forbidden.py``): torch and everything the worker imports before forking tasks must still import
  with them, ``torch.compile`` must still work, and each forbidden library must really raise. A newer torch that
  imports a name the stub does not give, or moved a library, fails here, not in the students' workers; the grader
  then grades without stubs and says so.
* **rank isolation** (``isolation.py``): whether a forked child can make its own namespaces (unprivileged user
  namespaces can be switched off, e.g. by AppArmor), and which Landlock ABI the kernel has.

The answer is cached per installation (torch's files, the stubs, the kernel, the grader's identity): it costs a
worker start (about 3 s) the first time only.
"""
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from ...selfcheck.fingerprint import code_fingerprint, grader_code
from .forbidden import STUB_MODULE, SWITCHED_OFF, USES

PROBE_TIMEOUT_S = 180.0

# Run in the worker's sandbox: import what the worker imports before it forks (worker.main), compile a function,
# try every forbidden library, then try rank isolation in a forked child.
PROBE = r"""
import importlib, json, sys
import torch, torch.distributed, torch.optim
from autograder.exercises import all_exercises
from autograder.exercises.beside.observing import observer_of
from autograder.grader.sandbox import isolation, worker
torch.set_num_threads(1)
for exercise in all_exercises().values():
    observer_of(exercise)
importlib.import_module("torch._dynamo")
worker._not_dumpable()  # as the worker is when it forks tasks (isolation must work from there)
answer = {"imports": True}
try:
    compiled = torch.compile(lambda x: torch.sin(x) + 1, backend="eager")
    answer["compiles"] = float(compiled(torch.zeros(1))) == 1.0
except Exception as exc:
    answer["compiles"] = f"{type(exc).__name__}: {exc}"[:300]
model = torch.nn.Linear(2, 2)
answer["uses"] = {}
for name, code in json.loads(sys.argv[1]).items():
    try:
        exec(code, {"torch": torch, "model": model})
        answer["uses"][name] = "no error"
    except BaseException as exc:
        answer["uses"][name] = f"{type(exc).__name__}: {exc}"[:300]
answer["isolation"] = isolation.available()
print(json.dumps(answer))
"""


def run_probe(sandbox) -> dict:
    """The probe's answer in a worker of ``sandbox`` (a student's: stubs bound), or {"error": why}."""
    with tempfile.TemporaryDirectory(prefix="grader-probe-") as workdir, \
            sandbox.launch([sys.executable, "-c", PROBE, json.dumps(USES)], workdir) as launch:
        try:
            proc = subprocess.Popen(launch.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir,
                                    env=launch.env, start_new_session=True, preexec_fn=launch.preexec)
        except (OSError, subprocess.SubprocessError) as exc:
            return {"error": f"the probe could not start: {exc}"}
        try:
            out, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            launch.kill_all(proc.pid)
            proc.communicate()
            return {"error": f"the probe did not finish within {PROBE_TIMEOUT_S:g} s"}
    try:
        answer = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
    except (IndexError, ValueError):
        answer = None
    if not isinstance(answer, dict):
        return {"error": err.decode(errors="replace").strip()[-400:] or f"the probe exited with {proc.returncode}"}
    return answer


def stub_problem(answer: dict) -> str:
    """Why the stubs cannot be used, from the probe's answer ("" when they work)."""
    if "error" in answer:
        return f"a worker with them did not start: {answer['error']}"
    if answer.get("compiles") is not True:
        return f"torch.compile fails with them: {answer.get('compiles')}"
    usable = [name for name, outcome in answer.get("uses", {}).items() if SWITCHED_OFF not in outcome]
    return f"these still work with them: {', '.join(usable)}" if usable else ""


def cache_key(sandbox) -> str:
    """Everything the answer depends on: torch's files and the stubs, the grader's code (what the worker imports),
    the kernel, the grader's identity and the isolation it builds."""
    digest = hashlib.sha256(STUB_MODULE.read_bytes())
    digest.update(code_fingerprint(grader_code()).encode())
    for _, target in sandbox.stubs.binds:
        stat = os.stat(target)
        digest.update(f"{target}|{stat.st_mtime_ns}|{stat.st_size}".encode())
    for path in ("/proc/sys/user/max_user_namespaces", "/proc/sys/kernel/unprivileged_userns_clone"):
        try:
            digest.update(Path(path).read_bytes())
        except OSError:
            pass
    digest.update(f"{sys.executable}|{platform.release()}|{os.geteuid()}|{sandbox.fingerprint()}".encode())
    return digest.hexdigest()[:24]


def cached_probe(sandbox) -> dict:
    """``run_probe``, remembered in the grader's own cache folder (unreadable to workers, which never see it)."""
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autograder"
    path = folder / f"sandbox-probe-{cache_key(sandbox)}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    answer = run_probe(sandbox)
    if "error" not in answer:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(answer))
        except OSError:
            pass
    return answer

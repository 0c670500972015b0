"""One cgroup manager for the grader's workers and the class hub's users (autograder/grader/sandbox/cgroups.py),
checked on a folder laid out like /sys/fs/cgroup (fast); the real kernel's groups are exercised by the hostile
class suite (workers) and the hub's tests (users)."""
import pytest

from autograder.grader.sandbox.cgroups import ControlGroup
from hub.limits import UserCgroups


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_hub_writes_and_reads_back_its_users_limits(tmp_path, version):
    if version == "v1":
        (tmp_path / "memory").mkdir(), (tmp_path / "cpu").mkdir()
    else:
        (tmp_path / "cgroup.controllers").write_text("cpu memory pids")
    groups = UserCgroups("jupyterhub-test", tmp_path)
    group = groups.prepare("alice", 3 << 30, 0.5)  # what JupyterHub's ByteSpecification makes of "3G"
    assert groups.limits_of("alice") == {"memory": 3 << 30, "cpu_quota": 50_000, "cpu_period": 100_000}
    assert all(folder.name == "alice" for folder in group.folders.values())


def test_a_control_group_puts_each_limit_in_its_controllers_folder(tmp_path):
    group = ControlGroup({c: tmp_path / c / "g" for c in ("cpu", "memory", "pids")})
    group.create({"cpu.shares": 1024, "memory.limit_in_bytes": 1 << 30, "pids.max": 512})
    assert (tmp_path / "cpu" / "g" / "cpu.shares").read_text() == "1024"
    assert group.read("memory.limit_in_bytes") == str(1 << 30) and group.read("pids.max") == "512"

"""A class list (CSV) becomes real Unix accounts; the hub lets in whoever is in the course's groups.

    username,role,name
    jdoe,student,Jane Doe
    msmith,instructor,Maria Smith

* ``role`` is ``student`` or ``instructor``; ``name`` is optional. A username is what the person types on the
  hub's login page, their nbgrader student id and the first label of their server's address, so it must be a
  lower-case Unix name that is also a DNS label: ``[a-z][a-z0-9-]*``, at most 32 characters.
* A bad row is reported with its line number and skipped; the rest of the class is still added.
* A new account gets a random password (written to ``<root>/hub/passwords.csv``, root only, to hand out).
  An account that already exists keeps its password and is only added to the course group; it is never
  deleted by ``hub down --purge``, which removes only the accounts the hub created (``<root>/hub/members.json``).
* Students get their own primary group and the students' group; instructors get the instructors' group as
  their primary group, so that what they create in the course folder and nbgrader's exchange stays shared with
  the other instructors (nbgrader's ``groupshared`` mode needs exactly this).
"""
import csv
import grp
import json
import os
import pwd
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

USERNAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
ROLES = ("student", "instructor")


@dataclass(frozen=True)
class Member:
    username: str
    role: str
    name: str = ""


@dataclass(frozen=True)
class BadRow:
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


def parse_class_list(text: str) -> tuple[list[Member], list[BadRow]]:
    """Members and the rows that could not be used (with the reason); never raises on content."""
    members, bad, seen = [], [], set()
    rows = csv.reader(text.splitlines())
    header = next(rows, None)
    columns = [h.strip().lower() for h in header or []]
    if "username" not in columns or "role" not in columns:
        return [], [BadRow(1, f"the first line must name the columns username,role[,name]; it is {header!r}")]
    for line, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        record = {c: (row[i].strip() if i < len(row) else "") for i, c in enumerate(columns)}
        username, role = record["username"].lower(), record["role"].lower()
        name = re.sub(r"[\x00-\x1f:,]", " ", record.get("name", ""))[:100].strip()  # GECOS field: no ':' or ','
        if not USERNAME.match(username) or username.endswith("-"):
            bad.append(BadRow(line, f"username {record['username']!r} is not a lower-case Unix name "
                                    "[a-z][a-z0-9-]* of at most 32 characters"))
        elif role not in ROLES:
            bad.append(BadRow(line, f"role {record['role']!r} is neither student nor instructor"))
        elif username in seen:
            bad.append(BadRow(line, f"{username} is listed twice; the first line counts"))
        else:
            seen.add(username)
            members.append(Member(username, role, name))
    return members, bad


# ---- Unix accounts -------------------------------------------------------------------------------

def _run(*command: str, stdin: str | None = None) -> None:
    done = subprocess.run(command, input=stdin, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")


def group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


class Accounts:
    """The accounts and groups this hub created, recorded in ``members.json`` so that teardown removes those only."""

    def __init__(self, state: Path, instructors_group: str, students_group: str):
        self.file = Path(state) / "members.json"
        self.passwords = Path(state) / "passwords.csv"
        self.groups = {"instructor": instructors_group, "student": students_group}
        self.record = json.loads(self.file.read_text()) if self.file.exists() else {"users": {}, "groups": []}

    def _save(self) -> None:
        self.file.write_text(json.dumps(self.record, indent=1))
        os.chmod(self.file, 0o600)

    def ensure_groups(self) -> None:
        for group in self.groups.values():
            if not group_exists(group):
                _run("groupadd", group)
                self.record["groups"].append(group)
                self._save()

    def add(self, member: Member) -> str | None:
        """Create or adopt the account; returns the new password, or None for an account that already existed."""
        group = self.groups[member.role]
        if user_exists(member.username):
            _run("usermod", "--append", "--groups", group, member.username)
            self.record["users"].setdefault(member.username, {"role": member.role, "created": False})
            self._save()
            return None
        if member.role == "instructor":
            _run("useradd", "--create-home", "--shell", "/bin/bash", "--gid", group, "--comment", member.name,
                 member.username)
        else:
            _run("useradd", "--create-home", "--shell", "/bin/bash", "--user-group", "--groups", group,
                 "--comment", member.name, member.username)
        self.record["users"][member.username] = {"role": member.role, "created": True}
        self._save()
        os.chmod(pwd.getpwnam(member.username).pw_dir, 0o700)  # useradd's default here is 0755: others could read
        password = secrets.token_urlsafe(9)
        _run("chpasswd", stdin=f"{member.username}:{password}\n")
        self._write_password(member, password)
        return password

    def _write_password(self, member: Member, password: str) -> None:
        new = not self.passwords.exists()
        with open(self.passwords, "a", newline="") as f:
            os.chmod(self.passwords, 0o600)
            writer = csv.writer(f)
            if new:
                writer.writerow(["username", "role", "password"])
            writer.writerow([member.username, member.role, password])

    def members(self) -> dict[str, dict]:
        return dict(self.record["users"])

    def remove_all(self, log=print) -> None:
        """Stop every process of the created accounts, delete them with their homes, then the created groups."""
        for username, info in sorted(self.record["users"].items()):
            if not user_exists(username):
                continue
            if info.get("created"):
                kill_processes_of(pwd.getpwnam(username).pw_uid)
                _run("userdel", "--remove", username)
                log(f"  removed user {username} and its home")
            else:  # adopted account: only leave the course group
                group = self.groups[info["role"]]
                if group_exists(group):
                    subprocess.run(["gpasswd", "--delete", username, group], capture_output=True)
        for group in self.record["groups"]:
            if group_exists(group):
                _run("groupdel", group)
                log(f"  removed group {group}")
        self.record = {"users": {}, "groups": []}


def processes_of(uid: int) -> list[int]:
    """Process ids whose real uid is ``uid`` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            line = next((x for x in status.splitlines() if x.startswith("Uid:")), "")
            if line.split()[1:2] == [str(uid)]:
                found.append(int(entry))
    return found


def kill_processes_of(uid: int, grace: float = 5.0) -> None:
    """SIGTERM each process of ``uid`` by its id, then SIGKILL what is left after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        pids = processes_of(uid)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = processes_of(uid)
        if not pids:
            return

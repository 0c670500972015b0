"""nbgrader's collect, counting a submission only for the student who owns its files.

Every student may create folders in the exchange's ``inbound/`` (that is how submitting works), so a student can
plant a folder named ``alice+lesson1+<a later time>+<anything>``. nbgrader's own collect only logs a warning
("cheating attempt?") and then collects it as alice's latest, replacing alice's real work. On the class hub every
submission folder is owned by the Unix account that wrote it, so this collect keeps, for each student, only the
submissions their own account wrote, and logs the others as refused.
Installed into the instructors' Jupyter config by ``python -m hub up`` (``ExchangeFactory.collect``).
"""
import glob
import os
import pwd

from nbgrader.exchange.default.collect import ExchangeCollect


def _owner(path: str) -> str | None:
    try:
        return pwd.getpwuid(os.stat(path).st_uid).pw_name
    except (KeyError, OSError):
        return None


class OwnerCheckedCollect(ExchangeCollect):
    def init_src(self):
        super().init_src()  # checks the course and the inbound folder, reads the due date
        student = self.coursedir.student_id or "*"
        pattern = os.path.join(self.inbound_path, f"{student}+{self.coursedir.assignment_id}+*")
        latest = {}
        for path in glob.glob(pattern):
            record = self._path_to_record(path)
            owner = _owner(path)
            if owner != record["username"]:
                self.log.error("Not collected: %s is named as %s's submission but was written by %s.",
                               os.path.basename(path), record["username"], owner or "an unknown account")
                continue
            due = getattr(self, "duedate", None)
            on_time = due is None or not self.before_duedate or record["timestamp"] <= due
            best = latest.get(record["username"])
            if best is None or (on_time, record["timestamp"]) > best[0]:
                latest[record["username"]] = ((on_time, record["timestamp"]), record)
        self.src_records = [record for _, record in latest.values()]

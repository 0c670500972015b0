"""FlightRecorder (Lesson 9): what the grader makes happen (cases.expected, the launcher's gate policy), and class
grading through the sandbox, where a report that never returns is stopped and no process is left."""
import pytest
from processes import descendants_left
from submission_factory import grade_one_exercise_class, reference_source
from variants.flight_recorder import WRONG

from autograder.exercises.flight_recorder.cases import LATE_S, cases, expected
from autograder.exercises.flight_recorder.observe import HoldAndRelease

EX, NB = "FlightRecorder", "09_failures.ipynb"


def test_public_scenarios_say_who_is_missing():
    c = cases(0)
    stalled = expected(c["stalled"])
    assert sorted(stalled) == [0, 2] and stalled[0]["missing"] == [1, 3]
    assert stalled[0]["last"] == [[3, "all_reduce"], [2, "broadcast"], [3, "all_reduce"], [2, "broadcast"]]
    desync = expected(c["desync"])
    assert all(r["missing"] == [] for r in desync.values())  # nobody is missing: the kinds differ at #2
    assert desync[0]["last"] == [[2, "all_gather"], [2, "all_gather"], [2, "barrier"], [2, "all_gather"]]
    groups = expected(c["two_groups"])
    assert groups[0] == {"missing": [2], "last": [[1, "all_reduce"], [1, "all_reduce"], None, [1, "all_reduce"]]}


@pytest.mark.parametrize("salt", range(1, 30))
def test_held_out_scenarios_keep_their_roles(salt):
    """Every salt: two held ranks (neither rank 0) and a late one; a skipped collective changes the kind; the held
    rank of the two groups never checked in on 'dp' and is a member of the other group."""
    c = cases(salt)
    s = c["stalled"]
    assert len(s["held"]) == 2 and 0 not in s["held"]
    for scenario in c.values():  # a late rank everywhere, one that reports: never rank 0, never held
        assert scenario["late"] in expected(scenario) and scenario["late"] != 0
    assert 2 <= s["hang"] <= 4
    d = expected(c["desync"])
    skipper = c["desync"]["skips"]
    assert d[0]["last"][skipper][0] == d[0]["last"][0][0] and d[0]["last"][skipper][1] != d[0]["last"][0][1]
    g = c["two_groups"]
    assert g["held"][0] in g["tp_members"] and 0 not in g["held"] and expected(g)[0]["last"][g["held"][0]] is None


class _Meter:
    def held(self, rank):
        return 0

    def sent(self):
        return 0


def test_on_time_ranks_start_together_the_late_one_after_a_while_held_ones_last(monkeypatch):
    c = cases(0)["stalled"]  # held 1 and 3, late 2, reporting 0 and 2
    policy, meter, now = HoldAndRelease(c), _Meter(), [100.0]
    monkeypatch.setattr("autograder.exercises.flight_recorder.observe.time.monotonic", lambda: now[0])
    assert policy.request(1, {"gate": "held"}, meter) == []
    assert policy.request(2, {"gate": "late"}, meter) == []
    assert policy.request(0, {"gate": "reporting"}, meter) == [(0, 1.0)]
    now[0] += LATE_S / 2
    assert policy.tick(meter) == []
    now[0] += LATE_S
    assert policy.tick(meter) == [(2, 1.0)]
    assert policy.request(2, {"gate": "reporting"}, meter) == [(2, 1.0)]
    assert policy.request(3, {"gate": "held"}, meter) == []
    assert policy.request(0, {"gate": "reported"}, meter) == [(0, 1.0)]
    assert sorted(policy.request(2, {"gate": "reported"}, meter)) == [(1, 1.0), (2, 1.0), (3, 1.0)]


def test_on_time_ranks_wait_for_each_other_before_reporting():
    c = cases(0)["desync"]  # late 1; 0, 2 and 3 on time
    policy = HoldAndRelease(c)
    assert policy.request(1, {"gate": "late"}, _Meter()) == []
    assert policy.request(0, {"gate": "reporting"}, _Meter()) == []
    assert policy.request(3, {"gate": "reporting"}, _Meter()) == []
    assert sorted(policy.request(2, {"gate": "reporting"}, _Meter())) == [(0, 1.0), (2, 1.0), (3, 1.0)]


@pytest.mark.slow
def test_class_grading_full_zero_and_a_report_that_never_returns_stopped(tmp_path, subreaper):
    """The solution full, the blank notebook 0, and a report that waits forever stopped by the grader's own launch
    timeout (its scenarios with a held rank fail, named by the diagnosis) with no process left: through the real
    sandbox."""
    rows = grade_one_exercise_class(tmp_path, NB, EX, {"alice": reference_source(EX), "bob": None,
                                                       "carl": WRONG["blocks_forever"][0]})
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == 10, rows["alice"]["feedback"]
    assert float(rows["bob"]["score"]) == 0 and "NotImplementedError" in rows["bob"]["feedback"]
    assert float(rows["carl"]["score"]) < 10 and "blocks_forever" in rows["carl"]["feedback"], rows["carl"]["feedback"]
    assert descendants_left() == []

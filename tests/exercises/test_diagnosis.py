"""Diagnosis, cause first (autograder/exercises/judging/diagnosis.py, each exercise's mistakes.py).

* every named wrong variant of tests/variants/ is diagnosed as the catalogue's mistake(s) that name it (its id is the
  variant's name, or the mistake lists it in ``variants``), and that cause explains every failed check, so no check
  gives its own (wrong) advice next to it; a blank function is "not started";
* every correct variant gets no cause;
* two mistakes at once are not reported as one (combined variants, built here);
* the report leads with the cause and says the rest once: one forgotten ``/ accumulation_steps`` no longer gives six
  hints of which four ask to change right code; a notebook left blank gets one line.
"""
import json

import pytest
from conftest import observed, reference_observation, variant_modules
from variants import variant_marks, variant_salts

from autograder.exercises import get_exercise
from autograder.exercises.judging.diagnosis import Diagnosis, catalogue, diagnose
from autograder.exercises.judging.verdict import feedback_sentence, format_report

WITH_CATALOGUE = sorted(ex for ex in variant_modules() if catalogue(get_exercise(ex)))


def expected_causes(exercise: str, name: str) -> set[str]:
    if name == "not_implemented":
        return {"not_started"}
    return {m.id for m in catalogue(get_exercise(exercise)) if m.id == name or name in m.variants}


def _params():
    for ex in WITH_CATALOGUE:
        module = variant_modules()[ex]
        for kind in ("CORRECT", "WRONG"):
            for index, name in enumerate(getattr(module, kind)):
                for salt in variant_salts(module, kind, index, name):  # the salts test_variants.py grades
                    yield pytest.param(ex, kind, name, salt, marks=variant_marks(module, kind, index, name, salt),
                                       id=f"{ex}-{name}-{'held-out' if salt else 'salt0'}")


@pytest.mark.parametrize("exercise,kind,name,salt", list(_params()))
def test_every_variant_is_diagnosed_as_itself(exercise, kind, name, salt):
    entry = getattr(variant_modules()[exercise], kind)[name]
    results, diagnosis, _ = observed(exercise, entry if kind == "CORRECT" else entry[0], salt)
    if kind == "CORRECT":
        assert diagnosis.kind == "passed" and diagnosis.cause_id == "", diagnosis
        return
    if all(r.passed for r in results):  # test_variants.py says so; this branch's checks cannot see the mistake yet
        pytest.skip(f"{name} passes every check here (its check needs the outside measurement)")
    want = expected_causes(exercise, name)
    assert want, f"no mistake in {exercise}'s catalogue stands for the variant {name!r}"
    assert set(diagnosis.cause_id.split("+")) == want, (
        diagnosis.cause_id, [c.seen for c in diagnosis.causes],
        "consistent only: is autograder/exercises/judging/known_fails.py stale? python tests/known_fails.py " + exercise)
    assert diagnosis.unexplained == (), f"failed checks no cause explains: {diagnosis.unexplained}"
    report = format_report(exercise, results, diagnosis)
    if diagnosis.kind == "cause":  # the explained checks keep their titles, never their own advice
        assert all(r.feedback not in report for r in results if not r.passed), report


@pytest.mark.parametrize("exercise", WITH_CATALOGUE)
def test_every_mistake_stands_for_a_named_variant(exercise):
    """A catalogue is built from the variants: each entry names one (by its id or in ``variants``)."""
    module = variant_modules()[exercise]
    for mistake in catalogue(get_exercise(exercise)):
        assert mistake.id == mistake.id.lower() and " " not in mistake.id
        assert {mistake.id, *mistake.variants} & set(module.WRONG), f"{mistake.id} stands for no named variant"
        for sentence in (mistake.did, mistake.why, mistake.fix):
            assert sentence.endswith(".") and len(sentence) < 200, sentence


def _combined():
    """Two mistakes in one cell, from the suites' own templates: each must be reported."""
    from variants import average_gradients as avg
    from variants import gpipe_schedule as gp
    from variants import train_amp as amp
    from variants import train_with_accumulation as acc
    from variants import zero_memory_per_rank as zero

    return {
        "train_with_accumulation": {
            "no_division_and_no_train_mode": (acc._variant(backward="loss.backward()").replace("    model.train()\n", ""),
                                              {"loss_not_divided", "forgets_train_mode"}),
            "steps_every_batch_and_returns_total": (acc._variant(when="True", ret="total"),
                                                    {"steps_every_batch", "returns_total_not_mean"}),
            "loss_tensor_kept_and_hard_coded_4": (acc.WRONG["keeps_loss_tensors_in_a_list"][0].replace(
                "accumulation_steps == 0", "4 == 0"), {"keeps_loss_tensors", "hard_coded_k"}),
        },
        "train_amp": {
            "no_train_mode_and_never_clips": (amp._variant(train="pass", clip="pass"), {"forgets_train_mode", "never_clips"}),
            "returns_nothing_and_no_zero_grad": (amp._variant(ret="None", zero="pass"),
                                                 {"returns_nothing", "never_zeroes_gradients"}),
        },
        "gpipe_schedule": {
            "from_one_and_too_long": (gp._closed(length="2 * (m + p - 1) + 1").replace('("F", j)', '("F", j + 1)')
                                      .replace('("B", j)', '("B", j + 1)'), {"microbatches_from_one", "too_long_by_one"}),
        },
        "average_gradients": {  # ranks: the slow tier
            "zero_fills_and_sums": (avg._loop("if p.grad is None:\n    p.grad = torch.zeros_like(p)\n"
                                              "dist.all_reduce(p.grad)\n"),
                                    {"zero_fills_missing_grads", "sums_without_dividing"}),
        },
        "zero_memory_per_rank": {
            "stage0_divides_and_no_value_error": (zero._variant(s0="(w + g + k) * psi / n", other="return 0"),
                                                  {"stage0_divides", "no_value_error"}),
            "floors_and_ignores_layout": (zero.WRONG["floor_division"][0].replace("w, g, k = bytes_per_param",
                                                                                  "w, g, k = 2, 2, 12"),
                                          {"floor_division", "ignores_bytes_per_param"}),
        },
    }


COMBINED = [pytest.param(ex, name, id=f"{ex}-{name}", marks=[pytest.mark.slow] if get_exercise(ex).ranks else [])
            for ex, found in _combined().items() for name in found]


@pytest.mark.parametrize("exercise,name", COMBINED)
def test_two_mistakes_at_once_are_not_reported_as_one(exercise, name):
    source, want = _combined()[exercise][name]
    _, diagnosis, _ = observed(exercise, source)
    assert set(diagnosis.cause_id.split("+")) == want, (diagnosis.cause_id, [c.seen for c in diagnosis.causes])
    assert diagnosis.unexplained == ()


def test_one_forgotten_division_names_its_cause_and_no_wrong_advice():
    """Issue 27's student: only `/ accumulation_steps` forgotten. Before, six [FAIL] lines, four of which asked to
    change code that was right (model.train(), zero_grad before the first batch, the returned loss, the last window)."""
    source, _ = variant_modules()["train_with_accumulation"].WRONG["no_division_by_k"]
    results, diagnosis, _ = observed("train_with_accumulation", source)
    report = format_report("train_with_accumulation", results, diagnosis)
    lines = report.splitlines()
    assert lines[1].strip().startswith("Most likely cause (loss_not_divided)"), report
    assert "Divide each micro-batch's loss by accumulation_steps before backward()." in report
    for wrong_advice in ("call model.train() first", "optimizer.zero_grad() before the first batch",
                         "loss.item() * accumulation_steps", "drop them (no step) or flush them"):
        assert wrong_advice not in report, report
    assert report.count("[FAIL]") == 6 and "This is why 6 checks failed" in report
    assert feedback_sentence(results, diagnosis).startswith("Cause loss_not_divided: You call backward()")


def test_a_blank_function_gets_one_line():
    source, _ = variant_modules()["train_with_accumulation"].WRONG["not_implemented"]
    results, diagnosis, _ = observed("train_with_accumulation", source)
    report = format_report("train_with_accumulation", results, diagnosis)
    assert diagnosis.cause_id == "not_started"
    assert report.splitlines()[1:] == ["  Not started: your function still raises NotImplementedError: replace that line "
                                       "with your code."], report


def test_unknown_failures_are_localised_and_keep_the_advice_it_does_not_explain():
    """A mistake the catalogue does not know (parameters halved at the start): no cause is named; the report leads
    with where the results go wrong (localise.py), which is grades.csv's cause, and every failed check whose own
    words do not name a wrong result keeps its advice."""
    source = variant_modules()["train_with_accumulation"].CORRECT["seed_style"].replace(
        "model.train()", "model.train()\n    for p in model.parameters():\n        p.data.mul_(0.5)")
    results, diagnosis, _ = observed("train_with_accumulation", source)
    assert diagnosis.kind == "unknown" and not diagnosis.causes
    assert diagnosis.cause_id.startswith("where: the gradient at each optimizer step")
    report = format_report("train_with_accumulation", results, diagnosis)
    assert report.splitlines()[1].strip().startswith("Where your results go wrong"), report
    assert "the gradient at each optimizer step: wrong in every scenario, first at step 1" in report
    assert all(r.feedback in report for r in results if not r.passed and "gradient" not in r.feedback), report


def test_the_diagnosis_survives_a_round_trip_through_a_saved_row():
    source, _ = variant_modules()["train_with_accumulation"].WRONG["forgets_train_mode"]
    results, diagnosis, _ = observed("train_with_accumulation", source)
    again = Diagnosis.from_dict(json.loads(json.dumps(diagnosis.to_dict())))
    assert again == diagnosis
    assert format_report("x", results, again) == format_report("x", results, diagnosis)


def test_a_fingerprint_that_cannot_read_its_data_does_not_match():
    from autograder.exercises.judging.diagnosis import Mistake

    def broken(student, reference):
        return student["scenarios"]["nowhere"]["x"]

    source, _ = variant_modules()["train_with_accumulation"].WRONG["forgets_train_mode"]
    results, _, student = observed("train_with_accumulation", source)
    ex = get_exercise("train_with_accumulation")
    mistake = Mistake("broken", "Did.", "Why.", "Fix.", broken)
    assert diagnose(ex, student, reference_observation("train_with_accumulation"), results, [mistake]).kind == "unknown"

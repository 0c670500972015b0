"""MiniFSDP (Lesson 5) graded by the class grader: through the sandbox, on held-out scenarios."""
import pytest
from processes import descendants_left
from submission_factory import grade_one_exercise_class, reference_source
from variants.mini_fsdp import WRONG

EX, NB = "MiniFSDP", "05_fsdp_zero.ipynb"


@pytest.mark.slow
def test_class_grading_full_partial_zero_and_fully_shard_without_leftovers(tmp_path, subreaper):
    """The solution full, a classic mistake partial, the blank notebook 0, torch's own FSDP 0 with a sentence."""
    rows = grade_one_exercise_class(tmp_path, NB, EX, {"alice": reference_source(EX), "bob": None,
                                                       "carl": WRONG["forgets_to_divide"][0],
                                                       "dora": WRONG["calls_torch_fully_shard"][0]})
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == 12, rows["alice"]["feedback"]
    assert float(rows["bob"]["score"]) == 0 and "NotImplementedError" in rows["bob"]["feedback"]
    assert 0 < float(rows["carl"]["score"]) < 12, rows["carl"]["feedback"]
    assert float(rows["dora"]["score"]) == 0 and "fully_shard" in rows["dora"]["feedback"], rows["dora"]["feedback"]
    assert descendants_left() == []

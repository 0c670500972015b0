"""The launcher of the grader's scenarios (exercises/ranks.py), on its own."""
import pytest

from autograder.exercises.ranks import run_on_ranks


def _answers_at_once(rank: int, world_size: int) -> dict:
    return {"rank": rank}


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ranks_that_never_communicate_all_answer(world_size):
    """A rank that answers at once must not end the process group under a peer still joining it (rank 0 hosts its
    store): without the launcher's barrier after joining, such a scenario failed now and then with gloo's "Connection
    closed by peer", more often under load, and a student whose ranks never communicate got no diagnosis."""
    for _ in range(3):
        found = run_on_ranks(_answers_at_once, world_size)
        assert "error" not in found, found
        assert [r["rank"] for r in found["ranks"]] == list(range(world_size))

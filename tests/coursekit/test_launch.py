"""The lessons' launcher (coursekit.dist.launch) when a rank dies inside torch rather than raising."""
import os

import pytest

from coursekit.dist import RankFailed, launch


def _rank_one_aborts(rank: int, world_size: int) -> int:
    if rank == 1:
        os.abort()  # what a crash inside a C++ library does: no Python exception, no result
    return rank


def test_a_rank_killed_by_a_signal_is_named_with_where_it_was():
    with pytest.raises(RankFailed) as failed:
        launch(_rank_one_aborts, 2)
    message = str(failed.value)
    assert "rank 1 died without a result (killed by SIGABRT)" in message, message
    assert "_rank_one_aborts" in message, message  # faulthandler's stack of the rank, not only its exit code

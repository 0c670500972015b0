"""The launcher's gate policies (exercises/beside/meter.py), driven by every order in which ranks can reach their gates."""
from hypothesis import given
from hypothesis import strategies as st

from autograder.exercises.beside.meter import SampleAtGates, StopAllAtGates


class FakeMeter:
    """Counts the requests: the bytes 'sent so far' grow by one with each, so a reading tells when it was taken."""

    def __init__(self):
        self.now = 0

    def held(self, rank):
        return 0

    def sent(self):
        self.now += 1
        return self.now


@st.composite
def arrivals(draw):
    """(world size, gates per rank, the order in which ranks ask): each rank asks at its gates in order, and asks at
    its next gate only once released from the last one."""
    world, gates = draw(st.integers(2, 4)), draw(st.integers(1, 3))
    return world, gates, draw(st.randoms(use_true_random=False))


@given(arrivals())
def test_stop_all_releases_a_gate_only_when_every_rank_is_there(case):
    world, gates, rng = case
    policy, meter = StopAllAtGates(world), FakeMeter()
    at = [0] * world             # the gate each rank asks at next
    waiting = set(range(world))  # ranks free to ask (not held at a gate, not finished)
    released = {}
    while waiting:
        rank = rng.choice(sorted(waiting))
        waiting.discard(rank)
        out = policy.request(rank, {"digest": [0.0, 0.0]}, meter)
        index = at[rank]
        arrived = [r for r in policy.records if r["index"] == index]
        if len(arrived) < world:
            assert out == []
            continue
        assert sorted(r for r, _ in out) == list(range(world)) and len({f for _, f in out}) == world  # a seed each
        released[index] = max(r["sent_bytes"] for r in arrived)
        for r, _ in out:
            at[r] += 1
            if at[r] < gates:
                waiting.add(r)
    assert sorted(released) == list(range(gates))
    for index, reading in released.items():  # the last arrival's reading: no request of a later gate came before it
        assert all(r["sent_bytes"] > reading for r in policy.records if r["index"] > index)


def test_sample_at_gates_answers_each_rank_at_once():
    policy, meter = SampleAtGates(2), FakeMeter()
    assert [r for r, _ in policy.request(1, None, meter)] == [1]
    assert [r for r, _ in policy.request(0, None, meter)] == [0]


@given(arrivals())
def test_shared_seeds_are_one_per_gate_for_every_rank_in_any_order(case):
    """Gates between steps (ShardedOptimizer): every rank computes the next step on the same gradients, so each gate
    index has one seed whichever rank asks first; requests beyond the scenario's gates are refused and counted."""
    world, gates, rng = case
    policy, meter = SampleAtGates(world, gates=gates, shared=True), FakeMeter()
    answers = {r: [] for r in range(world)}
    order = [r for r in range(world) for _ in range(gates + 1)]
    rng.shuffle(order)
    for rank in order:
        [(to, seed)] = policy.request(rank, {"digest": [0.0, 0.0]}, meter)
        assert to == rank
        answers[rank].append(seed)
    assert all(policy.seeds[r] == policy.seeds[0] for r in range(world)) and len(policy.seeds[0]) == gates
    assert all(answers[r][:gates] == policy.seeds[0] for r in range(world))
    assert policy.refused == [1] * world

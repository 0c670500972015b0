"""Issue 37, gates the launcher triggers: a rank cannot answer the grader's pauses ahead of its computation.

At each GradientGate a rank reports a digest of the gradient reaching it and waits; the launcher answers with a seed
it drew after the fork, and the gate multiplies the gradient by per-element factors drawn from it (gating.py). So
the gradient at the next pause exists only once this one was answered and the layer between them ran backward; the
launcher refuses requests beyond the model's pauses and recomputes every digest itself (meter.GatePolicy.expect).
The red team's MiniFSDP that learned each pause's digest in a throw-away pass and wrote all its requests ahead while
holding only shards scored 12/12 when the factors were scalars (tests/variants/mini_fsdp.py keeps it, as
``answers_gates_in_advance``; test_variants grades it under a held-out salt too).
"""
import pytest
import torch
from conftest import grade_source
from submission_factory import reference_source
from variants.mini_fsdp import WRONG

from autograder.exercises.beside.gating import GradientGate, factors, replay
from autograder.exercises.beside.meter import SEED_BITS, SampleAtGates

pytestmark = pytest.mark.slow


def failed(results, phrase: str):
    return [r for r in results if not r.passed and phrase in r.title]


def test_answering_the_pauses_ahead_loses_the_memory_checks():
    results = grade_source("MiniFSDP", WRONG["answers_gates_in_advance"][0])
    lost = failed(results, "Frees each gathered layer")
    assert lost and "pause 2 of 7" in lost[0].feedback and "asked early" in lost[0].feedback, results


# The reference, and one more request at a pause after its backward: asking twice is refused and counted.
ASKS_ONCE_MORE = '''
import autograder.exercises.beside.ranks as ranks

_Reference = MiniFSDP


class MiniFSDP(_Reference):
    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        ranks.ask_gate("backward", torch.zeros(1))
'''


def test_a_rank_that_asks_once_more_than_the_model_loses_the_memory_checks():
    results = grade_source("MiniFSDP", reference_source("MiniFSDP") + ASKS_ONCE_MORE)
    lost = failed(results, "Frees each gathered layer")
    assert lost and "8 times where its model's backward reaches 7" in lost[0].feedback, results
    assert not failed(results, "FSDP2"), "its values are right, and keep their points"


# BucketedDDP, the red team's other case: the real all-reduce runs after backward in bfloat16, and the bytes it saves
# go as junk point-to-point during backward, so the loopback sees as much as the method's, while rank 0 is held too.
BF16_AFTER_BACKWARD = '''
from autograder.exercises.beside.gating import GradientGate

_Reference = BucketedDDP


class BucketedDDP(_Reference):
    def _launch(self, b):
        if not any(isinstance(m, GradientGate) for m in self.module.modules()):
            return super()._launch(b)
        n = sum(p.numel() for p in self.buckets[b])
        peer = 1 - dist.get_rank()
        junk, sink = torch.zeros(n // 2), torch.empty(n // 2)
        self.in_flight[b] = (None, dist.batch_isend_irecv([dist.P2POp(dist.isend, junk, peer),
                                                           dist.P2POp(dist.irecv, sink, peer)]))

    def finish_gradient_synchronization(self):
        if not any(isinstance(m, GradientGate) for m in self.module.modules()):
            return super().finish_gradient_synchronization()
        for b in range(len(self.buckets)):
            for work in self.in_flight.get(b, (None, []))[1]:
                work.wait()
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[b]]).to(torch.bfloat16)
            dist.all_reduce(flat)
            flat = flat.float() / self.world_size
            offset = 0
            for param in self.buckets[b]:
                param.grad.copy_(flat[offset:offset + param.numel()].view_as(param.grad))
                offset += param.numel()
        self.ready, self.in_flight = [0] * len(self.buckets), {}
'''


def test_a_bf16_all_reduce_after_backward_with_junk_during_it_loses_the_overlap():
    results = grade_source("BucketedDDP", reference_source("BucketedDDP") + BF16_AFTER_BACKWARD)
    lost = failed(results, "Overlaps")
    assert lost and "3 significant digits" in lost[0].feedback, results
    assert len(failed(results, "")) == 1, "only the overlap check"


def test_seeds_are_drawn_per_rank_and_pause_and_extra_requests_are_refused():
    class Meter:
        def held(self, rank):
            return 0

        def sent(self):
            return 0

    policy = SampleAtGates(2, gates=2)
    answers = [policy.request(rank, {"digest": [0.0, 0.0]}, Meter())[0][1] for rank in (0, 1, 0, 1, 0)]
    assert len(set(answers)) == 5 and all(0 <= a < 2 ** SEED_BITS and a == int(a) for a in answers)
    assert policy.refused == [1, 0] and len(policy.records) == 4


def test_a_pause_gradient_depends_on_the_seed_answered_at_the_pause_before_it():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), GradientGate(), torch.nn.Tanh(), torch.nn.Linear(4, 4),
                                GradientGate(), torch.nn.Linear(4, 1))
    x = torch.randn(3, 4)

    def run(seeds):
        return replay(lambda: model(x).sum().backward(), seeds)

    first, again, other = run([11, 12]), run([11, 12]), run([13, 12])
    assert first == again and other[0] == first[0] and other[1] != first[1]
    # the second pause's gradient, by hand: the first pause's (w5 per row) times its factors, back through layer 3
    at_first = model[5].weight.detach().expand(3, 4) * factors(11, torch.empty(3, 4))
    by_hand = (at_first @ model[3].weight.detach()) * (1 - torch.tanh(model[0](x)).detach() ** 2)
    assert abs(first[1][0] - float(by_hand.double().sum())) < 1e-5


# TensorParallelMLP (its traffic scenario's one pause between the passes): the red team's f moved into the forward,
# its own request between the two all-reduces; and the reference asking once more after its backward.
def test_tensor_parallel_summing_x_grad_before_the_pause_loses_the_backward_bytes_check():
    from variants.tensor_parallel_mlp import WRONG as TP_WRONG

    results = grade_source("TensorParallelMLP", TP_WRONG["answers_gates_in_advance"][0])
    lost = failed(results, "backward pass")
    assert lost and "x.grad is not the one the grader's backward gives" in lost[0].feedback, results
    assert not failed(results, "forward pass") and not failed(results, "equals"), "its values keep their points"


TP_ASKS_AGAIN = '''
import autograder.exercises.beside.ranks as ranks

_Reference = TensorParallelMLP


class TensorParallelMLP(_Reference):
    def forward(self, x):
        y = super().forward(x)
        ranks.ask_gate("between forward and backward", y.detach())
        return y
'''


def test_tensor_parallel_asking_twice_loses_both_bytes_checks():
    results = grade_source("TensorParallelMLP", reference_source("TensorParallelMLP") + TP_ASKS_AGAIN)
    for phase in ("forward pass", "backward pass"):
        lost = failed(results, phase)
        assert lost and "asked at the grader's pauses 2 times where its forward and backward have 1" in \
            lost[0].feedback, results
    assert not failed(results, "equals"), "its values are right, and keep their points"


def test_checkpointer_answers_one_seed_a_save_for_every_rank_and_refuses_extra_requests(tmp_path):
    """The gate after each save (Checkpointer's KillAfterSave): every rank is held until all have saved, then all get
    the same seed (the next step's weights); a request beyond the run's saves is answered at once and counted."""
    import os

    from autograder.exercises.beside.meter import Meter
    from autograder.exercises.checkpointer.observe import KillAfterSave

    policy = KillAfterSave(2, kill_after=99, directory=tmp_path, steps=2)  # never reaches the kill
    meter = Meter()
    meter.open()
    meter.start([os.getpid()] * 2)
    seeds = []
    for _ in range(2):
        assert policy.request(0, {"gate": "saved"}, meter) == []  # held until rank 1 has saved too
        answered = policy.request(1, {"gate": "saved"}, meter)
        assert [r for r, _ in answered] == [0, 1] and answered[0][1] == answered[1][1]
        seeds.append(answered[0][1])
    assert seeds[0] != seeds[1]
    assert len(policy.request(0, {"gate": "saved"}, meter)) == 1 and policy.refused == [1, 0]


# The ring's pauses at its sends are requested by the rank; the launcher's own readings through the last hop are not.
def test_a_ring_that_asks_its_send_pauses_up_front_loses_the_method_check_on_the_launchers_own_readings():
    from variants.ring_attention import WRONG as RING_WRONG

    results = grade_source("ring_attention", RING_WRONG["asks_its_send_pauses_up_front"][0])
    lost = failed(results, "travel the ring")
    assert lost and "all through the last hop" in lost[0].feedback, results
    assert len(failed(results, "")) == 1, "its values are right, and keep their points"

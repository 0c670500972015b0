"""Issue 37, bands that padding cannot fill: a method's traffic scenario is sized so that every cheaper-looking
way round it sends far *more* bytes than the method, never fewer.

A band around the reference's bytes only stops a non-method that sends more. One that sends less can pad itself
into the band with messages of zeros, and the loopback counter cannot tell zeros from tokens. The red team's MoE
moved the experts' weights instead of the tokens (which also defeats the poisoned non-owned experts: the values are
exact), then padded with an all-to-all of zeros: 11/11. The traffic scenario now has wide experts and few tokens,
so moving the weights costs about 30 times the all-to-alls; no padding brings that down into the band.
"""
import pytest
from conftest import grade_source, reference_observation, student_observation
from submission_factory import reference_source
from variants.expert_parallel_moe import CORRECT, WRONG

from autograder.exercises.expert_parallel_moe import cases, checks
from autograder.exercises.judging.checking import measured_privately

pytestmark = pytest.mark.slow
MOE = "ExpertParallelMoE"

# Each expert's weights go to every rank (broadcast from its owner; their gradients summed back to it in the
# backward), every rank runs every expert on its own tokens, and an all-to-all of zeros pads the bytes.
MOVES_WEIGHTS_AND_PADS = '''
from torch.func import functional_call


class Shared(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, owner):
        ctx.owner = owner
        out = p.detach().clone()
        dist.broadcast(out, src=owner)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return (grad if dist.get_rank() == ctx.owner else torch.zeros_like(grad)), None


class ExpertParallelMoE(nn.Module):
    def __init__(self, router, experts):
        super().__init__()
        self.router, self.experts = router, experts
        self.per_rank = len(experts) // dist.get_world_size()
        mine = dist.get_rank() * self.per_rank
        self.local_experts = nn.ModuleList(experts[mine:mine + self.per_rank])

    def forward(self, x):
        probs = self.router(x).softmax(dim=-1)
        expert = probs.argmax(dim=-1)
        y = torch.zeros_like(x)
        for j, module in enumerate(self.experts):
            params = {n: Shared.apply(p, j // self.per_rank) for n, p in module.named_parameters()}
            rows = (expert == j).nonzero().squeeze(1)
            y = y.index_put((rows,), functional_call(module, params, (x[rows],)))
        padding = torch.zeros(128 * dist.get_world_size(), x.shape[1])  # the same size on every rank
        dist.all_to_all_single(torch.empty_like(padding), padding)
        return probs.gather(-1, expert[:, None]) * y
'''


def traffic_ratio(source: str) -> float:
    reference = reference_observation(MOE)
    got = student_observation(MOE, source)["scenarios"]["traffic"]["meter"]
    want = reference["scenarios"]["traffic"]["meter"]
    assert measured_privately(got, want), "this test needs a private loopback (an unprivileged user namespace)"
    return got["lo_bytes"] / want["lo_bytes"]


def test_moving_the_experts_instead_of_the_tokens_sends_far_more_than_any_band():
    reference = reference_observation(MOE)
    attack = student_observation(MOE, MOVES_WEIGHTS_AND_PADS)
    assert checks.fingerprint_problem(attack["scenarios"]["traffic"]["ranks"],
                                      reference["scenarios"]["traffic"]) is None, "the attack's values are exact"
    assert traffic_ratio(MOVES_WEIGHTS_AND_PADS) > 4 * cases.TRAFFIC_RATIO
    assert checks.traffic_problem(attack, reference)


@pytest.mark.parametrize("style", ["reference", *CORRECT])
def test_every_correct_style_is_well_inside_the_band(style):
    source = reference_source(MOE) if style == "reference" else CORRECT[style]
    assert 1 / 1.6 < traffic_ratio(source) < 1.6  # the band is 2× (the padded list all-to-all: 1.5)


@pytest.mark.parametrize("gather", ["all_gathers_the_tokens", "all_gather_and_reduce_scatter"])
def test_gathering_the_tokens_sends_more_than_twice_the_band(gather):
    assert traffic_ratio(WRONG[gather][0]) > 2 * cases.TRAFFIC_RATIO


# BucketedDDP: the red team's overlap without overlap. Each bucket's real all-reduce runs only after backward (a
# blocking one, in finish); during backward each completed bucket sends 30 % of its size as junk point-to-point to
# the other rank, so bytes flow while the grader holds rank 0 (11/11 under the old 1.5× band).
JUNK_LAUNCH = '''
    def _launch(self, b):
        n = sum(p.numel() for p in self.buckets[b])
        peer = 1 - dist.get_rank()
        junk, sink = torch.zeros(int(0.3 * n)), torch.empty(int(0.3 * n))
        self.in_flight[b] = dist.batch_isend_irecv([dist.P2POp(dist.isend, junk, peer),
                                                    dist.P2POp(dist.irecv, sink, peer)])

    def finish_gradient_synchronization(self):
        for b in range(len(self.buckets)):
            for work in self.in_flight.get(b, []):
                work.wait()
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in self.buckets[b]]) / self.world_size
            dist.all_reduce(flat)
            offset = 0
            for param in self.buckets[b]:
                if param.grad is not None:
                    param.grad.copy_(flat[offset:offset + param.numel()].view_as(param.grad))
                offset += param.numel()
        self.ready, self.in_flight = [0] * len(self.buckets), {}
'''


def bucketed_ddp_with(methods: str) -> str:
    source = reference_source("BucketedDDP")
    return source[:source.index("    def _launch(self, b):")] + methods.lstrip("\n")


def test_junk_sent_while_backward_is_held_does_not_pass_for_overlap():
    results = grade_source("BucketedDDP", bucketed_ddp_with(JUNK_LAUNCH))
    overlap = next(r for r in results if "overlap" in r.title.lower())
    assert not overlap.passed and "more than one broadcast" in overlap.feedback, overlap

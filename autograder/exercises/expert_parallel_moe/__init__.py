"""Lesson 8 exercise: ``ExpertParallelMoE(router, experts)``, a top-1 mixture of experts split over the ranks.

``router: nn.Linear(d, E)``; ``experts``: an ``nn.ModuleList`` of E modules mapping (t, d) → (t, d); E divisible by
the world size N. Rank r owns experts ``[r·E/N, (r+1)·E/N)`` and keeps those modules themselves and the router.
``forward(x)``, x: (t, d) this rank's tokens (t differs between ranks): logits = router(x), e = argmax, gate =
softmax(logits)[e], yᵢ = gateᵢ · expert_{eᵢ}(xᵢ); no token dropped. Tokens travel to the rank that owns their expert
and back with all-to-all, inside autograd functions, so that backward leaves x.grad, the router's gradient from this
rank's tokens, and each local expert's gradient from every rank's tokens routed to it.

The grader really runs it on 2, 3 and 4 forked gloo ranks with uneven token counts (and, on 3 ranks, a router
biased towards the first experts: many tokens for rank 0, none for the last rank, which must still take part in
every all-to-all, forward and backward). Inputs that require the method:
each rank draws only its own tokens, and on rank r the experts it does not own hold *other* weights (drawn per rank),
so a rank that runs other ranks' experts itself gets wrong values. Each rank records its output, x.grad, its own
experts' gradients, the router's gradient, and, for feedback, every gloo collective of the forward and of the
backward with its size (torch's profiler, ``gloo:<kind>``, whatever API issued it). The reference observation adds
the dense single-process MoE over all ranks' tokens with the true experts (in the grader's process).

Method ("all-to-all, not gather"), measured outside the ranks. The ranks' own record (at least two all-to-alls in
the forward and two in the backward, no all-gather / all-reduce / broadcast / point-to-point message of token size,
read on 2 and 3 ranks) lives in the student's process (issue 25: a replaced record): it shapes the feedback, and the
method check earns its points only when the bytes on the loopback agree. The ``traffic`` scenario: 4 ranks, 4
experts (1 per rank), 128, 96, 160 and 128 tokens of d = 128, experts Linear–Tanh–Linear of hidden width 1024
(each expert larger than all the tokens, so that moving the experts instead of the tokens costs far more: issue 37),
the same sizes for every salt, no profiler (a per-token loop under it takes seconds). The rank records the sum of
every row of its output and its experts' gradient checksums (the evidence, compared with the dense MoE's).
All-to-alls send each token that leaves its rank four times (dispatch and combine, forward and backward): about
3·|tokens| here. Every gather sends about N times that or more: all tokens to every rank ((N−1)·|tokens|), their
outputs back (an all-reduce or a reduce-scatter, which gloo runs as an all-reduce), and the same in the backward. A
submission passes when the scenario's ``lo_bytes`` are within 2× of the reference's either way (halfway,
geometrically, between the all-to-alls and the thriftiest gather). What each style measured, and what the scenario
costs: ``docs/method-evidence.md``.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="ExpertParallelMoE",
    notebook="08_multidim_parallel.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,
    evidence=checks.moe_really_ran,
    timeout_s=45,  # three launches; a deadlocking submission spends ranks.LAUNCH_TIMEOUT_S in each
    checks=[
        Check("The output equals the dense MoE's on every rank (2 ranks)", 2, checks.check_output),
        Check("x.grad equals the dense MoE's (2 ranks)", 2, checks.check_x_grad),
        Check("Each local expert's gradient comes from every rank's tokens (2 ranks)", 2, checks.check_experts),
        Check("The router's gradient, summed over the ranks, equals the dense MoE's (2 ranks)", 1, checks.check_router),
        Check("Output and gradients are right on 3 ranks with skewed routing and on 4 ranks", 2, checks.check_more_ranks),
        Check("Tokens travel by all-to-all in the forward and the backward, never by a gather (bytes measured outside "
              "your ranks)", 2, checks.check_all_to_all, evidence=checks.EVIDENCE_SCENARIOS),
    ],
)

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

Method ("all-to-all, not gather"). Here the method check reads the in-process record (at least two all-to-alls in
the forward and two in the backward, no all-gather / all-reduce / broadcast / point-to-point message of token size):
a student's process can forge it. To be measured outside the student's process instead
(``bench/lesson8_method_evidence.py``): the bytes each rank writes to its sockets (``/proc/<pid>/io`` wchar, gloo's
TCP sends on loopback), forward and backward. All-to-alls send each token once each way: 4·(N−1)/N·|tokens| per
rank; a value-correct gather (all-gather the tokens, all-reduce the outputs, autograd-aware) sends several times
that, growing with N. Measured (2-core CPU, torch 2.13.0+cpu, gloo, load average 59 from other jobs), t = 4096
tokens of d = 256 per rank (|tokens| = 4 MiB), experts Linear–Tanh–Linear:

    N = 2, E = 4   reference all-to-all   sent  8.1 MiB per rank   peak RSS 65–74 MiB
                   all-gather + reduce    sent 24.0 MiB per rank   peak RSS 156–170 MiB
    N = 4, E = 8   reference all-to-all   sent 11.7–12.3 MiB       peak RSS 68–70 MiB
                   all-gather + reduce    sent 72.0 MiB per rank   peak RSS 187–233 MiB

A threshold of 4·|tokens| per rank (the all-to-alls' ceiling, whatever N), or twice the reference's bytes in the same
batch, separates them with room on both sides; peak memory agrees. At the graded sizes (tens of tokens) gloo's
per-message overhead dominates: measure in a scenario of its own at this size. The grading scenarios cost
0.34–0.38 s per observation (all three, salts 1–3, load average 14).
"""
from ..protocol import Check, Exercise
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
        Check("Tokens travel by all-to-all in the forward and the backward, never by a gather", 2, checks.check_all_to_all,
              evidence=checks.METHOD_SCENARIOS),
    ],
)

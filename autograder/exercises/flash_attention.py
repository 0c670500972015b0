"""Lesson 7 exercise: ``FlashAttention``, a ``torch.autograd.Function`` (FlashAttention-2's algorithm, in torch).

``FlashAttention.apply(q, k, v, is_causal=False) -> o``: q (..., n_q, d), k and v (..., n_k, d), float32 or
bfloat16; o = softmax(q kᵀ / √d) v in q's dtype (``is_causal``: query i sees keys j ≤ i, n_q == n_k). Forward in
tiles of ``BLOCK_Q`` queries × ``BLOCK_K`` keys (module-level constants of the student's cell) with an online
softmax, arithmetic in float32; ``save_for_backward(q, k, v, o, L)`` with L the log-sum-exp of each query's scaled
scores. Backward recomputes each tile's probabilities from q, k and L and never holds an n_q × n_k matrix.

Values: every scenario draws seeded q, k, v and an upstream gradient, calls ``apply`` and ``backward``, and
records o, dq, dk, dv. The reference observation adds the truth: torch's ``scaled_dot_product_attention`` in
float64 on the same inputs. The checks compare with it, normwise (max |error| / max |truth|): 5e-5 in float32
(correct tiled float32 styles are within 1e-6 of it, 1e-5 with scores near 100, as torch's own float32 SDPA is) and
2e-2 with bfloat16 inputs (bf16's own round-off is 4e-3; correct styles measured at 6e-3). Lengths are not
multiples of the tile except in ``plain``; ``ragged`` has n_q ≠ n_k and one leading dimension.

Method (the ``memory`` scenario: n_q = n_k = 512, d = 16, one head, not causal, float32). There an n × n float32
matrix is 1 MiB and q, k, v, o together 128 KiB, so such a matrix dominates. Recorded in the student's process, and
graded (forgeable by a determined student, like everything in-process; an outside meter should replace them):

* what forward saves for backward (``saved_tensors_hooks``, each storage once): no tensor of n_q × n_k / 2 values
  or more, and a float32 L of shape (..., n_q);
* the largest tensor any operator returns during forward + backward (a dispatch mode, ``coursekit.ops.watch_ops``,
  which sees the backward's operators too, about 10 µs each): under half an n_q × n_k matrix. The profiler's
  memory replay would give the true peak, but costs about 10 s here (70× the run itself), so it is left to the
  outside meter.

Measured on the 2-core CPU (torch 2.13.0+cpu; peak = bytes allocated above the start over forward + backward, from the
profiler's memory events, ``coursekit.memory``; the input tensors exist before and are not counted):

  =========================================================  =========  =================  =================
  n = 512 (n = 1024)                                         saved B    peak / n² fp32     largest / n²
  =========================================================  =========  =================  =================
  reference (recomputes tiles, saves q, k, v, o, L)          133,120    0.13 (0.07)        0.031 (0.016)
  value-correct, saves P for backward (wrong)                1,181,696  3.07 (3.03)        1.0
  value-correct, backward through naive attention (wrong)    133,120    4.10 (4.05)        1.0
  naive attention under autograd (no Function)               1,146,880  3.06 (3.03)        1.0
  torch SDPA (CPU flash kernel), for comparison              133,120    0.63 (0.56)        0.031 (the kernel)
  =========================================================  =========  =================  =================

So an outside meter of peak memory can set its threshold at one n × n float32 matrix above the process's baseline
(8× the reference's peak at n = 512, 3× below every wrong method); measure the baseline with a FlashAttention that
returns at once. n = 1024 widens the gap (0.07 against 3 and more) but the reference's tile loop then takes about
0.5 s and a backward through naive attention about 7 s on this CPU.

The ``memory`` scenario also records whether torch's own SDPA ran (an operator of that name in the dispatch mode's
count: calling it is not an answer to this exercise, and every check then fails and says so), and a fingerprint of
its output (the evidence that it really computed attention there).

Cost of one observation (six scenarios, in the student's process): about 1.2 s on the 2-core CPU, most of it the
memory scenario's 90,000 operators under the dispatch mode.
"""
import math

import torch
import torch.nn.functional as F

from ..exercise import (
    Check,
    Exercise,
    ScenarioError,
    case,
    held_out_rng,
    observation,
    salted_seed,
    scenario,
    what,
)

FP32_RTOL = 5e-5    # normwise relative error against float64 SDPA; correct float32 styles: ~1e-6
BF16_RTOL = 2e-2    # bf16 inputs and results; correct styles: ~6e-3
EVIDENCE_RTOL = 0.1  # the evidence: the output points where attention's does (a wrong method still passes this)
MEMORY_N, MEMORY_D = 512, 16
FINGERPRINT_ROWS = 8  # rows of o and dq kept from the memory scenario (its full tensors are large)

# name: (what it is, dtype, is_causal, logit scale (None: plain randn), public sizes)
SCENARIOS = {
    "plain": ("called in float32, not causal, lengths a multiple of the tile", "float32", False, None,
              {"lead": [2, 2], "n_q": 32, "n_k": 32, "d": 8}),
    "ragged": ("called in float32 with n_q ≠ n_k, lengths not multiples of the tile, one leading dimension",
               "float32", False, None, {"lead": [2], "n_q": 21, "n_k": 53, "d": 8}),
    "causal": ("called in float32 with is_causal=True", "float32", True, None,
               {"lead": [1, 2], "n_q": 37, "n_k": 37, "d": 8}),
    "large_logits": ("called in float32 with scaled scores near 100", "float32", False, 100.0,
                     {"lead": [1, 2], "n_q": 40, "n_k": 40, "d": 8}),
    "bf16": ("called with bfloat16 inputs, is_causal=True", "bfloat16", True, None,
             {"lead": [1, 2], "n_q": 41, "n_k": 41, "d": 8}),
    "memory": (f"called on one head of {MEMORY_N} queries and keys (memory measured)", "float32", False, None,
               {"lead": [1, 1], "n_q": MEMORY_N, "n_k": MEMORY_N, "d": MEMORY_D}),
}


def _ragged(rng, low: int, high: int) -> int:
    """A length in [low, high] that is not a multiple of 16 (the default tile)."""
    return next(n for n in iter(lambda: rng.randint(low, high), None) if n % 16)


def held_out_sizes(name: str, salt: int) -> dict:
    """Other sizes for a role, keeping what its checks talk about (multiples of the tile or not, n_q ≠ n_k)."""
    rng = held_out_rng(salt, f"sizes of {name}")
    if name == "plain":
        n = rng.choice([32, 48])
        return {"lead": [2, 2], "n_q": n, "n_k": n, "d": 8}
    if name == "ragged":
        return {"lead": [2], "n_q": _ragged(rng, 17, 31), "n_k": _ragged(rng, 33, 63), "d": 8}
    if name == "memory":
        return {"lead": [1, 1], "n_q": MEMORY_N, "n_k": MEMORY_N, "d": MEMORY_D}
    n = _ragged(rng, 33, 47)
    return {"lead": [1, 2], "n_q": n, "n_k": n, "d": 8}


def cases(salt: int) -> dict[str, dict]:
    found = {}
    for i, (name, (words, dtype, causal, logits, sizes)) in enumerate(SCENARIOS.items()):
        found[name] = {"what": words, "dtype": dtype, "is_causal": causal, "logits": logits,
                       **(sizes if salt == 0 else held_out_sizes(name, salt)), "seed": salted_seed(300 + i, salt),
                       "measure_memory": name == "memory"}
    return found


# ---- the problem -----------------------------------------------------------------------------

def make_inputs(case: dict):
    """Seeded q, k, v and the upstream gradient, in the scenario's dtype."""
    g = torch.Generator().manual_seed(case["seed"])
    lead, d = tuple(case["lead"]), case["d"]
    q = torch.randn(*lead, case["n_q"], d, generator=g)
    k = torch.randn(*lead, case["n_k"], d, generator=g)
    v = torch.randn(*lead, case["n_k"], d, generator=g)
    if case["logits"]:  # q·k/√d = logits × cos(angle): q and every key near one direction, so scores near logits
        norm = (case["logits"] * math.sqrt(d)) ** 0.5
        direction = torch.randn(d, generator=g)
        q, k = (direction / direction.norm() + 0.3 * t / math.sqrt(d) for t in (q, k))
        q, k = (t / t.norm(dim=-1, keepdim=True) * norm for t in (q, k))
    upstream = torch.randn(*lead, case["n_q"], d, generator=g)
    dtype = getattr(torch, case["dtype"])
    return [t.to(dtype) for t in (q, k, v)], upstream.to(dtype)


def compact(t: torch.Tensor) -> list[float]:
    """A tensor as a flat list of floats with 6 significant digits: enough for the 5e-5 the checks allow, and it
    keeps the shipped reference observations small."""
    return [float(f"{x:.6g}") for x in t.detach().double().flatten().tolist()]


def saved_for_backward(fn, *args):
    """``fn(*args)``, and every distinct storage saved for backward while it ran: [(shape, dtype, bytes)]."""
    by_storage = {}

    def record(t):
        by_storage.setdefault(t.untyped_storage().data_ptr(),
                              (list(t.shape), str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
        result = fn(*args)
    return result, list(by_storage.values())


def run_values(cls, case: dict) -> dict:
    """One call and one backward: o, dq, dk, dv and their dtypes."""
    (q, k, v), upstream = make_inputs(case)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = cls.apply(q, k, v, case["is_causal"])
    if not isinstance(o, torch.Tensor) or o.shape != q.shape:
        got = f"shape {tuple(o.shape)}" if isinstance(o, torch.Tensor) else type(o).__name__
        raise ValueError(f"FlashAttention.apply returned {got}, not o shaped like q {tuple(q.shape)}")
    o.backward(upstream.to(o.dtype))
    grads = {name: t.grad for name, t in (("dq", q), ("dk", k), ("dv", v))}
    missing = [name for name, g in grads.items() if g is None]
    if missing:
        raise ValueError(f"backward left {', '.join(missing)} as None: return (dq, dk, dv, None)")
    return {"output": compact(o), **{name: compact(g) for name, g in grads.items()},
            "dtypes": {"output": str(o.dtype).removeprefix("torch."),
                       **{name: str(g.dtype).removeprefix("torch.") for name, g in grads.items()}}}


def run_memory(cls, case: dict) -> dict:
    """The method: what forward saves, the largest tensor any operation made in forward + backward, whether torch's
    SDPA ran; and a fingerprint of the results (the evidence that attention was computed)."""
    from coursekit.ops import watch_ops

    (q, k, v), upstream = make_inputs(case)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    found = {}

    def forward_and_backward():
        o, found["saved"] = saved_for_backward(cls.apply, q, k, v, case["is_causal"])
        if not isinstance(o, torch.Tensor) or o.shape != q.shape:
            raise ValueError("FlashAttention.apply did not return o shaped like q")
        o.backward(upstream)
        found["output"] = compact(o[..., :FINGERPRINT_ROWS, :])

    seen = watch_ops(forward_and_backward)
    sdpa = sorted(name for name in seen.counts if "scaled_dot_product" in name or "flash_attention" in name)
    return {"output": found["output"], "dq": compact(q.grad[..., :FINGERPRINT_ROWS, :]) if q.grad is not None else None,
            "saved": found["saved"], "largest_tensor": seen.largest, "sdpa_ops": sdpa}


def run_problem(cls, case: dict) -> dict:
    return run_memory(cls, case) if case["measure_memory"] else run_values(cls, case)


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: run_problem(fn, case))


def truth(case: dict) -> dict:
    """torch's SDPA in float64 on the scenario's inputs: o, dq, dk, dv (the memory scenario: its fingerprint)."""
    (q, k, v), upstream = make_inputs(case)
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=case["is_causal"])
    o.backward(upstream.double())
    if case["measure_memory"]:
        rows = slice(0, FINGERPRINT_ROWS)
        return {"output": compact(o[..., rows, :]), "dq": compact(q.grad[..., rows, :])}
    return {"output": compact(o), "dq": compact(q.grad), "dk": compact(k.grad), "dv": compact(v.grad)}


def observe_reference(fn, *, salt: int = 0) -> dict:
    """The reference's observation with the truth added; the checks read the truth, so the reference's own copies of
    the value scenarios' tensors are dropped (they ship to every student: half the size)."""
    result = observe(fn, salt=salt)
    result["truth"] = {name: truth(s["case"]) for name, s in result["scenarios"].items()}
    for s in result["scenarios"].values():
        if not s["case"]["measure_memory"]:
            for name in ("output", "dq", "dk", "dv"):
                s.pop(name, None)
    return result


# ---- reading an observation (plain Python only: no torch from here on) ---------------------------

SDPA = ("Your FlashAttention calls torch's scaled_dot_product_attention, which does this exercise for you: compute "
        "the tiles, the online softmax and the backward yourself, as the lesson asks, to earn the points.")


def relative_error(got, want) -> float:
    """max |got − want| / max |want|; infinite when the lengths differ or a value is not finite."""
    if not isinstance(got, list) or not isinstance(want, list) or len(got) != len(want) or not want:
        return math.inf
    worst = 0.0
    for x, y in zip(got, want):
        x = float(x)
        if not math.isfinite(x):
            return math.inf
        worst = max(worst, abs(x - float(y)))
    scale = max(abs(float(y)) for y in want)
    return worst / scale if scale else worst


def data_of(student: dict, reference: dict, key: str) -> dict:
    """The scenario's data, or ScenarioError (also when torch's SDPA did the work in the memory scenario)."""
    memory = student.get("scenarios", {}).get("memory")
    if isinstance(memory, dict) and memory.get("sdpa_ops"):
        raise ScenarioError(SDPA)
    return scenario(student, key, what(reference, key))


def values_problem(student, reference, key: str, names=("output",), *, rtol: float = FP32_RTOL) -> str | None:
    got, want = data_of(student, reference, key), reference["truth"][key]
    words = {"output": "the output o", "dq": "dq", "dk": "dk", "dv": "dv"}
    for name in names:
        error = relative_error(got.get(name), want[name])
        if error > rtol:
            how = "is not finite (overflow?)" if error == math.inf and isinstance(got.get(name), list) and \
                len(got[name]) == len(want[name]) else f"is off by {error:.1e} (relative to its largest value)"
            return f"When {what(reference, key)}, {words[name]} {how}, more than the {rtol:.0e} allowed"
    return None


def advice(problem: str | None, hint: str) -> str | None:
    return None if problem is None else f"{problem}: {hint}"


def check_output(student, reference):
    return advice(values_problem(student, reference, "plain"),
                  "scale the scores by 1/√d, keep a running max and sum per query, and rescale the accumulator "
                  "by exp(old max − new max) whenever the max grows.")


def check_gradients(student, reference):
    return advice(values_problem(student, reference, "plain", ("dq", "dk", "dv")),
                  "recompute P = exp(S − L) per tile with L = max + log(sum), use D = rowsum(dO ∘ O) over the "
                  "whole row, and dS = P ∘ (dP − D), scaled by 1/√d for dq and dk.")


def check_ragged(student, reference):
    return advice(values_problem(student, reference, "ragged", ("output", "dq", "dk", "dv")),
                  "the last tile of queries or keys may be shorter than BLOCK_Q or BLOCK_K: include it, and "
                  "accept any leading dimensions (...).")


def check_causal(student, reference):
    return advice(values_problem(student, reference, "causal", ("output", "dq", "dk", "dv")),
                  "with is_causal=True query i sees keys j ≤ i (itself included): mask the scores where j > i "
                  "with −inf, in the forward and when recomputing tiles in the backward.")


def check_large_logits(student, reference):
    return advice(values_problem(student, reference, "large_logits", ("output", "dq", "dk", "dv")),
                  "exp of a score near 100 overflows float32: subtract the running max before exponentiating.")


def check_bf16(student, reference):
    got = data_of(student, reference, "bf16")
    dtypes = got.get("dtypes", {})
    wrong = sorted(name for name in ("output", "dq", "dk", "dv") if dtypes.get(name) != "bfloat16")
    if wrong:
        return (f"When {what(reference, 'bf16')}, {', '.join(wrong)} came back as "
                f"{dtypes.get(wrong[0])}, not bfloat16: compute in float32, then return o and the gradients in "
                "the inputs' dtype.")
    return advice(values_problem(student, reference, "bf16", ("output", "dq", "dk", "dv"), rtol=BF16_RTOL),
                  "compute every tile in float32 (cast q, k, v and dO up first) and cast only the results down.")


def memory_data(student, reference) -> tuple[dict, dict]:
    return data_of(student, reference, "memory"), case(reference, "memory")


def check_saved(student, reference):
    got, c = memory_data(student, reference)
    n_q, n_k = c["n_q"], c["n_k"]
    saved = got["saved"]
    largest = max((math.prod(int(n) for n in shape) for shape, _, _ in saved), default=0)
    if largest * 2 > n_q * n_k:
        return (f"When {c['what']}, forward saved a tensor of {largest:,} values for backward (the n_q × n_k scores "
                "or probabilities?): save only q, k, v, o and L, and recompute each tile in backward.")
    if not any(list(shape) == c["lead"] + [n_q] and dtype == "float32" for shape, dtype, _ in saved):
        return (f"When {c['what']}, forward saved no float32 tensor of shape (..., n_q) for backward: save L, the "
                "log-sum-exp of each query's scaled scores, with q, k, v and o.")
    return None


def check_largest(student, reference):
    got, c = memory_data(student, reference)
    matrix = c["n_q"] * c["n_k"]
    largest = int(got["largest_tensor"])
    if largest * 2 > matrix:
        return (f"When {c['what']}, an operation in your forward or backward made a tensor of {largest:,} values, "
                f"{largest / matrix:.2g} of an n_q × n_k matrix: work tile by tile in both passes (recompute each tile's "
                "probabilities in backward; no autograd through a naive attention there).")
    return None


def memory_is_genuine(got: dict, want: dict) -> str | None:
    """The evidence for the memory checks: the scenario really computed attention (its output rows point where
    attention's do), which a function that skips the work cannot show."""
    c = want["case"]
    return None if isinstance(got.get("output"), list) and relative_error(got["output"], want["output"]) < \
        EVIDENCE_RTOL else f"when {c['what']}, its output is not attention's."


EXERCISE = Exercise(
    name="FlashAttention",
    notebook="07_transformers.ipynb",
    observe=observe,
    observe_reference=observe_reference,
    evidence=memory_is_genuine,
    timeout_s=60,  # about 1.5 s for a correct class; a naive backward at n = 512 costs a few seconds more
    checks=[
        Check("The output equals softmax(q kᵀ/√d) v (float32, lengths a multiple of the tile)", 2, check_output),
        Check("The gradients dq, dk, dv equal attention's (float32)", 2, check_gradients),
        Check("Lengths not multiples of the tile, n_q ≠ n_k, one leading dimension", 1, check_ragged),
        Check("Causal: query i sees keys j ≤ i (output and gradients)", 2, check_causal),
        Check("Scores near 100 do not overflow (output and gradients)", 1, check_large_logits),
        Check("bfloat16 inputs give bfloat16 results within bf16 round-off", 1, check_bf16),
        Check("Saves q, k, v, o and L for backward, nothing of size n_q × n_k", 1, check_saved,
              evidence=("memory",)),
        Check("Forward + backward never make an n_q × n_k matrix (largest tensor of any operation)", 2,
              check_largest, evidence=("memory",)),
    ],
)

"""The known mistakes of ``ring_attention`` and their fingerprints in the ranks' records (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/ring_attention.py
(tests/exercises/test_diagnosis.py). Each rank records its output chunk, its point-to-point messages ([peer, bytes]) and its
collectives ([kind, count] pairs); the reference carries full attention over the whole sequence (``full``), chunk by
chunk. Which ranks are right tells a lot: with a causal mask, rank 0 sees only its own chunk, rank 1 two chunks, and
so on. The ``memory`` scenario's readings, taken outside the ranks (what a rank holds at each of its sends, and its
sampled peak), tell a ring that keeps what it no longer needs from one that does not: its messages are the same.
"""
import math

from ..judging.checking import ABORTED, DEADLOCK, close
from ..judging.diagnosis import EVERY, Mistake, error_of, ran, raw_scenario
from ..judging.localise import Locate
from .cases import LAST_HOP_HELD_CHUNKS, LAST_HOP_SLACK_CHUNKS

NCCL_HANG = "would hang under NCCL"  # coursekit.gpu_semantics's words (this module stays free of torch)

ATOL = 1e-4


def _ranks(student, key) -> list[dict]:
    ranks = raw_scenario(student, key)["ranks"]
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        raise KeyError(key)
    return ranks


def _right(student, reference, key) -> list[bool]:
    return [close(r["output"], want, atol=ATOL) for r, want in zip(_ranks(student, key), reference["full"][key])]


def _sent(student, key, rank=0) -> list:
    return [m for m in _ranks(student, key)[rank]["sends"] if isinstance(m, list) and len(m) == 2]


def _bytes(messages) -> int:
    return sum(int(m[1]) for m in messages)


def _quiet(student, key) -> bool:
    rank = _ranks(student, key)[0]
    return not _sent(student, key) and not rank.get("collectives")


def _ring_as_reference(student, reference, key) -> bool:
    return _bytes(_sent(student, key)) == _bytes(reference["scenarios"][key]["ranks"][0]["sends"])


def _memory(student, reference) -> dict[str, float]:
    """The memory scenario in chunks of K and V (one rank's, float32), beyond the reference's ranks: ``first``, what
    a rank held at its first send; ``growth``, how much more its holding grew from its first send to its last;
    ``peak``, its sampled peak. The most over the ranks, each."""
    c = reference["scenarios"]["memory"]["case"]
    chunk = 2 * math.prod(c["lead"]) * c["chunk"] * c["d"] * 4
    got, want = ran(student, "memory")["meter"], reference["scenarios"]["memory"]["meter"]

    def at_sends(meter) -> list[list[float]]:
        held = [[] for _ in range(c["world_size"])]
        for record in meter["gates"]["records"]:
            held[int(record["rank"])].append(float(record["held_bytes"]))
        if not all(len(h) >= c["world_size"] - 1 for h in held):
            raise KeyError("sends")
        return held

    mine, theirs = at_sends(got), at_sends(want)
    last_hop = [f[-1] for f in got["gates"].get("floors") or [] if isinstance(f, list) and f and f[-1]]
    return {"first": (max(h[0] for h in mine) - max(h[0] for h in theirs)) / chunk,
            "growth": (max(h[-1] - h[0] for h in mine) - max(h[-1] - h[0] for h in theirs)) / chunk,
            "peak": (max(got["peak_bytes"]) - max(want["peak_bytes"])) / chunk,
            "last_hop": max(last_hop, default=0) / chunk,
            "ranks": c["world_size"]}


def _right_ring_that_grows(student, reference) -> dict[str, float] | None:
    """Right outputs and the reference's ring of messages, but what a rank holds grows from send to send by at
    least half a chunk more than the reference's: the memory readings then, else None."""
    if not (all(_right(student, reference, "two_ranks")) and all(_right(student, reference, "three_ranks"))
            and _ring_as_reference(student, reference, "two_ranks") and _ring_as_reference(student, reference,
                                                                                            "three_ranks")):
        return None
    memory = _memory(student, reference)
    kept = memory["last_hop"] > LAST_HOP_HELD_CHUNKS + LAST_HOP_SLACK_CHUNKS  # read at the launcher's own moments
    return memory if memory["growth"] >= 0.5 or kept else None


# Growth alone does not tell the two apart: a float64 partial output (c, d) is as large as a chunk of K and V. What
# does: keeping chunks adds nothing before the first send and at most the N chunks at the peak; results kept in float64
# (computed before the first send, with a float64 copy of q) add more than 2 chunks at once, and more than N at the end.

def ring_that_keeps_every_chunk(student, reference):
    memory = _right_ring_that_grows(student, reference)
    if memory and memory["first"] < 2 and memory["peak"] <= memory["ranks"] and memory["growth"] < 0.5:
        return (f"your ranks' messages and outputs are the ring's, but on {memory['ranks']} ranks (measured outside "
                f"your ranks) a rank held at least {memory['last_hop']:.1f} chunks of K and V all through the last "
                f"hop, where a ring holds {LAST_HOP_HELD_CHUNKS:g}: the chunks it had finished with stayed alive")
    if memory and memory["first"] < 2 and memory["peak"] <= memory["ranks"]:
        return (f"your ranks' messages and outputs are the ring's, but on {memory['ranks']} ranks (measured outside "
                "your ranks) what a rank held grew from its first send to its last by "
                f"{memory['growth']:.1f} chunks of K and V more than the reference's, and its peak was "
                f"{memory['peak']:.1f} chunks above theirs: the chunks it had finished with stayed alive")
    return None


def merge_all_partials_at_the_end(student, reference):
    memory = _right_ring_that_grows(student, reference)
    if memory and (memory["first"] >= 2 or memory["peak"] > memory["ranks"]):
        return (f"your ranks' messages and outputs are the ring's, but on {memory['ranks']} ranks (measured outside "
                f"your ranks) a rank held {memory['first']:.1f} chunks of K and V more than the reference's already at "
                f"its first send, {memory['growth']:.1f} more again by its last, and {memory['peak']:.0f} more at its "
                "peak: more than all N chunks of K and V together, as per-step results kept to the end in float64 are")
    return None


def all_gathers_k_and_v(student, reference):
    pairs = _ranks(student, "two_ranks")[0].get("collectives")
    kinds = sorted(str(p[0]) for p in pairs if isinstance(p, list) and len(p) == 2) if isinstance(pairs, list) else []
    if kinds and all(_right(student, reference, "two_ranks")):
        return f"the output is right, but the ranks called {kinds} instead of passing K and V around the ring"
    return None


def sends_after_the_last_step(student, reference):
    got, want = _bytes(_sent(student, "two_ranks")), _bytes(reference["scenarios"]["two_ranks"]["ranks"][0]["sends"])
    if all(_right(student, reference, "two_ranks")) and got > want:
        return f"on 2 ranks rank 0 sent {got // want} × the bytes of one hop: the ring needs N − 1 = 1 hop"
    return None


def ring_runs_backwards(student, reference):
    peers = {int(m[0]) for m in _sent(student, "three_ranks")}
    if peers == {2} and all(_right(student, reference, "three_ranks")):
        return "on 3 ranks rank 0 sent its K and V to rank 2, not to rank 1"
    return None


def causal_mask_on_local_positions(student, reference):
    if all(_right(student, reference, "two_ranks")) and not any(_right(student, reference, "two_ranks_causal")):
        return "without a causal mask every rank is right; with one, no rank is"
    return None


def later_chunks_seen_from_the_last_row(student, reference) -> bool:
    """With a causal mask, rank 0's last query row of its chunk is wrong: a mask on local positions lets it see every
    key of the next rank's chunk. A mask that only leaves the diagonal tile unmasked keeps that row right (it sees
    its whole chunk either way): the same ranks come out wrong, for another reason."""
    case = reference["scenarios"]["two_ranks_causal"]["case"]
    have, want = _ranks(student, "two_ranks_causal")[0]["output"], reference["full"]["two_ranks_causal"][0]
    row = case["chunk"] * case["d"]
    lasts = [slice(start + row - case["d"], start + row) for start in range(0, len(want), row)]
    return any(not close(have[at], want[at], atol=ATOL) for at in lasts)


def chunk_offsets_wrong(student, reference):
    causal3 = _right(student, reference, "three_ranks_causal")
    if all(_right(student, reference, "two_ranks_causal")) and not all(causal3) and _ring_as_reference(
            student, reference, "three_ranks_causal") and {int(m[0]) for m in _sent(student, "three_ranks")} == {1}:
        return "with a causal mask 2 ranks are right, but on 3 ranks some rank is not: a chunk's global offset is off"
    return None


def local_attention_only(student, reference):
    if _quiet(student, "two_ranks") and _right(student, reference, "two_ranks_causal")[0]:
        return ("no rank sent or received anything; with a causal mask rank 0 (which sees only its own chunk) is "
                "right and the others are not")
    return None


def returns_q(student, reference):
    if _quiet(student, "two_ranks") and not any(_right(student, reference, "two_ranks_causal")):
        return "no rank sent anything, and no rank's output is attention, not even rank 0's over its own chunk"
    return None


def missing_scale(student, reference):
    if _ring_as_reference(student, reference, "two_ranks") and not _right(student, reference, "two_ranks_causal")[0] \
            and not any(_right(student, reference, "two_ranks")):
        return "even rank 0's causal output over its own chunk alone is not attention: the scores are not scaled"
    return None


def _partial_merge(student, reference) -> list[bool] | None:
    if not _ring_as_reference(student, reference, "two_ranks") or any(_right(student, reference, "two_ranks")):
        return None
    if not _right(student, reference, "two_ranks_causal")[0]:
        return None
    return _right(student, reference, "three_ranks_causal")


def missing_last_step(student, reference):
    causal3 = _partial_merge(student, reference)
    if causal3 and causal3[:2] == [True, True] and not causal3[2]:
        return ("with a causal mask on 3 ranks, ranks 0 and 1 are right and rank 2, which needs the chunk of the last "
                "step, is not")
    return None


def partial_outputs_averaged(student, reference):
    causal3 = _partial_merge(student, reference)
    if causal3 and causal3[0] and not any(causal3[1:]):
        return ("with a causal mask only rank 0, which has a single chunk to merge, is right: the partial results are "
                "combined, but not with log-sum-exp weights")
    return None


def averages_partials(student, reference) -> bool:
    """Every rank's output is the plain average of its chunks' own softmax outputs (what averaging gives)."""
    return all(close(r["output"], want, atol=ATOL)
               for r, want in zip(_ranks(student, "three_ranks"), reference["averaged"]["three_ranks"]))


def receives_half_the_message(student, reference):
    if error_of(student, "two_ranks") == ABORTED:
        return "on 2 ranks gloo killed a rank: a message arrived with another size than the receiving buffer"
    return None


def blocking_send_then_recv(student, reference):
    if NCCL_HANG in error_of(student, "two_ranks"):
        return ("on 2 ranks every rank waited in a blocking send for a receive its peer had not posted yet: under NCCL "
                "(large chunks) and on gloo this ring hangs")
    return None


def deadlocks_on_three_ranks(student, reference):
    if error_of(student, "three_ranks") == DEADLOCK and not error_of(student, "two_ranks"):
        return "on 2 ranks it ran; on 3 ranks a rank waited for a message no rank sent"
    return None


MISTAKES = [
    Mistake("all_gathers_k_and_v", "You all-gather K and V instead of passing them around the ring.",
            "All-gather holds every chunk at once on every rank: the memory ring attention exists to avoid.",
            "Send your K/V chunk to rank r+1 and receive from r−1, N−1 times, with point-to-point ops.",
            all_gathers_k_and_v, variants=("all_gather_then_merge_chunk_by_chunk",)),
    Mistake("ring_that_keeps_every_chunk", "Your ring keeps every K/V chunk it receives (in a list) until it returns.",
            "A rank then ends up holding all N chunks, as much memory as an all-gather: the ring exists so that a rank "
            "holds only two at a time.",
            "Drop each chunk once you have computed with it: hold only the one you compute with and the one arriving.",
            ring_that_keeps_every_chunk,
            variants=("ring_fills_a_buffer_of_every_chunk", "asks_its_send_pauses_up_front")),
    Mistake("merge_all_partials_at_the_end_float64", "You keep every step's partial output (in float64) and merge them "
            "all at the end.", "Each partial output is as large as a chunk of V (twice that in float64), so a rank "
            "holds N of them and float64 copies: more memory than gathering K and V.",
            "Merge each step's result into one running output and log-sum-exp as soon as it is computed, in q's dtype.",
            merge_all_partials_at_the_end),
    Mistake("sends_after_the_last_step", "You send K and V after the last step too.",
            "After N−1 hops every rank has seen every chunk; one more hop is wasted traffic.",
            "Skip the send/receive on the last step.", sends_after_the_last_step),
    Mistake("ring_runs_backwards", "Your ring runs r → r−1.",
            "The exercise's ring runs r → r+1, and the causal offsets assume it (at step t a rank holds rank (r − t)'s "
            "chunk).", "Send to (r+1) % N and receive from (r−1) % N.", ring_runs_backwards),
    Mistake("causal_mask_on_local_positions", "You build the causal mask from positions inside the chunks.",
            "Causality is about global positions: a chunk of a lower rank is fully visible, a higher one not at all.",
            "Mask with the global positions: chunk offset + index, for queries and keys.",
            causal_mask_on_local_positions, requires=later_chunks_seen_from_the_last_row),
    Mistake("chunk_offsets_wrong", "You compute the global offset of the K/V chunk you hold wrongly.",
            "At step t rank r holds the chunk of rank (r − t) mod N, whose keys start at that rank's offset.",
            "Use ((r − t) % N) × chunk as the keys' offset.", chunk_offsets_wrong),
    Mistake("local_attention_only", "Each rank attends only to its own K/V chunk.",
            "Every query must see every key of the sequence: the chunks must travel the ring.",
            "Pass K and V around the ring and merge the N partial results.", local_attention_only),
    Mistake("returns_q", "Your function returns q (or another input) instead of the attention output.",
            "Nothing in it computes attention.", "Compute softmax(q kᵀ/√d) v, chunk by chunk around the ring.",
            returns_q, includes=EVERY),
    Mistake("missing_scale", "You do not scale the scores by 1/√d.", "Attention is softmax(q kᵀ / √d) v.",
            "Multiply q kᵀ by d ** -0.5 before the softmax.", missing_scale),
    Mistake("missing_last_step", "You stop one step early: the chunk received last is never used.",
            "N ranks hold N chunks: N steps of attention, N−1 hops between them.",
            "Run N compute steps (the last without a send).", missing_last_step),
    Mistake("partial_outputs_averaged", "You average the partial outputs instead of merging them with log-sum-exp "
            "weights.", "Each partial softmax is normalised over its own chunk; the right weights are each chunk's "
            "share of the total exp-sum.", "Keep each partial's log-sum-exp and rescale: out = Σ exp(lse_i − lse) out_i.",
            partial_outputs_averaged, requires=averages_partials),
    Mistake("receives_half_the_message", "Your receive buffer has another size than what the neighbour sends.",
            "A point-to-point message must arrive into a buffer of exactly its shape.",
            "Receive into torch.empty_like(k) (and v).", receives_half_the_message),
    Mistake("deadlocks_on_three_ranks", "Your sends and receives are ordered so that with 3 ranks they wait for each "
            "other.", "Blocking sends and receives in a ring deadlock unless the order breaks the cycle.",
            "Use isend/irecv (or batch_isend_irecv), or let even and odd ranks send first in turn.",
            deadlocks_on_three_ranks),
    Mistake("blocking_send_then_recv", "Every rank sends its K/V with a blocking send before it receives.",
            "A large send completes only when the peer's receive runs (NCCL, and gloo here), so a ring of ranks that "
            "all send first waits forever; NCCL may buffer small chunks and hang only at scale.",
            "Post the send and the receive together with dist.batch_isend_irecv (or isend/irecv, then wait), or let "
            "even ranks send first and odd ranks receive first.", blocking_send_then_recv),
]


def merged_chunks(student, reference) -> str:
    """Where an online-softmax merge goes wrong, by how many chunks a rank merges: with a causal mask rank r merges
    r + 1 chunks (rank 0 only its own), without one every rank merges N. Right wherever a rank merges one chunk and
    wrong wherever it merges more: one chunk's attention is right, and the error comes in with the second chunk."""
    one, more = set(), set()
    for key in reference["full"]:
        case = reference["scenarios"][key]["case"]
        if case.get("measure_memory"):
            continue
        for rank, ok in enumerate(_right(student, reference, key)):
            (one if case["is_causal"] and rank == 0 else more).add(ok)
    if one == {False} and more == {False} and all(
            not any(_ranks(student, key)[0]["output"]) for key in reference["full"]
            if reference["scenarios"][key]["case"]["is_causal"]):
        return ("Even a rank that attends to its own chunk only (rank 0 with is_causal=True) returns zeros, and every "
                "rank is wrong: the first block merged into the (empty) running output contributes nothing, so the "
                "merge weighs the new block wrongly.")
    if one != {True} or more != {False}:
        return ""
    same = all(_sent(student, key, r) == reference["scenarios"][key]["ranks"][r]["sends"]
               for key in reference["full"] for r in range(len(reference["full"][key])))
    return ("Every rank that attends to its own chunk only (rank 0 with is_causal=True) is right: one chunk's "
            "attention (the scale, the mask on the diagonal tile, its softmax) is right. Every rank that merges two or "
            "more chunks is wrong, with or without the mask: the error comes in with the second chunk (from the "
            "second ring step on), " + (
                "in how it is merged into the running output (how the running output and log-sum-exp are rescaled "
                "and combined), not in what travels: your ranks sent the reference's messages (the same peers and "
                "sizes)." if same else "in the chunks your ranks pass around (their messages differ from the "
                "reference's) or in how they are merged into the running output."))


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
LOCATE = Locate(names={"output": "the output"}, narrow=merged_chunks,
                ignore=("sends", "recvs", "collectives", "forbidden"),
                factors=lambda case: {"world_size": case["world_size"], "√d": math.sqrt(case["d"])},
                rows={"output": lambda case: (case["chunk"], case["d"], "query row of the rank's chunk")})

"""The checks of ``ring_attention``: plain Python on the observations (no torch here)."""
import math

from ..judging.checking import case, close, held_at_gates, rank_results, scenario, sketch_error
from .cases import (
    ATOL,
    GROWTH_SLACK_CHUNKS,
    LAST_HOP_HELD_CHUNKS,
    LAST_HOP_SLACK_CHUNKS,
    LOOPBACK_SPARE,
    PEAK_SLACK_CHUNKS,
    RTOL,
    SEND_SLACK_CHUNKS,
    SKETCH_RTOL,
)

ABORTED_HINT = ("Every rank sends and receives K/V chunks of the same shape as its own k and v.")


def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    """The scenario's per-rank records, exactly one per rank, or a ScenarioError with one sentence."""
    return rank_results(student, reference, key, reword=lambda message: message.replace(
        "Every rank must send and receive tensors of the same shapes as its peers expect.", ABORTED_HINT))


def output_problem(student, reference, key: str) -> str | None:
    c = case(reference, key)
    for rank, (got, want) in enumerate(zip(ranks_of(student, reference, key), reference["full"][key])):
        if not close(got["output"], want, atol=ATOL, rtol=RTOL):
            return (f"When {c['what']}, rank {rank}'s output differs from full attention over the whole sequence"
                    f"{hint(c, rank)}")
    return None


def hint(c: dict, rank: int) -> str:
    """What most often goes wrong in this kind of scenario (never a value of the reference)."""
    n = c["world_size"]
    if not c["is_causal"]:
        return (": at every step use the K/V chunk you hold, scale the scores by 1/√d, and merge the partial results "
                "with log-sum-exp weights (out = Σ exp(L_i − L)·out_i with L = logsumexp of the L_i), not an average.")
    if n == 2:
        return (": mask by global positions. Query i (global position) sees key j only if j ≤ i: the chunk of a "
                "lower rank is all visible, your own chunk needs the triangular mask, a higher rank's none of it.")
    return (f" (rank {rank} of {n}): at step t a rank holds the chunk of rank (r − t) mod N, since K and V travel "
            "r → r+1. Check the direction of your sends and the global positions you give each chunk.")


def check_two_ranks(student, reference):
    return output_problem(student, reference, "two_ranks")


def check_three_ranks(student, reference):
    return output_problem(student, reference, "three_ranks")


def check_two_ranks_causal(student, reference):
    return output_problem(student, reference, "two_ranks_causal")


def check_causal_ring(student, reference):
    return output_problem(student, reference, "three_ranks_causal") or \
        output_problem(student, reference, "four_ranks_causal")


TRAFFIC_SCENARIOS = ("two_ranks", "three_ranks")
METHOD_SCENARIOS = (*TRAFFIC_SCENARIOS, "memory")
MIB = 1 << 20


def held_at_sends(meter, c: dict) -> list[float] | None:
    """What each rank held at its sends (the launcher's readings at the gates before each one, meter.py), the most
    of them; None unless every rank made at least the ring's N−1 sends."""
    held = held_at_gates(meter, c["world_size"])
    return [max(h) for h in held] if held and all(len(h) >= c["world_size"] - 1 for h in held) else None


def held_growth(held: list[list[float]], world_size: int) -> list[float]:
    """Per rank, how much more it held at its later sends than at its first send of the second hop. The method's own
    arithmetic: from the second hop on (the first allocates the running output), a ring holds the same chunks at
    every send, so this is 0 whatever the style; a ring that keeps what it receives grows by a chunk per hop."""
    growth = []
    for readings in held:
        later = readings[len(readings) // (world_size - 1):]  # from the second hop (K and V may be sent apart)
        growth.append(max(later) - later[0] if later else 0.0)
    return growth


def memory_problem(student, reference) -> str | None:
    """Measured outside the ranks: at every send a rank holds at most SEND_SLACK_CHUNKS chunks of K and V more than
    the reference's ranks at theirs (a ring holds the chunk it sends and the one arriving), no more at its last send
    than at its second (GROWTH_SLACK_CHUNKS: it keeps nothing it received), and at its sampled peak at most
    PEAK_SLACK_CHUNKS more (a gather holds all N)."""
    c = case(reference, "memory")
    ranks_of(student, reference, "memory")
    meter, want = scenario(student, "memory", c["what"])["meter"], reference["scenarios"]["memory"]["meter"]
    chunk = 2 * math.prod(c["lead"]) * c["chunk"] * c["d"] * 4  # K and V of one rank, float32
    advice = ("hold only the chunk you compute with and the one arriving, and merge each step's result into a "
              "running one.")
    at_sends = held_at_sends(meter, c)
    if at_sends is None:
        return (f"When {c['what']}, the grader did not see every rank send its K/V chunk N−1 times (its memory is "
                f"read at each send): {advice}")
    rank = max(range(len(at_sends)), key=at_sends.__getitem__)
    extra = at_sends[rank] - max(held_at_sends(want, c))
    if extra > SEND_SLACK_CHUNKS * chunk:
        return (f"When {c['what']}, rank {rank} held {extra / chunk:.1f} chunks of K and V more than the reference's "
                f"ranks when it sent one (measured outside your process): {advice}")
    growth = held_growth(held_at_gates(meter, c["world_size"]), c["world_size"])
    rank = max(range(len(growth)), key=growth.__getitem__)
    if growth[rank] > GROWTH_SLACK_CHUNKS * chunk:
        return (f"When {c['what']}, rank {rank} held {growth[rank] / chunk:.1f} chunks of K and V more at its last send "
                f"than at its second (measured outside your process): a ring holds the same two at every hop, so "
                f"something kept the chunks it received: {advice}")
    problem = last_hop_problem(meter, c, chunk, advice)
    if problem:
        return problem
    peaks = meter["peak_bytes"]
    if not isinstance(peaks, list) or len(peaks) != c["world_size"]:
        return f"When {c['what']}, the grader could not read the memory of every rank."
    rank = max(range(len(peaks)), key=peaks.__getitem__)
    extra = peaks[rank] - max(want["peak_bytes"])
    if extra > PEAK_SLACK_CHUNKS * chunk:
        return (f"When {c['what']}, rank {rank} held {extra / chunk:.1f} chunks of K and V ({extra / MIB:.0f} MiB) more "
                f"than the reference's ranks at its peak (measured outside your process), as if it gathered them: "
                f"{advice}")
    return None


def last_hop_problem(meter: dict, c: dict, chunk: int, advice: str) -> str | None:
    """Read by the launcher at moments of its own choosing (observe.HopFloors), judged by the method's arithmetic:
    the ranks sent every K/V chunk to every other rank and no more (the loopback's bytes, where it carries only
    theirs), and while the last hop's bytes flowed each rank held at all times no more than what a ring holds there
    (``cases.LAST_HOP_HELD_CHUNKS``). None where the loopback is shared with other programs (its bytes place nothing)
    or no reading fell in the last hop (the launcher was not scheduled then)."""
    gates = meter.get("gates") if isinstance(meter, dict) else None
    if not meter.get("private_network") or not isinstance(gates, dict):
        return None
    n = c["world_size"]
    need, sent = (n - 1) * n * chunk, meter.get("lo_bytes")
    if not isinstance(sent, int | float) or not need <= sent <= need * (1 + LOOPBACK_SPARE):
        got = f"{sent / MIB:.1f} MiB" if isinstance(sent, int | float) else "an unknown number of bytes"
        return (f"When {c['what']}, your ranks sent {got} where a ring sends {need / MIB:.0f} MiB (every rank's K "
                "and V to every other rank; counted on their loopback, outside your process): send each chunk once "
                "per hop and nothing else.")
    floors = gates.get("floors")
    if not isinstance(floors, list) or len(floors) != n:
        return f"When {c['what']}, the grader could not read the memory of every rank."
    last = [f[-1] if isinstance(f, list) and f and isinstance(f[-1], int | float) else 0 for f in floors]
    limit = (LAST_HOP_HELD_CHUNKS + LAST_HOP_SLACK_CHUNKS) * chunk
    for rank, held in enumerate(last):
        if held > limit:  # 0: no reading fell in that hop
            return (f"When {c['what']}, rank {rank} held at least {held / chunk:.1f} chunks of K and V all through "
                    f"the last hop (read outside your process at moments the grader chose), where a ring holds "
                    f"{LAST_HOP_HELD_CHUNKS:g} with q, k, v and its output: {advice}")
    return None


def check_ring_traffic(student, reference):
    """Sends only to r+1, receives only from r−1, (N−1)·(|K|+|V|) values each way, and no collective (the ranks'
    own record, read where the outputs show the real computation: the scenarios without a mask), which shapes the
    feedback; the points need the memory measured outside the ranks to agree (``memory_problem``)."""
    for key in TRAFFIC_SCENARIOS:
        c = case(reference, key)
        n = c["world_size"]
        chunk_values = 2 * math.prod(c["lead"]) * c["chunk"] * c["d"]  # K and V of one chunk
        for rank, r in enumerate(ranks_of(student, reference, key)):
            others = sorted(str(kind) for kind, count in r["collectives"] if int(count) and kind != "barrier")
            if others:
                return (f"When {c['what']}, rank {rank} used {', '.join(others)}: in ring attention K and V travel "
                        "by point-to-point messages only (send/recv, isend/irecv or batch_isend_irecv).")
            sent = r["sends"]
            if any(int(peer) != (rank + 1) % n for peer, _ in sent) or \
                    any(int(peer) != (rank - 1) % n for peer, _ in r["recvs"]):
                return (f"When {c['what']}, rank {rank} exchanged messages with ranks other than its ring "
                        "neighbours: send to (r+1) mod N and receive from (r−1) mod N.")
            total = sum(int(values) for _, values in sent)
            if total != (n - 1) * chunk_values:
                steps = total / chunk_values
                return (f"When {c['what']}, rank {rank} sent K and V {steps:.2g} times over, not N−1 = {n - 1} times: "
                        "one hop per step, and no send after the last step.")
    return memory_problem(student, reference)


def outputs_are_genuine(got: dict, want: dict) -> str | None:
    """The evidence: every rank's output is its rows of the attention over all ranks' seeded chunks (no rank can
    compute it from its own chunk alone), in the memory scenario all of it (a sketch of every column, on vectors
    secret under a held-out salt: a few columns of V can be gathered alone). Counts of messages are believed only
    with it."""
    ranks = got.get("ranks")
    c = want["case"]
    if not isinstance(ranks, list) or len(ranks) != c["world_size"]:
        return f"when {c['what']}, the grader found no result from every rank."
    for r, w in zip(ranks, want["ranks"]):
        if not isinstance(r, dict) or not close(r.get("output"), w["output"], atol=ATOL, rtol=RTOL) or (
                "sketch" in w and sketch_error(r.get("sketch"), w["sketch"]) > SKETCH_RTOL):
            return f"when {c['what']}, the ranks' outputs are not the attention over the grader's sequence."
    return None

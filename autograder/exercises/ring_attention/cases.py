"""The scenarios of ``ring_attention`` and the shapes of its chunks (plain Python)."""
from ..scenarios import held_out_rng, salted_seed

ATOL, RTOL = 2e-5, 1e-4  # float32 round-off of a three-way log-sum-exp merge (measured: under 1e-6)


SCENARIOS = {  # name: (world size, causal, what it is: the words after "when")
    "two_ranks": (2, False, "called on 2 ranks"),
    "two_ranks_causal": (2, True, "called on 2 ranks with is_causal=True"),
    "three_ranks": (3, False, "called on 3 ranks"),
    "three_ranks_causal": (3, True, "called on 3 ranks with is_causal=True"),
    "four_ranks_causal": (4, True, "called on 4 ranks with is_causal=True"),
    "memory": (4, False, "called on 4 ranks with chunks of 64 positions and d = 16384 (memory measured)"),
}
PUBLIC_SHAPES = {  # leading dims, chunk length n/N, head dim d
    "two_ranks": ([2, 3], 4, 8),
    "two_ranks_causal": ([2], 5, 8),
    "three_ranks": ([2, 2], 3, 6),
    "three_ranks_causal": ([1, 2], 4, 8),
    "four_ranks_causal": ([2], 3, 8),
    "memory": ([1], 64, 16384),
}
# The memory scenario: one rank's K and V (2·64·16384 float32) are 8 MiB, its scores (64 × 64) 16 KiB, so K/V chunks
# dominate what a rank holds. The same shape for every salt (its peaks are compared with the reference's).
# A rank may hold this many K/V chunks more than the reference's ranks: at its peak (sampled every 2 ms), where a
# gather holds N chunks and a ring 2 to 3 (measured: correct styles ≤ 0.3 more, 1.0 when the launcher's heap lends
# them pages; a ring that keeps every chunk 1.9, gathers 3.3–5.8), and at each of its sends (read at a gate after
# trimming the heap: exact; correct styles ≤ 1.0 more, a ring that keeps every partial output 3.8).
PEAK_SLACK_CHUNKS = 1.5
SEND_SLACK_CHUNKS = 2.0
# From its second hop on, a ring holds the same chunks at every send (measured: correct styles 0.01 more at the last
# than at the second; a ring that keeps every chunk, or every partial output, 1.0 more at N = 4: one per hop).
GROWTH_SLACK_CHUNKS = 0.5
# Read by the launcher alone (observe.HopFloors), from the method's own arithmetic: while the last hop's bytes flow,
# a ring rank holds all the time no more than the q, k and v the grader handed it (1.5 chunks of K and V), the chunk
# it computes with and the one arriving (2) and its running output (0.5): 4 chunks; the least it held then (its
# floor) must stay under that plus LAST_HOP_SLACK_CHUNKS (a step's result still referenced, 0.5, and the rank's own
# overhead). A ring that keeps what it received holds 1.5 + 3 + 0.5 there at least, partial outputs kept in
# float64 1.5 + 2 + 0.5 + 3. Measured: correct styles 4.54 at most, a ring that fills a buffer of every chunk 5.03,
# one that keeps every chunk 5.54, every partial output in float64 6.99 (docs/method-evidence.md).
LAST_HOP_HELD_CHUNKS = 4.0
LAST_HOP_SLACK_CHUNKS = 0.75
# What the ranks send, counted by the loopback: every rank's K and V to every other rank, (N−1)·N chunks, and at most
# this fraction more (TCP's and gloo's headers, measured 0.1-0.5 %, and the grader's own store traffic, which polls
# while a send waits for its receive and grows with the machine's load): bytes for show, which would move the hops'
# places on the loopback (more than 0.15 of a hop up front brings a ring that keeps every chunk under the limit
# above), cost the method's points.
LOOPBACK_SPARE = 0.05
FINGERPRINT_COLUMNS = 4  # columns of every output row kept from the memory scenario (for feedback)
SKETCH_RTOL = 1e-3  # the memory scenario's evidence: a sketch of each rank's whole output (float32 round-off ~1e-6)


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; held-out salts draw other shapes (chunks of 2 to 6 positions, so every causal
    chunk has a diagonal block and past blocks) and other seeds."""
    found = {}
    for i, (name, (world_size, causal, words)) in enumerate(SCENARIOS.items()):
        if salt == 0 or name == "memory":
            lead, chunk, d = PUBLIC_SHAPES[name]
        else:
            rng = held_out_rng(salt, f"shapes of {name}")
            lead = [rng.randint(1, 3) for _ in range(rng.randint(1, 2))]
            chunk, d = rng.randint(2, 6), rng.choice([4, 6, 8, 12])
        found[name] = {"what": words, "world_size": world_size, "is_causal": causal, "lead": list(lead),
                       "chunk": chunk, "d": d, "seed": salted_seed(500 + i, salt), "measure_memory": name == "memory"}
    return found

"""Measuring a scenario's ranks from outside: what their own code cannot lower.

The launching process (the grading worker's zygote, which never runs student code, or the student's kernel in a
self-check) samples, while the ranks run:

* **memory**: each rank's anonymous and shared-memory resident bytes (``RssAnon + RssShmem`` of
  ``/proc/<pid>/status``) every ``interval`` seconds (``PEAK_SAMPLE_S`` where a check judges the peak, else
  ``SAMPLE_S``), above what it inherited at the fork (the launcher's own);
  the peak of each rank, and the peak of their sum. Freed tensors leave it: the worker sets
  ``MALLOC_MMAP_THRESHOLD_`` so that large blocks are returned to the kernel on free (in the scenarios whose
  memory a check reads, ``peaks`` or ``GatePolicy.reads_memory``; the others' ranks reuse freed blocks, faster,
  and their readings are not judged: ``ranks.reuse_freed_memory``). A rank cannot make this
  number smaller than the memory it really holds (file-backed pages, which it could drop, are not counted);
* **bytes on the loopback**: the ``lo`` transmit counter of the ranks' network namespace, before the ranks start and
  after they end: every byte the ranks sent each other through gloo (or through any socket). Exact where that
  namespace is theirs alone (``private_network``): the grader's sandbox, or a namespace the launcher made for them
  (loopback.py); where neither is possible the loopback also carries other programs' traffic, so checks that
  judge the bytes apply only where it is private.

Where these numbers are read by the checks, the exercise states its problem size so that the method's signal
dominates (docs/grading.md, "What a student controls").

**Gates.** Memory sampled every few milliseconds can miss a short peak, and bytes say nothing about *when* they
were sent. So a scenario may put gates in the grader's model (``ranks.ask_gate``): at each one a rank stops, sends
a digest of the data it has reached, and waits for the launcher's answer: a seed drawn after the fork, from which
the grader's ``GradientGate`` draws per-element factors it multiplies into the gradient (gating.py). The launcher's
gate policy answers: ``SampleAtGates`` reads the waiting rank's memory (what it holds at that point of its backward
pass); ``OverlapGates`` holds one rank and watches the loopback, to tell communication that runs while the backward
pass goes on from communication that waits for it or comes after it. The seeds make the gradient at each gate
unknowable before the previous gate was answered and the layer between them ran backward, so a rank cannot answer
its gates in advance; the launcher refuses more requests than the model has gates, and recomputes, once the ranks
have ended, what each digest must be under the seeds it handed out (``GatePolicy.expect``), which the checks compare
with the rank's.
"""
import os
import random
import time
from pathlib import Path

from .loopback import tx_bytes

PEAK_SAMPLE_S = 0.002  # where a check judges a scenario's peak (``peaks=True``): often enough to see a short one
SAMPLE_S = 0.25        # elsewhere: gates read memory exactly when it matters, and each reading costs the ranks CPU


def status_bytes(pid: int, fields=("RssAnon", "RssShmem")) -> int | None:
    """The named ``/proc/<pid>/status`` fields, summed in bytes; None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in fields:
            total += int(value.split()[0]) * 1024
    return total


def ranks_alone(pids: list[int], baseline: int) -> list[int | None]:
    """What each rank process holds above ``baseline`` (None when it is gone)."""
    return [None if held is None else max(0, held - baseline) for held in map(status_bytes, pids)]


class Meter:
    def __init__(self, interval: float = SAMPLE_S, gates=None, held=None, private_network: bool = False,
                 sent_counter=tx_bytes, sample_s: float | None = None):
        """``held(pids, baseline)``: what each rank holds now; in class grading, counted over every process it
        started (grader/sandbox/rank_holdings.py), else the rank processes alone. ``sent_counter()``: the bytes sent so
        far on the ranks' loopback; ``private_network``: it carries only their traffic. ``interval``: how often the
        launcher wakes (a gate policy's ticks may need it often); ``sample_s``: how often it reads memory then
        (default: at every wake-up)."""
        self.interval, self.gates, self.measure = interval, gates, held or ranks_alone
        self.sample_s, self.next_sample = interval if sample_s is None else sample_s, 0.0
        self.private_network, self.sent_counter = private_network, sent_counter
        self.pids: list[int] = []
        self.baseline = 0
        self.peaks: list[int] = []
        self.total_peak = 0
        self.samples = 0
        self.maxrss_kib: list[int | None] = []
        self.lo_start = self.lo_end = None
        self.seconds = 0.0

    def open(self) -> None:
        """Before the ranks are forked: the first rank may send (joining the process group, a broadcast) before the
        launcher has forked the last one, let alone started the meter, when the machine is loaded."""
        self.started = time.monotonic()
        self.baseline = status_bytes(os.getpid()) or 0
        self.lo_start = self.sent_counter()

    def start(self, pids: list[int]) -> None:
        """Once every rank is forked (after ``open``)."""
        self.pids = pids
        self.peaks = [0] * len(pids)
        self.maxrss_kib = [None] * len(pids)
        self.sample()

    def held(self, rank: int) -> int | None:
        """What rank ``rank`` holds now above what it inherited (None when it is gone)."""
        return self.measure(self.pids, self.baseline)[rank]

    def sample_if_due(self) -> None:
        """A reading, unless the last one is younger than ``sample_s`` (each costs the launcher a read of /proc)."""
        now = time.monotonic()
        if now >= self.next_sample:
            self.next_sample = now + self.sample_s
            self.sample()

    def sample(self) -> None:
        total = 0
        for i, grown in enumerate(self.measure(self.pids, self.baseline)):
            if grown is not None:
                self.peaks[i] = max(self.peaks[i], grown)
                total += grown
        self.total_peak = max(self.total_peak, total)
        self.samples += 1

    def sent(self) -> int | None:
        """Bytes sent on the loopback since the ranks started."""
        now = self.sent_counter()
        return None if None in (now, self.lo_start) else now - self.lo_start

    def gate_request(self, rank: int, request) -> list[tuple[int, float]]:
        return self.gates.request(rank, request, self) if self.gates else []

    def gate_tick(self) -> list[tuple[int, float]]:
        return self.gates.tick(self) if self.gates else []

    def reaped(self, rank: int, usage) -> None:
        self.maxrss_kib[rank] = int(usage.ru_maxrss)

    def finish(self) -> None:
        """After every rank has ended: nothing more is sent."""
        self.lo_end = self.sent_counter()
        self.seconds = time.monotonic() - self.started

    def result(self) -> dict:
        lo = (self.lo_end - self.lo_start) if None not in (self.lo_start, self.lo_end) else None
        return {"peak_bytes": self.peaks, "total_peak_bytes": self.total_peak, "lo_bytes": lo,
                "private_network": self.private_network,
                "samples": self.samples, "maxrss_kib": self.maxrss_kib,
                **({"gates": self.gates.result()} if self.gates else {})}


# ---- gate policies --------------------------------------------------------------------------------

def _digest(request) -> list[float] | None:
    digest = request.get("digest") if isinstance(request, dict) else None
    if isinstance(digest, list) and len(digest) == 2 and all(isinstance(v, int | float) for v in digest):
        return [float(v) for v in digest]
    return None


SEED_BITS = 52  # a gate's answer travels as a float (ranks.ask_gate): exact below 2 ** 53


class GatePolicy:
    """The launcher's side of the gates. Each answer is a seed drawn per rank and gate index by the launcher, after
    the ranks were forked (nothing in a rank's memory predicts it). The grader's ``GradientGate`` multiplies the
    gradient by per-element factors drawn from it (gating.py), so the gradient reaching the next gate exists only
    once this gate was answered and the layer between them really ran backward with it: a rank cannot answer a
    gate ahead of its computation and be measured while it holds little.

    ``shared``: every rank gets the same seed at the same gate index (ranks that compute on common data, such as
    the next step's gradients, which the seed draws: ``gating.step_seed``).

    ``gates``: how many gates each rank's model has. A request beyond them is answered at once with a seed no
    computation checks, and counted (``refused``): the rank loses the method check. ``expect(seeds)``: the grader's
    own recomputation, in the launcher once the ranks have ended, of what each rank's digests must be under the
    seeds it was given (``gating.replay``); the checks compare the ranks' digests with it. Every request is
    recorded with the rank's memory and the bytes sent so far."""

    tick_s: float | None = None  # how often ``tick`` must run while the ranks go on (None: it does nothing)
    reads_memory = False         # a check reads the ranks' memory at the gates (then they return freed memory)

    def __init__(self, world_size: int, gates: int | None = None, expect=None, shared: bool = False):
        self.world_size, self.gates, self.expect, self.shared = world_size, gates, expect, shared
        self.seeds: list[list[int]] = [[] for _ in range(world_size)]
        self.common: list[int] = []              # ``shared``: one seed per gate index, the same for every rank
        self.reached = [0] * world_size          # gates each rank has asked at
        self.refused = [0] * world_size          # requests beyond its model's gates
        self.records: list[dict] = []
        self.random = random.SystemRandom()      # nothing in the ranks' memory predicts it

    def answer(self, rank: int, index: int) -> int:
        seeds = self.seeds[rank]
        while len(seeds) <= index:
            if self.shared:  # ranks in lockstep that must compute on the same data (a step's gradients)
                while len(self.common) <= len(seeds):
                    self.common.append(self.random.getrandbits(SEED_BITS))
            seeds.append(self.common[len(seeds)] if self.shared else self.random.getrandbits(SEED_BITS))
        return seeds[index]

    def record(self, rank: int, request, meter: Meter) -> int | None:
        """The request's gate index, or None for one beyond the model's gates (answer it with ``refuse``)."""
        index = self.reached[rank]
        if self.gates is not None and index >= self.gates:
            self.refused[rank] += 1
            return None
        self.reached[rank] += 1
        self.records.append({"rank": rank, "index": index, "digest": _digest(request), "held_bytes": meter.held(rank),
                             "sent_bytes": meter.sent()})
        return index

    def refuse(self, rank: int) -> list[tuple[int, float]]:
        """Answered at once, never held: a rank that asks more often than its model has gates is not measured
        there, and its extra answers carry no seed any check uses."""
        return [(rank, self.random.getrandbits(SEED_BITS))]

    def request(self, rank: int, request, meter: Meter) -> list[tuple[int, float]]:
        raise NotImplementedError

    def tick(self, meter: Meter) -> list[tuple[int, float]]:
        return []

    def expected(self):
        if self.expect is None:
            return None
        try:
            return self.expect([list(seeds[:self.reached[rank]]) for rank, seeds in enumerate(self.seeds)])
        except Exception as exc:  # the grader's own code: the check then says it could not verify
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}

    def result(self) -> dict:
        return {"records": self.records[:256], "refused": self.refused, "expected": self.expected()}


class SampleAtGates(GatePolicy):
    """Each rank's memory at each of its gates, answered at once: what it holds at that point of the computation."""

    reads_memory = True

    def request(self, rank: int, request, meter: Meter) -> list[tuple[int, float]]:
        index = self.record(rank, request, meter)
        return self.refuse(rank) if index is None else [(rank, self.answer(rank, index))]


class StopAllAtGates(GatePolicy):
    """Every rank waits at each gate until all have reached it. The reading taken when the last one arrives (the
    largest ``sent_bytes`` of that gate index) is every byte the ranks sent before that point of their computation,
    and none they send after it: all of them are stopped there."""

    def __init__(self, world_size: int, gates: int | None = None, expect=None, shared: bool = False):
        super().__init__(world_size, gates, expect, shared)
        self.waiting: dict[int, set[int]] = {}

    def request(self, rank: int, request, meter: Meter) -> list[tuple[int, float]]:
        index = self.record(rank, request, meter)
        if index is None:
            return self.refuse(rank)
        arrived = self.waiting.setdefault(index, set())
        arrived.add(rank)
        if len(arrived) < self.world_size:
            return []
        del self.waiting[index]
        return [(r, self.answer(r, index)) for r in sorted(arrived)]


class OverlapGates(GatePolicy):
    """Every rank waits at each gate until all have reached it. At gate index ``hold`` (reached when the ranks have
    finished the backward of the layers after it, so a bucket's gradients are ready):

    1. only rank 0 goes on: does it reach its next gate within ``wait_s`` while its peers stay held? (A rank whose
       gradient hook waits for an all-reduce cannot: its peers have not contributed yet.)
    2. then the others go on too while rank 0 stays held at its next gate: do at least ``bucket_bytes`` appear on the
       loopback within ``wait_s``? (Only an all-reduce launched during the backward pass sends anything while rank 0
       is stopped before the next layer; one launched after backward has not started.)
    """

    tick_s = PEAK_SAMPLE_S  # it times rank 0 against wait_s, and watches the loopback while rank 0 is held

    def __init__(self, world_size: int, hold: int, bucket_bytes: int, wait_s: float = 1.0, gates: int | None = None,
                 expect=None):
        super().__init__(world_size, gates, expect)
        self.hold, self.bucket_bytes, self.wait_s = hold, bucket_bytes, wait_s
        self.waiting: dict[int, set[int]] = {}
        self.phase, self.since, self.sent_at_release = "barrier", 0.0, 0
        self.continued = self.sent_while_held = None

    def request(self, rank: int, request, meter: Meter) -> list[tuple[int, float]]:
        index = self.record(rank, request, meter)
        if index is None:
            return self.refuse(rank)
        self.waiting.setdefault(index, set()).add(rank)
        if self.phase == "first goes" and rank == 0 and index == self.hold + 1:
            self.continued = True
            return self._release_peers(meter)
        return self._release_full(meter)

    def _release_full(self, meter: Meter) -> list[tuple[int, float]]:
        out = []
        for index in sorted(self.waiting):
            ranks = self.waiting[index]
            if len(ranks) < self.world_size:
                continue
            if index == self.hold and self.phase == "barrier":
                self.phase, self.since = "first goes", time.monotonic()
                ranks.discard(0)
                out.append((0, self.answer(0, index)))
                continue
            if index == self.hold + 1 and self.phase in ("first goes", "peers go"):
                continue  # rank 0 waits here until the bytes test is over
            out += [(r, self.answer(r, index)) for r in sorted(ranks)]
            del self.waiting[index]
        return out

    def _release_peers(self, meter: Meter) -> list[tuple[int, float]]:
        self.phase, self.since, self.sent_at_release = "peers go", time.monotonic(), meter.sent() or 0
        peers = sorted(self.waiting.pop(self.hold, set()))
        return [(r, self.answer(r, self.hold)) for r in peers]

    def tick(self, meter: Meter) -> list[tuple[int, float]]:
        now = time.monotonic()
        if self.phase == "first goes" and now - self.since > self.wait_s:
            self.continued = False
            return self._release_peers(meter)
        if self.phase == "peers go":
            sent = (meter.sent() or 0) - self.sent_at_release
            if sent >= self.bucket_bytes or now - self.since > self.wait_s:
                self.sent_while_held, self.phase = sent, "done"
                return self._release_full(meter)
        return []

    def result(self) -> dict:
        return {**super().result(), "continued": self.continued, "sent_while_held": self.sent_while_held,
                "bucket_bytes": self.bucket_bytes}

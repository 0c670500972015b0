"""The checks of ``Checkpointer``: plain Python on the observations (no torch here)."""
from ..judging.checking import case, close, rank_results
from .cases import GATHERED_SHARE, RESIZE_ATOL, SAME_RTOL, STATE_BYTES, expected_step

MIB = 1 << 20
RESUMED = ("same_size", "resize")


def first_rank(student, reference, key: str) -> dict:
    return rank_results(student, reference, key)[0]


def never_failed(student, reference, key: str) -> dict:
    """The run that never failed under the seeds this student's killed run was answered (the launcher's own ranks,
    recorded with the resumed scenario: observe.KilledRun)."""
    return run_that_never_failed(student["scenarios"].get(key) or {}, reference["scenarios"][key])


def run_that_never_failed(got: dict, want: dict) -> dict:
    """The scenario's run that never failed; the reference's where it is not this scenario's run (what it read, and
    its state after the first step, before any seed, are the reference's): a replayed or forged observation then
    compares with the reference's seeds, which it was not given."""
    theirs = want["meter"]["never_failed"]
    try:
        mine = got["meter"]["never_failed"]
        if close(flat(mine["read"]), flat(theirs["read"]), atol=1e-6, rtol=1e-6) and \
                close(mine["first"], theirs["first"], atol=1e-6, rtol=1e-5):
            return mine
    except (KeyError, TypeError, AttributeError, IndexError):
        pass
    return theirs


def flat(rows) -> list:
    return [value for row in rows for value in row] if isinstance(rows, list) and all(
        isinstance(row, list) for row in rows) else None


def tolerance(key: str) -> dict:
    return {"atol": 1e-7, "rtol": SAME_RTOL} if key == "same_size" else {"atol": RESIZE_ATOL}


def ends_like_never_failed(student, reference, key: str) -> str | None:
    c = case(reference, key)
    got, truth = first_rank(student, reference, key), never_failed(student, reference, key)
    if close(got["final"], truth["final"], **tolerance(key)):
        return None
    return (f"When {c['what']}, the parameters after step {c['steps']} differ from those of a run that never failed: "
            "the resumed run must continue exactly where the last complete checkpoint left off (see the other "
            "checks for what came back wrong).")


def check_same_size(student, reference):
    return ends_like_never_failed(student, reference, "same_size")


def check_resize(student, reference):
    return ends_like_never_failed(student, reference, "resize")


def check_loaded_step(student, reference):
    for key in RESUMED:
        c = case(reference, key)
        want = expected_step(c)
        for rank, r in enumerate(rank_results(student, reference, key)):
            if r["loaded"] != want:
                if r["loaded"] == c["kill_after"]:
                    return (f"When {c['what']}, load() on rank {rank} returned the step of the save the kill cut off: "
                            "publish a checkpoint only once all of it is written (DCP's .metadata, written last), "
                            "and load the newest complete one.")
                return (f"When {c['what']}, load() on rank {rank} returned {r['loaded']!r}, not the step of the "
                        "newest complete checkpoint: return the step that the checkpoint you loaded was saved at.")
    return None


def check_no_step_lost(student, reference):
    for key in RESUMED:
        c = case(reference, key)
        got, truth = first_rank(student, reference, key), never_failed(student, reference, key)
        start = expected_step(c)
        want = truth["read"][start:]
        if len(got["read"]) != len(want):
            return (f"When {c['what']}, the resumed run trained {len(got['read'])} steps where {len(want)} were left: "
                    "no step may be lost or repeated.")
        for step, (mine, theirs) in enumerate(zip(got["read"], want), start=start + 1):
            if not close(mine[:1], theirs[:1], atol=1e-6, rtol=1e-6):
                return (f"When {c['what']}, step {step} of the resumed run read another batch than the run that never "
                        "failed: save the data loader's position (its state_dict) and restore it in load().")
            if not close(mine[1:], theirs[1:], atol=1e-6, rtol=1e-6):
                return (f"When {c['what']}, step {step} of the resumed run drew other random numbers than the run that "
                        "never failed: save torch's random number generator state and restore it in load().")
    return None


def check_optimizer(student, reference):
    c = case(reference, "resize")
    got, truth = first_rank(student, reference, "resize"), never_failed(student, reference, "resize")["at_resume"]
    if got["after_load"]["adam_step"] != truth["adam_step"] or \
            not close(got["after_load"]["moments"], truth["moments"], atol=RESIZE_ATOL):
        return (f"When {c['what']}, AdamW's moments and step count after load() are not those the run had at that "
                "step: save the optimizer's sharded state with the model's (get_state_dict) and load it through DCP, "
                "which reshards it to the new world size (set_state_dict).")
    return None


def check_shards_only(student, reference):
    c = case(reference, "memory")
    rank_results(student, reference, "memory")
    mine, theirs = student["scenarios"]["memory"]["meter"], reference["scenarios"]["memory"]["meter"]
    for rank, (got, want) in enumerate(zip(mine["peak_bytes"], theirs["peak_bytes"])):
        extra = (got or 0) - (want or 0)
        if extra > GATHERED_SHARE * STATE_BYTES:
            return (f"When {c['what']}, rank {rank} held {extra / MIB:.0f} MiB more than the reference: it gathered "
                    "the whole state. Let every rank write only its own shards (DCP), never the full state dict.")
    return None


def checkpointed_for_real(got: dict, want: dict) -> str | None:
    """The evidence: after load() the parameters are the trained ones of the run at that step under the seeds the
    killed run was answered after each save (only a real save and load give them: no replay from the case's seeds
    does); in the memory scenario, the ranks trained the seeded model and the directory holds at least half
    the state's bytes (measured by the launcher after the ranks ended)."""
    if want["case"]["memory"]:
        ranks = got.get("ranks")
        trained = isinstance(ranks, list) and ranks and close(ranks[0]["trained"], want["ranks"][0]["trained"],
                                                              atol=1e-6, rtol=1e-6)
        if trained and (got.get("disk_bytes") or 0) >= STATE_BYTES / 2:
            return None
        return f"when {want['case']['what']}, the checkpoint directory did not hold the trained state."
    ranks = got.get("ranks")
    truth = run_that_never_failed(got, want)
    if isinstance(ranks, list) and ranks and close(ranks[0]["after_load"]["params"], truth["at_resume"]["params"],
                                                   atol=RESIZE_ATOL):
        return None
    return f"when {want['case']['what']}, load() did not bring back the parameters the run had saved."

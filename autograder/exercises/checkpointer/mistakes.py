"""The known mistakes of ``Checkpointer`` and their fingerprints in the ranks' records (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/checkpointer.py
(tests/exercises/test_diagnosis.py). Rank 0 of each resumed run records what ``load()`` returned, the whole state
right after it, and what each resumed step read (sums of its batch and of its random numbers); each resumed scenario
carries the run that never failed under the seeds its killed run was answered (``meter.never_failed``). The memory
scenario's peaks are read outside the ranks.
"""
from ..judging.checking import close
from ..judging.diagnosis import EVERY, Mistake, error_of, ran
from ..judging.localise import Locate
from .cases import GATHERED_SHARE, RESIZE_ATOL, STATE_BYTES, expected_step
from .checks import never_failed

UNREADABLE = ("PytorchStreamReader", "central directory", "EOF", "unpickl", "truncated", "corrupt", "Ran out of input",
              "invalid load key", "UnpicklingError")
WRONG_SIZE = ("size mismatch", "dimensions", "No such file", "FileNotFoundError", "shape")


def _rank0(student, key) -> dict:
    return ran(student, key)["ranks"][0]


def _first_read(student, reference, key) -> tuple[list, list]:
    start = expected_step(reference["scenarios"][key]["case"])
    return _rank0(student, key)["read"][0], never_failed(student, reference, key)["read"][start]


def _resumed_right_state(student, reference, key) -> bool:
    got = _rank0(student, key)["after_load"]
    want = never_failed(student, reference, key)["at_resume"]
    return close(got["params"], want["params"], atol=RESIZE_ATOL) and close(got["moments"], want["moments"],
                                                                            atol=RESIZE_ATOL)


def no_rng_saved(student, reference):
    mine, theirs = _first_read(student, reference, "same_size")
    if close(mine[:1], theirs[:1], atol=1e-6, rtol=1e-6) and not close(mine[1:], theirs[1:], atol=1e-6, rtol=1e-6):
        return "the first resumed step read the right batch but drew other random numbers"
    return None


def no_data_position(student, reference):
    mine, theirs = _first_read(student, reference, "same_size")
    if not close(mine[:1], theirs[:1], atol=1e-6, rtol=1e-6) and _resumed_right_state(student, reference, "same_size"):
        return "the model and AdamW came back right, but the first resumed step read another batch"
    return None


def writes_in_place(student, reference):
    c = reference["scenarios"]["resize"]["case"]
    error = error_of(student, "resize")
    if any(word in error for word in UNREADABLE):
        return f"after the grader cut the newest save off, load() raised {error.split(':')[0][:40]}"
    if error == "" and _rank0(student, "resize")["loaded"] == c["kill_after"]:
        return "after the grader cut the newest save off, load() took it as complete"
    return None


def cannot_load_on_another_size(student, reference):
    error = error_of(student, "resize")
    if any(word in error for word in WRONG_SIZE) and _resumed_right_state(student, reference, "same_size"):
        return f"loaded on 2 ranks the checkpoint came back right; on 3 ranks load() raised {error.split(':')[0][:40]}"
    return None


def optimizer_not_resharded(student, reference):
    if _resumed_right_state(student, reference, "same_size") and not _resumed_right_state(student, reference, "resize") \
            and close(_rank0(student, "resize")["after_load"]["params"],
                      never_failed(student, reference, "resize")["at_resume"]["params"], atol=RESIZE_ATOL):
        return "on 3 ranks the parameters came back right but AdamW's moments did not"
    return None


def gathers_on_rank_0(student, reference):
    mine = ran(student, "memory")["meter"]["peak_bytes"]
    theirs = reference["scenarios"]["memory"]["meter"]["peak_bytes"]
    extra = max((m or 0) - (t or 0) for m, t in zip(mine, theirs))
    if extra > GATHERED_SHARE * STATE_BYTES:
        return f"a rank held {extra / (1 << 20):.0f} MiB more than the reference while saving"
    return None


def replays_training_in_load(student, reference):
    for key in ("same_size", "resize"):
        mine, theirs = _first_read(student, reference, key)
        if _rank0(student, key)["loaded"] != expected_step(reference["scenarios"][key]["case"]) or \
                not close(mine, theirs, atol=1e-6, rtol=1e-6):
            return None
    if _resumed_right_state(student, reference, "same_size"):  # resumed after step 2 at least: a seeded step
        return None
    return "load() returned the right step and the resumed steps read the right data, from parameters the run never had"


def does_nothing(student, reference):
    if _rank0(student, "same_size")["loaded"] is None and (ran(student, "memory").get("disk_bytes") or 0) == 0:
        return "load() found nothing and the checkpoint directory stayed empty"
    return None


MISTAKES = [
    Mistake("no_rng_saved", "You do not save and restore torch's random number generator state.",
            "The resumed run then draws other random numbers (dropout masks, noise) than the run that never stopped.",
            "Save torch.get_rng_state() with the checkpoint and restore it with torch.set_rng_state() in load().",
            no_rng_saved),
    Mistake("no_data_position", "You do not save and restore the data loader's position.",
            "The resumed run then reads the epoch's batches from the start again: some twice, others never.",
            "Save loader.state_dict() with the checkpoint and restore it with loader.load_state_dict() in load().",
            no_data_position),
    Mistake("writes_in_place", "You write each checkpoint over the previous one.",
            "A kill during the write leaves neither the old checkpoint nor the new one complete.",
            "Write every checkpoint to a new place and publish it by its last file operation (DCP's .metadata in a "
            "folder per step), then load the newest complete one.", writes_in_place),
    Mistake("cannot_load_on_another_size", "Every rank saves and loads its own shards as a file of its own.",
            "Those shards fit only the world size that wrote them: on another number of ranks there are other "
            "shards, or no file at all.",
            "Save through torch.distributed.checkpoint, whose metadata lets any world size read the pieces it needs.",
            cannot_load_on_another_size),
    Mistake("optimizer_not_resharded", "You load AdamW's state only on the world size that saved it.",
            "On another number of ranks AdamW then starts again from zero moments and step 1.",
            "Save the optimizer's sharded state with the model's (get_state_dict) and load both through DCP, which "
            "reshards them (set_state_dict).", optimizer_not_resharded),
    Mistake("gathers_on_rank_0", "You gather the whole model and optimizer state to save it.",
            "The gathering rank then holds the whole state at once, which sharding exists to avoid.",
            "Let every rank write only its own shards with torch.distributed.checkpoint.", gathers_on_rank_0),
    Mistake("replays_training_in_load", "Your checkpoint does not hold the trained state: load() rebuilds it by "
            "running the training again.",
            "A run's state follows from more than a fresh process sees (here, numbers only the saving run was given "
            "weigh each step), so a replay ends elsewhere, and each restart redoes every step.",
            "Save the model's and AdamW's sharded state in save(step) (torch.distributed.checkpoint) and restore it "
            "in load().", replays_training_in_load),
    Mistake("does_nothing", "Your checkpointer saves and loads nothing.", "A killed run then starts over from step 0.",
            "Save the state in save(step) and restore the newest complete checkpoint in load().", does_nothing,
            includes=EVERY),
]


LOCATE = Locate(names={"final": "the final parameters", "loaded": "the step load() returned",
                       "after_load": "the state after load() ({})", "read": "what each resumed step read"},
                # the state after load() and at the end follow the seeds each run was answered (not the reference's)
                ignore=("forbidden", "load_on_empty", "after_load", "final"),
                tolerance=lambda case: RESIZE_ATOL)

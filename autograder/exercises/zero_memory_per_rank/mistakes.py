"""The known mistakes of ``zero_memory_per_rank`` and their fingerprints in the returned numbers (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/zero_memory_per_rank.py
(tests/exercises/test_diagnosis.py). A fingerprint reads the raw calls (an error call does not parse like a value call).
"""
import math

from ..judging.diagnosis import EVERY, Mistake, raw_scenario
from ..judging.localise import Locate
from .cases import DEFAULT, SHARDED, STAGES
from .checks import _bytes, _close, _names, _which_sharded


def _value(student, key, stage):
    call = raw_scenario(student, key)["calls"][stage]
    value = call.get("value") if isinstance(call, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _case(reference, key):
    return reference["scenarios"][key]["case"]


def _shards(stage, subset):
    def seen(student, reference):
        c = _case(reference, "fp32_grads")  # w, g and k all differ: which are divided shows
        got = _value(student, "fp32_grads", stage)
        if got is not None and c["world_size"] > 1 and _which_sharded(got, c) == subset:
            return (f"with world_size={c['world_size']} your stage {stage} divides {_names(subset)} by the world size "
                    f"(it should divide {_names(SHARDED[stage])})")
        return None
    return seen


def _odd_rounding(rule, words):
    def seen(student, reference):
        differs = 0
        for key in ("odd_small", "odd_large"):
            c = _case(reference, key)
            n, world, (w, g, k) = c["num_params"], c["world_size"], c["bytes_per_param"] or DEFAULT
            for stage in (1, 2, 3):
                whole = sum(b * n for i, b in enumerate((w, g, k)) if i not in SHARDED[stage])
                parts = sum(b for i, b in enumerate((w, g, k)) if i in SHARDED[stage])
                got, exact, wrong = _value(student, key, stage), whole + parts * n / world, whole + rule(parts, n, world)
                if got is None or not _close(got, wrong):
                    return None
                differs += not _close(wrong, exact)
        return differs and f"with an odd world size your numbers are {words}"
    return seen


def stages_shifted_by_one(student, reference):
    c = _case(reference, "fp32_grads")
    subsets = [_which_sharded(_value(student, "fp32_grads", stage), c) for stage in (0, 1, 2)]
    if subsets == [SHARDED[1], SHARDED[2], SHARDED[3]]:
        return "your stages 0, 1 and 2 give what stages 1, 2 and 3 should"
    return None


def _layout_ignored(k_only: bool):
    def seen(student, reference):
        key = "fp32_adam" if k_only else "fp32_grads"  # where the wrong layout gives other bytes than the right one
        c = _case(reference, key)
        w, g, k = c["bytes_per_param"]
        layout = (w, g, DEFAULT[2]) if k_only else DEFAULT
        got = _value(student, key, 0)
        if got is not None and not _close(got, _bytes(c, (), (w, g, k))) and _close(got, _bytes(c, (), layout)):
            return f"with bytes_per_param={tuple(c['bytes_per_param'])} your stage 0 gives what {layout} gives"
        return None
    return seen


def returns_gigabytes(student, reference):
    got, want = _value(student, "paper", 0), _value(reference | {"raw": reference}, "paper", 0)
    if got and want and any(_close(got * unit, want) for unit in (1e9, 2**30)):
        return f"in the paper's example your stage 0 returns {got:g}: gigabytes, not bytes"
    return None


def returns_formatted_string(student, reference):
    call = raw_scenario(student, "paper")["calls"][0]
    text = call.get("text") if isinstance(call, dict) else None
    if call.get("type") == "str" and isinstance(text, str) and "B" in text:
        return "your function returns a formatted text (such as '120.0 GB'), not a number"
    return None


def no_value_error(student, reference):
    calls = raw_scenario(student, "invalid")["calls"]
    stages = _case(reference, "invalid")["stages"]
    if all(isinstance(c, dict) and isinstance(c.get("value"), (int, float)) for c in calls):
        return f"with stage={stages[0]} your function returned a number instead of raising ValueError"
    return None


def always_raises(student, reference):
    calls = [c for key in reference["scenarios"] for c in raw_scenario(student, key)["calls"]]
    if calls and all(isinstance(c, dict) and c.get("value_error") for c in calls):
        return "your function raised ValueError for every stage, valid ones too"
    return None


def returns_zero(student, reference):
    values = [_value(student, key, stage) for key in ("paper", "even") for stage in STAGES]
    if values and all(v == 0 for v in values):
        return "your function returned 0 for every stage"
    return None


MISTAKES = [
    Mistake("stage0_divides", "Your stage 0 divides the memory by the world size.",
            "Stage 0 is plain data parallelism: every rank holds the full weights, gradients and optimizer state.",
            "Return (w + g + k) * num_params for stage 0.", _shards(0, (0, 1, 2))),
    Mistake("stage1_shards_gradients", "Your stage 1 shards the gradients instead of the optimizer state (in its "
            "formula, or g and k are swapped where you unpack bytes_per_param).",
            "ZeRO-1 (P_os) partitions only the optimizer state.", "Divide only the optimizer state (k) by the world size.",
            _shards(1, (1,))),
    Mistake("stage1_shards_everything_but_weights", "Your stage 1 shards gradients and optimizer state.",
            "That is stage 2 (P_os+g); stage 1 partitions only the optimizer state.",
            "Divide only the optimizer state (k) by the world size for stage 1.", _shards(1, (1, 2))),
    Mistake("stage2_shards_weights_not_gradients", "Your stage 2 divides the weights' bytes by the world size where "
            "the gradients' belong (in its formula, or w and g are swapped where you unpack bytes_per_param).",
            "Stage 2 (P_os+g) partitions the gradients and the optimizer state; the weights stay whole until stage 3.",
            "Divide gradients and optimizer state (g + k), not the weights, for stage 2.", _shards(2, (0, 2))),
    Mistake("stage3_keeps_weights", "Your stage 3 keeps the weights whole.",
            "Stage 3 (P_os+g+p) partitions the weights as well.", "Divide all three (w + g + k) by the world size.",
            _shards(3, (1, 2))),
    Mistake("stages_shifted_by_one", "Your stages are shifted by one: stage s does what stage s + 1 should.",
            "Stage 0 shards nothing; stage 1 the optimizer state; stage 2 also the gradients; stage 3 also the weights.",
            "Start from stage 0 = no sharding.", stages_shifted_by_one, includes=("stage1_shards_everything_but_weights",)),
    Mistake("floor_division", "You divide with // (floor division).",
            "When the world size does not divide the bytes, the floor loses the remainder.",
            "Keep the exact quotient: use /.", _odd_rounding(lambda b, n, world: b * n // world, "rounded down")),
    Mistake("divides_params_first", "You divide num_params by the world size (with //) before multiplying by the bytes.",
            "num_params // world_size drops the remainder, and every byte of it.",
            "Multiply first and divide exactly: bytes * num_params / world_size.",
            _odd_rounding(lambda b, n, world: b * (n // world), "short by a multiple of the bytes per parameter")),
    Mistake("rounds_up", "You round the per-rank bytes up.", "The exercise asks for the exact quotient.",
            "Return the exact quotient (no math.ceil).",
            _odd_rounding(lambda b, n, world: math.ceil(b * n / world), "rounded up")),
    Mistake("ignores_bytes_per_param", "You use (2, 2, 12) whatever bytes_per_param is.",
            "The caller's layout (fp32 gradients, plain Adam in fp32, SGD) changes every buffer's size.",
            "Unpack w, g, k = bytes_per_param and use them.", _layout_ignored(False)),
    Mistake("optimizer_bytes_hard_coded", "You take the optimizer-state bytes as 12 whatever bytes_per_param says.",
            "12 bytes is only mixed-precision Adam's layout; other optimizers keep other states.",
            "Use the third entry of bytes_per_param.", _layout_ignored(True)),
    Mistake("returns_gigabytes", "You return gigabytes.", "The contract is bytes; convert only when you print.",
            "Return the bytes without dividing by 1e9.", returns_gigabytes),
    Mistake("returns_formatted_string", "You return a formatted text such as '120.0 GB'.",
            "The caller computes with the result; text cannot be added or compared.",
            "Return the number of bytes; format it only when you print.", returns_formatted_string),
    Mistake("no_value_error", "You do not raise ValueError for a stage outside 0-3.",
            "A typo in the stage then silently gives a plan for another stage.",
            "End with `raise ValueError(...)` when no stage matched (no catch-all else for stage 3).", no_value_error,
            explains=("ValueError",), variants=("else_is_stage_3",)),
    Mistake("always_raises", "Your function raises ValueError for every stage.",
            "Stages 0-3 are valid and must return bytes.", "Raise ValueError only for a stage outside 0-3.",
            always_raises, variants=("always_raises_value_error",), includes=EVERY),
    Mistake("returns_zero", "Your function returns 0 for every stage.", "Nothing in it computes the memory.",
            "Compute the bytes per rank from num_params, world_size, stage and bytes_per_param.", returns_zero,
            includes=EVERY),
]


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
LOCATE = Locate(names={"value": "the bytes per rank", "type": "the returned type", "value_error": "raising ValueError"},
                positions={"calls": "stage {i}"}, ignore=("text",),
                factors=lambda case: {"world_size": case["world_size"], "4 (bytes per float32)": 4})

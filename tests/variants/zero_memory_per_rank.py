"""Submissions for `zero_memory_per_rank`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell. A wrong entry names the checks (by a
phrase of their title) that must fail for it.
"""
from variants import EVERY_CHECK

CORRECT = {
    "if_chain": '''
def zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):
    w, g, k = bytes_per_param
    psi, n = num_params, world_size
    if stage == 0:
        return (w + g + k) * psi
    elif stage == 1:
        return w * psi + g * psi + k * psi / n
    elif stage == 2:
        return w * psi + (g + k) * psi / n
    elif stage == 3:
        return (w + g + k) * psi / n
    else:
        raise ValueError("stage must be 0-3")
''',
    "divisor_per_buffer": '''
def zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):
    if stage not in range(4):
        raise ValueError(f"bad stage {stage}")
    divisors = [1 if stage < 3 else world_size, 1 if stage < 2 else world_size, 1 if stage < 1 else world_size]
    return sum(b * num_params / d for b, d in zip(bytes_per_param, divisors))
''',
    "exact_fractions": '''
from fractions import Fraction

def zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):
    if stage not in (0, 1, 2, 3):
        raise ValueError("ZeRO has stages 0, 1, 2 and 3")
    weights, grads, opt = (Fraction(b) * Fraction(num_params) for b in bytes_per_param)
    n = Fraction(world_size)
    if stage >= 1:
        opt /= n
    if stage >= 2:
        grads /= n
    if stage >= 3:
        weights /= n
    return weights + grads + opt
''',
    "integer_when_exact_and_prints": '''
def zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):
    table = {0: (False, False, False), 1: (False, False, True), 2: (False, True, True), 3: (True, True, True)}
    if stage not in table:
        raise ValueError("unknown ZeRO stage")
    total = 0
    for sharded, per in zip(table[stage], bytes_per_param):
        part = per * num_params
        total += part / world_size if sharded else part
    print(f"stage {stage}: {total / 1e9:.2f} GB")
    return int(total) if total == int(total) else total
''',
    "raises_value_error_subclass": '''
class StageError(ValueError):
    pass

def zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):
    if not 0 <= stage <= 3:
        raise StageError(stage)
    w, g, o = bytes_per_param
    shard = lambda b, on: b * num_params / world_size if on else b * num_params
    return shard(w, stage >= 3) + shard(g, stage >= 2) + shard(o, stage >= 1)
''',
}

_BODY = '''
def zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):
    w, g, k = bytes_per_param
    psi, n = num_params, world_size
    if stage == 0:
        return {s0}
    if stage == 1:
        return {s1}
    if stage == 2:
        return {s2}
    if stage == 3:
        return {s3}
    {other}
'''


def _variant(s0="(w + g + k) * psi", s1="w * psi + g * psi + k * psi / n", s2="w * psi + (g + k) * psi / n",
             s3="(w + g + k) * psi / n", other='raise ValueError("stage must be 0-3")'):
    return _BODY.format(s0=s0, s1=s1, s2=s2, s3=s3, other=other)


WRONG = {
    "stage0_divides": (_variant(s0="(w + g + k) * psi / n"), ["paper", "Stage 0"]),
    "stage1_shards_gradients": (_variant(s1="w * psi + g * psi / n + k * psi"), ["paper", "Stage 1"]),
    "stage1_shards_everything_but_weights": (_variant(s1="w * psi + (g + k) * psi / n"), ["paper", "Stage 1"]),
    "stage2_shards_weights_not_gradients": (_variant(s2="g * psi + (w + k) * psi / n"), ["Stage 2", "bytes_per_param"]),
    "stage3_keeps_weights": (_variant(s3="w * psi + (g + k) * psi / n"), ["paper", "Stage 3"]),
    "stages_shifted_by_one": (_variant(s0="w * psi + g * psi + k * psi / n", s1="w * psi + (g + k) * psi / n",
                                       s2="(w + g + k) * psi / n"), ["paper", "Stage 0", "Stage 1", "Stage 2"]),
    "floor_division": (_variant(s1="w * psi + g * psi + k * psi // n", s2="w * psi + (g + k) * psi // n",
                                s3="(w + g + k) * psi // n"), ["exactly"]),
    "divides_params_first": (_variant(s1="w * psi + g * psi + k * (psi // n)", s2="w * psi + (g + k) * (psi // n)",
                                      s3="(w + g + k) * (psi // n)"), ["exactly"]),
    "rounds_up": ('import math\n' + _variant(s1="w * psi + g * psi + math.ceil(k * psi / n)",
                                             s2="w * psi + math.ceil((g + k) * psi / n)",
                                             s3="math.ceil((w + g + k) * psi / n)"), ["exactly"]),
    "ignores_bytes_per_param": (_variant().replace("w, g, k = bytes_per_param", "w, g, k = 2, 2, 12"),
                                ["bytes_per_param"]),
    "optimizer_bytes_hard_coded": (_variant().replace("w, g, k = bytes_per_param", "w, g, _ = bytes_per_param; k = 12"),
                                   ["bytes_per_param"]),
    "returns_gigabytes": (_variant(s0="(w + g + k) * psi / 1e9", s1="(w * psi + g * psi + k * psi / n) / 1e9",
                                   s2="(w * psi + (g + k) * psi / n) / 1e9", s3="(w + g + k) * psi / n / 1e9"),
                          ["paper"]),
    "returns_formatted_string": (_variant(s0='f"{(w + g + k) * psi / 1e9:.1f} GB"',
                                          s1='f"{(w * psi + g * psi + k * psi / n) / 1e9:.1f} GB"',
                                          s2='f"{(w * psi + (g + k) * psi / n) / 1e9:.1f} GB"',
                                          s3='f"{(w + g + k) * psi / n / 1e9:.1f} GB"'), ["a number", "paper"]),
    "no_value_error": (_variant(other="return (w + g + k) * psi / n"), ["ValueError"]),
    "else_is_stage_3": ('''
def zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):
    w, g, k = bytes_per_param
    if stage == 0:
        return (w + g + k) * num_params
    elif stage == 1:
        return (w + g) * num_params + k * num_params / world_size
    elif stage == 2:
        return w * num_params + (g + k) * num_params / world_size
    else:
        return (w + g + k) * num_params / world_size
''', ["ValueError"]),
    "always_raises_value_error": ('''
def zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):
    raise ValueError("not written yet")
''', EVERY_CHECK),
    "returns_zero": ('''
def zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):
    if stage not in (0, 1, 2, 3):
        raise ValueError(stage)
    return 0
''', EVERY_CHECK),
    "not_implemented": ('''
def zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):
    # YOUR CODE HERE
    raise NotImplementedError()
''', ["paper", "a number", "ValueError"]),
}

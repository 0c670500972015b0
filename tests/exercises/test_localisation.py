"""Localisation (autograder/exercises/judging/localise.py): uncatalogued single-bug cells get told which result is wrong,
where and by how much, and never a confident cause that is not theirs.

``UNCATALOGUED`` is the development set: each entry is a student cell (run after the notebook's setup cell, like
tests/variants/) with one mistake no catalogue lists, and phrases its localisation must contain. The engine is
generic: it is not tuned to these cells, and a held-out set measures it. Round 2 adds, for each kind of failure
the held-out set showed, cells of its own: ``LOOSE_MATCHES`` (a catalogue fingerprint partly present: never a
confident cause), ``CRASHES`` (which scenarios raised, what they share), ``PATTERNS`` (where and which part is
wrong) and ``SAME_EFFECT`` (a bug no observation tells from a catalogued one: that cause, worded for both). Round 3
adds ``CONTRADICTED`` (a catalogue's signs plus one its named variants never show: another position's values, a
scenario they always get wrong right here, a stage they always get right wrong here) and ``RANK_CRASHES`` (which
rank raised, and the student's line).
"""
import pytest
from conftest import reference_observation, student_observation
from variants import average_gradients as avg
from variants import bucketed_ddp as ddp
from variants import expert_parallel_moe as moe
from variants import flash_attention as fa
from variants import fused_layer_norm as fln
from variants import gpipe_schedule as gp
from variants import mini_fsdp as fsdp
from variants import ring_attention as ring
from variants import sharded_optimizer as so
from variants import tensor_parallel_mlp as tp
from variants import train_amp as amp
from variants import train_with_accumulation as acc
from variants import zero_memory_per_rank as zero

from autograder.exercises import get_exercise
from autograder.exercises.judging.diagnosis import diagnose
from autograder.exercises.judging.localise import DEDUCED, Locate, localise
from autograder.exercises.judging.verdict import feedback_sentence, format_report

# Each cell is a wrong answer: tests/any_cpu.py judges it under one of the other kernel levels (conftest.py)
pytestmark = pytest.mark.one_level

_DK = "dk[..., j:j + BLOCK_K, :] += ds.transpose(-1, -2) @ qi * scale"
_DV = "dv[..., j:j + BLOCK_K, :] += p.transpose(-1, -2) @ doi"

UNCATALOGUED = {  # name: (exercise, cell, phrases the localisation must contain, ranks: slow)
    "flash_dk_missing_scale": ("FlashAttention", fa._TILED.replace(_DK, _DK.removesuffix(" * scale")),
                               ["dk: wrong", "√d times too large", "Right: dq, dv, o"]),
    "flash_dv_doubled": ("FlashAttention", fa._TILED.replace(_DV, _DV + " * 2"), ["dv: wrong", "2 times too large"]),
    "flash_dq_negated": ("FlashAttention", fa._TILED.replace("dq[..., i:i + BLOCK_Q, :] += ds @ kj * scale",
                                                            "dq[..., i:i + BLOCK_Q, :] -= ds @ kj * scale"),
                         ["dq: wrong", "opposite sign"]),
    "acc_loss_over_len_dataloader": ("train_with_accumulation",
                                     acc._variant(backward="(loss / len(dataloader)).backward()"),
                                     ["the gradient at each optimizer step: wrong"]),
    "acc_zero_grad_before_step": ("train_with_accumulation", acc._BODY.format(
        backward="(loss / accumulation_steps).backward()", when="(i + 1) % accumulation_steps == 0",
        zero="pass", ret="total / len(dataloader)").replace("            optimizer.step()",
                                                            "            optimizer.zero_grad()\n"
                                                            "            optimizer.step()"),
        ["the gradient at each optimizer step: wrong", "zeros"]),
    "acc_no_backward": ("train_with_accumulation", acc._variant(backward="pass"),
                        ["the gradient at each optimizer step: wrong", "zeros"]),
    "amp_no_backward": ("train_amp", amp._variant(backward="pass"), ["the first update of the parameters", "zeros"]),
    "amp_no_scaler_update": ("train_amp", amp._BODY.replace("        scaler.update()\n", "").format(
        default="torch.float16", scaler_args="device.type, enabled=(dtype == torch.float16)", train="model.train()",
        zero="optimizer.zero_grad()", autocast_args="device.type, dtype=dtype", backward="scaler.scale(loss).backward()",
        clip=amp._CLIP, step="scaler.step(optimizer)", ret="model"),
        ["raised RuntimeError: unscale_() is being called after step() when called with the default dtype"]),
    "avg_reduce_max": ("average_gradients", avg._loop('''
if p.grad is not None:
    dist.all_reduce(p.grad, op=dist.ReduceOp.MAX)
    p.grad /= world_size
'''), ["the gradients after your call: wrong"], True),
    "avg_weights_only": ("average_gradients", avg._loop('''
if p.grad is not None and p.dim() > 1:
    dist.all_reduce(p.grad)
    p.grad /= world_size
'''), ["the gradients after your call: wrong", "parameter hidden.bias", "right on parameter hidden.weight"], True),
    "zero_stage2_shards_only_optimizer": ("zero_memory_per_rank", zero.CORRECT["if_chain"].replace(
        "return w * psi + (g + k) * psi / n", "return w * psi + g * psi + k * psi / n"),
        ["the bytes per rank: wrong", "stage 2"]),
    "zero_stage3_times_n": ("zero_memory_per_rank", zero.CORRECT["if_chain"].replace(
        "return (w + g + k) * psi / n", "return (w + g + k) * psi * n"),
        ["the bytes per rank: wrong", "stage 3", "world_size"]),
    "gpipe_backward_one_step_late": ("gpipe_schedule", gp._closed(
        bwd="m + p + (p - 1 - s) + j"), ["raised IndexError: list index out of range when called with num_stages=2"]),
    "bucketed_reduce_max": ("BucketedDDP", ddp._mutate(("dist.all_reduce(flat, async_op=True)",
                                                        "dist.all_reduce(flat, op=dist.ReduceOp.MAX, async_op=True)")),
                            ["the gradients after backward: wrong", "step 1"], True),
    "moe_gate_detached": ("ExpertParallelMoE", moe._moe(result="gate.detach() * returned[unsort]"),
                          ["the router's gradient: wrong", "missing (None", "Right:", "the output"], True),
    "fsdp_grads_doubled": ("MiniFSDP", fsdp._mistake((
        "shard.grad = grad if shard.grad is None else shard.grad + grad", "shard.grad = grad * 2")),
        ["the gradient norms: wrong", "step 1: world_size times too large"], True),
    "ring_forgets_to_rescale": ("ring_attention", ring._ring().replace(
        "out = out * (lse - new_lse).exp().unsqueeze(-1) + ", "out = out + "), ["the output: wrong"], True),
    "tp_activation_after_the_sum": ("TensorParallelMLP", tp._variant(
        "h = F.linear(F_.apply(x), self.w1, self.b1)\nreturn F.gelu(G_.apply(F.linear(h, self.w2)) + self.b2)"),
        ["the output: wrong"], True),
}


# Single bugs that a catalogue fingerprint matches loosely (the same coarse sign as a known mistake): the general
# calibration rule (diagnosis.diagnose) must not name that mistake with confidence, and the localisation must speak.
_L_SAVED = "L[..., i:i + BLOCK_Q] = m + torch.log(l)"
_BUCKET_BYTES = "sum(q.numel() * 4 for q in self.buckets[-1]) + p.numel() * 4 > limit"
LOOSE_MATCHES = {  # name: (exercise, cell, ranks: slow)
    "flash_L_saved_without_the_max": ("FlashAttention", fa._TILED.replace(_L_SAVED, "L[..., i:i + BLOCK_Q] = torch.log(l)")),
    "amp_clips_to_a_hard_coded_norm": ("train_amp", amp._variant(clip=amp._CLIP.replace("max_norm)", "0.5)"))),
    "acc_returns_the_last_loss": ("train_with_accumulation", acc._variant(ret="loss.item()")),
    "acc_divides_by_k_twice": ("train_with_accumulation",
                               acc._variant(backward="(loss / accumulation_steps / accumulation_steps).backward()")),
    "zero_swaps_weight_and_optimizer_bytes": ("zero_memory_per_rank", zero.CORRECT["if_chain"].replace(
        "w, g, k = bytes_per_param", "k, g, w = bytes_per_param")),
    "avg_divides_on_rank0_only": ("average_gradients", avg._loop(
        "if p.grad is not None:\n    dist.all_reduce(p.grad)\n    if dist.get_rank() == 0:\n        p.grad /= world_size\n"),
        True),
    "moe_router_softmax_over_tokens": ("ExpertParallelMoE", moe._moe().replace(
        "self.router(x).softmax(dim=-1)", "self.router(x).softmax(dim=0)"), True),
    "bucketed_counts_elements_not_bytes": ("BucketedDDP", ddp._mutate(
        (_BUCKET_BYTES, _BUCKET_BYTES.replace(" * 4", ""))), True),
}

_ZERO = zero.CORRECT["if_chain"]
# Round 2: one bug each, written for this set (not the held-out one). Loose matches of a catalogue fingerprint:
LOOSE_MATCHES.update({
    "amp_clips_each_parameter_alone": ("train_amp", amp._variant(clip=amp._CLIP.replace(
        "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
        "[torch.nn.utils.clip_grad_norm_(p, max_norm) for p in model.parameters()]"))),
    "amp_clips_by_value": ("train_amp", amp._variant(clip=amp._CLIP.replace("clip_grad_norm_", "clip_grad_value_"))),
    "acc_mean_over_one_batch_too_many": ("train_with_accumulation", acc._variant(ret="total / (len(dataloader) + 1)")),
    "acc_mean_without_the_last_batch": ("train_with_accumulation",
                                        acc._variant(ret="(total - loss.item()) / (len(dataloader) - 1)")),
    "flash_L_off_by_one_tile": ("FlashAttention", fa._TILED.replace(_L_SAVED, "L[..., i:i + BLOCK_Q] = m + torch.log(l + 1)")),
})
# A catalogue fingerprint ("the ranks hold different parameters") met by a bug that shares all but one parameter:
# never sharing leaves a stale share on every rank (Mistake.requires), this leaves one parameter stale on one rank.
_SO_SHARE = '            for p in group["params"]:\n                dist.broadcast'
LOOSE_MATCHES["sharded_last_parameter_never_shared"] = (
    "ShardedOptimizer", so._greedy().replace(_SO_SHARE, _SO_SHARE.replace('group["params"]', 'group["params"][:-1]')),
    True)
# The ranks a local-positions mask gets wrong, for another reason: the diagonal tile left unmasked (its last query
# row stays right, which a mask on local positions never leaves right: Mistake.requires).
LOOSE_MATCHES["ring_diagonal_tile_unmasked"] = (
    "ring_attention", ring._ring(future="(k_pos[None, :] > q_pos[:, None]) & (source != rank)"), True)
# Divides by the number of buckets: the sum, where there is one bucket; not where there are several.
LOOSE_MATCHES["bucketed_divides_by_the_bucket_count"] = (
    "BucketedDDP", ddp._mutate(("flat /= dist.get_world_size()", "flat /= len(self.buckets)")), True)
# A bug whose every observable effect is a catalogued mistake's: its cause, worded to cover both.
SAME_EFFECT = {  # name: (exercise, cell, the cause)
    "zero_swaps_weight_and_gradient_bytes": ("zero_memory_per_rank", _ZERO.replace(
        "w, g, k = bytes_per_param", "g, w, k = bytes_per_param"), "stage2_shards_weights_not_gradients"),
}
# Crashes: where, in which scenarios, what they have in common.
CRASHES = {  # name: (exercise, cell, phrases)
    "zero_stage3_undefined_name": ("zero_memory_per_rank", _ZERO.replace("return (w + g + k) * psi / n",
                                                                          "return (w + g + k) * psi / world"),
                                   ["raised NameError", "each time on stage 3", "ran without raising",
                                    "of student cell: `return (w + g + k) * psi / world`"]),
    "acc_asserts_whole_windows": ("train_with_accumulation", acc._variant(
        backward="assert len(dataloader) % accumulation_steps == 0; (loss / accumulation_steps).backward()"),
        ["raised AssertionError", "ran without raising"]),
    "gpipe_one_stage_divides_by_zero": ("gpipe_schedule", gp._closed(length="2 * (m + p - 1) + 0 // (p - 1)"),
                                        ["raised ZeroDivisionError", "only when num_stages=1", "at line",
                                         "Right where it ran without raising: "]),
    "amp_unscales_twice": ("train_amp", amp._variant(clip=amp._CLIP + "; scaler.unscale_(optimizer)"),
                           ["raised RuntimeError", "only when dtype is not bfloat16"]),
    # results the parser could not take (every fp16 step skipped: no update) are no exception: said as what came back
    "amp_scales_the_loss_twice": ("train_amp", amp._variant(backward="scaler.scale(scaler.scale(loss)).backward()"),
                                  ["Your function returned results shaped otherwise than the reference's",
                                   "only when dtype is not bfloat16"]),
}
# A result off in a pattern the checks' words do not name: where, and which part.
PATTERNS = {  # name: (exercise, cell, phrases)
    "zero_counts_floats_not_bytes": ("zero_memory_per_rank", _ZERO.replace("psi, n = num_params, world_size",
                                                                            "psi, n = num_params / 4, world_size"),
                                     ["the bytes per rank: wrong", "4 (bytes per float32) times too small"]),
    "flash_dq_wrong_after_the_first_key_tile": ("FlashAttention", fa._TILED.replace(
        "dq[..., i:i + BLOCK_Q, :] += ds @ kj * scale", "dq[..., i:i + BLOCK_Q, :] += ds @ kj * (scale if j == 0 else 1)"),
        ["dq: wrong", "Right: dk, dv, o"]),
    "acc_steps_one_batch_late": ("train_with_accumulation", acc._variant(when="i % accumulation_steps == 0 and i > 0"),
                                 ["wrong", "step 1"]),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if e[2:] else [], id=n)
                                  for n, e in LOOSE_MATCHES.items()])
def test_a_loosely_matching_fingerprint_is_no_confident_cause(name):
    exercise, source = LOOSE_MATCHES[name][:2]
    results, diagnosis = diagnosed(exercise, source)
    assert not all(r.passed for r in results)
    assert diagnosis.located, diagnosis
    assert diagnosis.kind != "cause", f"a confident cause that is not this mistake: {diagnosis.cause_id}"


def _params():
    for name, entry in UNCATALOGUED.items():
        yield pytest.param(name, marks=[pytest.mark.slow] if len(entry) > 3 and entry[3] else [], id=name)


def diagnosed(exercise: str, source: str):
    ex = get_exercise(exercise)
    reference = reference_observation(exercise)
    student = student_observation(exercise, source)
    results = ex.grade(student, reference)
    return results, diagnose(ex, student, reference, results)


def localised_without_a_cause(exercise: str, source: str, phrases):
    """The variant fails, gets no confident cause, and its localisation says every phrase."""
    results, diagnosis = diagnosed(exercise, source)
    assert not all(r.passed for r in results)
    assert diagnosis.kind != "cause", f"a confident cause that is not this mistake: {diagnosis.cause_id}"
    located = " ".join(diagnosis.located)
    for phrase in phrases:
        assert phrase in located, (phrase, diagnosis.located)
    return results, diagnosis


@pytest.mark.parametrize("name", list(_params()))
def test_uncatalogued_mistake_is_localised(name):
    exercise, source, phrases = UNCATALOGUED[name][:3]
    results, diagnosis = diagnosed(exercise, source)
    assert not all(r.passed for r in results)
    assert diagnosis.kind != "cause", f"a confident cause that is not this mistake: {diagnosis.cause_id}"
    located = " ".join(diagnosis.located)
    for phrase in phrases:
        assert phrase in located, (phrase, diagnosis.located, diagnosis.cause_id)
    report = format_report(exercise, results, diagnosis)
    first = diagnosis.located[0].removeprefix(DEDUCED)  # the renderers label that line "Narrowed down"
    assert first in report
    if diagnosis.kind != "cause":  # no confident cause: the localisation leads, and is the grades.csv cause
        assert report.splitlines()[1].strip().startswith(("Where your results go wrong", "Consistent with")), report
        assert diagnosis.cause_id.startswith("where: ") and first in feedback_sentence(results, diagnosis)


# ---- the engine on plain data: each pattern, and what it never does ---------------------------------------------

def _obs(**values):
    return {"scenarios": {"s": {"case": {"what": "called", "d": 16}, **values}}}


@pytest.mark.parametrize("have,words", [
    ([4.0 * x for x in range(1, 11)], "√d times too large"),
    ([-x for x in range(1, 11)], "opposite sign"),
    ([0.0] * 10, "all zeros"),
    ([float(x) for x in range(0, 10)], "shifted by one"),
    ([x + (0.3 if x > 5 else 0) for x in range(1, 11)], "from element 6 on"),
    ([float("nan")] * 10, "not finite"),
])
def test_patterns(have, words):
    spec = Locate(names={"v": "dk"}, factors=lambda case: {"√d": case["d"] ** 0.5})
    found = localise(spec, _obs(v=have, w=[1.0] * 10), _obs(v=[float(x) for x in range(1, 11)], w=[1.0] * 10))
    assert found.wrong[0].startswith("dk: wrong") and words in found.wrong[0], found
    assert found.right == ("w",)


def test_right_values_are_not_localised_and_no_reference_value_is_quoted():
    spec = Locate()
    want = [0.123456 * x for x in range(1, 11)]
    assert localise(spec, _obs(v=want), _obs(v=want)).empty
    off = localise(spec, _obs(v=[w * 1.2837 + (0.01 if i == 3 else 0) for i, w in enumerate(want)]), _obs(v=want))
    assert off.wrong and "0.123" not in " ".join(off.lines())


def test_a_crash_is_said_once_with_where():
    ref = {"scenarios": {"a": {"case": {"what": "called on 2 ranks"}, "x": [1.0] * 10},
                         "b": {"case": {"what": "called on 3 ranks"}, "x": [1.0] * 10}}}
    got = {"scenarios": {"a": {"case": {}, "error": "RuntimeError: boom"}, "b": {"case": {}, "error": "RuntimeError: boom"}}}
    found = localise(Locate(), got, ref)
    assert found.crashed.count("boom") == 1 and "called on 2 ranks" in found.crashed and "every scenario (2)" in found.crashed


def test_a_crash_names_what_the_raising_scenarios_have_in_common():
    ref = {"scenarios": {k: {"case": {"what": f"called on {n} ranks", "world_size": n, "seed": i}, "x": [1.0] * 10}
                         for i, (k, n) in enumerate((("a", 2), ("b", 3), ("c", 2), ("d", 3)))}}
    got = {"scenarios": {k: ({"error": "RuntimeError: boom"} if v["case"]["world_size"] == 3 else {"x": [1.0] * 10})
                         for k, v in ref["scenarios"].items()}}
    found = localise(Locate(), got, ref)
    assert "2 of 4 scenarios, only when world_size=3" in found.crashed and "ran without raising" in found.crashed
    assert found.right == ("x",) and found.crashed.count("boom") == 1


# Their fingerprints match a catalogued mistake, but what that mistake needs to be right is not (Mistake.requires):
# its own signature does not fit, so it is named nowhere, not even as a possibility (issue 36: a ring that forgets to
# rescale was told "consistent with ... you average the partial outputs", which points the wrong way).
DEMOTED = {"flash_dq_negated": "l_saved_as_max_only", "amp_no_backward": "loss_not_scaled",
           "bucketed_reduce_max": "launches_bucket_at_its_first_gradient",
           "ring_forgets_to_rescale": "partial_outputs_averaged"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if len(UNCATALOGUED[n]) > 3 else [])
                                  for n in DEMOTED])
def test_a_cause_whose_needs_are_not_met_is_not_named(name):
    exercise, source = UNCATALOGUED[name][:2]
    results, diagnosis = diagnosed(exercise, source)
    assert diagnosis.kind == "unknown" and not diagnosis.causes, diagnosis
    report = format_report(exercise, results, diagnosis)
    assert "Consistent with" not in report and DEMOTED[name] not in report, report
    assert report.splitlines()[1].strip().startswith("Where your results go wrong"), report


def test_every_renderer_leads_with_the_localisation_and_withholds_the_advice_it_explains():
    """One structure (feedback.sections) for the test cell, grades.csv, the feedback files and the notebook."""
    from dataclasses import asdict

    from autograder.exercises.exercise import CheckResult
    from autograder.exercises.judging.diagnosis import Diagnosis
    from autograder.grader.report import feedback_html, feedback_markdown
    from autograder.grader.rows import Row

    results = [CheckResult("Gradients equal attention's", 2, 0, "dk is off by 1.8: mind the causal mask."),
               CheckResult("bf16 results", 1, 0, "the dtype is float32: cast the results down."),
               CheckResult("The output", 2, 2, "")]
    diagnosis = Diagnosis("unknown", (), ("Gradients equal attention's", "bf16 results"),
                          ("dk: wrong in every scenario: √d times too large.", "Right: o, dq."), "dk ×√d")
    assert diagnosis.cause_id == "where: dk ×√d"
    report = format_report("FlashAttention", results, diagnosis)
    lines = report.splitlines()
    assert lines[1].strip().startswith("Where your results go wrong") and "√d times too large" in lines[2]
    assert "mind the causal mask" not in report and "cast the results down" in report  # explained / not explained
    assert feedback_sentence(results, diagnosis).startswith("dk: wrong in every scenario")
    row = Row("ann", "07.ipynb", "FlashAttention", 2.0, 5.0, "", [asdict(r) for r in results],
              cause=diagnosis.cause_id, diagnosis=diagnosis.to_dict())
    markdown, page = feedback_markdown("ann", [row]), feedback_html("ann", [row])
    headings = [line for line in markdown.splitlines() if line.startswith(("#", "**"))]
    assert "**Where your results go wrong" in markdown and not any("`" in h for h in headings), headings
    assert markdown.index("√d times too large") < markdown.index("Passed") and "√d times too large" in page


@pytest.mark.parametrize("name", list(CRASHES) + list(PATTERNS))
def test_crashes_and_patterns_are_localised(name):
    exercise, source, phrases = {**CRASHES, **PATTERNS}[name]
    results, diagnosis = localised_without_a_cause(exercise, source, phrases)


@pytest.mark.parametrize("name", list(SAME_EFFECT))
def test_a_bug_with_a_catalogued_mistakes_effect_gets_its_cause(name):
    exercise, source, cause = SAME_EFFECT[name]
    results, diagnosis = diagnosed(exercise, source)
    assert diagnosis.cause_id == cause, diagnosis


# ---- round 3: one bug each, written for this set (not the held-out one) ------------------------------------------

_SO = "greedy_by_size_broadcast"
_SO_STEP = '''        loss = self.local.step(closure, **kwargs) if self.local is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p, src=self.owner[p])
'''
_SO_EARLY = '''        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p, src=self.owner[p])
        loss = self.local.step(closure, **kwargs) if self.local is not None else None
'''
_OFFSET = "            start += p.numel()\n"
# A catalogue fingerprint's signs, and a sign that no named variant of that mistake ever shows (another position's
# values, a scenario its variants always get wrong that is right here, a stage they always get right): never the
# confident cause; the localisation says what differs (name: exercise, cell, phrases, ranks: slow).
CONTRADICTED = {
    "bucketed_unpack_offset_never_advances": ("BucketedDDP", ddp.CORRECT["futures_wait_all_forward_order"].replace(
        _OFFSET, ""), ["the gradients after backward: wrong", "the right values of parameter"], True),
    "sharded_broadcasts_before_the_step": ("ShardedOptimizer", so.CORRECT[_SO].replace(_SO_STEP, _SO_EARLY),
                                           ["the parameters after each step: wrong", "one step late"], True),
    "amp_clips_to_one_not_max_norm": ("train_amp", amp._variant(clip=amp._CLIP.replace("max_norm)", "1.0)")),
                                      ["the gradient norms: wrong when called with max_norm=0.01"], False),
    "zero_rotates_the_bytes": ("zero_memory_per_rank", _ZERO.replace("w, g, k = bytes_per_param",
                                                                     "g, k, w = bytes_per_param"),
                               ["the bytes per rank: wrong", "wrong on stage 1 and 2"], False),
}
SAME_EFFECT["zero_swaps_gradient_and_optimizer_bytes"] = (
    "zero_memory_per_rank", _ZERO.replace("w, g, k = bytes_per_param", "w, k, g = bytes_per_param"),
    "stage1_shards_gradients")
_BLOCK_OUT = "block_out = scores.softmax(dim=-1) @ kv[1]"
# Crashes in rank exercises: the rank that raised, what the raising scenarios share, the line of the student's cell.
RANK_CRASHES = {  # name: (exercise, cell, phrases)
    "ring_shape_error_off_rank_zero": ("ring_attention", ring._ring().replace(
        _BLOCK_OUT, "block_out = scores.softmax(dim=-1) @ (kv[1] if rank == 0 else kv[1][..., :-1, :])"),
        ["raised RuntimeError", "on rank 1", "line 23 of", "`block_out = scores.softmax", "never on rank 0"]),
    "avg_shape_error_on_rank_one": ("average_gradients", avg._loop(
        "if p.grad is not None:\n    dist.all_reduce(p.grad)\n    p.grad /= world_size\n"
        "    if dist.get_rank() == 1:\n        p.grad += torch.ones(3)\n"),
        ["raised RuntimeError", "each time on rank 1", "`p.grad += torch.ones(3)`"]),
    "avg_reduces_a_slice_on_other_ranks": ("average_gradients", avg._loop(
        "if p.grad is not None:\n    dist.all_reduce(p.grad if dist.get_rank() == 0 else p.grad.flatten()[:1])\n"
        "    p.grad /= world_size\n"), ["gloo stopped a rank (SIGABRT)", "in every scenario"]),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if e[3] else [], id=n)
                                  for n, e in CONTRADICTED.items()])
def test_a_sign_its_variants_never_show_is_no_confident_cause(name):
    exercise, source, phrases = CONTRADICTED[name][:3]
    results, diagnosis = localised_without_a_cause(exercise, source, phrases)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RANK_CRASHES))
def test_a_rank_crash_says_which_rank_and_which_line(name):
    exercise, source, phrases = RANK_CRASHES[name]
    results, diagnosis = diagnosed(exercise, source)
    assert diagnosis.kind != "cause", diagnosis.cause_id
    located = " ".join(diagnosis.located)
    for phrase in phrases:
        assert phrase in located, (phrase, diagnosis.located)
    report = format_report(exercise, results, diagnosis)
    assert report.count(diagnosis.located[0][:60]) == 1, report  # said once; the checks follow without repeating it


# Merge and normalisation bugs of an online softmax: which results, and where a result is still right (the rank that
# merges one block, the rows before the first merge).
MERGES = {  # name: (exercise, cell, phrases)
    "ring_never_updates_the_lse": ("ring_attention", ring._ring().replace("            lse = new_lse\n", ""),
                                   ["the output: wrong", "right on rank 0 (wrong on rank 1) when called on 2 ranks "
                                                         "with is_causal=True"]),
    "ring_forgets_to_rescale_causal_rows": ("ring_attention", UNCATALOGUED["ring_forgets_to_rescale"][1],
                                            ["right on rank 0 (wrong on rank 1)"]),
    "flash_D_averaged_not_summed": ("FlashAttention", fa._TILED.replace("D = (dof * o.float()).sum(-1)",
                                                                        "D = (dof * o.float()).mean(-1)"),
                                    ["dq: wrong", "dk: wrong", "Right: dv, o"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MERGES))
def test_an_online_softmax_merge_bug_is_localised(name):
    exercise, source, phrases = MERGES[name]
    results, diagnosis = diagnosed(exercise, source)
    assert diagnosis.kind != "cause", diagnosis.cause_id
    located = " ".join(diagnosis.located)
    for phrase in phrases:
        assert phrase in located, (phrase, diagnosis.located)


def _error_records(value):
    if isinstance(value, dict):
        if isinstance(value.get("error"), str):
            yield value
        for v in value.values():
            yield from _error_records(v)
    elif isinstance(value, list):
        for v in value:
            yield from _error_records(v)


def test_a_reference_error_quotes_no_line_of_the_solution():
    """A student's error carries the line of their cell it came from; the reference's expected errors (the
    ValueError zero_memory_per_rank must raise) must not: references ship to students."""
    student = student_observation("zero_memory_per_rank", CRASHES["zero_stage3_undefined_name"][1])
    assert any("code" in e for e in _error_records(student))
    reference = reference_observation("zero_memory_per_rank")
    assert list(_error_records(reference)) and not any({"cell", "line", "code"} & set(e) for e in _error_records(reference))


# ---- round 4: where inside a result, and by what relation (one bug each, written for this set) -------------------

_O_TILE = "o[..., i:i + BLOCK_Q, :] = acc / l.unsqueeze(-1)"
_FR_REPORT = '''
            if not behind or time.monotonic() >= end:
                return {"missing": [r + 1 for r in behind], "last": last}
'''
INSIDE = {  # name: (exercise, cell, phrases, ranks: slow)
    "flash_dk_from_the_diagonal_tiles_only": ("FlashAttention", fa._TILED.replace(_DK, _DK + " * (1 if i == j else 0)"),
                                              ["Only dk is wrong", "dk's own sum", "dk: wrong"], False),
    "flash_first_query_tile_unnormalised": ("FlashAttention", fa._TILED.replace(_O_TILE, _O_TILE + " if i else acc"),
                                            ["o: wrong", "query rows 1 to 16 (of 32)", "a factor of its own"], False),
    "flash_dv_skips_the_last_key_tile": ("FlashAttention", fa._TILED.replace(_DV, _DV + " if j + BLOCK_K < n_k else 0"),
                                         ["Only dv is wrong", "from key row 17 on (of 32)", "zeros there"], False),
    "gpipe_forward_microbatches_reversed": ("gpipe_schedule", gp._closed().replace(
        'table[s + j][s] = ("F", j)', 'table[s + j][s] = ("F", m - 1 - j)'),
        ["differs from time step 0 on: at stage 0 (of 2) yours holds ('F', 3)"], False),
    "amp_loss_negated": ("train_amp", amp._variant(backward="scaler.scale(-loss).backward()"),
                         ["the first update of the parameters: wrong in every scenario: the right value with the "
                          "opposite sign"], False),
    "layer_norm_dw_without_x_hat": ("FusedLayerNorm", fln.edit(fln.REFERENCE, (
        "tl.store(dw_ptr + start_of_row + cols, dy * x_hat, mask=mask)",
        "tl.store(dw_ptr + start_of_row + cols, dy, mask=mask)")),
        ["y, dx and db are right: the error is in dw's own terms", "dw: wrong"], False),
    "avg_reduce_min": ("average_gradients", avg._loop("if p.grad is not None:\n"
                                                      "    dist.all_reduce(p.grad, op=dist.ReduceOp.MIN)\n"),
                       ["the gradients after your call: wrong", "a MIN reduction"], True),
    "avg_divides_by_world_size_plus_one": ("average_gradients", avg._loop(
        "if p.grad is not None:\n    dist.all_reduce(p.grad)\n    p.grad /= world_size + 1\n"),
        ["(world_size + 1)/world_size times too small"], True),
    "moe_gate_squared": ("ExpertParallelMoE", moe._moe(result="gate * gate * returned[unsort]"),
                         ["the output: wrong", "each wrong token row is the right one times a factor of its own"], True),
    "ring_mask_hides_the_diagonal": ("ring_attention", ring._ring(future="k_pos[None, :] >= q_pos[:, None]"),
                                     ["not finite", "at query row 1 of the rank's chunk (of 3) only"], True),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if e[3] else [], id=n)
                                  for n, e in INSIDE.items()])
def test_where_inside_a_result_and_by_what_relation(name):
    exercise, source, phrases = INSIDE[name][:3]
    results, diagnosis = localised_without_a_cause(exercise, source, phrases)
    assert phrases[0] in format_report(exercise, results, diagnosis)[:600]  # where the student reads first


def test_rows_columns_and_relations_on_plain_data():
    rows = {"v": lambda case: (4, 4, "query row")}
    want = [float(i % 7 + 1) for i in range(16)]

    def found(have):
        return " ".join(localise(Locate(names={"v": "o"}, rows=rows), _obs(v=have), _obs(v=want)).wrong)

    scaled = [w * (1 + (i // 4)) if i >= 8 else w for i, w in enumerate(want)]  # rows 3 and 4, each its own factor
    assert "from query row 3 on (of 4)" in found(scaled) and "a factor of its own" in found(scaled)
    zeros = [0.0 if i < 4 else w for i, w in enumerate(want)]
    assert "query row 1 (of 4), the others right" in found(zeros) and "zeros there" in found(zeros)
    column = [w + 5 if i % 4 == 3 else w for i, w in enumerate(want)]
    assert "only column 4 (of 4) of each" in found(column)
    nan = [float("nan") if 4 <= i < 8 else w for i, w in enumerate(want)]
    assert "at query row 2 (of 4) only, the others finite" in found(nan)
    offset = [w + 0.5 for w in want]
    assert "more than the right one by the same 0.5" in found(offset)


def test_a_table_says_which_entry_differs_and_what_the_students_holds():
    spec = Locate(names={"t": "the table"}, whole={"t": "time step {i}"}, entries={"t": "stage {i}"})
    want = [[["F", 0], None], [["F", 1], ["F", 0]]]
    have = [[["F", 0], None], [["F", 1], ["B", 0]]]
    line = localise(spec, _obs(t=have), _obs(t=want)).wrong[0]
    assert "differs from time step 1 on: at stage 1 (of 2) yours holds ('B', 0)" in line, line
    assert "('F', 0)" not in line  # never the reference's entry



def test_a_deadlock_says_no_set_of_ranks_that_timing_chose():
    """Which ranks the launcher saw stop first in a deadlock is timing, not the student's code: the words must not
    change from one run to the next (the kit and the instructor compared them); a real exception keeps its ranks."""
    from autograder.exercises.judging.localise import _crashed

    reference = {"scenarios": {k: {"case": {"what": f"on {n} ranks", "world_size": n}} for k, n in (("a", 2), ("b", 3))}}
    hung = [_crashed(reference, [("a", first, "", "deadlock"), ("b", "rank 2", "", "deadlock")])
            for first in ("rank 0", "rank 1")]
    assert not any("never on rank" in words or "rank 1, rank 2" in words for words in hung), hung
    raised = _crashed(reference, [("a", "rank 1", "", "ValueError: no"), ("b", "rank 2", "", "ValueError: no")])
    assert "it raised on rank 1, rank 2, never on rank 0" in raised


# ---- round 5 (issue 36's last kinds): what an exercise's observations rule out (Locate.narrow), an aliased table ---

_MERGE = "out = out * (lse - new_lse).exp().unsqueeze(-1) + block_out * (block_lse - new_lse).exp().unsqueeze(-1)"
_FSDP_SHARD = "self.shards[child_name] = nn.Parameter(flat.chunk(self.world_size)[self.rank].clone())"
_GP_TABLE = "table = [[None] * p for _ in range(2 * (m + p - 1))]"
NARROWED = {  # name: (exercise, cell, phrases, ranks: slow)
    "gpipe_one_row_object_for_every_step": ("gpipe_schedule", gp._closed().replace(
        _GP_TABLE, "row = [None] * p\n    table = [row for _ in range(2 * (m + p - 1))]"),
        ["the schedule table: wrong", "every time step's row is the same"], False),
    "tp_gelu_after_fc2_as_well": ("TensorParallelMLP", tp._variant(
        "h = F.gelu(F.linear(F_.apply(x), self.w1, self.b1))\nreturn F.gelu(G_.apply(F.linear(h, self.w2)) + self.b2)"),
        ["Every rank's output is GELU of the right output", "the output: wrong"], True),
    "tp_relu_for_gelu": ("TensorParallelMLP", tp._variant(
        "h = F.relu(F.linear(F_.apply(x), self.w1, self.b1))\nreturn G_.apply(F.linear(h, self.w2)) + self.b2"),
        ["fc2.bias's gradient is right", "the hidden activation entering fc2"], True),
    "moe_softmax_of_the_transposed_logits": ("ExpertParallelMoE", moe._moe().replace(
        "probs = self.router(x).softmax(dim=-1)", "probs = self.router(x).t().softmax(dim=-1).t()"),
        ["not softmax probabilities over the experts", "sum to 1 over the experts"], True),
    "fsdp_first_shard_on_every_rank": ("MiniFSDP", fsdp._mistake((_FSDP_SHARD, _FSDP_SHARD.replace(
        "flat.chunk(self.world_size)[self.rank]", "flat[:flat.numel() // self.world_size]"))),
        ["Every rank holds the same shard, rank 0's"], True),
    "ring_new_block_not_weighted": ("ring_attention", ring._ring().replace(
        _MERGE, "out = out * (lse - new_lse).exp().unsqueeze(-1) + block_out"),
        ["Every rank that merges two or more chunks is wrong", "one chunk's attention", "the reference's messages"],
        True),
    "ring_max_for_logaddexp": ("ring_attention", ring._ring().replace(
        "new_lse = torch.logaddexp(lse, block_lse)", "new_lse = torch.maximum(lse, block_lse)"),
        ["Every rank that merges two or more chunks is wrong", "a factor of its own"], True),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if e[3] else [], id=n)
                                  for n, e in NARROWED.items()])
def test_what_the_observations_rule_out(name):
    exercise, source, phrases = NARROWED[name][:3]
    results, diagnosis = diagnosed(exercise, source)
    assert not all(r.passed for r in results)
    assert diagnosis.kind == "unknown" and not diagnosis.causes, diagnosis  # no cause, not even a hedged one
    located = " ".join(diagnosis.located)
    for phrase in phrases:
        assert phrase in located, (phrase, diagnosis.located)
    assert phrases[0] in format_report(exercise, results, diagnosis)[:1500]  # where the student reads first


def test_a_table_whose_rows_are_one_list_says_so():
    spec = Locate(names={"t": "the table"}, whole={"t": "time step {i}"}, entries={"t": "stage {i}"})
    want = [[["F", 0], None], [["F", 1], ["F", 0]], [None, ["F", 1]]]
    line = localise(spec, _obs(t=[[["F", 1], ["F", 1]]] * 3), _obs(t=want)).wrong[0]
    assert "every time step's row is the same" in line, line
    other = localise(spec, _obs(t=[want[0], want[0], want[2]]), _obs(t=want)).wrong[0]
    assert "row is the same" not in other and "differs from time step 1 on" in other, other

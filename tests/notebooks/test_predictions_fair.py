"""Predictions that teach: the answer is not given just above the question, and tolerances accept right reasoning.

* Every prediction (``my_… = None``) is listed in ``ANSWERS`` below, with the ways a text could state its answer
  (regular expressions), or ``None`` where the answer is only known by measuring on the student's machine (the
  question then states the inputs to reason from; the lesson reviews that). A listed answer must not appear in the
  question (the nearest markdown cell above the prediction cell), in the cell just above that question, or as the
  prediction cell's own "e.g." example.
* ``compare(...)`` never uses a tiny positive relative tolerance: exact answers use ``tolerance=0``, round-off gaps
  and quantities that span decades ``magnitude=True`` (coursekit.predict).
"""
import ast
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = [REPO / "solutions/00-start-here.ipynb", *sorted((REPO / "solutions").glob("lesson*/*.ipynb"))]
PREDICTION = re.compile(r"^(my_\w+) = None(?:\s*#(.*))?$", re.M)
MEASURED = None  # the answer exists only as a measurement on the student's machine

ANSWERS = {
    "my_all_reduced": r"holds? 3\b|= 3\b|\b3\.0\b",
    # Lesson 1
    "my_no_divide_ratio": r"\b(4|four|k) times (too )?larg|\b4× (too )?larg",
    "my_same_masks": MEASURED,  # depends on the CPU (the text lists the cases)
    "my_curves_coincide": r"the curves coincide\b|on top of each other",
    "my_peak_growth": MEASURED,
    "my_token_weight_ratio": r"11\.2|56 ?/ ?5",
    "my_slowdown": MEASURED,
    # Lesson 2
    "my_float16_total": r"(?<![\w.^{])32(\.0)?\b(?! ?bits)|stops? at 32",
    "my_block_output_dtype": r"output (is|stays|remains|will be) `?(torch\.)?float32",
    "my_flushed_percent": MEASURED,
    "my_skipped_steps": MEASURED,
    "my_clip_ratio": r"\bS times (less|smaller)|65,?536 times",
    "my_old_scaler_enabled": r"switch(es)? (themselves|itself) off|falls? back to float32",
    "my_initial_scale": r"2\^\{?16\}?|65,?536",
    "my_final_log2_scale": MEASURED,
    "my_fp16_matmul_ratio": MEASURED,
    # Lesson 3
    "my_rank1_after_hello": r"0 ?\+ ?1 ?= ?1|holds? 1\b",
    "my_rank1_all_reduce_first": r"\b111\b",
    "my_rank2_reduce_scatter": r"\b333\b",
    "my_bytes_per_rank_at_8": r"1\.75|7 ?/ ?4|14 ?/ ?8",
    "my_ranks_bit_identical": r"difference (is|was) exactly 0|are bit-identical",
    "my_default_buckets": r"\b(2|two) buckets",
    "my_hidden_share": MEASURED,
    "my_calls_no_sync_backward_only": r"\b24\b",
    "my_same_checksums": r"same checksum(s)? (as|on every)",
    "my_speedup_2_ranks": MEASURED,
    # Lesson 4
    "my_split_bit_identical": r"not necessarily bit for bit|agree to float32 round-off",
    "my_bubble_p4_m6": r"3 ?/ ?9|1 ?/ ?3\b|0\.33|33 ?%",
    "my_bubble_m4": r"= ?1 ?/ ?5|= ?0\.2\b",
    "my_gpipe_over_1f1b_m8": r"\b4 ?×|\b4 times|m ?/ ?2\b|never holds more than",
    "my_all_reduces_per_step": r"\b(2|two) all-reduces",
    # Lesson 5
    "my_bytes_per_param_mixed": r"\b16 bytes|= ?16\b|\b16 B\b",
    "my_stage1_gb_at_1024": r"\b30(\.\d+)? GB|30 \+",
    "my_stage3_ranks_under_1gb": r"\b128\b",
    "my_zero1_traffic": r"\b3 ?×|\b3 times|three times",
    "my_share": r"\b0\.5\b|1 ?/ ?2\b|\bhalf\b",
    "my_minifsdp_peak_layers": MEASURED,
    "my_checkpointed_fraction": r"half the activations|\b0\.5\b",
    "my_zero3_gb_70b_8": r"\b140\b",
    # Lesson 6
    "my_b_star_if_peak": r"2\.5|1 ?/ ?MFU",
    "my_ddp_buckets": r"\b(4|four) buckets",
    "my_exposed_share": MEASURED,
    "my_share_batch_256": MEASURED,
    "my_peak_fraction_k4": MEASURED,
    "my_resume_gap": r"bit[- ]for[- ]bit|exactly 0\b|= ?0\.0e\+00",
    "my_recipe_fits": MEASURED,
    "my_accelerate_gap": r"agree to round-off|exactly the same weights",
    # Lesson 7: the byte counts follow from the table and the sizes printed above the question
    "my_fp32_naive_bytes": r"1,?572,?864|1,?593,?344|1\.5\d MB",
    "my_bf16_dropout_bytes": r"1,?212,?416|1,?230,?848|1\.2\d MB",
    "my_fp32_sdpa_bytes": r"1,?052,?672|1,?056,?768|1\.05 MB",
    "my_naive_peak_mib_2048": r"\b256 MiB|\b264 MiB|two 128 MiB",
    "my_flash_memory_fraction": r"\b1 ?/ ?[34]\b|\b0\.(25|33?)\b|\b(25|33) ?%",
    "my_full_fraction": r"\b5 ?/ ?16\b|\b20 ?/ ?64\b|\b0\.3[1-7]\b",
    "my_core_fraction": r"\b0\.[56]\d\b|\b3 ?/ ?5\b",
    "my_unscaled_error": r"relative error (of |is )?(1(\.0+)?|100 ?%)(?![\d.])|(rounds?|flush(es)?) to zero",
    "my_graph_breaks": r"\b(2|two) graph breaks|\b(3|three) graphs",
    # Lesson 8
    "my_tp_all_reduces": r"\b(4|four) all-reduces|one all-reduce after attention, one after the\s+MLP",
    "my_sp_all_gathers": r"\b(4|four) all-gathers",
    "my_large_model_fsdp_fits": r"(does not|doesn't|won't|will not|cannot) fit with FSDP alone"
                                r"|FSDP alone (does not|doesn't|won't|cannot) (fit|suffice)",
    "my_sp_fraction": r"\b0\.9\b|\b9 ?/ ?10\b|\b90 ?%",
    "my_ring_over_ulysses": r"\bN ?/ ?2\b|ratio (is |of )?2\b|\btwice\b|\b2 ?×|\b2 times",
    "my_dropped_fraction": MEASURED,  # how unbalanced a fresh router is (the question states T and E)
    # Lesson 9
    "my_same_without_rng": r"masks (differ|change)|other units are dropped",
    "my_files": r"\b(5|five) files",
    "my_best_interval": MEASURED,  # from the checkpoint cost measured on the student's machine
    "my_in_place_loads": r"(does not|doesn't|won't|will not|cannot|no longer) load|neither is left|is truncated",
    "my_resumed_at": r"resum\w* (at|from) (step )?4\b",
    "my_blamed_by_timeout": r"not who is missing|names? no rank|(does not|doesn't) name (a|any|the) rank",
    "my_get_waits_s": MEASURED,  # the wait the next cell times (the store's timeout, read from the text above)
    # Lesson 10
    "my_add_bytes": r"12,?000 bytes|3 ?× ?1000 ?× ?4",
    "my_fused_extra_bytes": r"\b256 bytes|64 ?× ?4 bytes",
    "my_alpha": r"0\.135|e\^\{?[−-]2\}?|exp\([−-]2\)",
    "my_causal_tiles": r"1 ?\+ ?2 ?\+ ?3 ?\+ ?4",
    "my_dx_row_sum": r"(sums?|adds? up) to (zero|0)\b",
    "my_unfused_over_fused": MEASURED,  # depends on how PyTorch's backward splits into operators
    "my_unfused_ce_extra_bytes": r"256,?00[04] bytes|64 ?× ?1,?000 ?× ?4",
}


def predictions():
    """(notebook, prediction name, its e.g. comment, the question's text, the text of the cell above it)."""
    found = []
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            for match in PREDICTION.finditer("".join(cell["source"])) if cell["cell_type"] == "code" else ():
                q = next(j for j in range(i - 1, -1, -1) if cells[j]["cell_type"] == "markdown")
                above = "".join(cells[q - 1]["source"]) if q > 0 else ""
                found.append((path.stem, match.group(1), match.group(2) or "", "".join(cells[q]["source"]), above))
    return found


PREDICTIONS = predictions()


def test_every_prediction_is_listed():
    names = {name for _, name, *_ in PREDICTIONS}
    assert not names - set(ANSWERS), f"add these predictions to ANSWERS: {sorted(names - set(ANSWERS))}"
    assert not set(ANSWERS) - names, f"ANSWERS lists predictions the lessons no longer ask: {sorted(set(ANSWERS) - names)}"


@pytest.mark.parametrize("stem,name,example,question,above", PREDICTIONS, ids=[p[1] for p in PREDICTIONS])
def test_the_answer_is_not_given_just_above_the_question(stem, name, example, question, above):
    answer = ANSWERS.get(name)
    if answer is MEASURED:
        return
    for where, text in (("the question", question), ("the cell above the question", above),
                        ("the prediction cell's example", example)):
        hit = re.search(answer, text)
        assert not hit, f"{stem}: {where} gives the answer to {name}: …{text[max(0, hit.start() - 60):hit.end() + 30]}…"


def compare_calls():
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "compare":
                    yield path.stem, node


@pytest.mark.parametrize("stem,call", list(compare_calls()), ids=lambda v: v if isinstance(v, str) else "")
def test_no_tiny_relative_tolerance(stem, call):
    keywords = {k.arg: k.value for k in call.keywords}
    tolerance = keywords.get("tolerance")
    if isinstance(tolerance, ast.Constant) and isinstance(tolerance.value, (int, float)):
        assert tolerance.value == 0 or tolerance.value >= 0.01, (
            f"{stem}: {ast.unparse(call)[:80]}: a relative tolerance of {tolerance.value} rejects right reasoning; use "
            "tolerance=0 for an exact answer or magnitude=True for a round-off gap")


def test_the_checker_finds_an_answer_stated_above():
    assert re.search(ANSWERS["my_float16_total"], "in float16 the total stops at 32, where the gap is 0.031")
    assert not re.search(ANSWERS["my_float16_total"], "float32 has 23 mantissa bits; 32 bits in all")

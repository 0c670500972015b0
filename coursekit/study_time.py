"""How long a lesson takes to study, computed from its material by one stated formula.

    minutes = words / 150 + code lines / 15 + 3 × predictions + the sum over its graded exercises of
              (10 + 2 × reference lines) × difficulty,
    rounded up to 5 minutes, and stated in hours (to the half hour) from two hours on.

* words: the prose of the markdown cells (hints included), read carefully, as technical text is, at 150 a minute;
* code lines: the non-blank lines of the code cells a student reads and runs, 15 a minute (a graded cell's
  reference solution is not counted: the student writes it, inside the exercise's time);
* predictions: each ``my_… = None`` cell, 3 minutes (work it out, write it down, read the comparison);
* a graded exercise: its size — the lines of code of the reference solution, comments and blank lines left out —
  at 2 minutes a line, plus 10 minutes to read the task and run the checks, times a difficulty declared below with
  its reason: 1 for a known pattern, 1.5 for one new mechanism, 2 for several that interact, 3 for an algorithm to
  derive and debug (Stanford's CS336 gives its students days for its FlashAttention).

The start page's table and the line under each lesson's title state the result, the title with each exercise's
share; ``python -m coursekit.study_time`` prints every lesson's inputs and result (``--write`` puts them into
solutions/), and a test fails when a notebook states another number.
"""
import json
import math
import re
import sys
from pathlib import Path

WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE, MINUTES_PER_PREDICTION = 150, 15, 3
EXERCISE_BASE_MINUTES, MINUTES_PER_REFERENCE_LINE = 10, 2
DIFFICULTY = {  # graded exercise → (factor, why)
    "train_with_accumulation": (1, "a training loop with one change: the loss divided by the micro-batches"),
    "train_amp": (1, "the documented autocast and GradScaler pattern"),
    "average_gradients": (1, "one all-reduce per gradient"),
    "BucketedDDP": (2, "gradient hooks, asynchronous all-reduces and their handles, the order of the buckets"),
    "gpipe_schedule": (1.5, "a schedule whose dependencies must be reasoned out"),
    "TensorParallelMLP": (2, "autograd functions whose backward is the conjugate collective"),
    "zero_memory_per_rank": (1, "the ZeRO paper's arithmetic"),
    "ShardedOptimizer": (1.5, "owners, a wrapped optimizer and a broadcast after the step"),
    "MiniFSDP": (2, "gathers and reduce-scatters inside autograd, and memory measured from outside"),
    "saved_activation_bytes": (1, "one hook and the bookkeeping of storages"),
    "FlashAttention": (3, "a tiled online softmax, forward and backward, derived from the formulas"),
    "ring_attention": (3, "partial softmaxes merged across ranks, sends and receives that must not deadlock"),
    "ExpertParallelMoE": (3, "routing, capacity, an all-to-all of uneven splits and the way back"),
    "Checkpointer": (1.5, "sharded state dicts through DCP, and what a kill leaves on disk"),
    "FusedLayerNorm": (1.5, "two Triton kernels over a row in chunks and masks, modelled on the lesson's RMSNorm"),
    "FlightRecorder": (1, "check-ins in a key-value store, read with a deadline"),
    "TritonFlashAttention": (2, "an online softmax over key tiles as one Triton kernel, masks and causal tiles skipped, "
                             "after Lesson 7's PyTorch tiles"),
}
# how a lesson states it under its title: the total, then each graded exercise's share
STATED = re.compile(r"study time about (\d+(?:\.5)?) (minutes|min|h)\b(?: \(graded: [^)]*\))?")
PREDICTION = re.compile(r"^my_\w+ = None\b", re.M)
# "[ ]" keeps nbgrader's markers themselves out of this file, which ships to students
SOLUTION = re.compile(r"### BEGIN[ ]SOLUTION(.*?)### END[ ]SOLUTION", re.S)


def say(minutes: int) -> str:
    """Minutes as a student plans with them: "about 45 min", from two hours on "about 5.5 h"."""
    if minutes < 120:
        return f"about {minutes} min"
    hours = round(minutes / 30) / 2
    return f"about {hours:g} h"


def reference_lines(source: str) -> int:
    """Lines of code of the reference solution in a graded cell: comments and blank lines left out."""
    return sum(1 for part in SOLUTION.findall(source) for line in part.splitlines()
               if line.strip() and not line.strip().startswith("#"))


def exercise_minutes(name: str, lines: int) -> int:
    """One graded exercise: (10 + 2 × reference lines) × its declared difficulty, rounded up to 5 minutes."""
    factor, _ = DIFFICULTY[name]
    return 5 * math.ceil((EXERCISE_BASE_MINUTES + MINUTES_PER_REFERENCE_LINE * lines) * factor / 5)


def material(notebook: Path) -> dict:
    """The counts the formula uses, for one lesson notebook; ``exercises`` maps each to its reference lines."""
    cells = json.loads(notebook.read_text())["cells"]
    words = code = predictions = 0
    exercises = {}
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            words += len(STATED.sub("", text).split())  # the stated time itself is not material
            continue
        grading = cell.get("metadata", {}).get("nbgrader", {})
        if grading.get("grade"):
            continue  # a test cell: `check(...)`, nothing to read
        if grading.get("solution"):
            exercises[grading["grade_id"]] = reference_lines(text)
        predictions += len(PREDICTION.findall(text))
        code += sum(1 for line in SOLUTION.sub("", text).splitlines() if line.strip())
    return {"words": words, "code lines": code, "predictions": predictions, "exercises": exercises}


def study_minutes(notebook: Path) -> int:
    """The formula above, rounded up to 5 minutes."""
    m = material(notebook)
    minutes = (m["words"] / WORDS_PER_MINUTE + m["code lines"] / CODE_LINES_PER_MINUTE
               + MINUTES_PER_PREDICTION * m["predictions"]
               + sum(exercise_minutes(name, lines) for name, lines in m["exercises"].items()))
    return 5 * math.ceil(minutes / 5)


def statement(notebook: Path) -> str:
    """What the title says: "study time about 6 h (graded: `f` about 30 min, `g` about 5 h)"."""
    shares = ", ".join(f"`{name}` {say(exercise_minutes(name, lines))}"
                       for name, lines in material(notebook)["exercises"].items())
    return f"study time {say(study_minutes(notebook))}" + (f" (graded: {shares})" if shares else "")


def start_page_row(notebook: Path) -> re.Pattern:
    """The start page's table row of a lesson: its link, then the study time in the last column."""
    link = re.escape(f"({notebook.parent.name}/{notebook.name})")
    return re.compile(rf"^(\|[^\n]*{link}[^\n]*\| )(about [\d.]+ (?:min|h))( \|)$", re.M)


def write(root: Path) -> None:
    """Put each lesson's computed study time under its title and into the start page's table."""
    start_page = root / "00-start-here.ipynb"
    start = json.loads(start_page.read_text())
    for notebook in sorted(root.glob("lesson*/*.ipynb")):
        nb = json.loads(notebook.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = [STATED.sub(statement(notebook), line) for line in cell["source"]]
        notebook.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        for cell in start["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = [start_page_row(notebook).sub(rf"\g<1>{say(study_minutes(notebook))}\g<3>", line)
                                  for line in cell["source"]]
    start_page.write_text(json.dumps(start, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str]) -> None:
    root = Path(__file__).resolve().parent.parent / "solutions"
    if "--write" in argv:
        write(root)
    for notebook in sorted(root.glob("lesson*/*.ipynb")):
        m = material(notebook)
        print(f"{notebook.name}: {say(study_minutes(notebook))} = {m['words']:,} words / {WORDS_PER_MINUTE} + "
              f"{m['code lines']} code lines / {CODE_LINES_PER_MINUTE} + {MINUTES_PER_PREDICTION} × "
              f"{m['predictions']} predictions + the graded exercises:")
        for name, lines in m["exercises"].items():
            factor, why = DIFFICULTY[name]
            print(f"    {name}: ({EXERCISE_BASE_MINUTES} + {MINUTES_PER_REFERENCE_LINE} × {lines} reference lines) "
                  f"× difficulty {factor:g} ({why}) = {say(exercise_minutes(name, lines))}")


if __name__ == "__main__":
    main(sys.argv[1:])

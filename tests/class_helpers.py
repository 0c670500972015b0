"""A mixed class of submissions for the class report: the variants of two lessons, blank notebooks, a copied pair,
a time-out, a damaged notebook, a cell that reaches into the grader and a hostile student id.

Built with autograder.authoring.class_builder (the released notebooks with their exercise cells filled in), so the
real CLI grades it as it grades a class downloaded from an LMS.
"""
import re
from pathlib import Path

from conftest import variant_modules

from autograder.authoring.class_builder import filled, released_notebook, write

NOTEBOOKS = {"01_gradient_accumulation.ipynb": "train_with_accumulation", "02_mixed_precision.ipynb": "train_amp"}
HOSTILE = "<img src=x onerror=alert(1)>"
COPIES = ("copy-a", "copy-b")


def renamed(source: str) -> str:
    """The same code with every assigned local name renamed (what a student who copies does first)."""
    names = sorted(set(re.findall(r"^\s+([a-z_][a-z0-9_]*)\s*=", source, re.MULTILINE)) | {"inputs", "targets"})
    for i, name in enumerate(names):
        source = re.sub(rf"\b{name}\b", f"my_{name[:2]}{i}", source)
    return source


def build_mixed_class(folder: Path, size: int = 32) -> dict:
    """``folder/<student>/<notebook>`` for ``size`` students; returns what the report must show."""
    wrong = {ex: [(n, s) for n, (s, _) in variant_modules()[ex].WRONG.items() if n != "not_implemented"]
             for ex in NOTEBOOKS.values()}
    right = {ex: list(variant_modules()[ex].CORRECT.items()) for ex in NOTEBOOKS.values()}
    acc = variant_modules()["train_with_accumulation"].CORRECT["model_zero_grad_and_counter"]  # a style of its own
    special = {
        COPIES[0]: {"train_with_accumulation": acc},
        COPIES[1]: {"train_with_accumulation": renamed(acc)},
        "blank": None,                                                       # the released notebooks, untouched
        # an endless loop that waits rather than spins: the same time-out, without 20 CPU-s taken from the other tests
        "loops-forever": {"train_with_accumulation": "import time\n\n\ndef train_with_accumulation(*args, **kwargs):\n"
                                                     "    while True:\n        time.sleep(1)\n"},
        "reaches-in": {"train_with_accumulation": "import autograder\n\n" + right["train_with_accumulation"][1][1]},
        HOSTILE: {"train_with_accumulation": right["train_with_accumulation"][0][1]},
    }
    students = {}
    for i in range(size - len(special) - 1):
        pick = {}
        for ex, options in wrong.items():
            if i % 4 == 3:
                pick[ex] = right[ex][i % len(right[ex])][1]
            else:
                pick[ex] = options[(i * (3 if ex == "train_amp" else 1)) % len(options)][1]
        students[f"student{i:02d}"] = pick
    students.update(special)
    for student, answers in students.items():
        for notebook, exercise in NOTEBOOKS.items():
            if answers is None or exercise not in answers:
                write(folder, student, notebook, released_notebook(notebook))
            else:
                write(folder, student, notebook, filled(notebook, {exercise: answers[exercise]}))
    write(folder, "damaged", "01_gradient_accumulation.ipynb", b'{"cells": [ not json')
    write(folder, "damaged", "02_mixed_precision.ipynb", released_notebook("02_mixed_precision.ipynb"))
    return {"students": len(students) + 1, "copies": COPIES, "timed_out": "loops-forever", "damaged": "damaged",
            "reaches_in": "reaches-in", "hostile": HOSTILE, "blank": "blank"}

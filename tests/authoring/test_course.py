"""The course's conventions hold for every lesson: one source of truth, matching points, a setup cell."""
import json

from autograder.authoring.course import SETUP_TAG
from autograder.exercises import all_exercises


def test_every_registered_exercise_lives_in_exactly_one_notebook(course):
    homes = {}
    for spec in course.notebooks.values():
        for exercise in spec.exercises:
            homes.setdefault(exercise, []).append(spec.name)
    assert sorted(homes) == sorted(all_exercises()), "an exercise module without a notebook cell, or the reverse"
    for exercise, notebooks in homes.items():
        assert notebooks == [all_exercises()[exercise].notebook], (exercise, notebooks)


def test_test_cells_award_exactly_the_checks_points(course):
    for spec in course.notebooks.values():
        for exercise in spec.exercises:
            assert spec.test_points.get(exercise) == all_exercises()[exercise].max_score, (spec.name, exercise)


def test_test_cells_call_the_shared_checks(course):
    for spec in course.notebooks.values():
        cells = json.loads(spec.source.read_text())["cells"]
        for exercise in spec.exercises:
            (test,) = [c for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == f"test_{exercise}"]
            source = "".join(test["source"])
            assert f'check("{exercise}", {exercise})' in source, (spec.name, source)
            assert test["metadata"]["nbgrader"].get("locked"), f"{spec.name}: the test cell must be read-only"


def test_graded_notebooks_have_a_locked_setup_cell(course):
    for spec in course.notebooks.values():
        if not spec.exercises:
            continue
        cells = json.loads(spec.source.read_text())["cells"]
        setup = [c for c in cells if SETUP_TAG in c["metadata"].get("tags", [])]
        assert setup, f"{spec.name} has no cell tagged {SETUP_TAG!r}"
        assert all(c["metadata"].get("nbgrader", {}).get("locked") for c in setup), spec.name


def test_released_names_are_unique(course):
    assert len(course.notebooks) == len({spec.name for spec in course.notebooks.values()})


def test_readme_lessons_table_is_generated_and_current(course):
    """The README's lessons table is generated from the course (exercises and their points, what each lesson
    measures, recorded run times): `python -m autograder generate` writes it, and here it is current."""
    from autograder.authoring.readme import lessons_table, stale_readme

    assert stale_readme() == []
    table = lessons_table(course)
    for spec in course.notebooks.values():
        for exercise, points in spec.test_points.items():
            assert f"`{exercise}` ({points:g} pts)" in table


def test_both_readmes_count_from_the_course(course):
    """The counts the READMEs state in prose come from the course, and a stale one is caught."""
    from autograder.authoring.readme import NUMBER_WORDS, course_counts, rendered_counts

    lessons = len(list((course.root / "solutions").glob("lesson*/*.ipynb")))
    exercises = sum(len(spec.exercises) for spec in course.notebooks.values())
    counts = course_counts(course)
    said = (NUMBER_WORDS + [str(exercises)])[min(exercises, len(NUMBER_WORDS))]
    assert counts["last_lesson"] == str(lessons) and counts["exercises"] == said
    for readme in (course.root / "README.md", course.root / "studentkit/README.md"):
        text = readme.read_text()
        assert "<!-- count:lessons -->" in text and "<!-- count:exercises -->" in text, readme
        stale = text.replace(f"<!-- count:lessons -->{counts['lessons']}<", "<!-- count:lessons -->six<")
        assert stale != text and rendered_counts(stale, course) == text, readme

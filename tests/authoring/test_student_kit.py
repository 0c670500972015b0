"""The student kit: the course in a student's hands without the answers, self-checks that work anywhere.

* fast: the shipped reference file's failure modes (missing, truncated, edited, stale) each give one clear sentence
  and never a score, and the leak scanner finds solution code wherever it is planted;
* slow: the kit built by the instructor's command holds no solution code; installed into a fresh venv in an empty
  folder, its test cells give exactly the instructor's verdicts on the reference, the blank stub and a correct
  style and two wrong variants of each exercise, Validate works, and nbgrader's instructor tools are hidden.
"""
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import variant_modules
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nbgrader_cli import COURSE, NBGRADER, run
from submission_factory import filled, reference_source, released_notebook

from autograder.authoring.course import load_course, reference_function
from autograder.authoring.reference_files import stale_references
from autograder.authoring.studentkit import KIT, catalogue_leaks, find_leaks, solution_bodies, student_files
from autograder.exercises import get_exercise
from autograder.selfcheck import check
from autograder.selfcheck import recorded as observations

REPO = Path(__file__).resolve().parents[2]
L1, L1_EXERCISE = "01_gradient_accumulation.ipynb", "train_with_accumulation"
SHIPPED = observations.reference_file(L1_EXERCISE).read_bytes()


# ---- the shipped reference file, read as a student's test cell reads it ---------------------------

@pytest.fixture
def student_mode(monkeypatch):
    """The self-check as the student kit runs it: against the shipped files (``selfcheck.check`` without a live
    reference, which only an instructor's checkout passes)."""
    observations._load.cache_clear()
    yield
    observations._load.cache_clear()


def run_check(exercise: str, fn, reference_file: Path | None = None, monkeypatch=None):
    """The test cell's check in student mode; with ``reference_file``, that file stands for the shipped one."""
    if reference_file is not None:
        folder = reference_file.parent / f"shipped-{reference_file.stem}"
        folder.mkdir(exist_ok=True)
        if reference_file.exists():
            shutil.copyfile(reference_file, observations.reference_file(exercise, folder))
        monkeypatch.setattr(observations, "FOLDER", folder)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        score = check(exercise, fn)
    return score, printed.getvalue()


def _rebuilt(mutate) -> bytes:
    """The shipped file after ``mutate(data)``, with a digest that matches again (a consistent, wrong file)."""
    data = json.loads(SHIPPED)
    mutate(data)
    data["digest"] = observations.digest(data)
    return json.dumps(data).encode()


def _edited_value() -> bytes:
    data = json.loads(SHIPPED)
    data["observation"]["scenarios"]["default"]["returned"] += 1.0
    return json.dumps(data).encode()


def _same_content(data: bytes) -> bool:
    try:
        return json.loads(data) == json.loads(SHIPPED)
    except ValueError:
        return False


BROKEN_FILES = {  # case: (file content or None for missing, phrase the student reads)
    "missing": (None, "missing"),
    "truncated": (SHIPPED[: len(SHIPPED) // 2], "damaged"),
    "empty": (b"", "damaged"),
    "edited_by_hand": (_edited_value(), "changed after it was built"),
    "not_an_object": (b"[1, 2, 3]", "not one this version"),
    "other_format": (_rebuilt(lambda d: d.update(format=99)), "not one this version"),
    "another_exercise": (_rebuilt(lambda d: d.update(exercise="train_amp")), "holds another exercise"),
    "other_checks": (_rebuilt(lambda d: d.update(checks="0" * 16)), "not the ones"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_FILES))
def test_a_broken_reference_file_gives_one_sentence_and_no_score(case, student_mode, monkeypatch, tmp_path, capfd):
    content, phrase = BROKEN_FILES[case]
    path = tmp_path / f"{L1_EXERCISE}.json"
    if content is not None:
        path.write_bytes(content)
    score, printed = run_check(L1_EXERCISE, reference_function(L1_EXERCISE), path, monkeypatch)
    assert score == 0.0, f"a {case} reference file gave the reference solution {score} points"
    assert printed.startswith(f"{L1_EXERCISE}: not checked.") and phrase in printed, printed
    assert "Traceback" not in printed and len(printed.splitlines()) == 1, printed
    assert "reinstall" in printed
    assert capfd.readouterr().err == "", "a test cell must not write to stderr (nbgrader scores it 0)"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, len(SHIPPED)), flips=st.lists(st.tuples(st.integers(0, len(SHIPPED) - 1),
                                                                  st.integers(1, 255)), max_size=3))
def test_any_damage_to_the_file_is_reported_never_scored(student_mode, monkeypatch, tmp_path, cut, flips):
    damaged = bytearray(SHIPPED[:cut])
    for where, xor in flips:
        if where < len(damaged):
            damaged[where] ^= xor
    path = tmp_path / f"damaged-{cut}-{hash(tuple(flips))}.json"
    path.write_bytes(bytes(damaged))
    score, printed = run_check(L1_EXERCISE, reference_function(L1_EXERCISE), path, monkeypatch)
    if _same_content(bytes(damaged)):  # e.g. only the final newline cut: the same JSON, rightly trusted
        assert score == 11, printed
    else:
        assert score == 0.0 and "not checked" in printed, printed


def test_student_mode_uses_the_shipped_file_and_agrees(student_mode, monkeypatch):
    """Without solutions/, the reference solution scores full against the shipped file, blank scores 0."""
    full, printed = run_check(L1_EXERCISE, reference_function(L1_EXERCISE))
    assert full == 11 and "Note:" not in printed, printed
    blank = released_source(L1, L1_EXERCISE)
    setup = load_course().notebooks[L1].setup_code
    namespace = {}
    for code in [*setup, blank]:
        exec(code, namespace)
    assert run_check(L1_EXERCISE, namespace[L1_EXERCISE])[0] == 0


def test_a_different_setting_is_said_in_one_line():
    recorded = observations.RecordedReference("train_amp", {"scenarios": {"bf16": {}, "fp16_default": {}}},
                                              torch="2.13.0+cpu", device="cpu")
    assert observations.setting_notes(recorded, {"scenarios": {"bf16": {}}}, "2.13.0+cu128") == []
    notes = observations.setting_notes(recorded, {"scenarios": {"bf16": {}, "bf16@cuda": {}, "fp16_default@cuda": {}}},
                                       "2.14.1+cu128")
    assert len(notes) == 2
    assert "torch 2.14.1+cu128 here, 2.13.0+cpu where the reference was recorded" in notes[0]
    assert "2 scenario(s) on cuda have no recorded reference" in notes[1]


def test_recorded_gpu_scenarios_cost_a_cpu_only_student_nothing():
    """A kit whose reference was recorded on a GPU machine: a student without one is checked on the CPU only."""
    recorded = observations.RecordedReference("train_amp", {"scenarios": {"bf16": {"x": 1}, "bf16@cuda": {"x": 2}}},
                                              torch="2.13.0+cu128", device="cuda")
    student = {"scenarios": {"bf16": {"x": 1}}}
    assert observations.on_this_machine(recorded, student)["scenarios"] == {"bf16": {"x": 1}}
    notes = observations.setting_notes(recorded, student, "2.13.0+cpu")
    assert notes == ["Note: 1 recorded scenario(s) on cuda were not checked: this machine has no such device (the "
                     "instructor's grader checks them on one that has)."]
    with_gpu = {"scenarios": {"bf16": {"x": 1}, "bf16@cuda": {"x": 3}}}
    assert observations.on_this_machine(recorded, with_gpu)["scenarios"] == recorded.observation["scenarios"]


def test_a_stale_file_is_caught(tmp_path):
    assert stale_references() == [], "autograder/references/ is out of date: run `python -m autograder references`"
    stale = tmp_path / "stale"
    shutil.copytree(observations.FOLDER, stale)
    observations.reference_file(L1_EXERCISE, stale).write_bytes(_rebuilt(lambda d: d.update(solution="0" * 16)))
    observations.reference_file("train_amp", stale).unlink()
    problems = stale_references(stale)
    assert any("solution or setup cells of `train_with_accumulation` changed" in p for p in problems), problems
    assert any("references/train_amp.json is missing" in p for p in problems), problems
    (stale / "gone_exercise.json").write_text("{}")
    assert any("gone_exercise.json belongs to no exercise" in p for p in stale_references(stale))


# ---- what goes into the kit, and what must not ----------------------------------------------

def test_the_kit_carries_the_declared_parts_only():
    """The kit's contents are declared (``KIT``), not computed: the exercises, the self-check and the references,
    never the grader, the authoring tools or the command line."""
    names = {p.relative_to(REPO).as_posix() for p in student_files()}
    assert KIT == ("autograder/__init__.py", "autograder/exercises", "autograder/selfcheck", "autograder/references")
    for needed in ("autograder/__init__.py", "autograder/selfcheck/__init__.py", "autograder/selfcheck/recorded.py",
                   "autograder/exercises/exercise.py", "autograder/exercises/judging/verdict.py"):
        assert needed in names
    for exercise in load_course().exercises:
        package = get_exercise(exercise).package.replace(".", "/")
        assert {f"{package}/{part}.py" for part in ("__init__", "cases", "observe", "checks")} <= names
        assert f"autograder/references/{exercise}.json" in names
    assert not [n for n in names if n.startswith(("autograder/grader/", "autograder/authoring/"))
                or n in ("autograder/cli.py", "autograder/__main__.py")]


def test_the_leak_scanner_finds_solution_code_wherever_it_is(tmp_path):
    bodies = solution_bodies()
    assert set(bodies) == set(load_course().exercises) and all(len(b) >= 1 for b in bodies.values())
    for exercise, body in bodies.items():
        folder = tmp_path / exercise
        inner = io.BytesIO()
        with zipfile.ZipFile(inner, "w") as z:  # a notebook with the answer, inside a zip, inside a zip
            nb = {"cells": [{"cell_type": "code", "source": ["# a student's notes\n", *[f"    {line}\n" for line in body]]}]}
            z.writestr("lesson/answer.ipynb", json.dumps(nb))
        folder.mkdir()
        with zipfile.ZipFile(folder / "kit.whl", "w") as z:
            z.writestr("pkg/inner.zip", inner.getvalue())
        found = find_leaks(folder)
        assert any(f"solution code of `{exercise}`" in p for p in found), (exercise, found)


def test_no_catalogue_of_mistakes_quotes_a_line_of_a_solution(tmp_path):
    """The catalogues (and their localisation declarations) ship in the kit and are read without making the
    mistake: their fix texts describe the change in words. One planted line is found, inside a wheel too."""
    bodies = solution_bodies()
    catalogues = sorted((REPO / "autograder" / "exercises").glob("*/mistakes.py"))
    assert len(catalogues) >= 10
    for path in catalogues + [REPO / "autograder" / "exercises" / "judging" / "localise.py"]:
        assert catalogue_leaks(str(path.relative_to(REPO)), path.read_text(), bodies) == [], path
    line = next(line for line in bodies["train_amp"] if line.startswith("with torch.autocast"))
    planted = (REPO / "autograder/exercises/train_amp/mistakes.py").read_text() + f"\nFIX = 'Use `{line}`.'\n"
    with zipfile.ZipFile(tmp_path / "kit.whl", "w") as z:
        z.writestr("autograder/exercises/train_amp/mistakes.py", planted)
    assert any("quotes a line of the solution of `train_amp`" in p for p in find_leaks(tmp_path))


@pytest.mark.slow
def test_the_built_kit_holds_no_solution_and_no_instructor_file(student_kit):
    assert find_leaks(student_kit) == []
    (wheel,) = student_kit.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "autograder/references/train_with_accumulation.json" in names
    for lesson in (REPO / "notebooks").rglob("*"):
        if lesson.is_file() and "__pycache__" not in lesson.parts:
            assert f"training_at_scale_student/course/{lesson.relative_to(REPO / 'notebooks').as_posix()}" in names
    instructor_only = ("solutions/", "tests/", "bench/", "autograder/grader/", "autograder/authoring/")
    assert not [n for n in names if n.startswith(instructor_only)]
    recorded = {p.relative_to(REPO).as_posix() for p in (REPO / "coursekit" / "results").iterdir()}
    assert recorded and recorded <= set(names), "recorded GPU results must reach the students' lessons"
    assert (student_kit / "README.md").read_text().startswith("# Training at Scale — student kit")
    assert f"./{wheel.name}" in (student_kit / "environment.yml").read_text()
    assert (student_kit.parent / f"training-at-scale-student-{wheel.name.split('-')[1]}.zip").is_file()


@pytest.mark.slow
def test_nbgrader_release_gives_students_no_solution(tmp_path):
    """The instructor's `nbgrader release_assignment` publishes the generated notebooks, never a solution."""
    env = {**os.environ, "NBGRADER_COURSE_ROOT": str(tmp_path / "instructor"),
           "NBGRADER_EXCHANGE": str(tmp_path / "exchange"), "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data")}
    (tmp_path / "instructor").mkdir()
    (tmp_path / "exchange").mkdir()
    for assignment in sorted({spec.assignment for spec in load_course().notebooks.values()}):
        run([NBGRADER, "release_assignment", assignment, "--force"], COURSE, env)
    outbound = tmp_path / "exchange" / "training-at-scale" / "outbound"
    assert len(list(outbound.rglob("*.ipynb"))) >= 6
    assert find_leaks(outbound) == []


# ---- the installed kit, far from the repository ------------------------------------------------

def released_source(notebook: str, exercise: str) -> str:
    cell = next(c for c in released_notebook(notebook)["cells"]
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == exercise)
    return "".join(cell["source"])


# Every variant's verdict is the variant suites' job (tests/exercises/, tests/known_fails.py). This test asks whether
# the installed kit (its shipped reference file, its code away from the repository) says what the instructor's
# checkout says, in score and words: every case kind on every exercise, and two wrong variants so that two failing
# checks' reports are compared. A second correct style and a third wrong variant cost a quarter of the test (about
# 35 of 140 CPU-s a side) and go through the same shipped file, catalogue of mistakes and localisation.
SAMPLED_CORRECT, SAMPLED_WRONG = 1, 2


def selfcheck_job() -> dict:
    """Per exercise: the setup cells, and the exercise cell as reference, blank stub and a fixed sample of its
    variants (the kit must agree with the instructor's grader on each; the suites cover the rest)."""
    job, variants = {}, variant_modules()
    for spec in load_course().notebooks.values():
        for exercise in spec.exercises:
            module = variants[exercise]
            slow = set(getattr(module, "PUBLIC_ONLY", ()))  # deadlocks: each costs a launch timeout
            correct = sorted(module.CORRECT)[:SAMPLED_CORRECT]
            wrong = sorted(name for name in module.WRONG if name not in slow)[:SAMPLED_WRONG]
            cases = {"reference": reference_source(exercise), "blank": released_source(spec.name, exercise)}
            cases |= {f"correct:{name}": module.CORRECT[name] for name in correct}
            cases |= {f"wrong:{name}": module.WRONG[name][0] for name in wrong}
            job[exercise] = {"setup": spec.setup_code, "cases": cases}
    return job


def start_selfchecks(python: str, job: dict, cwd: Path, env: dict | None) -> subprocess.Popen:
    """Start kit_selfcheck.py (copied next to the work, away from the repository) on ``job``; files, not pipes,
    carry its input and output, so two of them can run side by side."""
    script = cwd / "kit_selfcheck.py"
    shutil.copyfile(Path(__file__).resolve().parents[1] / "kit_selfcheck.py", script)
    (cwd / "job.json").write_text(json.dumps(job))
    with open(cwd / "job.json") as stdin, open(cwd / "results.json", "w") as stdout, open(cwd / "log.txt", "w") as log:
        process = subprocess.Popen([python, str(script)], stdin=stdin, stdout=stdout, stderr=log, cwd=cwd, env=env)
    process.folder = cwd
    return process


def selfcheck_results(process: subprocess.Popen) -> dict:
    process.wait(timeout=1800)
    assert process.returncode == 0, (process.folder / "log.txt").read_text()[-3000:]
    return json.loads((process.folder / "results.json").read_text())


def run_selfchecks(python: str, job: dict, cwd: Path, env: dict | None) -> dict:
    return selfcheck_results(start_selfchecks(python, job, cwd, env))


def digits_masked(text: str) -> str:
    """The words of a report, its numbers masked. A measured number (memory held, bytes sent) varies by a few percent
    between two runs, which can move it across the localisation's wording of a size ("1.1 times the right value",
    "off by about 9%", and what follows of its shape): a line is compared up to its first size. A list of ranks counts
    as one rank (which ranks of a deadlocked ring raise first varies from run to run)."""
    masked = re.sub(r"\d+(\.\d+)?", "#", text)
    # which ranks of a deadlocked ring raise "would hang" first, and which are stopped waiting, varies run to run
    masked = re.sub(r"rank #(, rank #)*( and # more)?", "rank(s) #", masked)
    size = re.sub(r"off by about #%( \(relative to its largest value\))?|# times the right value|about # times too small"
                  r"( \(no factor of the exercise\))?", "<a size>", masked)
    return re.sub(r"<a size>.*", "<a size> …", size)  # and what the line says of it after that (its shape, elsewhere)


# Variants whose values depend on the secret seeds a launcher draws per run (a MiniFSDP that answers the grader's
# pauses ahead multiplies its gradients by factors of seeds it asked for early): the same score and cause in both
# runs, but which values the localisation finds wrong beyond the tolerance varies with the seeds.
SEEDED_BY_THE_LAUNCHER = {"MiniFSDP/wrong:answers_gates_in_advance"}


def without_localisation(report: str) -> str:
    return "\n".join(line for line in report.splitlines() if not line.strip().startswith(("Wrong:", "Right:")))


@pytest.mark.slow
def test_installed_kit_self_checks_give_the_instructors_verdicts(installed_kit, tmp_path):
    job = selfcheck_job()
    (tmp_path / "instructor").mkdir()
    kit_run = start_selfchecks(str(installed_kit.bin / "python"), job, installed_kit.home, installed_kit.env())
    instructor_run = start_selfchecks(sys.executable, job, tmp_path / "instructor", None)  # live references
    in_kit, instructor = selfcheck_results(kit_run), selfcheck_results(instructor_run)
    maxima = {e: load_course().spec_for_exercise(e).test_points[e] for e in job}
    for key, got in sorted(in_kit.items()):
        exercise, case = key.split("/", 1)
        if case in ("reference",) or case.startswith("correct:"):
            assert got["score"] == maxima[exercise], (key, got["report"])
        elif case == "blank":
            assert got["score"] == 0, (key, got["report"])
        else:
            assert got["score"] < maxima[exercise], (key, got["report"])
        assert got["score"] == instructor[key]["score"], f"{key}: the kit and the instructor disagree"
        # the same words; measured numbers (bytes sent, memory held) vary by a few percent between two runs
        mine, theirs = digits_masked(got["report"]), digits_masked(instructor[key]["report"])
        if key in SEEDED_BY_THE_LAUNCHER:
            mine, theirs = without_localisation(mine), without_localisation(theirs)
        assert mine == theirs, f"{key}: different reports"
    assert set(in_kit) == set(instructor) and len(in_kit) == sum(len(j["cases"]) for j in job.values())


@pytest.mark.slow
def test_installed_kit_validate_and_the_student_commands(installed_kit):
    course = installed_kit.home / "validated-course"  # its own folder: the browser tests use the default one
    copied = installed_kit.run("training-at-scale", "copy", "--dir", str(course))
    assert "copied" in copied.stdout and (course / "00-start-here.ipynb").is_file()
    lesson1 = course / "lesson1" / L1
    validate = installed_kit.run("nbgrader", "validate", str(lesson1), check=False, cwd=course)
    assert "VALIDATION FAILED" in validate.stdout and f"{L1_EXERCISE}: 0 / 11 points" in validate.stdout, validate.stdout
    assert "Partial credit" not in validate.stdout, validate.stdout  # the check's report, not nbgrader's fixed text
    lesson1.write_text(json.dumps(filled(L1, {L1_EXERCISE: reference_source(L1_EXERCISE)}), indent=1))
    validate = installed_kit.run("nbgrader", "validate", str(lesson1), cwd=course)
    assert "Success! Your notebook passes all the tests." in validate.stdout, validate.stdout
    again = installed_kit.run("training-at-scale", "copy", "--dir", str(course))  # a second run keeps the student's work
    assert "kept your own version of 1 file(s)" in again.stdout and "lesson1/" + L1 in again.stdout
    assert L1_EXERCISE in lesson1.read_text() and "NotImplementedError" not in json.dumps(
        [c for c in json.loads(lesson1.read_text())["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id")
         == L1_EXERCISE])


@pytest.mark.slow
def test_installed_kit_hides_the_instructor_tools(installed_kit):
    server = installed_kit.run("jupyter", "server", "extension", "list").stdout + \
        installed_kit.run("jupyter", "server", "extension", "list").stderr
    # the kit's Assignment List is nbgrader's, behind the kit's extension (which, with no exchange, names the LMS)
    for extension, state in (("nbgrader.server_extensions.formgrader", "disabled"),
                             ("nbgrader.server_extensions.course_list", "disabled"),
                             ("nbgrader.server_extensions.assignment_list", "disabled"),
                             ("training_at_scale_student.assignment_list", "enabled"),
                             ("nbgrader.server_extensions.validate_assignment", "enabled")):
        line = next(x for x in server.splitlines() if f"{extension} " in x)
        assert state in line, line
    lab = installed_kit.run("jupyter", "labextension", "list")
    disabled = (lab.stdout + lab.stderr).split("Disabled extensions:", 1)[-1]
    for plugin in ("formgrader", "course-list", "create-assignment"):
        assert f"@jupyter/nbgrader:{plugin}" in disabled
    for plugin in ("assignment-list", "validate-assignment"):
        assert f"@jupyter/nbgrader:{plugin}" not in disabled


@pytest.mark.slow
def test_installed_kit_reports_an_edited_reference_file(installed_kit, tmp_path):
    (shipped,) = installed_kit.venv.glob(f"lib/python*/site-packages/autograder/references/{L1_EXERCISE}.json")
    original = shipped.read_bytes()
    try:
        data = json.loads(original)
        data["observation"]["scenarios"]["default"]["returned"] *= 1.001
        shipped.write_text(json.dumps(data))  # a student "adjusting" a reference value
        job = {L1_EXERCISE: {"setup": load_course().notebooks[L1].setup_code,
                             "cases": {"reference": reference_source(L1_EXERCISE)}}}
        got = run_selfchecks(str(installed_kit.bin / "python"), job, installed_kit.home, installed_kit.env())
    finally:
        shipped.write_bytes(original)
    result = got[f"{L1_EXERCISE}/reference"]
    assert result["score"] == 0 and "changed after it was built" in result["report"], result


@pytest.mark.slow
def test_the_class_grader_never_reads_the_shipped_file(monkeypatch, tmp_path):
    """`python -m autograder grade` computes its references from solutions/: a forged shipped file (one that
    would make the blank notebook look right) changes nothing, and the file is never even opened."""
    from submission_factory import write

    from autograder.grader.batch import grade_class
    from autograder.grader.sandbox.launch import make_sandbox

    def forged(data):  # the blank notebook's observation recorded as the "reference"
        data["observation"] = {"scenarios": {}}
    folder = tmp_path / "references"
    folder.mkdir()
    observations.reference_file(L1_EXERCISE, folder).write_bytes(_rebuilt(forged))
    monkeypatch.setattr(observations, "FOLDER", folder)

    def never(*args, **kwargs):
        raise AssertionError("the class grader read the shipped reference observations")
    monkeypatch.setattr(observations, "_load", never)
    write(tmp_path / "in", "ada", L1, filled(L1, {L1_EXERCISE: reference_source(L1_EXERCISE)}))
    write(tmp_path / "in", "bob", L1, released_notebook(L1))
    rows, _ = grade_class(tmp_path / "in", tmp_path / "out", make_sandbox(), jobs=2, progress=False)
    scores = {r.student: (r.score, r.max_score) for r in rows}
    assert scores == {"ada": (11.0, 11.0), "bob": (0.0, 11.0)}, scores


IMPORTS_RESOLVE = r'''
import ast, importlib, json, sys
from pathlib import Path
problems = []
for notebook in sorted(Path(sys.argv[1]).rglob("*.ipynb")):
    sys.path.insert(0, str(notebook.parent))  # the kernel runs in the lesson's folder: its scripts import
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(l for l in cell["source"] if not l.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                pairs = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                pairs = [(node.module, a.name) for a in node.names]
            else:
                continue
            for module, name in pairs:
                try:
                    imported = importlib.import_module(module)
                    if name and not hasattr(imported, name):
                        importlib.import_module(f"{module}.{name}")
                except Exception as exc:
                    problems.append(f"{notebook.name}: {module}{'.' + name if name else ''}: {exc!r}")
    sys.path.pop(0)
print(json.dumps(problems))
'''


@pytest.mark.slow
def test_every_lesson_import_resolves_in_the_installed_kit(installed_kit):
    """Everything a lesson imports (coursekit helpers, torch APIs, the lesson's own scripts) exists in the kit."""
    course = installed_kit.home / "training-at-scale"
    installed_kit.run("training-at-scale", "copy")
    done = installed_kit.run("python", "-c", IMPORTS_RESOLVE, str(course), cwd=course)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []

"""What a student and an instructor see, tested in a real Chromium against a real JupyterLab.

Two JupyterLab servers per module: the student's, started by ``training-at-scale lab`` from the student kit
installed in a fresh venv (what students get: no solutions anywhere), and the instructor's, started like
``make lab`` in a temporary copy of the repository (see browser_helpers). Each step leaves a screenshot under
test-artifacts/browser/<test>/; a failing step says what was expected and where its screenshot is.

* start page (student kit): the default URL opens the start page, the Nbgrader menu offers the Assignment List
  but none of the instructor's tools, and the kernel is the kit's environment (its setup cell forks two ranks
  and all-reduces).
* student (student kit): Lesson 1 → Run All → plots render → type the solution into the exercise cell →
  Run All → 11/11 (against the kit's shipped reference results) → Validate → "Success!".
* instructor (repository): nbgrader generate_assignment + autograde two submissions → formgrader shows the
  assignment and the graded submissions with their scores.
"""
import json
import re
import time

import pytest
from browser_helpers import (
    CHROMIUM_ARGS,
    REPO,
    LabServer,
    Screenshots,
    StudentKitLab,
    chromium_executable,
    fill_exercise,
    playwright_or_skip,
    reference_solution,
)

LESSON1 = "lesson1/01_gradient_accumulation.ipynb"   # in the student's course folder
EXERCISE = "train_with_accumulation"
STUDENT_MENU, INSTRUCTOR_ONLY_MENU = ("Assignment List",), ("Formgrader", "Course List")
VIEWPORT = {"width": 1400, "height": 900}
KERNEL_READY = "Python 3 (ipykernel) | Idle"  # Lab's status bar once the notebook's kernel has started
# True when every code cell shows an execution count: nothing queued ([*]) or never run ([ ]).
ALL_CELLS_RAN = """() => {
    const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
    return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
}"""
STDERR_OUTPUT = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
RUN_ALL_TIMEOUT_MS = 300_000   # Lesson 1 took 15–45 s on a shared 2-core CPU; CI machines can be busier
VALIDATE_TIMEOUT_MS = 300_000


# ---- fixtures: one server and one browser for the module --------------------------------------

@pytest.fixture(scope="module")
def browser():
    executable = chromium_executable()
    with playwright_or_skip()() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def lab(browser, tmp_path_factory):
    with LabServer(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="module")
def student_lab(browser, installed_kit, tmp_path_factory):
    with StudentKitLab(installed_kit, tmp_path_factory.mktemp("student-lab")) as server:
        yield server


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    context.close()


# ---- helpers: what a person does in Lab --------------------------------------------------------

def open_in_lab(page, lab, path: str, workspace: str) -> None:
    """Open a notebook in its own Lab workspace (so tabs another test left open are not restored)."""
    page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{path}?token={lab.token}")
    wait_until_ready(page, lab.root / path)


def wait_until_ready(page, notebook) -> None:
    """Every cell of the notebook is on the page, and its kernel has started and is idle."""
    cells = len(json.loads(notebook.read_text())["cells"])
    page.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-Cell').length === {cells}",
                           timeout=90_000)
    page.wait_for_selector(f".jp-StatusBar-Widget >> text={KERNEL_READY!r}", timeout=90_000)


def menu(page, top: str, item: str) -> None:
    page.click(f".lm-MenuBar-itemLabel:text-is('{top}')")
    page.click(f".lm-Menu-itemLabel:text-is('{item}')")


def run_all_cells(page) -> float:
    start = time.monotonic()
    menu(page, "Run", "Run All Cells")
    page.wait_for_function(ALL_CELLS_RAN, timeout=RUN_ALL_TIMEOUT_MS)
    return time.monotonic() - start


def code_cell(page, text: str):
    cell = page.locator(".jp-CodeCell").filter(has_text=text)
    assert cell.count() == 1, f"expected one code cell containing {text!r}, found {cell.count()}"
    return cell


def rendered_images(page) -> list[dict]:
    return page.locator(".jp-OutputArea-output img").evaluate_all(
        "imgs => imgs.map(i => ({width: i.naturalWidth, height: i.naturalHeight, complete: i.complete}))")


# ---- tests ---------------------------------------------------------------------------------------

def test_start_page_links_point_at_the_lessons():
    """Every lesson notebook that exists is linked from the start page under its real path (fast, no browser)."""
    start = json.loads((REPO / "notebooks" / "00-start-here.ipynb").read_text())
    text = "".join("".join(c["source"]) for c in start["cells"] if c["cell_type"] == "markdown")
    links = set(re.findall(r"\]\((lesson\d+/[^)]+\.ipynb)\)", text))
    for lesson in sorted((REPO / "notebooks").glob("lesson*/*.ipynb")):
        relative = lesson.relative_to(REPO / "notebooks").as_posix()
        assert relative in links, f"notebooks/00-start-here.ipynb does not link {relative}: add it to the lesson table"
    for link in links:  # a lesson not written yet may be linked; a written one under another name may not
        folder = REPO / "notebooks" / link.split("/")[0]
        assert not folder.is_dir() or (REPO / "notebooks" / link).exists(), \
            f"the start page links {link}, but {folder.name}/ holds {[p.name for p in folder.glob('*.ipynb')]}"


@pytest.mark.browser
@pytest.mark.slow
def test_start_page_opens_with_the_course_kernel_and_nbgrader(page, student_lab):
    lab = student_lab
    shots = Screenshots(page, "start_page")
    with shots.step("start-page", f"`training-at-scale lab`'s default URL {lab.default_url} should show the start page"):
        page.goto(f"{lab.url}/?token={lab.token}")
        assert lab.default_url in page.url, f"the browser landed on {page.url}"
        wait_until_ready(page, lab.root / lab.default_url.split("/lab/tree/", 1)[1])
        heading = page.locator(".jp-MarkdownCell h1").first.inner_text()
        assert "Training at Scale" in heading, f"the first heading is {heading!r}"
        assert page.locator("table a:text('Gradient accumulation')").count() == 1, "no link to Lesson 1 in the table"

    with shots.step("nbgrader-menu", f"the Nbgrader menu should offer {STUDENT_MENU} and none of {INSTRUCTOR_ONLY_MENU}"):
        page.click(".lm-MenuBar-itemLabel:text-is('Nbgrader')")
        items = page.locator(".lm-Menu-itemLabel").all_inner_texts()
        missing = [item for item in STUDENT_MENU if item not in items]
        assert not missing, f"missing {missing}; the menu holds {items}: is the nbgrader lab extension enabled?"
        extra = [item for item in INSTRUCTOR_ONLY_MENU if item in items]
        assert not extra, f"a student's Lab offers the instructor's {extra}"
        tabs = page.locator(".jp-SideBar.jp-mod-right .lm-TabBar-tab").evaluate_all(
            "tabs => tabs.map(t => t.getAttribute('title') || t.textContent)")
        assert not [t for t in tabs if "Create Assignment" in (t or "")], f"the right side bar offers {tabs}"

    with shots.step("assignment-list", "Nbgrader → Assignment List should open the students' assignment panel and, "
                    "with no class hub, say that work is handed in through the LMS"):
        page.click(".lm-Menu-itemLabel:text-is('Assignment List')")
        page.wait_for_selector("text=Released, downloaded, and submitted assignments for course", timeout=30_000)
        page.wait_for_selector("text=Hand in by uploading your .ipynb file to your course's LMS", timeout=30_000)
        assert page.locator("text=Error fetching courses!").count() == 0, "the Assignment List shows an error"

    with shots.step("setup-check", "the start page's setup cell should run in the course's kernel without errors"):
        page.locator(".lm-TabBar-tabLabel:text('00-start-here')").click()
        page.wait_for_selector(f".jp-StatusBar-Widget >> text={KERNEL_READY!r}", timeout=90_000)
        run_all_cells(page)
        output_area = code_cell(page, "def all_reduce_rank").locator(".jp-OutputArea")
        output_area.scroll_into_view_if_needed()
        output = output_area.inner_text()
        assert "The course is ready" in output, f"the setup cell printed:\n{output}"
        assert str(lab.kit.bin) in output, f"the kernel does not run the kit's Python (in {lab.kit.bin}):\n{output}"
        assert page.locator(STDERR_OUTPUT).count() == 0, "a cell wrote to stderr (red output)"


@pytest.mark.browser
@pytest.mark.slow
def test_student_runs_lesson1_and_validate_passes(page, student_lab):
    lab = student_lab
    shots = Screenshots(page, "student")
    with shots.step("open-lesson1", f"{LESSON1} should open with an idle Python kernel"):
        open_in_lab(page, lab, LESSON1, workspace="student")
        stub = code_cell(page, f"def {EXERCISE}(").inner_text()
        assert "NotImplementedError" in stub, f"the exercise cell is not the student's stub:\n{stub}"

    with shots.step("run-all", "Run → Run All Cells should run every cell without red output and render the plot"):
        seconds = run_all_cells(page)
        print(f"Run All (exercise not done): {seconds:.0f} s")
        assert page.locator(STDERR_OUTPUT).count() == 0, "a cell wrote to stderr or raised"
        images = rendered_images(page)
        assert images and all(i["complete"] and i["width"] > 100 for i in images), f"plots did not render: {images}"
        page.locator(".jp-OutputArea-output img").first.scroll_into_view_if_needed()

    with shots.step("exercise-not-done", "before the exercise is done, its test cell should score 0"):
        test_output = code_cell(page, f'check("{EXERCISE}"').locator(".jp-OutputArea")
        test_output.scroll_into_view_if_needed()
        assert "0 / 11 points" in test_output.inner_text(), test_output.inner_text()

    solution = reference_solution(EXERCISE)
    with shots.step("fill-exercise", "typing the solution into the exercise cell should replace the stub"):
        editor = code_cell(page, f"def {EXERCISE}(").locator(".cm-content")
        editor.click()
        page.keyboard.press("Control+a")  # select the cell's text (the cursor is in the cell's editor)
        page.keyboard.insert_text(solution)  # like a paste: no auto-indent or auto-closed brackets
        assert "NotImplementedError" not in editor.inner_text(), editor.inner_text()

    with shots.step("run-all-solved", "after the exercise, Run All should score 11 / 11 and draw both plots"):
        seconds = run_all_cells(page)
        print(f"Run All (exercise done): {seconds:.0f} s")
        test_output = code_cell(page, f'check("{EXERCISE}"').locator(".jp-OutputArea")
        test_output.scroll_into_view_if_needed()
        report = test_output.inner_text()
        assert "11 / 11 points" in report and "[FAIL]" not in report, report
        assert page.locator(STDERR_OUTPUT).count() == 0, "a cell wrote to stderr or raised"

    with shots.step("training-plot", "with the exercise done, section 4's training curves should render too"):
        images = rendered_images(page)
        assert len(images) == 2 and all(i["complete"] and i["width"] > 100 for i in images), \
            f"expected 2 rendered plots, found {images}"
        page.locator(".jp-OutputArea-output img").first.scroll_into_view_if_needed()

    with shots.step("validate", "Validate should save the notebook, run it in a fresh kernel and report success"):
        start = time.monotonic()
        page.click(".validate-button")
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for(timeout=VALIDATE_TIMEOUT_MS)
        print(f"Validate: {time.monotonic() - start:.0f} s")
        text = dialog.inner_text()
        assert "Success! Your notebook passes all the tests." in text, f"the Validate dialog says:\n{text}"

    saved = json.loads((lab.root / LESSON1).read_text())
    cell = next(c for c in saved["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == EXERCISE)
    assert "".join(cell["source"]).strip() == solution.strip(), \
        f"the saved exercise cell is not what was typed (screenshot: {shots.folder})"


@pytest.mark.browser
@pytest.mark.slow
def test_instructor_sees_graded_submissions_in_formgrader(page, lab, tmp_path):
    # The instructor's side with real nbgrader commands, in the server's (temporary) course folder.
    release = tmp_path / "release"  # not the student's notebooks/: the student test may have saved work there
    lab.nbgrader("generate_assignment", "lesson1", "--force", f"--CourseDirectory.release_directory={release}")
    released = json.loads((release / "lesson1" / "01_gradient_accumulation.ipynb").read_text())
    submissions = {"ada": fill_exercise(json.loads(json.dumps(released)), EXERCISE, reference_solution(EXERCISE)),
                   "bob": released}  # bob handed in the notebook as released: the exercise is not done
    for student, notebook in submissions.items():
        folder = lab.cwd / "submitted" / student / "lesson1"
        folder.mkdir(parents=True)
        (folder / "01_gradient_accumulation.ipynb").write_text(json.dumps(notebook))
    start = time.monotonic()
    lab.nbgrader("autograde", "lesson1")
    print(f"nbgrader autograde (2 submissions): {time.monotonic() - start:.0f} s")

    shots = Screenshots(page, "instructor")
    with shots.step("instructor-menu", f"the instructor's Nbgrader menu should offer {INSTRUCTOR_ONLY_MENU}"):
        page.goto(f"{lab.url}/lab?token={lab.token}")
        page.click(".lm-MenuBar-itemLabel:text-is('Nbgrader')")
        items = page.locator(".lm-Menu-itemLabel").all_inner_texts()
        assert all(item in items for item in INSTRUCTOR_ONLY_MENU), f"the instructor's menu holds {items}"
        page.keyboard.press("Escape")

    with shots.step("formgrader", "formgrader should list lesson1 with 2 submissions"):
        page.goto(f"{lab.url}/formgrader?token={lab.token}")
        row = page.locator("tr").filter(has=page.locator("a:text-is('lesson1')"))
        row.wait_for(timeout=60_000)
        cells = row.locator("td").all_inner_texts()
        assert "2" in [c.strip() for c in cells], f"the lesson1 row reads {cells}"

    with shots.step("submissions", "Manual Grading should show ada 11 / 11 and bob 0 / 11"):
        page.click("a:text-is('Manual Grading')")
        page.click("a:text-is('lesson1')")
        page.click("a:text-is('01_gradient_accumulation')")
        page.wait_for_selector("text=Submission #1", timeout=60_000)
        page.click("text=Show All Names")
        scores = {}
        for student in submissions:
            row = page.locator("tr").filter(has_text=student)
            row.wait_for(timeout=30_000)
            scores[student] = re.findall(r"\d+(?:\.\d+)? / \d+(?:\.\d+)?", row.inner_text())[0]
        assert scores == {"ada": "11 / 11", "bob": "0 / 11"}, f"formgrader shows {scores}"

    with shots.step("graded-submission", "ada's graded submission should show the check report with 11 / 11"):
        page.locator("tr").filter(has_text="ada").locator("a").filter(has_text="ada").first.click()
        page.wait_for_selector("text=train_with_accumulation: 11 / 11 points", timeout=60_000)
        page.locator("text=train_with_accumulation: 11 / 11 points").scroll_into_view_if_needed()

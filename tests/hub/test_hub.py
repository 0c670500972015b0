"""A class on JupyterHub, for real: ``python -m hub up`` sets up a hub with real Unix users, Chromium logs in
through the hub's login page, and the whole term's loop runs through JupyterLab, the Assignment List and formgrader.

* term: the instructor releases Lesson 1 in formgrader; two students fetch it in their Assignment List, one hands
  in the reference answer, one a wrong answer, both with Submit; the instructor collects in formgrader, grades with
  ``python -m autograder grade --gradebook``, sees 11 / 11 and less in formgrader, generates and releases feedback;
  each student fetches and sees their own feedback only. Screenshots of every step: test-artifacts/hub/term/.
* isolation, as the real users: a student cannot read another student's home, feedback or submission, the course
  folder, the gradebook or the instructor environment; nothing a student can read holds solution code; a student's
  browser session cannot open another student's server.
* servers: each runs as its user, in its role's environment, inside its cgroup with the configured limits;
  formgrader may be framed by the instructor's own origin only, students' servers by nothing.
* bad input: submitting twice, after the deadline, with the notebook deleted or renamed; a hub restart mid-term.

One hub for the module (its setup builds three environments: the slow part); ``down --purge`` removes it
afterwards, also when a test fails, and the last test checks that nothing is left.
"""
import contextlib
import csv
import json
import re
import time
from pathlib import Path

import pytest
from browser_helpers import playwright_or_skip, reference_solution
from hub_helpers import (
    CHROMIUM_ARGS,
    REPO,
    artifacts,
    chromium_executable,
    dismiss_notifications,
    hub_or_skip,
    leftovers,
    login,
    released_notebook,
    start_class_hub,
    stop_class_hub,
    write_as,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.serial]  # serial: its browser flows time out under load

EXERCISE, LESSON, NB = "train_with_accumulation", "lesson1", "01_gradient_accumulation.ipynb"
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "BEGIN HIDDEN TESTS")


def wrong_answer() -> str:
    """A plausible mistake from the variant suite: the loss is not divided by the number of micro-batches."""
    import sys

    sys.path.insert(0, str(REPO / "tests"))
    from variants import train_with_accumulation as variants

    source, _ = next(iter(variants.WRONG.values()))
    return source


def notebook_with(answer: str | None) -> str:
    notebook = released_notebook_cache["nb"]
    copy = json.loads(json.dumps(notebook))
    if answer is not None:
        for cell in copy["cells"]:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == EXERCISE:
                cell["source"] = answer
    return json.dumps(copy, indent=1)


released_notebook_cache: dict = {}


# ---- fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub_or_skip()
    chromium_executable()
    playwright_or_skip()
    hub = start_class_hub(tmp_path_factory.mktemp("class-hub"))
    print(f"python -m hub up: {hub.up_seconds:.0f} s")
    released_notebook_cache["nb"] = released_notebook(hub)
    try:
        yield hub
    finally:
        stop_class_hub(hub)


@pytest.fixture(scope="module")
def browser(hub):
    with playwright_or_skip()() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_executable(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Steps:
    """Numbered screenshots of one test's steps (across several users' pages) under test-artifacts/hub/<name>/."""

    def __init__(self, name: str):
        self.folder, self.count = artifacts(name), 0

    @contextlib.contextmanager
    def step(self, page, name: str, what: str):
        problem = None
        try:
            yield
        except Exception as exc:  # playwright's TimeoutError, AssertionError from a check inside the step
            problem = str(exc).split("\nassert ")[0]
        self.count += 1
        path = self.folder / f"{self.count:02d}-{name}{'-FAILED' if problem else ''}.png"
        page.screenshot(path=str(path))
        if problem:
            pytest.fail(f"{what}: {problem}\n(screenshot: {path})", pytrace=False)


# ---- what a person does --------------------------------------------------------------------------

def open_formgrader(page):
    """Nbgrader → Formgrader inside the instructor's JupyterLab; returns the frame (blank if the CSP blocks it)."""
    page.click(".lm-MenuBar-itemLabel:text-is('Nbgrader')")
    page.click(".lm-Menu-itemLabel:text-is('Formgrader')")
    frame = page.frame_locator(".jp-MainAreaWidget iframe").last
    frame.locator("text=Manage Assignments").first.wait_for(timeout=60_000)
    return frame


def formgrader_action(frame, assignment: str, column: str) -> str:
    """Click the icon in ``column`` (release, collect, generate-feedback, release-feedback) of the assignment's row;
    returns the text of the dialog formgrader answers with, after closing it."""
    row = frame.locator("tr").filter(has=frame.locator(f"a:text-is('{assignment}')"))
    row.locator(f"td.{column} a").click()
    dialog = frame.locator("#success-modal, #error-modal").locator(".modal-body")
    dialog.wait_for(timeout=300_000)
    text = dialog.inner_text()
    frame.locator("#success-modal, #error-modal").locator("button[data-dismiss='modal']").last.click()
    frame.locator(".modal-backdrop").wait_for(state="detached", timeout=30_000)
    return text


def open_assignment_list(page):
    page.click(".lm-MenuBar-itemLabel:text-is('Nbgrader')")
    page.click(".lm-Menu-itemLabel:text-is('Assignment List')")
    page.locator("#released_assignments_list").wait_for(timeout=60_000)


def refresh_assignment_list(page):
    page.click("#refresh_assignments_list")
    for name in ("released", "fetched", "submitted"):
        page.locator(f"#{name}_assignments_list_loading").wait_for(state="hidden", timeout=60_000)


def list_rows(page, name: str):
    return page.locator(f"#{name}_assignments_list > .list_item")


# ---- the term ------------------------------------------------------------------------------------

def test_a_term_in_the_browser(hub, browser):
    steps = Steps("term")
    teacher = login(browser, hub, hub.instructor)
    dismiss_notifications(teacher)
    with steps.step(teacher, "instructor-formgrader", "formgrader should open inside the instructor's JupyterLab"):
        frame = open_formgrader(teacher)
        frame.locator(f"a:text-is('{LESSON}')").wait_for()

    with steps.step(teacher, "instructor-releases-lesson1", "Release in formgrader should publish lesson1"):
        said = formgrader_action(frame, LESSON, "release")
        assert "Successfully released" in said, said
        outbound = hub.settings.exchange / "training-at-scale" / "outbound" / LESSON / NB
        assert outbound.is_file(), f"nothing in {outbound.parent}"

    answers = {"alice": reference_solution(EXERCISE), "bob": wrong_answer()}
    pages = {}
    for short, answer in answers.items():
        user = hub.user(short)
        page = pages[short] = login(browser, hub, user)
        dismiss_notifications(page)
        with steps.step(page, f"{short}-first-page", f"{short}'s first page should say where the course is (issue 27)"):
            page.locator(".jp-RenderedMarkdown h1:has-text('Training at Scale: start here')").wait_for(timeout=60_000)
            assert "Nbgrader → Assignment List" in page.locator(".jp-RenderedMarkdown").first.inner_text()
            assert (Path(f"/home/{user}") / "WELCOME.md").is_file()
        with steps.step(page, f"{short}-fetches", f"{short} should see lesson1 released and fetch it"):
            open_assignment_list(page)
            refresh_assignment_list(page)
            released = list_rows(page, "released")
            assert released.count() == 1 and LESSON in released.first.inner_text(), released.all_inner_texts()
            released.first.locator(".item_status button").click()
            list_rows(page, "fetched").first.wait_for(timeout=60_000)
        mine = Path(f"/home/{user}") / LESSON / NB
        assert mine.is_file(), f"the fetched notebook is not in {user}'s home"
        write_as(hub, user, mine, notebook_with(answer))  # the student's work, saved by the student
        with steps.step(page, f"{short}-submits", f"{short} should submit lesson1 with the Assignment List"):
            refresh_assignment_list(page)
            list_rows(page, "fetched").first.locator(".item_status button:text-is('Submit')").click()
            list_rows(page, "submitted").first.wait_for(timeout=120_000)
            assert LESSON in list_rows(page, "submitted").first.inner_text()

    with steps.step(teacher, "instructor-collects", "Collect in formgrader should collect both submissions"):
        said = formgrader_action(frame, LESSON, "collect")
        assert "Successfully collected" in said, said
        submitted = hub.settings.nbgrader_course / "submitted"
        collected = sorted(p.name for p in submitted.iterdir())
        assert collected == sorted(hub.user(s) for s in answers), collected

    start = time.monotonic()
    graded = hub.as_user(hub.instructor, "python", "-m", "autograder", "grade", "submitted", "--out",
                         str(hub.settings.course / "grading" / LESSON), "--gradebook", "--quiet",
                         cwd=hub.settings.nbgrader_course, timeout=900)
    print(f"python -m autograder grade --gradebook (2 students, as the instructor): {time.monotonic() - start:.0f} s")
    with open(hub.settings.course / "grading" / LESSON / "summary.csv") as f:
        summary = {row["student"]: row for row in csv.DictReader(f)}
    assert set(summary) == {hub.user(s) for s in answers}, (summary, graded.stdout)

    with steps.step(teacher, "instructor-sees-scores", "formgrader should show alice 11 / 11 and bob less"):
        teacher.reload()
        frame = open_formgrader(teacher)
        frame.locator("a:text-is('Manual Grading')").click()
        frame.locator(f"a:text-is('{LESSON}')").click()
        frame.locator("a:text-is('01_gradient_accumulation')").click()
        frame.locator("text=Submission #1").wait_for(timeout=60_000)
        frame.locator("text=Show All Names").click()
        scores = {}
        for short in answers:
            row = frame.locator("tr").filter(has_text=hub.user(short))
            scores[short] = re.findall(r"(\d+(?:\.\d+)?) / (\d+(?:\.\d+)?)", row.inner_text())[0]
        assert scores["alice"] == ("11", "11"), scores
        assert float(scores["bob"][0]) < 11 and scores["bob"][1] == "11", scores

    with steps.step(teacher, "instructor-releases-feedback", "formgrader should generate and release feedback"):
        frame.locator("a:text-is('Manage Assignments')").click()
        frame.locator(f"a:text-is('{LESSON}')").first.wait_for()
        said = formgrader_action(frame, LESSON, "generate-feedback")
        assert "Successfully generated feedback" in said, said
        said = formgrader_action(frame, LESSON, "release-feedback")
        assert "Successfully released feedback" in said, said

    feedback = {}
    for short, page in pages.items():
        user = hub.user(short)
        with steps.step(page, f"{short}-feedback", f"{short} should fetch and open their own feedback"):
            refresh_assignment_list(page)
            row = list_rows(page, "submitted").first
            row.locator("button:text-is('Fetch Feedback')").click()
            link = page.locator("#submitted_assignments_list a:text('view feedback')").first
            link.wait_for(timeout=120_000)
            link.click()  # the file browser goes to the feedback folder; open the HTML there
            page.locator(".jp-DirListing-item").filter(has_text="01_gradient_ac").first.dblclick()
            page.locator(".jp-HTMLViewer").last.wait_for(timeout=60_000)
        found = Path(f"/home/{user}/{LESSON}/feedback").rglob("*.html")
        files = sorted(p for p in found if ".ipynb_checkpoints" not in p.parts)  # opening it in Lab saves a copy
        assert len(files) == 1, files
        feedback[short] = files[0].read_text()
    assert "train_with_accumulation: 11 / 11 points" in feedback["alice"]
    bob_score = re.search(r"train_with_accumulation: (\d+(?:\.\d+)?) / 11 points", feedback["bob"])
    assert bob_score and float(bob_score[1]) < 11, feedback["bob"][-2000:]
    assert hub.user("bob") not in feedback["alice"] and hub.user("alice") not in feedback["bob"]
    for page in [teacher, *pages.values()]:
        page.context.close()


# ---- isolation, as the real users ------------------------------------------------------------------

def test_students_cannot_read_each_other_or_the_course(hub):
    alice, bob, teacher = hub.user("alice"), hub.user("bob"), hub.instructor
    s = hub.settings
    private = {f"{alice}'s home": Path(f"/home/{alice}"),
               f"{alice}'s notebook": Path(f"/home/{alice}") / LESSON / NB,
               "the course folder": s.course,
               "the solutions": s.course / "solutions" / LESSON / NB,
               "the gradebook": s.nbgrader_course / "gradebook.db",
               "the collected submissions": s.nbgrader_course / "submitted",
               "the instructor environment": s.env("instructor"),
               "the instructors' Jupyter config": s.jupyter_config("instructor"),
               "the exchange's inbound folder": s.exchange / "training-at-scale" / "inbound",
               "the exchange's feedback folder": s.exchange / "training-at-scale" / "feedback",
               "the hub's state (passwords, cookie secret)": s.state}
    readable = [what for what, path in private.items() if hub.can_read(bob, path)]
    assert not readable, f"{bob} (a student) can read: {readable}"
    for what in ("the course folder", "the gradebook", "the collected submissions", "the exchange's inbound folder"):
        assert hub.can_read(teacher, private[what]), f"the instructor cannot read {what}"
    assert hub.can_read(bob, s.exchange / "training-at-scale" / "outbound" / LESSON / NB), "students cannot fetch"
    # (a submission in the exchange is named <student>+<assignment>+<time>+<random>: unlisted, so unguessable)


def test_nothing_a_student_can_read_holds_solution_code(hub, tmp_path):
    """Every file student bob can open under the hub's folders and everyone's homes, scanned for solution code
    and solution markers (the student environment is the leak-checked kit wheel: its files are scanned too)."""
    from autograder.authoring.studentkit import find_leaks

    bob = hub.user("bob")
    roots = [hub.settings.root, hub.settings.envs, "/home"]
    lister = ("import os,sys\nfor r in sys.argv[1:]:\n for d,ds,fs in os.walk(r):\n  for f in fs:\n"
              "   p=os.path.join(d,f)\n   if os.path.isfile(p) and not os.path.islink(p) and os.access(p,os.R_OK)"
              " and (p.endswith(('.py','.ipynb','.json','.md','.txt','.html','.csv','.whl','.zip','.cfg','.toml','.db',"
              "'.sqlite'))"
              " or '.' not in f):\n    print(p)")
    listed = hub.as_user(bob, "/usr/bin/python3", "-c", lister, *roots).stdout.splitlines()
    site = [p for p in listed if "/site-packages/" in p and not re.search(r"/site-packages/(autograder|coursekit|"
                                                                         r"training_at_scale_student)/", p)]
    scanned = [Path(p) for p in listed if p not in set(site)]
    assert any(p.name == NB for p in scanned), "bob's own fetched notebook should be among the files he can read"
    copy = tmp_path / "readable"
    student_config = hub.settings.jupyter_config("student")
    for i, path in enumerate(scanned):
        # the students' own nbgrader_config.py (exchange path, course id) is not the course's instructor-only config
        # of that name: scanned for solution code under another name
        name = f"{path.name}.student-setting" if path.parent == student_config else path.name
        dest = copy / f"{i:05d}-{name}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(path.read_bytes())
    assert find_leaks(copy) == [], "a student can read solution material"


def test_a_student_session_cannot_open_another_students_server(hub, browser):
    page = login(browser, hub, hub.user("bob"))
    alice = hub.user("alice")
    reply = page.goto(f"{hub.settings.user_url(alice)}/api/contents/{LESSON}")
    body = page.content()
    assert reply.status in (403, 404) or "403" in body, f"bob opened {alice}'s files: {reply.status}\n{body[:500]}"
    page.screenshot(path=str(artifacts("isolation") / "bob-opens-alices-server.png"))
    page.context.close()


def test_servers_run_as_their_user_in_their_environment_with_limits(hub):
    import urllib.request

    from hub.limits import UserCgroups

    cgroups = UserCgroups(f"jupyterhub-{hub.tag}")
    for user, role in ((hub.instructor, "instructor"), (hub.user("alice"), "student")):
        pids = cgroups.members(user)
        assert pids, f"{user}'s server is in no cgroup of the hub (limits would not apply)"
        exe = {Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[1].decode() for p in pids
               if Path(f"/proc/{p}/cmdline").exists() and b"jupyterhub-singleuser" in Path(f"/proc/{p}/cmdline").read_bytes()}
        assert exe == {str(hub.settings.env(role) / "bin" / "jupyterhub-singleuser")}, exe
        uids = {Path(f"/proc/{p}/status").read_text().split("Uid:")[1].split()[0] for p in pids
                if Path(f"/proc/{p}/status").exists()}
        import pwd
        assert uids == {str(pwd.getpwnam(user).pw_uid)}, uids
        limits = cgroups.limits_of(user)
        assert hub.settings.mem_limit == "3G" and limits["memory"] == 3 << 30, limits  # JupyterHub's units: 1024-based
        assert limits["cpu_quota"] == int(hub.settings.cpu_limit * limits["cpu_period"]), limits
        # formgrader may be framed by the instructor's own origin; a student's server by nobody
        request = urllib.request.Request(f"http://127.0.0.1:{hub.settings.port}/user/{user}/api/status",
                                         headers={"Host": f"{user}.{hub.settings.domain}:{hub.settings.port}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                csp = reply.headers.get("Content-Security-Policy", "")
        except urllib.error.HTTPError as reply:  # 403 without a token: the headers are what matters here
            csp = reply.headers.get("Content-Security-Policy", "")
        expected = "frame-ancestors 'self'" if role == "instructor" else "frame-ancestors 'none'"
        assert expected in csp, f"{user}: Content-Security-Policy {csp!r}"


# ---- bad input ---------------------------------------------------------------------------------------

def submit(hub, student: str, answer: str | None, *, delete=False, rename=None) -> str:
    """Fetch (if needed), change the notebook as the student would, submit with nbgrader (the Assignment List's
    Submit runs the same exchange code); returns what nbgrader said."""
    user = hub.user(student)
    home = Path(f"/home/{user}")
    if not (home / LESSON).exists():
        hub.as_user(user, "nbgrader", "fetch_assignment", LESSON)
    notebook = home / LESSON / NB
    if answer is not None:
        write_as(hub, user, notebook, notebook_with(answer))
    if delete:
        hub.as_user(user, "rm", str(notebook))
    if rename:
        hub.as_user(user, "mv", str(notebook), str(home / LESSON / rename))
    done = hub.as_user(user, "nbgrader", "submit", LESSON)
    return done.stdout + done.stderr


def test_bad_input_as_nbgrader_users_expect(hub):
    teacher, s = hub.instructor, hub.settings
    inbound = s.exchange / "training-at-scale" / "inbound"
    course = s.nbgrader_course

    # carol submits twice: both stay in the exchange, the latest is collected
    submit(hub, "carol", wrong_answer())
    time.sleep(1.1)  # nbgrader's timestamps have a resolution of microseconds, names of seconds: keep them apart
    submit(hub, "carol", reference_solution(EXERCISE))
    carol = sorted(p.name for p in inbound.iterdir() if p.name.startswith(hub.user("carol") + "+"))
    assert len(carol) == 2, f"carol's two submissions should both be in the exchange: {carol}"

    # dave deletes the released notebook, erin renames it; both still submit
    said = submit(hub, "dave", None, delete=True)
    assert "missing" in said.lower() or NB in said, said
    said = submit(hub, "erin", reference_solution(EXERCISE), rename="my lesson 1.ipynb")
    assert NB in said or "my lesson 1" in said, said

    # the deadline passes; bob hands in a late fix
    hub.as_user(teacher, "nbgrader", "db", "assignment", "add", LESSON, "--duedate=2020-01-01 00:00:00 UTC", cwd=course)
    submit(hub, "bob", reference_solution(EXERCISE))

    # bob plants a submission named as alice's straight into the exchange (inbound is writable by every student):
    # refused at collect, alice's work stays
    fake = inbound / f"{hub.user('alice')}+{LESSON}+2099-01-01 00:00:00.000000 UTC+{'ab' * 16}"
    hub.as_user(hub.user("bob"), "cp", "-r", str(Path(f"/home/{hub.user('bob')}") / LESSON), str(fake))
    write_as(hub, hub.user("bob"), fake / NB, notebook_with(wrong_answer() + "\n# handed in by bob as alice\n"))
    write_as(hub, hub.user("bob"), fake / "timestamp.txt", "2099-01-01 00:00:00.000000 UTC")
    assert fake.owner() == hub.user("bob")

    # the hub restarts mid-term: every submission is still there, students log in again
    before = sorted(p.name for p in inbound.iterdir())
    hub.hub_command("stop")
    hub.hub_command("start")
    assert sorted(p.name for p in inbound.iterdir()) == before, "a hub restart lost submissions"

    collected = hub.as_user(teacher, "nbgrader", "collect", LESSON, "--update", cwd=course)
    log = collected.stdout + collected.stderr
    submitted = course / "submitted"
    assert f"is named as {hub.user('alice')}'s submission but was written by {hub.user('bob')}" in log, log
    assert "handed in by bob" not in (submitted / hub.user("alice") / LESSON / NB).read_text()
    assert (submitted / hub.user("carol") / LESSON / NB).is_file()
    assert (submitted / hub.user("erin") / LESSON / "my lesson 1.ipynb").is_file()
    assert not (submitted / hub.user("dave") / LESSON / NB).exists()
    out = s.course / "grading" / f"{LESSON}-bad-input"
    hub.as_user(teacher, "python", "-m", "autograder", "grade", "submitted", "--out", str(out), "--gradebook",
                "--quiet", cwd=course, timeout=900)
    with open(out / "grades.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f) if r["notebook"] == NB}
    assert float(rows[hub.user("alice")]["score"]) == 11, "bob's submission in alice's name must not count"
    assert float(rows[hub.user("carol")]["score"]) == 11, "carol's latest (correct) submission should count"
    assert float(rows[hub.user("bob")]["score"]) == 11, "bob's late fix should be collected and graded"
    assert float(rows[hub.user("erin")]["score"]) == 11, rows[hub.user("erin")]
    assert "please keep the released file name" in rows[hub.user("erin")]["feedback"]
    assert float(rows[hub.user("dave")]["score"]) == 0
    assert f"No notebook {NB} was submitted" in rows[hub.user("dave")]["feedback"]

    # late: collect kept bob's submission time, after the due date the gradebook holds
    from nbgrader.utils import parse_utc

    stamp = parse_utc((submitted / hub.user("bob") / LESSON / "timestamp.txt").read_text().strip())
    probe = ("from nbgrader.api import Gradebook\nwith Gradebook('sqlite:///gradebook.db') as gb:\n"
             " print(gb.find_assignment('lesson1').duedate.isoformat())")
    due = parse_utc(hub.as_user(teacher, "python", "-c", probe, cwd=course).stdout.strip())
    assert stamp > due, f"bob's submission ({stamp}) should be after the due date ({due}); collect said:\n{log}"
    probe = ("from nbgrader.api import Gradebook\nimport sys\nwith Gradebook('sqlite:///gradebook.db') as gb:\n"
             " print(gb.find_submission('lesson1', sys.argv[1]).total_seconds_late)")
    late = hub.as_user(teacher, "python", "-c", probe, hub.user("bob"), cwd=course).stdout.strip()
    assert float(late) > 0, f"formgrader would not flag bob's submission late: total_seconds_late={late}"


def test_zz_teardown_leaves_the_machine_clean(hub):
    """Runs last in this module: tear the hub down now and check what is left (the fixture's teardown then finds
    nothing to do)."""
    stop_class_hub(hub)
    assert leftovers(hub) == []

"""The .md feedback reads as plain text and still renders literally (issue 27).

``md_text`` used to backslash-escape every punctuation mark (``loss\\, 1\\.5\\, is off by about 7\\%``), unreadable
when pasted into an LMS text box. Now it escapes only what Markdown could read as markup there; these tests render
its output with mistune, in the places the feedback puts it and next to anything, and compare what a reader sees
with the text itself.
"""
import re
from html.parser import HTMLParser

import mistune
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autograder.grader.escape import md_text, strip_controls
from autograder.grader.report import feedback_markdown
from autograder.grader.rows import Row

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MARKUP_HEAVY = st.text(alphabet=st.sampled_from(list("*_`[]()<>!#&;|~\\-+=.:^\"'/?%@ 0123456789abxy\u00a0")),
                       max_size=40)
TEXTS = MARKUP_HEAVY | st.text(max_size=60)


class _Visible(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text, self.tags = [], set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.text.append(" ")

    def handle_endtag(self, tag):
        self.text.append(" ")

    def handle_data(self, data):
        self.text.append(data)


def rendered(markdown: str) -> tuple[str, set[str]]:
    """(what a reader sees, white space collapsed; the HTML tags used)."""
    parser = _Visible()
    parser.feed(mistune.html(markdown))
    return " ".join("".join(parser.text).split()), parser.tags


def plain(text: str) -> str:
    return " ".join(strip_controls(text, keep_newlines=False).split())


@FAST
@given(TEXTS)
def test_a_paragraph_shows_the_text_itself(text):
    assert rendered(md_text(text)) == (plain(text), {"p"} if plain(text) else set())


@FAST
@given(TEXTS, TEXTS)
def test_in_a_heading_and_next_to_each_other_nothing_combines(a, b):
    seen, tags = rendered(f"# Feedback for {md_text(a)} ({md_text(b)})")
    assert (seen, tags) == (plain(f"Feedback for {plain(a)} ({plain(b)})"), {"h1"})
    seen, tags = rendered(f"x {md_text(a)}{md_text(b)}({md_text(b)}){md_text(a)} y")
    assert (seen, tags) == (plain(f"x {plain(a)}{plain(b)}({plain(b)}){plain(a)} y"), {"p"})


@FAST
@given(TEXTS, TEXTS)
def test_a_check_line_of_the_feedback_stays_one_list_item(title, feedback):
    seen, tags = rendered(f"- ❌ {md_text(title)} (0/1)  \n  {md_text(feedback)}\n- ✅ next (1/1)")
    assert seen == plain(f"❌ {plain(title)} (0/1) {plain(feedback)} ✅ next (1/1)")
    assert tags <= {"ul", "li", "br", "p"}, tags  # p: a loose list, when the second line is empty


def test_ordinary_feedback_is_not_escaped():
    text = ("For num_params=24,000,000, world_size=16: your loss, 1.5, is off by about 7% (expected 1.4); "
            "divide by accumulation_steps - the mean over 4 * 8 = 32 samples. See step 2.")
    assert md_text(text) == text


def test_the_feedback_file_reads_as_plain_text():
    row = Row("ada", "01_gradient_accumulation.ipynb", "train_with_accumulation", 3.0, 11.0, "",
              checks=[{"title": "Loss matches", "points": 1, "score": 0,
                       "feedback": "The loss, 1.5, is off by about 7%: divide it by accumulation_steps."}])
    markdown = feedback_markdown("ada", [row])
    assert "The loss, 1.5, is off by about 7%: divide it by accumulation_steps." in markdown
    assert "train_with_accumulation (01_gradient_accumulation.ipynb)" in markdown
    assert not re.search(r"\\[,.%:()]", markdown), markdown

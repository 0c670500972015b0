"""coursekit.predict.compare: the predict-then-run comparison every lesson section uses (ungraded)."""
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coursekit.predict import compare


def test_blank_prediction_prints_the_measurement(capsys):
    assert compare(None, 4.0, unit="MiB", why="Activations grow with b.") is None
    out = capsys.readouterr()
    assert "No prediction written" in out.out and "4 MiB" in out.out and "Why: Activations grow with b." in out.out
    assert out.err == ""


def test_numbers_within_tolerance_are_close(capsys):
    assert compare(4, 4.5, tolerance=0.25) is True
    assert compare("about 4 MiB", 4.5) is True
    assert compare("1,024", 1000.0, tolerance=0.05) is True
    assert compare(8, 4.0) is False
    assert "2× the measurement" in capsys.readouterr().out


def test_zero_measurement_uses_an_absolute_tolerance():
    assert compare(0.1, 0, tolerance=0.25) is True
    assert compare(3, 0) is False


def test_answers_compare_as_words():
    assert compare(True, True) is True
    assert compare("yes", True) is True
    assert compare("same", True) is True
    assert compare("no", True) is False
    assert compare("tf32", "TF32") is True


def test_an_unreadable_number_is_not_an_error(capsys):
    assert compare("four", 4.0) is None
    assert "Could not read 'four'" in capsys.readouterr().out


@given(prediction=st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20),
                            st.lists(st.integers(), max_size=3)),
       measured=st.one_of(st.booleans(), st.integers(-10**6, 10**6), st.floats(-1e6, 1e6), st.sampled_from(["ieee", "tf32"])))
def test_never_raises_and_never_writes_to_stderr(prediction, measured):
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        result = compare(prediction, measured, unit="ms", why="because")
    assert result in (True, False, None)
    assert err.getvalue() == "" and out.getvalue().rstrip().endswith("because")


# ---- every section of every lesson asks for a prediction before it measures ----
LESSONS = sorted((Path(__file__).resolve().parents[2] / "solutions").glob("lesson*/*.ipynb"))
# Sections that measure nothing of their own: the graded exercises (their check is the feedback), GPU results
# recorded elsewhere, the reading list and the summary.
NO_PREDICTION = re.compile(r"Exercise|Summary|Recorded on a GPU|Where to go next")
PREDICTION_INPUT = re.compile(r"^(my_\w+) = None\b", re.M)


def sections(cells: list[dict]) -> list[tuple[str, list[dict]]]:
    """A notebook's level-2 sections (## title), each with its cells, subsections included."""
    found: list[tuple[str, list[dict]]] = []
    for cell in cells:
        heading = re.search(r"^## (.+)$", "".join(cell["source"]), re.M) if cell["cell_type"] == "markdown" else None
        if heading:
            found.append((heading.group(1).strip(), []))
        if found:
            found[-1][1].append(cell)
    return found


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_section_asks_for_a_prediction_and_compares_it(path):
    cells = json.loads(path.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    missing = []
    for title, section in sections(cells):
        inputs = [name for source in ("".join(c["source"]) for c in section if c["cell_type"] == "code")
                  for name in PREDICTION_INPUT.findall(source)]
        if not NO_PREDICTION.search(title) and not inputs:
            missing.append(title)
        for name in inputs:  # the answer is compared with a measurement in a later cell
            assert any(f"compare({name}," in cell for cell in code), f"{path.stem}: {name} is never compared"
    assert not missing, f"{path.stem}: sections with no prediction input: {missing}"

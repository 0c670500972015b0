"""Accessibility basics of the course's plots.

* Every notebook cell in solutions/ that draws a figure gives each plot a title, axis labels (at least one with
  a unit in parentheses) and a one-line caption saying what to notice — by calling coursekit's ``finish(...)``
  or by setting them itself — and the notebook applies ``use_course_style()`` before its first plot.
* No rainbow colour maps (their brightness is not monotonic, so they are unreadable in greyscale).
* coursekit.plots' style tells series apart by marker and line style, not by colour alone.

The notebook checks read the cells' source with ``ast`` (no execution), so they take a second and apply to
lessons as soon as they land. A failure names the notebook, the cell and what is missing.
"""
import ast
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from coursekit.plots import finish, use_course_style  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p for p in (REPO / "solutions").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)

PYPLOT_NAMES = {"plt", "pyplot"}
# pyplot functions that create a figure, or draw on the current one (creating it if needed)
FIGURE_MAKERS = {"subplots", "figure", "subplot", "subplot_mosaic"}
PYPLOT_DRAWING = {"plot", "bar", "barh", "scatter", "hist", "imshow", "matshow", "errorbar", "step", "stem",
                  "fill_between", "stackplot", "pie", "loglog", "semilogx", "semilogy", "boxplot", "violinplot"}
FINISH_KEYWORDS = ("title", "xlabel", "ylabel", "caption")
RAINBOW_MAPS = {"jet", "rainbow", "hsv", "gist_rainbow", "nipy_spectral", "gist_ncar", "turbo", "prism", "flag"}
# An axis that measures one of these needs its unit; counts and ratios ("optimizer step") do not.
NEEDS_UNIT = re.compile(r"\b(time|latency|duration|memory|bandwidth)\b", re.IGNORECASE)
UNIT = re.compile(r"\(.+\)|\[.+\]|\b(s|ms|µs|us|ns|seconds?|minutes?|bytes?|[KMGT]i?B(/s)?|per second)\b|/s\b|%")
WCAG_NON_TEXT_CONTRAST = 3.0  # WCAG 2.1 success criterion 1.4.11: graphical objects against their background


# ---- reading notebook cells ------------------------------------------------------------------------

def code_cells(path: Path) -> list[tuple[int, str]]:
    """(1-based cell number, source) of each code cell; IPython magics and shell lines blanked out."""
    cells = json.loads(path.read_text())["cells"]
    out = []
    for number, cell in enumerate(cells, start=1):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
        out.append((number, "\n".join(lines)))
    return out


def where(path: Path, number: int, source: str) -> str:
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    return f"{path.relative_to(REPO)}, cell {number} ({first[:60]!r})"


def call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def is_pyplot_call(node: ast.AST, names: set[str]) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
            and isinstance(node.func.value, ast.Name) and node.func.value.id in PYPLOT_NAMES)


def in_loop(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.For, ast.While, ast.comprehension, ast.ListComp, ast.GeneratorExp)):
            return True
    return False


def literal_text(node: ast.AST | None) -> str | None:
    """The text of a string literal or the constant parts of an f-string; None when not a literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return None


def panel_count(node: ast.Call) -> int:
    """Axes created by plt.subplots(nrows, ncols) when both are literals; 1 otherwise."""
    if call_name(node) != "subplots":
        return 1
    values = {kw.arg: kw.value for kw in node.keywords}
    values.update(zip(("nrows", "ncols"), node.args))
    count = 1
    for key in ("nrows", "ncols"):
        if isinstance(values.get(key), ast.Constant) and isinstance(values[key].value, int):
            count *= values[key].value
    return count


# ---- the rules, per cell -----------------------------------------------------------------------------

def finish_problems(call: ast.Call) -> list[str]:
    problems = []
    given = {kw.arg: kw.value for kw in call.keywords}
    for key in FINISH_KEYWORDS:
        if key not in given:
            problems.append(f"finish(...) has no {key}=")
        elif key != "caption" and literal_text(given[key]) is not None and not literal_text(given[key]).strip():
            problems.append(f"finish(...) has an empty {key}=")  # an empty caption is fine on one panel of several
    caption = literal_text(given.get("caption"))
    if caption and caption.strip() and not caption.lstrip().startswith("Notice"):
        problems.append(f"the caption should start with 'Notice:' (it says what to look at): {caption[:60]!r}")
    if caption and "\n" in caption.strip():
        problems.append("the caption should be one line")
    for key in ("xlabel", "ylabel"):
        label = literal_text(given.get(key))
        if label and NEEDS_UNIT.search(label) and not UNIT.search(label):
            problems.append(f"the {key} {label!r} measures time, memory or bandwidth but names no unit, "
                            "e.g. 'step time (ms)'")
    return problems


def has_caption(calls: list[ast.Call], texts: list[str], finishers: set[str]) -> bool:
    """A non-empty caption from finish(...), a helper that finishes, or a 'Notice: ...' text of its own."""
    for call in calls:
        if call_name(call) in finishers - {"finish"}:
            return True
        if call_name(call) == "finish":
            caption = next((kw.value for kw in call.keywords if kw.arg == "caption"), None)
            if caption is not None and (literal_text(caption) is None or literal_text(caption).strip()):
                return True
    return any(t.lstrip().startswith("Notice") for t in texts)


def finishing_functions(sources: list[str]) -> set[str]:
    """Names of functions defined in these sources that call finish(...): a call to one counts as finish."""
    names = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(n, ast.Call) and call_name(n) == "finish" for n in ast.walk(node)):
                names.add(node.name)
    return names


# Plot helpers in coursekit (e.g. a lesson's plotting module) that finish their plots themselves.
COURSEKIT_FINISHERS = finishing_functions([p.read_text() for p in (REPO / "coursekit").glob("*.py")]) - {"finish"}


def cell_problems(source: str, helpers: set[str] = frozenset()) -> list[str]:
    """What the plotting in one cell lacks (empty list: nothing). ``helpers``: functions that call finish."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # not plain Python (the notebook tests run every cell; nothing to check here)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    problems = [f"colour map {literal_text(kw.value)!r} is unreadable in greyscale: use 'viridis', 'cividis' or 'Greys'"
                for call in calls for kw in call.keywords
                if kw.arg == "cmap" and (literal_text(kw.value) or "").lower().removesuffix("_r") in RAINBOW_MAPS]
    for call in calls:
        if call_name(call) == "finish":
            problems += finish_problems(call)
    makers = [c for c in calls if is_pyplot_call(c, FIGURE_MAKERS)]
    drawing = [c for c in calls if is_pyplot_call(c, PYPLOT_DRAWING)]
    if not makers and not drawing:
        return problems
    finishers = {"finish", *helpers, *COURSEKIT_FINISHERS}
    finishes = [c for c in calls if call_name(c) in finishers]
    texts = [literal_text(n) or "" for n in ast.walk(tree) if isinstance(n, (ast.Constant, ast.JoinedStr))]
    if not has_caption(calls, texts, finishers):
        problems.append("the plot has no one-line caption starting with 'Notice:' (finish(..., caption=...) adds it)")
    if finishes:
        titled = sum(float("inf") if in_loop(c, parents) else 1
                     for c in calls if call_name(c) in finishers | {"set_title"})
        panels = sum(panel_count(c) for c in makers) or 1
        if titled < panels:
            problems.append(f"the cell draws {panels} plot(s) but titles and labels only {titled:g}: "
                            "call finish(ax, ...) for each axes")
        return problems
    # Without finish(): the cell must do finish's job itself.
    names = {call_name(c) for c in calls}
    for need, options in (("title", {"set_title", "title", "suptitle"}), ("x-axis label", {"set_xlabel", "xlabel"}),
                          ("y-axis label", {"set_ylabel", "ylabel"})):
        if not names & options:
            problems.append(f"the plot has no {need}: call coursekit.plots.finish(ax, title=..., xlabel=..., "
                            "ylabel=..., caption='Notice: ...')")
    return problems


# ---- tests: notebooks --------------------------------------------------------------------------------

@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO / "solutions")))
def test_every_plot_has_title_axis_labels_and_caption(notebook):
    cells = code_cells(notebook)
    helpers = finishing_functions([source for _, source in cells])
    problems = [f"{where(notebook, number, source)}: {problem}"
                for number, source in cells for problem in cell_problems(source, helpers)]
    assert not problems, "plots that a reader cannot fully read:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO / "solutions")))
def test_course_style_is_applied_before_the_first_plot(notebook):
    for number, source in code_cells(notebook):
        if "use_course_style()" in source:
            return
        try:
            calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
        except SyntaxError:
            continue
        if any(is_pyplot_call(c, FIGURE_MAKERS | PYPLOT_DRAWING) for c in calls):
            pytest.fail(f"{where(notebook, number, source)} plots before use_course_style() was called: "
                        "its series would differ by colour only")


# ---- the rules must catch what they are for (so a silent regex bug cannot pass every notebook) ---------

GOOD = """fig, ax = plt.subplots()
ax.plot(x, y, label="measured")
finish(ax, title="Step time", xlabel="micro-batch (samples)", ylabel="time (ms)", caption="Notice: linear.")
"""
GOOD_WITHOUT_FINISH = """plt.plot(x, y)
plt.title("Loss"); plt.xlabel("step"); plt.ylabel("loss (nats)")
plt.figtext(0, 0, "Notice: it falls.")
"""
GOOD_ONE_CAPTION_FOR_TWO_PANELS = """fig, (a, b) = plt.subplots(1, 2)
finish(a, title="fp16", xlabel="step", ylabel="loss scale", caption="")
finish(b, title="bf16", xlabel="step", ylabel="loss scale", caption="Notice: bf16 needs no scaling.")
"""
GOOD_PANELS_IN_LOOP = """fig, axes = plt.subplots(1, 3)
for ax, name in zip(axes, names):
    finish(ax, title=name, xlabel="rank", ylabel="memory (MiB)", caption=f"Notice: {name} shrinks.")
"""
BAD = {
    "no finish, no labels": ("fig, ax = plt.subplots()\nax.plot(x, y)\nplt.show()\n", "no title"),
    "no caption": ('fig, ax = plt.subplots()\nfinish(ax, title="t", xlabel="x (s)", ylabel="y")\n', "no caption="),
    "caption says nothing to notice": (
        'fig, ax = plt.subplots()\nfinish(ax, title="t", xlabel="x (s)", ylabel="y", caption="A plot.")\n', "Notice:"),
    "empty caption everywhere": (
        'fig, ax = plt.subplots()\nfinish(ax, title="t", xlabel="x", ylabel="y", caption="")\n', "no one-line caption"),
    "time without a unit": (
        'fig, ax = plt.subplots()\nfinish(ax, title="t", xlabel="b", ylabel="step time", caption="Notice: up.")\n',
        "names no unit"),
    "two panels, one labelled": (
        'fig, (a, b) = plt.subplots(1, 2)\nfinish(a, title="t", xlabel="x (s)", ylabel="y", caption="Notice: up.")\n',
        "draws 2 plot(s)"),
    "rainbow colour map": (GOOD + 'ax.imshow(m, cmap="jet")\n', "greyscale"),
}


@pytest.mark.parametrize("source", [GOOD, GOOD_WITHOUT_FINISH, GOOD_ONE_CAPTION_FOR_TWO_PANELS,
                                    GOOD_PANELS_IN_LOOP, "print('no plot here')\n"])
def test_rules_accept_labelled_plots(source):
    assert cell_problems(source) == []


def test_a_helper_that_finishes_counts_as_finish():
    helper = 'def draw(ax, d):\n    ax.plot(d)\n    finish(ax, title="t", xlabel="x (s)", ylabel="y", caption="Notice: up.")\n'
    caller = "fig, ax = plt.subplots()\ndraw(ax, data)\n"
    assert cell_problems(helper) == []
    assert cell_problems(caller, finishing_functions([helper, caller])) == []
    assert cell_problems(caller) != [], "without the helper's definition the caller draws an unlabelled plot"


@pytest.mark.parametrize("case", sorted(BAD))
def test_rules_reject_unreadable_plots(case):
    source, phrase = BAD[case]
    problems = cell_problems(source)
    assert any(phrase in p for p in problems), f"{case}: expected a problem mentioning {phrase!r}, got {problems}"


# ---- tests: coursekit.plots --------------------------------------------------------------------------

@pytest.fixture
def course_style():
    with matplotlib.rc_context():
        use_course_style()
        yield
    plt.close("all")


def test_series_differ_by_marker_and_line_style(course_style):
    """Plot as many series as the style defines; each must have its own marker AND its own dash pattern."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()
    assert {"color", "marker", "linestyle"} <= set(cycle), f"the style cycles only {sorted(cycle)}"
    fig, ax = plt.subplots()
    lines = [ax.plot([0, 1], [i, i + 1])[0] for i in range(len(cycle["color"]))]
    markers = [line.get_marker() for line in lines]  # what was drawn
    dashes = [str(style) for style in cycle["linestyle"]]  # Line2D reports every custom dash as '--'
    assert len(set(markers)) == len(markers), f"two series share a marker: {markers}"
    assert len(set(dashes)) == len(dashes), f"two series share a dash pattern: {dashes}"
    assert not {"None", "", " "} & set(markers + dashes), f"a series has no marker or no line: {markers}, {dashes}"
    assert plt.rcParams["lines.markersize"] >= 4, "markers too small to tell apart in print"


def test_finish_sets_title_labels_and_caption(course_style):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="a")
    finish(ax, title="T", xlabel="x (s)", ylabel="y (MiB)", caption="Notice: it rises.")
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("T", "x (s)", "y (MiB)")
    assert "Notice: it rises." in [t.get_text() for t in fig.texts], "the caption is not on the figure"
    assert ax.get_legend() is not None, "a labelled series should get a legend"


def relative_luminance(colour: str) -> float:
    def channel(c):
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = matplotlib.colors.to_rgb(colour)
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def test_line_colours_stand_out_from_a_white_page(course_style):
    """Greyscale print keeps only lightness: every series colour must be clearly darker than the page."""
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    contrast = {c: (1.05) / (relative_luminance(c) + 0.05) for c in colours}
    faint = {c: round(r, 2) for c, r in contrast.items() if r < WCAG_NON_TEXT_CONTRAST}
    assert not faint, f"colours below {WCAG_NON_TEXT_CONTRAST}:1 contrast on white: {faint}"

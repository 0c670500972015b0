"""One plot style for the course: readable in greyscale, every chart titled, labelled, captioned.

Series differ by marker and line style as well as colour, so a printout or a
colour-blind reader can still tell them apart.
"""
import matplotlib.pyplot as plt
from cycler import cycler

# Okabe–Ito colours (colour-blind safe; the orange darkened to 4.6:1 contrast on white) with distinct markers and dashes.
_COLOURS = ["#000000", "#A36800", "#0072B2", "#009E73", "#D55E00", "#CC79A7"]
_MARKERS = ["o", "s", "^", "D", "v", "x"]
_DASHES = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1))]


def use_course_style() -> None:
    plt.rcParams.update({
        "axes.prop_cycle": cycler(color=_COLOURS) + cycler(marker=_MARKERS) + cycler(linestyle=_DASHES),
        "figure.figsize": (6.4, 3.8),
        "figure.dpi": 100,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "lines.markersize": 5,
        "font.size": 10,
    })


def finish(ax, *, title: str, xlabel: str, ylabel: str, caption: str) -> None:
    """Title, axis labels (with units) and a one-line caption saying what to notice."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(frameon=False)
    fig = ax.figure
    if caption:  # one caption per figure: multi-panel figures pass it on one panel only
        fig.text(0.01, 0.005, caption, ha="left", va="bottom", fontsize=8.5, style="italic", wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))

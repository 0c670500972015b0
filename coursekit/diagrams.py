"""Lesson 8's map, drawn (nothing measured): the mesh's axes, the ring's hops, Ulysses' axis swap and an MoE layer's
dispatch and combine, one panel each, in the course's colours (rank r: one colour everywhere)."""
import math

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from .plots import _COLOURS, finish

RANK_COLOURS = _COLOURS[1:5]  # ranks 0-3


def _arrow(ax, start, end, **style):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="black", lw=1.2, **style))


def _box(ax, x, y, w, h, rank, text="", **style):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=RANK_COLOURS[rank], alpha=0.55, edgecolor="black", **style))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)


def _mesh(ax):
    for r in range(4):
        row, col = divmod(r, 2)
        _box(ax, col * 2, 2 - row * 2, 1.2, 0.9, r, f"rank {r}\n(dp {row}, tp {col})")
    for row in range(2):  # tp groups: a row; dp groups: a column
        ax.plot([1.2, 2], [2.45 - row * 2] * 2, color="black", lw=2.5, linestyle="-", marker="")
        ax.plot([0.6 + row * 2] * 2, [2, 0.9], color="black", lw=1, linestyle="--", marker="")
    return "2 × 2 mesh", "tp axis (solid): TP + SP", "dp axis (dashed): FSDP", (-0.3, 3.5, -0.3, 3.2)


def _ring(ax):
    centres = [(math.cos(math.pi / 2 - r * math.pi / 2), math.sin(math.pi / 2 - r * math.pi / 2)) for r in range(4)]
    for r, (x, y) in enumerate(centres):
        ax.add_patch(plt.Circle((x, y), 0.28, facecolor=RANK_COLOURS[r], alpha=0.55, edgecolor="black"))
        ax.text(x, y, f"r{r}", ha="center", va="center", fontsize=9)
        (x2, y2) = centres[(r + 1) % 4]
        _arrow(ax, (x + 0.3 * (x2 - x), y + 0.3 * (y2 - y)), (x + 0.7 * (x2 - x), y + 0.7 * (y2 - y)))
    ax.text(0, 0, "K, V\nr → r+1", ha="center", va="center", fontsize=8)
    return "Ring attention: N − 1 hops", "step t: rank r holds chunk (r − t) mod N", "", (-1.5, 1.5, -1.4, 1.4)


def _grid(ax, x0, by_row):
    for i in range(4):
        for j in range(4):
            _box(ax, x0 + j * 0.5, 2 - i * 0.5, 0.5, 0.5, i if by_row else j)


def _ulysses(ax):
    _grid(ax, 0, by_row=True)
    _grid(ax, 3, by_row=False)
    _arrow(ax, (2.1, 1.25), (2.9, 1.25))
    ax.text(2.5, 1.5, "all-to-all", ha="center", fontsize=8)
    return ("Ulysses: sequence ↔ heads", "heads (colour: the rank holding them)", "sequence chunks",
            (-0.2, 5.2, 0.3, 2.7))


def _moe(ax):
    for r in range(2):
        _box(ax, 0, 1.6 - r * 1.4, 1, 0.9, r, f"rank {r}\ntokens")
        _box(ax, 2.2, 1.6 - r * 1.4, 1.2, 0.9, r, f"experts\n{2 * r}, {2 * r + 1}")
        _box(ax, 4.6, 1.6 - r * 1.4, 1, 0.9, r, f"rank {r}\n× gate")
    for a in range(2):
        for b in range(2):
            _arrow(ax, (1, 2.05 - a * 1.4), (2.2, 2.05 - b * 1.4))
            _arrow(ax, (3.4, 2.05 - a * 1.4), (4.6, 2.05 - b * 1.4), linestyle="--")
    return "MoE: dispatch and combine", "solid: dispatch, dashed: combine (all-to-all each)", "", (-0.2, 5.8, 0, 2.7)


def draw_lesson8_map():
    """The figure: four panels, no data."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.4))
    for i, (ax, draw) in enumerate(zip(axes.flat, (_mesh, _ring, _ulysses, _moe))):
        title, xlabel, ylabel, (x0, x1, y0, y1) = draw(ax)
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
        finish(ax, title=title, xlabel=xlabel, ylabel=ylabel, caption="" if i < 3 else
               "Notice: each panel is one way of splitting the work; one colour is one rank throughout.")
    return fig

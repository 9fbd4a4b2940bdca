"""Every course picture reads: no text on text, no legend on the data, nothing cut off, every colour keyed.

Each test renders one figure function or one panel's picture of :mod:`zerokit.course` and
:mod:`zerokit.plot` on small inputs — four short real runs shared by the module (ddp in fp32
and bf16-mixed, zero2 without and with optimizer offload, 2 ranks, 2 steps), stand-in
reports where a real one would need many ranks (the 8-rank grid), and the pure functions
(the ring's rounds, pipeline schedules, the planner, the α-β model) on their own — and
reads the drawn artists' window extents (``artist.get_window_extent`` on the figure's Agg
renderer). :func:`problems` lists what a reader would trip over:

- **text on text**: two texts (titles, axis labels, tick labels, annotations, legend
  entries, the figure's title) whose boxes come closer than 2 × :data:`TEXT_GAP_PX` pixels
  (rotated texts as rotated rectangles): touching labels read as one;
- **legend on data**: a legend's box over bars, filled patches, line segments or markers
  of any axes, beyond :data:`LEGEND_OVERLAP_PX`;
- **clipped**: a text or legend past the figure's edge;
- **no key**: a colour used by bars, patches or lines that no legend entry (of any legend
  of the figure) carries, in :data:`KEYED` kinds of artists;
- **small text**: a text smaller than :data:`MIN_FONT_PT` points;
- **bars lost at the axis' scale**: an axes whose bars all span less than
  :data:`MIN_BAR_SHARE` of its width and of its height (0.1 s bars on a 0–10 s axis);
- **repeated labels**: two tick labels of one axis that read the same (rows a reader cannot
  tell apart);
- **legend between panels**: a legend that sits in the gap between two axes of one row,
  where a reader cannot tell whose it is (one under or over an axes, no wider than it, is that axes');
- **text on a line**: an annotation whose box a line of its axes crosses;
- **one number on a log axis**: a log-scaled axis with fewer than two labelled ticks (a reader cannot tell
  its scale);
- **annotations run together**: two annotations of one axes on one line whose boxes stand less than
  :data:`ANNOTATION_GAP_PX` apart (a pipeline's ``0.0`` ``1.0`` read as ``0.01.0``).

The checks are tested too: a figure built to have each fault is caught, and a sane one passes.
"""
from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest

matplotlib = pytest.importorskip("matplotlib")
pytest.importorskip("ipywidgets")

import zerokit  # noqa: E402
from zerokit import course, plot  # noqa: E402

#: two texts collide when their boxes, each grown by this many pixels per side, intersect: a reader needs a gap
TEXT_GAP_PX = 1.0
#: a legend's box, shrunk by this many pixels per side, must not touch a data artist
LEGEND_OVERLAP_PX = 2.0
#: how far past the figure's edge (pixels) a text may reach: anti-aliasing
EDGE_PX = 1.0
#: the smallest text a figure may use (points): a tick label at 100 dpi is still read from a notebook's column
MIN_FONT_PT = 8.0
#: the longest bar of an axes spans at least this share of the axes (along its length): else the scale hides it
MIN_BAR_SHARE = 0.2
#: two annotations side by side on one line stand at least this many pixels apart: closer, a reader joins them
ANNOTATION_GAP_PX = 5.0


# --- reading a drawn figure ------------------------------------------------------------------------

def _renderer(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _visible_text(t) -> bool:
    return t.get_visible() and bool(t.get_text().strip()) and (t.get_alpha() is None or t.get_alpha() > 0)


def _drawn_tick_labels(axis):
    labels = []
    for tick in axis._update_ticks():  # the ticks matplotlib draws: inside the view interval
        for label in (tick.label1, tick.label2):
            if _visible_text(label) and tick.get_visible():
                labels.append(label)
    return labels


def _texts(fig):
    """(name, Text) of every text a reader sees, legends' entries and titles included."""
    out = []
    if fig._suptitle is not None and _visible_text(fig._suptitle):
        out.append(("figure title", fig._suptitle))
    out += [("figure text", t) for t in fig.texts if _visible_text(t) and t is not fig._suptitle]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for title in (ax.title, ax._left_title, ax._right_title):
            if _visible_text(title):
                out.append(("title", title))
        for label in (ax.xaxis.label, ax.yaxis.label):
            if _visible_text(label):
                out.append(("axis label", label))
        out += [("tick label", t) for t in _drawn_tick_labels(ax.xaxis) + _drawn_tick_labels(ax.yaxis)]
        out += [("text", t) for t in ax.texts if _visible_text(t)]
    for legend in _legends(fig):
        out += [("legend entry", t) for t in legend.get_texts() if _visible_text(t)]
        if _visible_text(legend.get_title()):
            out.append(("legend title", legend.get_title()))
    return out


def _legends(fig):
    legends = list(fig.legends)
    for ax in fig.axes:
        legends += [c for c in ax.get_children() if isinstance(c, matplotlib.legend.Legend)]
    return [g for g in legends if g.get_visible()]


def _corners(text, renderer):
    """The text's box as 4 corners in pixels: rotated with the text (its window extent is the rotated box's hull)."""
    box = text.get_window_extent(renderer)
    angle = text.get_rotation() % 180
    if angle == 0:
        return [(box.x0, box.y0), (box.x1, box.y0), (box.x1, box.y1), (box.x0, box.y1)]
    text.set_rotation(0)
    flat = text.get_window_extent(renderer)
    text.set_rotation(angle)
    (cx, cy), w, h, a = ((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2), flat.width, flat.height, math.radians(angle)
    ux, uy, vx, vy = math.cos(a) * w / 2, math.sin(a) * w / 2, -math.sin(a) * h / 2, math.cos(a) * h / 2
    return [(cx - ux - vx, cy - uy - vy), (cx + ux - vx, cy + uy - vy), (cx + ux + vx, cy + uy + vy),
            (cx - ux + vx, cy - uy + vy)]


def _shrink(corners, px):
    cx, cy = sum(x for x, _ in corners) / 4, sum(y for _, y in corners) / 4
    out = []
    for x, y in corners:
        dx, dy = x - cx, y - cy
        d = math.hypot(dx, dy) or 1.0
        out.append((x - dx / d * px * math.sqrt(2), y - dy / d * px * math.sqrt(2)))
    return out


def _convex_overlap(p, q) -> bool:
    """Whether two convex polygons intersect (separating axis theorem)."""
    for poly in (p, q):
        for i in range(len(poly)):
            (x0, y0), (x1, y1) = poly[i], poly[(i + 1) % len(poly)]
            nx, ny = y1 - y0, x0 - x1
            a = [nx * x + ny * y for x, y in p]
            b = [nx * x + ny * y for x, y in q]
            if max(a) <= min(b) or max(b) <= min(a):
                return False
    return True


def _data_boxes(ax, renderer):
    """(what, Bbox) of the axes' data in pixels: bars and patches, markers, and short pieces of every line."""
    from matplotlib.collections import PathCollection, PolyCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.transforms import Bbox

    boxes = []
    for patch in ax.patches:
        if isinstance(patch, Patch) and patch.get_visible():
            box = patch.get_window_extent(renderer)
            if box.width > 0.5 and box.height > 0.5:
                boxes.append(("bar or patch", box))
    for line in ax.lines:
        if not line.get_visible() or not isinstance(line, Line2D):
            continue
        xy = line.get_transform().transform(line.get_xydata())
        ms = line.get_markersize() * renderer.points_to_pixels(1.0) / 2 if line.get_marker() not in (None, "None",
                                                                                                      "", " ") else 0
        if ms:
            boxes += [("marker", Bbox([[x - ms, y - ms], [x + ms, y + ms]])) for x, y in xy if math.isfinite(x + y)]
        if line.get_linestyle() not in ("None", "", " ", "none"):
            for (x0, y0), (x1, y1) in zip(xy, xy[1:]):
                if not math.isfinite(x0 + y0 + x1 + y1):
                    continue
                n = max(1, int(math.hypot(x1 - x0, y1 - y0) // 3))
                for k in range(n + 1):
                    x, y = x0 + (x1 - x0) * k / n, y0 + (y1 - y0) * k / n
                    boxes.append(("line", Bbox([[x - 0.5, y - 0.5], [x + 0.5, y + 0.5]])))
    for c in ax.collections:
        if not c.get_visible():
            continue
        if isinstance(c, PolyCollection):
            for path in c.get_paths():
                box = path.transformed(c.get_transform()).get_extents()
                if box.width > 0.5 and box.height > 0.5:
                    boxes.append(("bar or patch", box))
        elif isinstance(c, PathCollection):
            r = math.sqrt(max(c.get_sizes(), default=36)) * renderer.points_to_pixels(1.0) / 2
            for x, y in c.get_offset_transform().transform(c.get_offsets()):
                boxes.append(("marker", Bbox([[x - r, y - r], [x + r, y + r]])))
    clip = ax.get_window_extent(renderer)  # what lies outside the axes is not drawn
    return [(w, b) for w, b in boxes if b.overlaps(clip) and Bbox.intersection(b, clip) is not None]


def _overlap_px(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return min(w, h)


def _rgb(color):
    from matplotlib.colors import to_rgba

    r, g, b, a = to_rgba(color)
    return None if a == 0 else (round(r, 2), round(g, 2), round(b, 2))


def _used_colors(ax):
    """{colour: what uses it} of the axes' bars, filled patches and lines: what a reader must be able to decode."""
    from matplotlib.patches import Rectangle

    used = {}
    for patch in ax.patches:
        if not patch.get_visible() or (isinstance(patch, Rectangle) and patch.get_width() * patch.get_height() == 0):
            continue
        if patch.get_fill():
            key = _rgb(patch.get_facecolor())
            if key is not None and key != (1.0, 1.0, 1.0):  # white: a hatched bar's ground, keyed by its edge
                used.setdefault(key, "bar or patch")
            elif key == (1.0, 1.0, 1.0):
                used.setdefault(_rgb(patch.get_edgecolor()), "hatched bar")
    for line in ax.lines:
        if line.get_visible() and len(line.get_xydata()):
            used.setdefault(_rgb(line.get_color()), "line")
    for c in ax.collections:
        if c.get_visible() and len(c.get_facecolors()):
            for rgba in c.get_facecolors():
                used.setdefault(_rgb(rgba), "collection")
    used.pop(None, None)
    return used


def _legend_colors(fig):
    keyed = set()
    for legend in _legends(fig):
        for h in getattr(legend, "legend_handles", None) or legend.legendHandles:
            for getter in ("get_facecolor", "get_edgecolor", "get_color", "get_markerfacecolor"):
                if hasattr(h, getter):
                    value = getattr(h, getter)()
                    many = not isinstance(value, str) and len(value) and not isinstance(value[0], (int, float))
                    for v in (value if many else [value]):
                        try:
                            keyed.add(_rgb(v))
                        except ValueError:
                            pass
    return keyed


def problems(fig) -> list:
    """What makes ``fig`` hard to read (see the module docstring); [] when nothing."""
    renderer = _renderer(fig)
    found = []
    width, height = fig.bbox.width, fig.bbox.height
    texts = [(name, t, _corners(t, renderer), t.get_window_extent(renderer)) for name, t in _texts(fig)]
    for name, t, _, box in texts:
        if box.x0 < -EDGE_PX or box.y0 < -EDGE_PX or box.x1 > width + EDGE_PX or box.y1 > height + EDGE_PX:
            found.append(f"clipped by the figure's edge: {name} {t.get_text()!r}")
    for i, (n1, t1, c1, _) in enumerate(texts):
        s1 = _shrink(c1, -TEXT_GAP_PX)
        for n2, t2, c2, _ in texts[i + 1:]:
            if _convex_overlap(s1, _shrink(c2, -TEXT_GAP_PX)):
                found.append(f"text on text: {n1} {t1.get_text()!r} and {n2} {t2.get_text()!r}")
    for legend in _legends(fig):
        box = legend.get_window_extent(renderer)
        if box.x0 < -EDGE_PX or box.y0 < -EDGE_PX or box.x1 > width + EDGE_PX or box.y1 > height + EDGE_PX:
            found.append(f"legend clipped by the figure's edge: {[t.get_text() for t in legend.get_texts()]}")
        inner = box.padded(-LEGEND_OVERLAP_PX)
        for ax in fig.axes:
            hits = {what for what, b in _data_boxes(ax, renderer) if _overlap_px(inner, b) > 0}
            if hits:
                found.append(f"legend {[t.get_text() for t in legend.get_texts()][:3]}… over the data "
                             f"({', '.join(sorted(hits))}) of the axes titled {ax.get_title()!r}")
        for name, t, c, _ in texts:
            if name.startswith("legend"):
                continue
            corners = [(box.x0, box.y0), (box.x1, box.y0), (box.x1, box.y1), (box.x0, box.y1)]
            if _convex_overlap(_shrink(corners, LEGEND_OVERLAP_PX), _shrink(c, -TEXT_GAP_PX)):
                found.append(f"legend over text: {name} {t.get_text()!r}")
    for name, t, _, _ in texts:
        if t.get_fontsize() < MIN_FONT_PT - 1e-6:
            found.append(f"small text: {name} {t.get_text()!r} at {t.get_fontsize():g} pt (< {MIN_FONT_PT:g})")
    found += _bars_lost(fig, renderer) + _repeated_labels(fig) + _legends_between_panels(fig, renderer)
    found += _texts_on_lines(fig, renderer) + _log_axes_without_scale(fig) + _annotations_run_together(fig, renderer)
    keyed = _legend_colors(fig)
    for ax in fig.axes:
        used = _used_colors(ax)
        if len(used) == 1 and ax.get_legend() is None:  # one series, one colour: its axis labels say what it is
            continue
        shades = any("shade" in t.get_text() for g in _legends(fig) for t in [*g.get_texts(), g.get_title()])
        for color, what in used.items():
            if color in keyed or (shades and _a_shade_of(color, keyed)):
                continue
            if not _labelled_in_place(ax, color, renderer):
                found.append(f"a colour without a key: {what} in {color} on the axes titled {ax.get_title()!r}")
    return sorted(set(found))


def _bars(ax):
    """The axes' bars: the rectangles of its bar containers (``ax.bar`` / ``ax.barh``)."""
    from matplotlib.container import BarContainer

    return [(c, p) for c in ax.containers if isinstance(c, BarContainer) for p in c.patches if p.get_visible()]


def _bars_lost(fig, renderer) -> list:
    """Axes whose every bar is a sliver of the axes along its length: the scale was set by something else."""
    found = []
    for ax in fig.axes:
        bars = _bars(ax)
        if not bars:
            continue
        box = ax.get_window_extent(renderer)
        longest = 0.0
        for container, patch in bars:
            b = patch.get_window_extent(renderer)
            horizontal = getattr(container, "orientation", "vertical") == "horizontal"
            longest = max(longest, b.width / box.width if horizontal else b.height / box.height)
        if longest < MIN_BAR_SHARE:
            found.append(f"bars lost at the axis' scale: the longest bar spans {longest:.0%} of the axes titled "
                         f"{ax.get_title()!r}")
    return found


def _repeated_labels(fig) -> list:
    """Tick labels of one axis that read the same, a group's name written under them counted in (``r0`` under
    ``ddp`` and ``r0`` under ``zero1`` are two bars a reader tells apart)."""
    renderer = _renderer(fig)
    found = []
    for ax in fig.axes:
        names = [(t.get_window_extent(renderer), t.get_text().strip()) for t in ax.texts if _visible_text(t)]
        for axis in (ax.xaxis, ax.yaxis):
            words = []
            for t in _drawn_tick_labels(axis):
                box = t.get_window_extent(renderer)
                centre = (box.x0 + box.x1) / 2
                under = sorted((abs((b.x0 + b.x1) / 2 - centre), name) for b, name in names if b.y1 <= box.y0 + 1)
                words.append(" / ".join([t.get_text().strip(), *[name for _, name in under[:1]]]))
            twice = sorted({w for w in words if words.count(w) > 1})
            if twice:
                found.append(f"repeated labels on one axis of the axes titled {ax.get_title()!r}: {twice}")
    return found


def _legends_between_panels(fig, renderer) -> list:
    """Legends in the gap between two axes of one row; one that spans no wider than an axes it sits under or
    over (a legend below the middle of three panels) is that axes'."""
    found = []
    boxes = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
    for legend in _legends(fig):
        g = legend.get_window_extent(renderer)
        if any(c.x0 - 1 <= g.x0 and g.x1 <= c.x1 + 1 and (g.y1 <= c.y0 + 1 or g.y0 >= c.y1 - 1) for c in boxes):
            continue
        for a in boxes:
            for b in boxes:
                same_row = min(a.y1, b.y1) - max(a.y0, b.y0) > 0
                if same_row and a.x1 <= g.x0 and g.x1 <= b.x0 + 1:
                    found.append(f"legend between panels: {[t.get_text() for t in legend.get_texts()][:3]}…")
    return sorted(set(found))


def _texts_on_lines(fig, renderer) -> list:
    """Annotations (ax.text) whose box a line of the same axes runs through."""
    from matplotlib.lines import Line2D

    found = []
    for ax in fig.axes:
        texts = [t for t in ax.texts if _visible_text(t)]
        if not texts:
            continue
        lines = [b for what, b in _data_boxes(ax, renderer) if what == "line"]
        for t in texts:
            box = t.get_window_extent(renderer).padded(-1.0)
            if any(_overlap_px(box, b) > 0 for b in lines):
                found.append(f"text on a line: {t.get_text()!r} on the axes titled {ax.get_title()!r}")
    return found


def _log_axes_without_scale(fig) -> list:
    """Log-scaled axes with fewer than two labelled ticks in view: one number does not give a log axis its scale."""
    found = []
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if axis.get_scale() == "log" and len(_drawn_tick_labels(axis)) < 2:
                found.append(f"one number on a log axis: the {name} axis of the axes titled {ax.get_title()!r} "
                             f"labels {[t.get_text() for t in _drawn_tick_labels(axis)]}")
    return found


def _annotations_run_together(fig, renderer) -> list:
    """Annotations (ax.text) of one axes on one line, side by side, closer than ANNOTATION_GAP_PX."""
    found = []
    for ax in fig.axes:
        boxes = sorted(((t.get_window_extent(renderer), t.get_text()) for t in ax.texts if _visible_text(t)),
                       key=lambda item: item[0].x0)
        for i, (a, text_a) in enumerate(boxes):
            for b, text_b in boxes[i + 1:]:
                if b.x0 - a.x1 >= ANNOTATION_GAP_PX:
                    break  # sorted by their left edges: every later one starts further right
                same_line = min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5 * min(a.height, b.height)
                if same_line and b.x0 >= a.x0 and a.x1 <= b.x1:
                    found.append(f"annotations run together: {text_a!r} and {text_b!r} on the axes titled "
                                 f"{ax.get_title()!r}")
    return sorted(set(found))[:5]


def _a_shade_of(color, keyed, tolerance: float = 0.02) -> bool:
    """``color`` is one of ``keyed`` blended towards black or white (a key that says "shade: pass" covers it)."""
    for k in keyed:
        if k is None:
            continue
        for target in (0.0, 1.0):
            spans = [(c - t_) for c, t_ in zip(k, (target,) * 3)]
            big = max(range(3), key=lambda i: abs(spans[i]))
            if abs(spans[big]) < 1e-6:
                continue
            t = (k[big] - color[big]) / spans[big]  # how far towards the target
            if 0 < t < 1 and all(abs(k[i] - t * spans[i] - color[i]) <= tolerance for i in range(3)):
                return True
    return False


def _labelled_in_place(ax, color, renderer) -> bool:
    """Every box of ``color`` carries the same label inside it ("3", or "3.0" and "3.1": micro-batch 3 on its
    chunks): the colour is keyed where it is drawn, as a pipeline schedule's micro-batches are."""
    import re

    boxes = [p.get_window_extent(renderer) for p in ax.patches
             if p.get_visible() and p.get_fill() and _rgb(p.get_facecolor()) == color]
    boxes = [b for b in boxes if b.width > 0.5 and b.height > 0.5]
    if not boxes:
        return False
    centres = []
    for t in ax.texts:
        if _visible_text(t):
            e = t.get_window_extent(renderer)
            centres.append(((e.x0 + e.x1) / 2, (e.y0 + e.y1) / 2, re.sub(r"\.\d+$", "", t.get_text().strip())))
    labels = set()
    for b in boxes:
        inside = {label for x, y, label in centres if b.x0 <= x <= b.x1 and b.y0 <= y <= b.y1}
        if len(inside) != 1:
            return False
        labels |= inside
    return len(labels) == 1


# --- the checks catch what they should -------------------------------------------------------------

def _sane():
    fig, ax = course.new_figure(6, 3)
    ax.bar([0, 1, 2], [3, 4, 5], color="C0", label="measured")
    ax.plot([0, 1, 2], [3, 4, 5], "k-", label="theory")
    ax.set_xticks([0, 1, 2], ["a", "b", "c"])
    ax.set_title("a title")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig, ax


def test_a_sane_figure_passes():
    fig, _ = _sane()
    assert problems(fig) == []


def _log_figure(low_ms: float, high_ms: float, ticks):
    """Lesson 01's α-β picture in small: milliseconds on a log axis from ``low_ms`` to ``high_ms``."""
    fig, ax = course.new_figure(6, 3)
    ax.plot([1e2, 1e7], [low_ms, high_ms], "o-", color="C0", label="N=2")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks(ax.yaxis)
    ax.set_title("fit")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def test_a_log_axis_over_about_a_decade_labels_more_than_one_tick():
    """Lesson 01's fit spanned 1.5–20 ms: a log axis labelling its decades only showed one number, "10"; the
    course's plain_log_ticks labels 2, 4, 6 … there, and still only the decades over many."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    def decades_only(axis):  # what plain_log_ticks did: the decades as plain numbers, every minor tick blank
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())

    assert any("one number on a log axis" in p for p in problems(_log_figure(1.5, 20, decades_only)))
    fig = _log_figure(1.5, 20, course.figures.plain_log_ticks)
    assert problems(fig) == []
    assert {"2", "10"} <= {t.get_text() for t in _drawn_tick_labels(fig.axes[0].yaxis)}
    wide = _log_figure(0.01, 1e4, course.figures.plain_log_ticks)  # six decades: the decades alone
    assert problems(wide) == []
    assert all(t.get_text() in {"0.01", "0.1", "1", "10", "100", "1000", "10000"}
               for t in _drawn_tick_labels(wide.axes[0].yaxis))


def test_the_checks_catch_each_fault():
    fig, ax = _sane()  # box labels side by side, 3 px apart: read as "0.01.02.0"
    ax.set_xlim(-0.5, 4.5)
    first = ax.text(3.0, 2.0, "0.0", ha="left", va="center")
    box = first.get_window_extent(_renderer(fig))
    step = ax.transData.inverted().transform([(box.x1 + 3, 0)])[0][0] - 3.0
    for k, word in enumerate(["1.0", "2.0"], start=1):
        ax.text(3.0 + k * step, 2.0, word, ha="left", va="center")
    assert any("annotations run together" in p for p in problems(fig))

    fig, ax = _sane()
    ax.set_xticks([0, 0.05, 2], ["a long label", "another long label", "c"])
    assert any("text on text" in p for p in problems(fig))

    fig, ax = course.new_figure(3.5, 2.5)  # world sizes 2 … 16 on a narrow axis: "10111213…"
    ax.plot(range(2, 17), range(2, 17), label="x")
    ax.set_xticks(range(2, 17))
    fig.tight_layout()
    assert any("text on text: tick label '1" in p for p in problems(fig))

    fig, ax = _sane()
    ax.legend(loc="center")
    assert any("over the data" in p for p in problems(fig))

    fig, ax = _sane()
    ax.set_title("a title far too long for a figure this narrow, which runs off both of its edges " * 2)
    assert any("clipped" in p for p in problems(fig))

    fig, ax = _sane()
    ax.bar([3], [2], color="#C44E52")
    assert any("without a key" in p for p in problems(fig))

    fig, ax = _sane()
    ax.set_title("a title", fontsize=6)
    assert any("small text" in p for p in problems(fig))

    fig, ax = course.new_figure(6, 3)  # bars of 0.1 s on a 0–10 s axis (a timeout line set the scale)
    ax.barh([0, 1], [0.1, 0.12], color="C0")
    ax.axvline(10, color="C3", label="timeout")
    ax.set_yticks([0, 1], ["a", "b"])
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    assert any("bars lost" in p for p in problems(fig))

    fig, ax = _sane()
    ax.set_xticks([0, 1, 2], ["kv 0", "kv 0", "kv 1"])
    assert any("repeated labels" in p for p in problems(fig))

    fig, (left, right) = course.new_figure(10, 3, ncols=2)
    for a in (left, right):
        a.bar([0, 1], [1, 2], color="C0", label="x")
        a.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    assert any("legend between panels" in p for p in problems(fig))

    fig, ax = _sane()
    ax.axhline(4.5, color="k", linestyle="--")
    ax.text(1, 4.5, "fits", ha="center", va="center")
    assert any("text on a line" in p for p in problems(fig))

    fig, ax = _sane()  # rotated labels: close but apart passes, on top of each other fails
    ax.set_xticks([0, 1, 2], ["label one", "label two", "label three"], rotation=30, ha="right")
    fig.tight_layout()
    assert problems(fig) == []
    ax.set_xticks([0, 0.04, 2], ["label one", "label two", "label three"], rotation=30, ha="right")
    assert any("text on text" in p for p in problems(fig))


def test_no_lesson_or_course_figure_asks_for_small_text():
    """The lessons' own figure code (notebooks/src) and the course's never ask for text under MIN_FONT_PT: the
    figures drawn only inside a lesson are not rendered here, so their sizes are read from the source."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = [*sorted((root / "notebooks" / "src").glob("*.py")), *sorted((root / "zerokit" / "course").glob("*.py")),
             root / "zerokit" / "plot.py"]
    small = [f"{f.relative_to(root)}:{n}: {line.strip()}" for f in files
             for n, line in enumerate(f.read_text().splitlines(), 1)
             for m in re.finditer(r"\b(?:fontsize|labelsize|title_fontsize)\s*=\s*(\d+(?:\.\d+)?)\b", line)
             if float(m.group(1)) < MIN_FONT_PT]
    assert not small, "text under the minimum size:\n" + "\n".join(small)


# --- the course's pictures ------------------------------------------------------------------------

SIZE = dict(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8)


@pytest.fixture(scope="module")
def work():
    return zerokit.tiny_gpt(**SIZE)


@pytest.fixture(scope="module")
def runs(work):
    """Four short real runs on 2 ranks: ddp in fp32 (with records) and bf16-mixed, zero2 without and with offload."""
    train = lambda *a, **k: zerokit.train(work, *a, world_size=2, steps=2, reference=False, **k)  # noqa: E731
    return {"fp32": train("ddp", keep_records=True), "bf16-mixed": train("ddp", precision="bf16-mixed"),
            "zero2": train("zero2", offload="none", precision="bf16-mixed"),
            "zero2 offload": train("zero2", offload="optimizer", precision="bf16-mixed")}


def _captured(monkeypatch, module):
    """Keep the figures a panel module turns into PNG bytes (``module.png``)."""
    figures = []
    real = module.png

    def keep(fig):
        figures.append(fig)
        return real(fig)

    monkeypatch.setattr(module, "png", keep)
    return figures


def _assert_readable(fig, what):
    found = problems(fig)
    assert found == [], f"{what}:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("n,op", [(2, "all_reduce"), (4, "all_reduce"), (8, "all_reduce"), (3, "reduce_scatter"),
                                  (4, "all_gather")])
def test_ring_schedule_figure(n, op):
    _assert_readable(course.ring_schedule_figure(n, op), f"ring_schedule_figure({n}, {op!r})")


@pytest.mark.parametrize("n,op", [(2, "all_reduce"), (3, "reduce_scatter"), (8, "all_reduce")])
def test_collective_panel(monkeypatch, n, op):
    from zerokit import theory
    from zerokit.course import ring_panel

    figures = _captured(monkeypatch, ring_panel)
    panel = course.CollectivePanel(world_sizes=(2, 3, 4, 8), world_size=n, run=False)
    panel.op.value = op
    payload = 64 * 1024
    panel.last_result = [{"rank": r, "rounds": theory.ring_steps(op, n), "payload_bytes": payload,
                          "sent_bytes": theory.ring_bytes_sent(op, payload, n), "ring_cost_bytes": 0, "seconds": 1e-3}
                         for r in range(n)]
    panel.draw()
    _assert_readable(figures[-1], f"CollectivePanel {op} on {n}")


def test_volume_figure():
    series = {"all-reduce": {"N": [2, 3, 4], "sent": [1.0, 1.33, 1.5], "theory": [1.0, 1.33, 1.5]},
              "all-gather": {"N": [2, 3, 4], "ring_cost": [0.5, 0.67, 0.75], "theory": [0.5, 0.67, 0.75]}}
    _assert_readable(course.volume_figure(series, ylabel="MiB sent per rank", reference=(2.0, "2S"),
                                          title="bytes per rank against N"), "volume_figure")
    wide = {name: {"N": [2, 3, 4], "ring_cost": [k * 1.0, k * 1.33, k * 1.5], "theory_N": list(range(2, 17)),
                   "theory": [k * 2 * (n - 1) / n for n in range(2, 17)]} for name, k in (("DDP", 1), ("ZeRO-3", 1.5))}
    _assert_readable(course.volume_figure(wide, ylabel="KiB per rank per step", title=(
        "ring cost of the measured payloads per rank per step: ZeRO-3 = 1.5 × DDP at every N")), "volume_figure, long")


def _points(fit):
    sizes = [100 * 4**k for k in range(9)]
    return [{"op": "all_reduce", "n": n, "payload_bytes": s, "sent_bytes": 0,
             "seconds": course.modelled_seconds(fit, "all_reduce", s, n)["total_s"] * (1.3 if k % 2 else 0.8)}
            for n in (2, 3, 4) for k, s in enumerate(sizes)]


def test_latency_bandwidth_figures():
    fit = {"alpha_s": 380e-6, "beta_Bps": 700 * 2**20}
    _assert_readable(course.latency_bandwidth_figure(_points(fit), fit), "latency_bandwidth_figure")
    _assert_readable(course.all_reduce_scaling_figure(fit, [64 * 2**10, 25 * 2**20, 2**30], [2, 4, 8, 64, 1024]),
                     "all_reduce_scaling_figure")


def test_memory_bars_and_peak_bars(runs):
    report = zerokit.Report([runs["fp32"].result, runs["bf16-mixed"].result])
    _assert_readable(plot.memory_bars(runs["fp32"]).figure, "plot.memory_bars")
    _assert_readable(course.peak_bars(report).figure, "course.peak_bars")
    fig, axes = course.new_figure(8, 3.2, ncols=2)  # lesson 02's two precisions side by side
    for ax, run in zip(axes, (runs["fp32"], runs["bf16-mixed"])):
        plot.memory_bars(run, ax=ax, legend=ax is axes[-1])  # one key, right of the second panel
    fig.tight_layout()
    _assert_readable(fig, "two plot.memory_bars side by side")


@pytest.mark.parametrize("view", ["model states", "peak"])
@pytest.mark.parametrize("bars", [4, 16])
def test_memory_panel(monkeypatch, work, runs, view, bars):
    from zerokit.course import memory_panel

    figures = _captured(monkeypatch, memory_panel)
    panel = course.MemoryPanel(work, strategies=("ddp",), run=False, view=view)
    # 16 bars: eight jobs on two ranks, as lessons 06 and 12 run; each bar's label its own
    names = ("ddp", "zero1", "zero2", "zero3", "zero2-naive", "fsdp", "zero3-hpz", "zero1-tp")
    results = [_renamed(r, names[i]) for i, r in enumerate([r.result for r in runs.values()] * 2)]
    panel.last_report = zerokit.Report(results[:bars // 2])
    panel.draw()
    _assert_readable(figures[-1], f"MemoryPanel ({view}, {bars} bars)")


def _renamed(result, strategy):
    """A copy of a run's result under another strategy's name (a stand-in for a run the test does not make)."""
    import copy

    out = copy.copy(result)
    out.strategy = strategy
    return out


def test_offload_panel_and_bars(monkeypatch, work, runs):
    from zerokit.course import offload_panel

    figures = _captured(monkeypatch, offload_panel)
    panel = course.OffloadPanel(work, run=False)
    panel.last_report = zerokit.Report([runs["zero2"].result, runs["zero2 offload"].result])
    panel.draw()
    _assert_readable(figures[-1], "OffloadPanel")


def _grid_report(dp=2, tp=2, pp=2):
    """A stand-in for an 8-rank grid run: what GridPanel.draw and grid_rows read, with plausible bytes."""
    ranks = []
    for r in range(dp * tp * pp):
        coords = {"pp": r // (dp * tp), "dp": r // tp % dp, "tp": r % tp}
        states = {"params": 14_000 + 100 * coords["pp"], "grads": 14_000, "optimizer": 15_000}
        traffic = {"dp": 14_000, "tp": 36_000 + 500 * coords["pp"], "pp": 4_000}
        ranks.append(SimpleNamespace(rank=r, coords=coords, model_state_bytes=states,
                                     theory_model_states={"total": sum(states.values())},
                                     comm_bytes_by_axis={a: {"ring_cost_bytes": v} for a, v in traffic.items()},
                                     theory_comm_bytes_by_axis=traffic))
    result = SimpleNamespace(ranks=ranks, parallel={"dp": dp, "tp": tp, "pp": pp}, param_count=14_304,
                             strategy="zero1")
    return SimpleNamespace(results=[result])


@pytest.mark.parametrize("degrees", [(2, 2, 2), (2, 1, 1), (1, 4, 2)])
def test_grid_panel(monkeypatch, work, degrees):
    from zerokit.course import grid_panel

    figures = _captured(monkeypatch, grid_panel)
    dp, tp, pp = degrees
    course.GridPanel(work, dp=dp, tp=tp, pp=pp, report=_grid_report(dp, tp, pp))
    _assert_readable(figures[-1], f"GridPanel dp {dp} × tp {tp} × pp {pp}")


@pytest.mark.parametrize("policy", ["every_k", "torch-selective"])
def test_checkpointing_panel(monkeypatch, policy):
    from zerokit.course import checkpointing_panel

    figures = _captured(monkeypatch, checkpointing_panel)
    fake = {"policy": policy, "n": 8, "k": 2, "counted_by": "ledger", "none_stored": 400_000,
            "none_peak": 420_000, "stored": 40_000, "peak": 140_000, "recomputed_forwards": 8, "A": 50_000,
            "X": 8_000, "korthikanti_A": 52_000, "theory_stored": 32_000, "theory_peak": 132_000,
            "segment_layers": 2, "none_s": 0.010, "policy_s": 0.013}
    if policy.startswith("torch"):  # torch's policies: counted by live tensors, no formula
        fake.update(counted_by="live tensors", theory_stored=None, theory_peak=None, segment_layers=None, k=None)
    monkeypatch.setattr(checkpointing_panel, "measure_policy", lambda *a, **k: dict(fake))
    course.CheckpointingPanel(blocks=(4, 8, 16), n=8, policy=policy, k=2)
    _assert_readable(figures[-1], f"CheckpointingPanel ({policy})")


@pytest.mark.parametrize("preset,gpus,memory,strategy", [("llama-13b", 8, 80, "zero1"), ("t5-3b", 8, 16, "zero3"),
                                                          ("gpt2-1.5b", 8, 16, "zero3")])
def test_plan_panel(monkeypatch, preset, gpus, memory, strategy):
    from zerokit.course import plan_panel

    figures = _captured(monkeypatch, plan_panel)
    course.PlanPanel(preset=preset, gpus=gpus, gpu_memory_gb=memory, strategy=strategy, micro_batch_size=1)
    _assert_readable(figures[-1], f"PlanPanel {preset}")


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 4, 4, 1), ("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2),
                                        ("zb-h1", 3, 8, 1), ("1f1b", 8, 32, 1)])
def test_pipeline_panel(monkeypatch, name, p, m, v):
    from zerokit.course import pipeline_panel

    figures = _captured(monkeypatch, pipeline_panel)
    course.PipelinePanel(p=p, m=m, name=name, chunks=max(v, 2))
    _assert_readable(figures[-1], f"PipelinePanel {name} p={p} m={m}")
    if (p, m) == (4, 8):  # the lesson's schedules: every compute box keeps its label, forward boxes included
        sched = zerokit.schedule(name, p, m, chunks=v)
        boxes = sum(len(sched.compute(r)) for r in range(p))
        labels = [t for t in figures[-1].axes[0].texts if t.get_text().strip()]
        assert len(labels) == boxes, f"{name}: {boxes - len(labels)} of {boxes} boxes without their label"
    if v > 1:  # the boxes read "m.c": the key says so
        keys = " ".join(g.get_title().get_text() for g in _legends(figures[-1]))
        assert "micro-batch" in keys and "chunk" in keys, keys


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "zb-h1"])
def test_lesson_08_schedule_pictures_keep_every_label_apart(name):
    """Lesson 08's four schedules at p = 4, m = 8: every box keeps its label, and no two labels run together
    (interleaved's "m.c" labels in one-t_f boxes were 3 px apart at 13 inches)."""
    from zerokit.course.pipeline_panel import schedule_figure

    result = zerokit.simulate(zerokit.schedule(name, 4, 8, chunks=2 if name == "interleaved" else 1))
    fig = schedule_figure(result, title=f"{name}, p = 4, m = 8")
    _assert_readable(fig, f"schedule_figure {name}")
    labels = [t for t in fig.axes[0].texts if t.get_text().strip()]
    assert len(labels) == sum(len(result.schedule.compute(r)) for r in range(4)), name


def test_pipeline_side_by_side_figure():
    """Lesson 08's simulated schedule next to a measured one: one key at the foot, no legend between the panels."""
    from zerokit.course.pipeline_panel import side_by_side_figure

    sched = zerokit.schedule("1f1b", 2, 4)
    spans = [[(str(a), 0.004 * i, 0.004 * i + (0.003 if a.kind == "F" else 0.006))
              for i, a in enumerate(sched.actions[r])] for r in range(2)]
    _assert_readable(side_by_side_figure(sched, spans), "side_by_side_figure")


def test_failure_diagnosis_figure():
    from zerokit.course.failure_panel import Diagnosis, diagnosis_figure

    d = Diagnosis("mismatched collective", "RankFailed", (1,), "CollectiveMismatch", "all_reduce", 3, "backward",
                  1.2, "CollectiveMismatch: rank 1 called all_gather where rank 0 called all_reduce",
                  "rank 0 is waiting for async all_reduce #3 of backward; rank 1 is dead; it was in all_gather #3 "
                  "of backward")
    _assert_readable(diagnosis_figure(d), "diagnosis_figure")


def test_timelines(monkeypatch, work, runs):
    from zerokit.course import timeline_panel

    ax, _ = plot.timeline(runs["fp32"], steps=range(1, 2))
    _assert_readable(ax.figure, "plot.timeline")
    _assert_readable(course.timeline_figure({"ddp": runs["fp32"]}, steps=range(1, 2)), "course.timeline_figure")
    # lesson 05: two runs whose steps differ several-fold, each on its own axis, each title giving its step's length
    own = course.timeline_figure({"ddp": runs["fp32"], "ddp again": runs["fp32"]}, steps=range(1, 2),
                                 shared_axis=False)
    _assert_readable(own, "course.timeline_figure(shared_axis=False)")
    first, second = own.axes[:2]
    assert not first.get_shared_x_axes().joined(first, second)
    assert all(re.search(r"slowest rank's step \d+\.\d ms — ", ax.get_title(loc="left")) for ax in (first, second))
    figures = _captured(monkeypatch, timeline_panel)
    panel = course.TimelinePanel(work, "ddp", run=False, steps=2)
    panel.last_report = runs["fp32"]
    panel.draw()
    _assert_readable(figures[-1], "TimelinePanel")


def test_context_parallel_pictures(monkeypatch):
    """Lesson 15's: the ring's transfers under its blocks, and the context panel (one process, then cp = 2)."""
    from zerokit.course import context_panel

    work = zerokit.tiny_gpt(**{**SIZE, "seq_len": 32})
    ring = zerokit.train(work, "ddp", world_size=2, steps=2, parallel={"cp": 2}, keep_records=True, reference=False)
    _assert_readable(course.ring_overlap_figure(ring.result, step=1), "ring_overlap_figure")
    figures = _captured(monkeypatch, context_panel)
    course.ContextPanel(work, cp=2, attention="ring", steps=1)
    _assert_readable(figures[-1], "ContextPanel")


def _loss_effect(steps=60):
    """A stand-in for zeropp_loss_effect's result: gradients' errors about five times the weights'."""
    import random

    rng = random.Random(0)
    tally = lambda bound: {"max_abs": 0.999 * bound, "mean_abs": bound / 2, "max_bound": bound,  # noqa: E731
                           "over_bound": 0, "elements": 1000}
    return {"steps": list(range(steps)),
            "losses": {"zero3": [4 - 0.02 * i for i in range(steps)],
                       "zeropp": [4 - 0.02 * i + 0.001 * rng.random() for i in range(steps)]},
            "weight_error": [tally(0.004 + 1e-5 * i) for i in range(steps)],
            "gradient_error": [tally(0.01 + 0.02 * rng.random()) for _ in range(steps)]}


def test_loss_effect_figure_gives_weights_and_gradients_each_their_scale():
    """Lesson 17's picture of what quantization cost: weights and gradients on axes of their own (on one, the
    weights' errors were a flat line under the gradients'), the bound drawn over the measured error, not a band
    that hides it."""
    from zerokit.course.quantization_panel import loss_effect_figure

    effect = _loss_effect()
    fig = loss_effect_figure(effect, "tiny GPT, 60 steps")
    _assert_readable(fig, "loss_effect_figure")
    _, weights, grads = fig.axes
    for ax, tallies in ((weights, effect["weight_error"]), (grads, effect["gradient_error"])):
        low, high = ax.get_ylim()
        assert max(t["max_abs"] for t in tallies) > 0.5 * high  # the series fills its own axis
        measured, _, bound = ax.lines
        assert bound.get_zorder() >= measured.get_zorder() and bound.get_linewidth() <= measured.get_linewidth()
        assert bound.get_linestyle() not in ("-", "solid")  # dashed: the measured line shows between the dashes


def test_panels_tables_are_there_for_a_reader_without_a_kernel():
    """The quantization and MoE panels hand their table to the cell that shows them (lessons 16 and 17)."""
    import torch

    panel = course.QuantizationPanel(torch.linspace(-1, 1, 1000), block_sizes=(16, 256), block_size=16)
    shown = panel.table()
    assert [row["block size · bits"] for row in shown.rows] == ["16 · int8", "256 · int8"]
    assert shown._repr_html_().startswith("<table>")


def test_moe_panel(monkeypatch):
    from zerokit.course import moe_panel

    figures = _captured(monkeypatch, moe_panel)
    panel = course.MoEPanel(dict(SIZE), n_experts=4, top_k=2, capacity=1.0, ep=2, dp=2)
    _assert_readable(figures[-1], "MoEPanel")
    assert [row["rank"] for row in panel.table().rows] == [0, 1]  # its table, for the saved notebook

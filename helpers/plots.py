"""Figures from Results only (a plot never runs anything): memory curves per phase, before/after bars, sweeps.

One colour per category and one phase order across the collection; every axis is in GiB (2**30 bytes).
Figures are built once and updated in place (`MemoryCurve.update`) so an explorer redraws quickly.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from helpers import evidence, strategies
from helpers.errors import InputError
from helpers.results import Result
from helpers.units import scale, to_gib
from helpers.vocab import CATEGORIES, PHASE_LABELS

COLORS = {                     # colour-blind-safe (Okabe-Ito, then greys) and the same in every notebook
    "parameters": "#0072B2", "master_weights": "#56B4E9", "gradients": "#009E73", "optimizer_states": "#E69F00",
    "activations": "#CC79A7", "logits": "#D55E00", "temporaries": "#999999", "comm_buffers": "#F0E442",
    "checkpoint": "#000000", "pinned_overhead": "#7F3C8D", "generation": "#11A579",
}
DEVICE_TITLES = {"gpu": "GPU (each)", "host": "host RAM (per node)"}
DOTTED = [":", "-.", (0, (5, 2, 1, 2)), (0, (1, 3))]                       # reported figures, one style each
LINES = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#000000"]   # sweeps: no red (red means OOM)
OOM_RED = "#D00000"
SHORT = {"setup": "setup", "resume": "resume", "forward": "forward", "backward": "backward", "step": "step", "generation": "generation",
         "steady": "later iters"}


WIDTH_IN = 8.8                 # at dpi 100, 880 px: inside a 1366-px laptop's notebook with JupyterLab's sidebar open


def fit_canvas(fig: Figure) -> Figure:
    """A live (ipympl) canvas with its toolbar beside the figure, not over the axes, and no title bar; nothing to do
    for a picture (inline backend)."""
    canvas = fig.canvas
    if hasattr(canvas, "toolbar_position"):
        canvas.toolbar_position = "right"
        canvas.toolbar_visible = True
        canvas.header_visible = False
        canvas.footer_visible = False
        canvas.resizable = False
    return fig


def legend_columns(labels: list[str], fig: Figure, most: int = 5) -> int:
    """As many legend columns (at most `most`) as fit the figure's width: the widest label at 7.5 pt is about
    4.6 px a character at 100 dpi, plus its handle and gap (35 px)."""
    width = fig.get_figwidth() * fig.dpi - 20
    column = max((len(t) for t in labels), default=1) * 4.6 + 35
    return max(1, min(most, len(labels), int(width // column)))


class MemoryCurve:
    """Memory per phase, stacked by category, one panel per device (the host panel only when something is on the
    host); capacity line, OOM marker, overlays; one legend under the plot naming only what is drawn.

    `update` lays the figure out again (constrained layout at each draw): new tick labels or a panel dropped never
    overprint. A series of one's own is added by appending its artists to `self.extras` and its (handle, label) to
    the `legend` list that `_decorate` returns, inside `update`.
    """

    def __init__(self, result: Result, title: str | None = None, figsize=(WIDTH_IN, 4.6), dpi: int = 100,
                 source: str | None = None, overlay: Result | None = None, reported: list[dict] | None = None):
        self.fig: Figure = plt.figure(figsize=figsize, dpi=dpi, layout="constrained")
        fit_canvas(self.fig)
        self.grid = self.fig.add_gridspec(1, 2)
        self.axes = {"gpu": self.fig.add_subplot(self.grid[0, 0]), "host": self.fig.add_subplot(self.grid[0, 1])}
        self.phases = list(result.gpu.phases)
        self.bars: dict[str, dict[str, list]] = {}
        self.extras: list = []
        self.legend = None
        x = range(len(self.phases))
        for dev, ax in self.axes.items():
            self.bars[dev] = {}
            for cat in CATEGORIES:
                self.bars[dev][cat] = ax.bar(x, [0] * len(self.phases), 0.62, color=COLORS[cat], label=cat,
                                             edgecolor="white", linewidth=0.4)
            ax.set_xticks(list(x), [SHORT[p] for p in self.phases], fontsize=8.5)
            ax.set_ylabel("GiB (2^30 bytes)")
            ax.grid(axis="y", alpha=0.3)
        self.title, self.source = title, source
        self.update(result, overlay, reported)

    def panels(self, result: Result) -> list[str]:
        """The devices drawn: the GPU always, the host when anything of the result is there."""
        return ["gpu"] + (["host"] if any(result.host.phases.values()) else [])

    def update(self, result: Result, overlay: Result | None = None, reported: list[dict] | None = None) -> None:
        """Redraw for another result of the same phases (heights, panels, markers, legend, layout)."""
        if list(result.gpu.phases) != self.phases:
            raise ValueError(f"phases changed from {self.phases} to {list(result.gpu.phases)}: make a new MemoryCurve")
        for artist in self.extras:
            artist.remove()
        self.extras = []
        self.result = result
        shown = self.panels(result) + (["host"] if overlay is not None and any(overlay.host.phases.values()) else [])
        self.axes["host"].set_visible("host" in shown)
        self.axes["gpu"].set_subplotspec(self.grid[0, 0] if "host" in shown else self.grid[0, :])
        legend = self._decorate(result, overlay, reported)
        if self.legend is not None:
            self.legend.remove()
        self.legend = self.fig.legend([h for h, _ in legend], [t for _, t in legend], loc="outside lower center",
                                      ncols=legend_columns([t for _, t in legend], self.fig), fontsize=7.5,
                                      frameon=False)
        mode = evidence.label(result) + (f"; black line: {evidence.label(overlay)}" if overlay is not None else "")
        marks = " and ".join(m for m, on in (("stars", self._stars), ("dotted lines", self._dotted)) if on)
        source = f"\nreported figures ({marks}): {self.source}" if self.source and marks else ""
        s = result.setup
        adam = f", AdamW {s.get('adam_impl') or 'foreach'}" if strategies.get(s["strategy"]).torch_optimizer else ""
        head = self.title or (f"{result.model}: {s['strategy']} x{s['gpus']}, {s['precision']}{adam}, "
                              f"batch {s['batch']} x seq {s['seq']} [{mode}]")
        self.fig.suptitle("\n".join(textwrap.wrap(head, 120)) + source, fontsize=9.5)

    def _decorate(self, result: Result, overlay: Result | None, reported: list[dict] | None) -> list[tuple]:
        """Bar heights, capacity lines, OOM marks, overlay and reported figures; the legend's (handle, label) pairs."""
        used: set[str] = set()
        legend: list[tuple] = []
        dotted, stars, capacity = [], False, False
        for dev, ax in self.axes.items():
            d = result.device(dev)
            bottoms = [0.0] * len(self.phases)
            for cat in CATEGORIES:
                for i, (rect, phase) in enumerate(zip(self.bars[dev][cat], self.phases)):
                    h = to_gib(d.breakdown[phase][cat])
                    rect.set_y(bottoms[i])
                    rect.set_height(h)
                    rect.set_visible(h > 0)              # empty categories cost nothing to draw
                    bottoms[i] += h
                    if h > 0 and ax.get_visible():
                        used.add(cat)
            top = max(bottoms + [0.1])
            if dev == "gpu" and d.reserved:
                outline, height = reserved_outline(ax, d, self.phases, modelled=result.mode != "gpu")
                self.extras += outline
                legend += [(a, a.get_label()) for a in outline]          # named in the one legend below
                top = max(top, height)
            title = DEVICE_TITLES[dev]
            if d.capacity_bytes:
                cap = to_gib(d.capacity_bytes)
                top = max(top, cap)
                capacity = True
                title += f"; capacity {cap:,.0f} GiB"
                self.extras.append(ax.axhline(cap, color=OOM_RED, linestyle="--", linewidth=1.2))
                first = d.first_over()
                if first:                   # the marker on the bar, the words in a corner: they never overlap
                    i = self.phases.index(first)
                    self.extras.append(ax.plot(i, bottoms[i], marker="X", markersize=13, color=OOM_RED,
                                               markeredgecolor="white")[0])
                    self.extras.append(ax.text(0.01, 0.99, f"X = OOM at {PHASE_LABELS[first]}", transform=ax.transAxes,
                                               va="top", ha="left", color=OOM_RED, fontsize=9, fontweight="bold"))
            ax.set_title(title, fontsize=10)
            if overlay is not None:
                o = overlay.device(dev)
                ys = [to_gib(o.phases.get(p, 0)) for p in self.phases]
                top = max(top, *ys)
                line = ax.plot(range(len(self.phases)), ys, "o-", color="black", linewidth=1.2, markersize=5,
                               label=evidence.label(overlay))[0]
                self.extras.append(line)
                if dev == "gpu":
                    legend.append((line, evidence.label(overlay)))
            for item in reported or []:
                if item.get("device") != dev or item.get("value") is None or not isinstance(item["value"], (int, float)):
                    continue
                from helpers.cases import reported_bytes
                y = to_gib(reported_bytes(item))
                top = max(top, y)
                if item.get("phase") in self.phases:
                    i = self.phases.index(item["phase"])
                    self.extras.append(ax.plot(i + 0.22, y, marker="*", markersize=14, color="#FFD400",
                                               markeredgecolor="black")[0])
                    stars = True
                else:                       # named in the legend, never written over the bars
                    style = DOTTED[len(dotted) % len(DOTTED)]
                    line = ax.axhline(y, color="black", linestyle=style, linewidth=1.1)
                    self.extras.append(line)
                    read = "" if item.get("read_as") == item.get("unit") else f", read as {item['read_as']}"
                    dotted.append((line, f"{DEVICE_TITLES[dev].split(' ')[0]}: reported {item['value']} "
                                         f"{item['unit']}{read} ({to_gib(reported_bytes(item)):,.1f} GiB)"))
            ax.set_ylim(0, top * 1.15)
            if not any(bottoms):
                self.extras.append(ax.text(0.5, 0.5, "nothing here", transform=ax.transAxes, ha="center",
                                           color="#777777", fontsize=10))
        self._stars, self._dotted = stars, bool(dotted)
        entries = [(plt.Rectangle((0, 0), 1, 1, color=COLORS[c]), c.replace("_", " ")) for c in CATEGORIES if c in used]
        if capacity:
            entries.append((plt.Line2D([], [], color=OOM_RED, linestyle="--"), "capacity"))
        if stars:
            entries.append((plt.Line2D([], [], marker="*", markersize=10, color="#FFD400", markeredgecolor="black",
                                       linestyle="none"), "reported"))
        return entries + legend + dotted

    def legend_labels(self) -> list[str]:
        """What the legend names now."""
        return [t.get_text() for t in self.legend.get_texts()] if self.legend is not None else []

    def heights(self, device: str) -> dict[str, float]:
        """The drawn total per phase on `device`, in GiB (what a reader sees)."""
        return {p: sum(self.bars[device][c][i].get_height() for c in CATEGORIES) for i, p in enumerate(self.phases)}


def reserved_outline(ax, d, phases: list[str], modelled: bool = True) -> tuple[list, float]:
    """Outlines over a GPU's stacked allocated bars: what the caching allocator reserves (solid; `modelled` by the
    allocator model, else read from torch.cuda) and the device total with the CUDA context and NCCL (dashed), per
    phase; the artists (each labelled for a legend) and the tallest outline in GiB."""
    x = range(len(phases))
    reserved = [to_gib(d.reserved.get(p, 0)) for p in phases]
    total = [to_gib((d.device_total or {}).get(p, 0)) for p in phases]
    res = ax.bar(x, reserved, 0.74, fill=False, edgecolor="black", linewidth=1.1,
                 label=f"reserved (caching allocator{', modelled' if modelled else ''})")
    tot = ax.bar(x, total, 0.86, fill=False, edgecolor="#555555", linewidth=0.9, linestyle="--",
                 label="+ CUDA context, cuBLAS and NCCL (nvidia-smi)")
    return [res, tot], max(reserved + total)


def memory_curve(result: Result, overlay: Result | None = None, reported: list[dict] | None = None,
                 title: str | None = None, source: str | None = None) -> MemoryCurve:
    """A MemoryCurve of `result`, with a measurement overlaid and the case's reported figures marked
    (stars at a phase, dotted lines otherwise), their `source` written under the figure."""
    _check_results([result] + ([overlay] if overlay is not None else []), "memory_curve needs a Result")
    _check_title(title, "memory_curve")
    if reported is not None and (not isinstance(reported, (list, tuple)) or
                                 not all(isinstance(x, dict) for x in reported)):
        raise InputError(f"memory_curve: reported must be a list of dicts (a figure each, with its unit), got "
                         f"{type(reported).__name__}")
    return MemoryCurve(result, title, source=source, overlay=overlay, reported=reported)


def _title(ax, title: str, subtitle: str, width_in: float) -> None:
    """A title wrapped to the figure's width, with the evidence line under it."""
    chars = max(30, int(width_in * 11))
    ax.set_title("\n".join(textwrap.wrap(title, chars) + textwrap.wrap(subtitle, int(chars * 1.15))), fontsize=9.5)


def compare_bars(results: dict[str, Result], device: str = "gpu", title: str = "") -> Figure:
    """Before/after: each result's peak on `device`, stacked by category, with its capacity line; the axis in GiB, or
    MiB when every peak is under 1 GiB; the kind of evidence under the title."""
    _check_results(results.values() if isinstance(results, dict) else None, "compare_bars needs a {label: Result} dict")
    _check_title(title or "", "compare_bars")
    title = title or ""
    width = min(WIDTH_IN, max(6.0, 1.6 + 1.5 * len(results)))
    fig, ax = plt.subplots(figsize=(width, 4.6), layout="constrained")
    fit_canvas(fig)
    labels = list(results)
    unit, div = scale([results[k].device(device).peak_bytes for k in labels])
    top = 0.0
    for i, label in enumerate(labels):
        d = results[label].device(device)
        bottom = 0.0
        for cat in CATEGORIES:
            h = d.categories.get(cat, 0) / div
            ax.bar(i, h, 0.6, bottom=bottom, color=COLORS[cat], edgecolor="white", linewidth=0.4)
            bottom += h
        ax.text(i, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=9, zorder=5,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1, "alpha": 0.85})   # readable over a capacity line
        top = max(top, bottom)
        if d.capacity_bytes:
            ax.hlines(d.capacity_bytes / div, i - 0.4, i + 0.4, color=OOM_RED, linestyle="--")
            top = max(top, d.capacity_bytes / div)
    ax.set_ylim(0, max(top, 0.1) * 1.12)
    used = [c for c in CATEGORIES if any(r.device(device).categories.get(c) for r in results.values())]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[c]) for c in used]
    names = [c.replace("_", " ") for c in used]
    if any(results[k].device(device).capacity_bytes for k in labels):
        handles.append(plt.Line2D([], [], color=OOM_RED, linestyle="--"))
        names.append("capacity")
    fig.legend(handles, names, fontsize=7, loc="outside lower center", ncols=legend_columns(names, fig), frameon=False)
    kinds = [evidence.label(results[k]) for k in labels]
    if len(set(kinds)) > 1:                 # each bar says what it is
        per_bar = max(14, int(width * 11 / len(labels)))          # characters a tick label may take per line
        ticks = [k + "\n" + "\n".join(textwrap.wrap(f"[{evidence.KINDS[evidence.kind(results[k])]}]", per_bar))
                 for k in labels]
        subtitle = ""
    else:
        ticks, subtitle = labels, kinds[0]
    ax.set_xticks(range(len(labels)), ticks, fontsize=9 if subtitle else 8)
    ax.set_ylabel(f"peak, {DEVICE_TITLES[device]} — {unit} (2^{30 if unit == 'GiB' else 20} bytes)")
    _title(ax, title, subtitle, width)
    ax.grid(axis="y", alpha=0.3)
    return fig


def sweep(xs: list, results, xlabel: str, device: str = "gpu", title: str = "", category: str | None = None,
          phase: str | None = None, steps: bool = False) -> Figure:
    """Memory on `device` against one set-up variable: each result's peak, its total at `phase`, or one `category`;
    `results` is a list, or {label: list} for several lines. The capacity line is drawn; a point whose set-up runs
    out of memory is marked, with a red edge: an X when the GPU overflows, a triangle when the host does.
    `steps` draws each value as holding until the next point (for quantities that change in whole steps)."""
    series = results if isinstance(results, dict) else {"": results}
    try:
        xs = list(xs)
    except TypeError:
        raise InputError(f"sweep needs xs as a list of values, got {type(xs).__name__}") from None
    if not series:
        raise InputError("sweep needs at least one series of results, got an empty dict")
    for label, rs in series.items():
        _check_results(rs if isinstance(rs, (list, tuple)) else None, "sweep needs lists of Results")
        if len(rs) != len(xs):
            raise InputError(f"sweep needs one result per x: {len(xs)} xs, got {len(rs)} results"
                             + (f" for {label!r}" if label else ""))
    if category is not None and category not in CATEGORIES:
        raise InputError(f"unknown category {category!r}: allowed are {', '.join(CATEGORIES)}")
    missing = next((r for rs in series.values() for r in rs if phase is not None and phase not in r.device(device).phases),
                   None)
    if missing is not None:
        raise InputError(f"phase {phase!r} must be in every result, got a result with phases "
                         f"{', '.join(missing.device(device).phases) or 'none'}")
    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    fit_canvas(fig)
    top = 0.1

    def value(r: Result) -> float:
        d = r.device(device)
        if category:
            return to_gib(d.breakdown[phase or d.peak_phase][category]) if d.breakdown else 0.0
        return to_gib(d.phases[phase] if phase else d.peak_bytes)

    marks = {"gpu": "X", "host": "^"}          # the same shape for the same device in every figure
    used = set()
    for n, (label, rs) in enumerate(series.items()):
        ys = [value(r) for r in rs]
        top = max(top, *ys)
        color = LINES[n % len(LINES)]
        ax.plot(xs, ys, "o-", label=label or None, drawstyle="steps-post" if steps else "default", markersize=4,
                color=color)
        for dev, marker in marks.items():      # filled with its line's colour, so each mark belongs to a line
            pts = [(x, y) for x, y, r in zip(xs, ys, rs) if r.oom["device"] == dev]
            if pts:
                ax.plot(*zip(*pts), marker, color=color, markeredgecolor=OOM_RED, markeredgewidth=1.6,
                        markersize=10, linestyle="none", zorder=4)
                used.add(dev)
    for dev in ("gpu", "host"):
        if dev in used:
            ax.plot([], [], marks[dev], color="white", markeredgecolor=OOM_RED, markeredgewidth=1.6, markersize=9,
                    linestyle="none", label=f"set-up runs out of memory on the {'GPU' if dev == 'gpu' else 'host'}")
    caps = {r.device(device).capacity_bytes for rs in series.values() for r in rs} - {None}
    if caps and not category:
        cap = to_gib(max(caps))
        ax.axhline(cap, color=OOM_RED, linestyle="--", label=f"capacity {cap:,.0f} GiB")
        top = max(top, cap)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_ylim(0, top * 1.12)
    what = (category.replace("_", " ") if category else "total") + (f" at {PHASE_LABELS[phase]}" if phase else "") \
        if category or phase else "peak"
    ax.set_xlabel(xlabel)
    ax.set_ylabel("GiB (2^30 bytes)")
    head = f"{title}: {what}, {DEVICE_TITLES[device]}" if title else f"{what}, {DEVICE_TITLES[device]}"
    _title(ax, head, evidence.of_all(r for rs in series.values() for r in rs), 6.5)
    ax.grid(alpha=0.3)
    return fig


def _check_results(results, what: str) -> None:
    """InputError unless `results` is a non-empty collection of Results."""
    if results is None:
        raise InputError(f"{what}, got another type")
    results = list(results)
    if not results:
        raise InputError(f"{what} with at least one result, got none")
    bad = [r for r in results if not isinstance(r, Result)]
    if bad:
        raise InputError(f"{what}: each value must be a helpers.results.Result, got {type(bad[0]).__name__}")


def _check_title(title, what: str) -> None:
    if title is not None and not isinstance(title, str):
        raise InputError(f"{what}: title must be text, got {type(title).__name__}")

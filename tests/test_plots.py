"""Figures and explorers: every kind renders headless, shows the result's own numbers, and responds to controls."""

import matplotlib

matplotlib.use("Agg")

import nbformat  # noqa: E402
import pytest  # noqa: E402

from helpers import cases, estimate, explore, plots  # noqa: E402
from helpers.units import GiB  # noqa: E402


def texts(fig):
    return ([t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title() for ax in fig.axes]
            + [fig._suptitle.get_text() if fig._suptitle else ""])


def test_memory_curve_draws_the_results_numbers_and_marks_the_oom():
    r = estimate.run("llama-3-8b", cases.setup(1))
    curve = plots.memory_curve(r, reported=cases.case(1)["reported"])
    for dev in ("gpu", "host"):
        for phase, height in curve.heights(dev).items():
            assert height == pytest.approx(r.device(dev).phases[phase] / GiB)
    assert any("OOM at optimizer step" in t for t in texts(curve.fig))
    assert any("capacity 80 GiB" in t for t in texts(curve.fig))
    assert "estimate (arithmetic)" in curve.fig._suptitle.get_text()             # the kind of evidence, in the title
    assert all("GiB" in ax.get_ylabel() for ax in curve.fig.axes)


def test_overlay_and_update_in_place():
    r = estimate.run("llama-3-8b", cases.setup(1))
    fixed = estimate.run("llama-3-8b", cases.setup(1, fixed=True))
    curve = plots.memory_curve(r, overlay=fixed)
    before = curve.heights("gpu")
    curve.update(fixed)
    assert curve.heights("gpu") != before
    assert curve.heights("gpu")["step"] == pytest.approx(fixed.gpu.phases["step"] / GiB)
    assert not any("OOM at optimizer step" in t for t in texts(curve.fig))


def test_compare_bars_and_sweep():
    a, b = estimate.run("llama-3-8b", cases.setup(1)), estimate.run("llama-3-8b", cases.setup(1, fixed=True))
    fig = plots.compare_bars({"ZeRO-2": a, "+ offload": b}, "gpu")
    tops = sorted(float(t) for t in texts(fig) if t.replace(".", "").isdigit())
    assert tops == pytest.approx(sorted([a.gpu.peak_bytes / GiB, b.gpu.peak_bytes / GiB]), abs=0.05)
    xs = [1, 2, 4, 8, 16]
    results = [estimate.run("llama-3-8b", cases.setup(1, fixed=True, batch=x, seq=4096)) for x in xs]
    fig = plots.sweep(xs, results, "micro batch")
    line = fig.axes[0].lines[0]
    assert list(line.get_ydata()) == pytest.approx([r.gpu.peak_bytes / GiB for r in results])
    assert any(l.get_label() == "set-up runs out of memory on the GPU" for l in fig.axes[0].lines)
    assert "estimate (arithmetic)" in fig.axes[0].get_title()


def test_explorer_controls_change_figure_and_verdict():
    e = explore.explorer(case=1)
    assert e.verdict.value.count("OOM on GPU at the optimizer step")
    assert e.verdict_text.startswith("OOM on GPU at the optimizer step") and "<" not in e.verdict_text
    before = e.curve.heights("gpu")
    e.set(offload_optimizer=True)
    assert "fits" in e.verdict.value and e.curve.heights("gpu") != before
    assert e.curve.heights("gpu")["step"] == pytest.approx(e.result.gpu.phases["step"] / GiB)
    shown = e.curve.heights("gpu")
    e.set(strategy="fsdp2")                       # FSDP2 cannot offload the optimizer alone
    assert "not a valid set-up" in e.verdict.value and "together" in e.verdict.value
    assert e.curve.heights("gpu") == shown
    e.set(offload_params=True, gpus=2)
    assert "fits" in e.verdict.value and e.setup.strategy == "fsdp2"


def test_every_plot_says_what_kind_of_evidence_its_lines_are():
    from helpers.measure import dryrun

    r = estimate.run("llama-3-8b", cases.setup(1))
    dry = dryrun.run("llama-3-8b", cases.setup(1), progress=False)               # ZeRO-2: re-enacted in torch
    curve = plots.memory_curve(r, overlay=dry)
    labels = [l.get_label() for ax in curve.fig.axes for l in ax.lines]
    assert "dry run — re-enacted in torch" in labels
    assert "re-enacted in torch" in curve.fig._suptitle.get_text()
    fig = plots.compare_bars({"estimate": r, "dry run": dry})
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert [t.replace("\n", " ") for t in ticks] == ["estimate [estimated]", "dry run [re-enacted in torch]"]


def test_compare_bars_uses_mib_for_a_twin_and_sweep_marks_the_other_devices_oom():
    from helpers.measure import scaled

    twin, s = scaled.scaled_setup("llama-3-8b", cases.setup(1))
    small = estimate.run(str(twin), s)
    fig = plots.compare_bars({"twin": small})
    assert "MiB" in fig.axes[0].get_ylabel() and float(fig.axes[0].texts[0].get_text()) > 1      # not "0.0" GiB
    ratios = [0.3, 0.6, 1.0]
    rs = [estimate.run("qwen2.5-72b", cases.setup(3, offload_ratio=x, sub_group_size=100_000_000)) for x in ratios]
    assert rs[0].oom["device"] == "gpu"
    fig = plots.sweep(ratios, rs, "ratio", device="host", phase="resume")
    assert any(l.get_label() == "set-up runs out of memory on the GPU" for l in fig.axes[0].lines)
    from helpers.errors import InputError

    with pytest.raises(InputError, match="at least one result"):
        plots.sweep([], [], "nothing")


def test_explorer_shows_a_cases_reported_figures_only_at_their_set_up():
    e = explore.explorer(case=5)                                 # the reported set-up: batch 1, no offload
    assert [i["applies_to"] for i in e.reported_here()] == ["reported"]
    e.set(offload_optimizer=True, offload_params=True, batch=4)   # the fix: now its ~18 GB and ~155 GB belong here
    assert {i["applies_to"] for i in e.reported_here()} == {"fixed"}
    e.set(batch=8)                                               # neither the report's set-up nor its fix
    assert e.reported_here() == []


def test_explorer_runs_headless_in_a_notebook_and_renders_static(tmp_path):
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%matplotlib widget\nfrom helpers import explore\ne = explore.explorer(case=5)\ne"),
        nbformat.v4.new_code_cell("e.set(batch=4)\nassert 'fits' in e.verdict.value or 'OOM' in e.verdict.value"),
    ])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    assert any("image/png" in o.get("data", {}) for o in outputs)          # the static picture beside the widget
    html, _ = HTMLExporter(config=_png_first()).from_notebook_node(nb)
    assert "data:image/png;base64" in html
    nb2 = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import matplotlib\nmatplotlib.use('Agg')\n%matplotlib inline\nfrom helpers import cases, estimate, plots\n"
        "plots.memory_curve(estimate.run('llama-3-8b', cases.setup(1))).fig")])
    NotebookClient(nb2, timeout=120, kernel_name="python3").execute()
    html, _ = HTMLExporter().from_notebook_node(nb2)
    assert "data:image/png;base64" in html


def _png_first():
    from traitlets.config import Config

    c = Config()
    c.NbConvertBase.display_data_priority = ["image/png", "text/html", "text/plain"]
    return c


def test_explorer_keeps_the_options_it_has_no_control_for():
    """Case 6 runs with overlap_comm false (LLaMA-Factory's config); moving a slider and back must not lose it."""
    e = explore.explorer(case=6)
    start = e.result.gpu.phases
    e.set(seq=4096)
    e.set(seq=2048)
    assert e.setup == cases.setup(6) and e.result.gpu.phases == start
    assert {i["applies_to"] for i in e.reported_here()} >= {"reported", "machine"}


@pytest.mark.parametrize("number", range(1, 8))
def test_case_figures_fit_a_laptop_with_their_legend_inside(number):
    """880 px at most; the one legend under the plot lies inside the figure and names only what is drawn."""
    c = cases.case(number)
    r = estimate.run(c["model"], cases.setup(number))
    curve = plots.memory_curve(r, reported=c["reported"], source=cases.citation(number))
    curve.fig.draw_without_rendering()
    width, height = curve.fig.bbox.width, curve.fig.bbox.height
    box = curve.legend.get_window_extent()
    assert width <= 900 and box.x0 >= -1 and box.x1 <= width + 1 and box.y0 >= -1 and box.y1 <= height + 1
    drawn = {cat.replace("_", " ") for dev in curve.panels(r) for cat in plots.CATEGORIES
             if any(r.device(dev).breakdown[p][cat] for p in curve.phases)}
    named = set(curve.legend_labels())
    assert drawn <= named and not ({n for n in named if n.replace(" ", "_") in plots.CATEGORIES} - drawn)
    assert curve.axes["host"].get_visible() == any(r.host.phases.values())

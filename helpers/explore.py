"""Explorers: sliders and toggles for a set-up, bound to the estimator, redrawing one memory figure in place.

`explore.explorer("llama-3-8b", cases.setup(1))` returns an Explorer; in a notebook it displays itself.
Controls change a TrainSetup; an invalid combination shows its error as the verdict and leaves the figure as it was.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time

import ipywidgets as w
import matplotlib.pyplot as plt

from helpers import estimate, models, plots, report
from helpers.errors import InputError
from helpers.training import FACES, Control, TrainSetup, with_applicable


def _steps(options: tuple, value) -> tuple:
    """A slider's stops with `value` among them (a set-up's own value is always reachable)."""
    if value in options:
        return tuple(options)
    numbers = sorted([o for o in options if not isinstance(o, str)] + [value])
    return tuple(o for o in options if isinstance(o, str)) + tuple(numbers)


def _control(c: Control, value) -> w.Widget:
    """The widget of one field's Control, showing `value` (None as the control's `none`)."""
    shown = c.none if value is None else value
    common = dict(description=c.label, tooltip=c.tooltip or None)
    if c.kind == "slider":
        return w.IntSlider(shown, min=c.lo, max=max(c.hi, shown), continuous_update=False, **common)
    if c.kind == "steps":
        return w.SelectionSlider(options=_steps(c.options, shown), value=shown, continuous_update=False, **common)
    if c.kind == "menu":
        return w.Dropdown(options=tuple(dict.fromkeys(c.options + (shown,))), value=shown, **common)
    if c.kind == "check":
        return w.Checkbox(shown, **common)
    return w.FloatText(shown, **common)                                          # 'gib'


def _value(c: Control, shown):
    """The field's value a control shows (its `none` -> None)."""
    return None if c is not None and shown == c.none else shown


class Explorer:
    """A memory figure of `model` under a set-up, and one control per set-up option."""

    def __init__(self, model: str = "llama-3-8b", setup: TrainSetup | None = None, reported: list[dict] | None = None,
                 source: str | None = None, fixed: TrainSetup | None = None):
        if setup is not None and not isinstance(setup, TrainSetup):
            raise InputError(f"setup must be a TrainSetup (helpers.training.TrainSetup(batch=2, seq=1024, ...)), got "
                             f"{type(setup).__name__}" + (": pass TrainSetup(**it)" if isinstance(setup, dict) else ""))
        self.model = model
        self.setup = (setup or TrainSetup(gpu_gib=80)).validate()
        self.reported = reported
        # a reported figure belongs to one set-up ('reported' or 'fixed') or to the machine; it is drawn only there
        self.anchors = {"reported": (model, self.setup), "fixed": (model, fixed)}
        self.result = estimate.run(model, self.setup)
        self.controls = {"model": w.Dropdown(options=models.catalogue(), description="model",
                                             value=model if model in models.catalogue() else None)}
        self.controls |= {name: _control(f.control, getattr(self.setup, name))
                          for name, f in FACES.items() if f.control is not None}
        self.verdict = w.HTML()
        self.reset_button = w.Button(description="reset to the case" if reported else "reset", icon="undo",
                                     tooltip="every control back to where this explorer started",
                                     layout=w.Layout(width="auto", flex="0 0 auto")) # long verdicts never squeeze it
        self.reset_button.on_click(lambda _: self.reset())
        self.start = ({k: c.value for k, c in self.controls.items()}, self.setup, self.model)
        self._holding = False
        self.source = source
        with plt.ioff():                      # shown once, inside the explorer's own widget
            self.curve = plots.MemoryCurve(self.result, source=source, reported=self.reported_here())
        self.last_update_s = 0.0
        for c in self.controls.values():
            c.observe(self._changed, names="value")
        self._show_verdict()

    def setup_from_controls(self) -> TrainSetup:
        """The set-up the controls show (a control's `none` value is the field's None; a field that no longer applies,
        such as LoRA's targets without a LoRA rank, goes back to its default); fields without a control (DeepSpeed's
        bucket and sub-group sizes, overlap_comm) keep the values the explorer started with."""
        values = {name: _value(FACES[name].control, c.value) for name, c in self.controls.items() if name in FACES}
        return with_applicable(dataclasses.replace(self.setup, **values)).validate()

    def set(self, **values) -> None:
        """Move controls as a reader would (each change redraws), to a field's value (None included: the control's
        'none' is chosen); grad_checkpointing=True/False moves the checkpointing control to 'full'/'none'."""
        if "grad_checkpointing" in values:
            on = values.pop("grad_checkpointing")
            if not isinstance(on, bool):
                raise InputError(f"grad_checkpointing must be True or False, got {on!r}")
            values["checkpointing"] = "full" if on else "none"
        unknown = sorted(set(values) - set(self.controls))
        if unknown:
            raise InputError(f"no control {unknown[0]!r}: the explorer's controls are {', '.join(self.controls)}")
        for k, v in values.items():                 # a value no control can show is said, never clamped to a slider
            if k in FACES:
                problem = self._unshowable(k, v)
                if problem:
                    try:                            # the field's own message where the set-up refuses the value too
                        dataclasses.replace(self.setup, **{k: v}).validate()
                    except InputError as exc:
                        problem = str(exc)
                    self._invalid(problem)
                    return
        if "model" in values and values["model"] not in self.controls["model"].options:
            raise InputError(f"model must be one of the catalogue's ({', '.join(self.controls['model'].options)}), "
                             f"got {values['model']!r}")
        for k, v in values.items():
            control = FACES[k].control if k in FACES else None
            shown = control.none if control is not None and v is None else v
            widget = self.controls[k]
            if isinstance(widget, w.SelectionSlider) and shown not in widget.options:
                widget.options = _steps(widget.options, shown)
            if isinstance(widget, w.IntSlider) and shown > widget.max:
                widget.max = shown                  # (a slider clamps to its max: the value itself is reachable)
            widget.value = shown
        given = {k: v for k, v in values.items() if k in FACES}
        if self.error is None and any(getattr(self.setup, k) != v for k, v in given.items()):
            try:                                    # a value the set-up dropped as not applying: said, not dropped
                with_applicable(dataclasses.replace(self.setup, **given), keep=given).validate()
            except InputError as exc:
                self._invalid(str(exc))

    def reset(self) -> None:
        """Every control back to where the explorer started (one redraw)."""
        values, setup, model = self.start
        self._holding = True
        try:
            for k, v in values.items():
                self.controls[k].value = v
        finally:
            self._holding = False
        self._changed()
        assert (self.setup, self.model) == (setup, model), "reset did not restore the starting set-up"

    def _changed(self, change=None) -> None:
        if self._holding:
            return
        started = time.perf_counter()
        try:
            setup = self.setup_from_controls()
            model = self.controls["model"].value or self.model
            result = estimate.run(model, setup)
        except InputError as exc:
            self._invalid(str(exc))
            return
        self.error = None
        self.setup, self.model, self.result = setup, model, result
        if list(result.gpu.phases) != self.curve.phases:
            plt.close(self.curve.fig)
            with plt.ioff():
                self.curve = plots.MemoryCurve(result, source=self.source)
        self.curve.update(result, reported=self.reported_here())
        self.curve.fig.canvas.draw_idle()
        self._render_static()
        self._show_verdict()
        self.last_update_s = time.perf_counter() - started

    def _unshowable(self, k: str, v) -> str | None:
        """Why control `k` cannot show value `v` (off a menu, not a number for a slider, below a slider's least), or
        None: a combination the set-up refuses is shown, and said, by `_changed`."""
        widget, control = self.controls[k], FACES[k].control
        shown = control.none if control is not None and v is None else v
        number = isinstance(shown, (int, float)) and not isinstance(shown, bool) and math.isfinite(shown)
        if isinstance(widget, w.Dropdown) and shown not in widget.options:
            return f"{k} must be one of {', '.join(map(str, widget.options))}, got {v!r}"
        if isinstance(widget, w.SelectionSlider) and shown not in widget.options and not number:
            return f"{k} must be a number or one of {', '.join(map(str, widget.options))}, got {v!r}"
        if isinstance(widget, w.IntSlider) and not (number and shown == int(shown) and shown >= widget.min):
            return f"{k} must be a whole number of at least {widget.min}, got {v!r}"
        if isinstance(widget, w.Checkbox) and not isinstance(v, bool):
            return f"{k} must be True or False, got {v!r}"
        if isinstance(widget, (w.FloatText, w.BoundedFloatText)) and not (
                isinstance(shown, (int, float)) and not isinstance(shown, bool)):
            return f"{k} must be a number, got {v!r}"
        return None

    def _invalid(self, message: str) -> None:
        """Show that the controls make no valid set-up (the figure keeps the last valid one)."""
        self.verdict.value = f"<b style='color:#B00020'>not a valid set-up:</b> {message}"
        self.error = message
        self.verdict_text = f"not a valid set-up: {message}"

    def reported_here(self) -> list[dict]:
        """The reported figures that belong to the set-up shown now (a case's figures vanish once it is left)."""
        out = []
        for item in self.reported or []:
            where = item.get("applies_to", "reported")
            if where == "machine" or self.anchors.get(where) == (self.model, self.setup):
                out.append(item)
        return out

    def _show_verdict(self) -> None:
        text = report.verdict(self.result)
        self.verdict_text = text
        color = "#B00020" if text.startswith("OOM") else "#1B5E20"
        self.verdict.value = f"<b style='color:{color}'>{text}</b>"

    def widget(self) -> w.Widget:
        """The main controls in a compact grid, the rest in a collapsed section, the verdict, and the figure (live with
        ipympl, a picture redrawn into an output otherwise); about 860 px wide."""
        c = self.controls
        for k, control in c.items():
            control.layout = w.Layout(width="280px")
            if isinstance(control, w.Checkbox):
                control.indent = False
            else:
                control.style = {"description_width": "80px"}
        grid = lambda keys: w.GridBox([c[k] for k in keys], layout=w.Layout(
            grid_template_columns="repeat(3, 285px)", grid_gap="2px 4px"))
        fields = [k for k in c if k in FACES]
        main = grid(["model"] + [k for k in fields if FACES[k].control.main])
        rest = grid([k for k in fields if not FACES[k].control.main])
        if "google.colab" in sys.modules:    # Colab's widget manager does not open an Accordion (colabtools #3571)
            more = w.VBox([w.HTML("<b>more options</b>"), rest])
        else:
            more = w.Accordion([rest], selected_index=None,
                               titles=("more options: parallelism, optimizer, LoRA, memory savers, capacities",))
        head = [main, more, w.HBox([self.reset_button, self.verdict])]
        canvas = self.curve.fig.canvas
        if isinstance(canvas, w.DOMWidget):
            return w.VBox(head + [canvas])
        out = w.Output()                     # without ipympl: a picture, redrawn into the same output
        self._output = out
        self._render_static()
        return w.VBox(head + [out])

    def _render_static(self) -> None:
        out = getattr(self, "_output", None)
        if out is not None:
            from IPython.display import display

            out.clear_output(wait=True)
            with out:
                display(self.curve.fig)

    def _repr_mimebundle_(self, **kwargs):
        """The live widget for JupyterLab, plus a PNG of the figure for static renderings (nbconvert, CI docs)."""
        import base64
        import io

        bundle = self.widget()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        png = io.BytesIO()
        self.curve.fig.savefig(png, format="png", dpi=80)
        data["image/png"] = base64.b64encode(png.getvalue()).decode()
        data["text/plain"] = f"Explorer({self.model}): {report.verdict(self.result)}"
        return bundle


def explorer(model: str = "llama-3-8b", setup: TrainSetup | None = None, case: int | None = None,
             reported: list[dict] | None = None, source: str | None = None) -> Explorer:
    """An Explorer for `model` under `setup` (with `reported` figures of that set-up marked, `source` under them),
    or preset to a case (its model, set-up and reported figures)."""
    if case is not None:
        from helpers import cases

        c = cases.case(case)
        return Explorer(c["model"], cases.setup(case), reported=c["reported"], source=cases.citation(case),
                        fixed=cases.setup(case, fixed=True))
    return Explorer(model, setup, reported=reported, source=source)

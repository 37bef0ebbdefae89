"""Explorers: sliders and toggles for a set-up, bound to the estimator, redrawing one memory figure in place.

`explore.explorer("llama-3-8b", cases.setup(1))` returns an Explorer; in a notebook it displays itself.
Controls change a TrainSetup; an invalid combination shows its error as the verdict and leaves the figure as it was.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import ipywidgets as w
import matplotlib.pyplot as plt

from helpers import estimate, models, plots, report
from helpers.errors import InputError
from helpers.training import (
    ADAM_IMPLS, ATTENTIONS, BASE_WEIGHTS, CHECKPOINTING, OPTIMIZERS, PRECISIONS, STRATEGIES, TrainSetup,
)

SEQS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
GPUS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
LORA_RANKS = [0, 4, 8, 16, 32, 64, 128, 256]
GRAD_ACCUMS = [1, 2, 4, 8, 16, 32, 64]
MODEL_PARALLEL = [1, 2, 4, 8, 16]


class Explorer:
    """A memory figure of `model` under a set-up, and one control per set-up option."""

    def __init__(self, model: str = "llama-3-8b", setup: TrainSetup | None = None, reported: list[dict] | None = None,
                 source: str | None = None, fixed: TrainSetup | None = None):
        self.model = model
        self.setup = (setup or TrainSetup(gpu_gib=80)).validate()
        self.reported = reported
        # a reported figure belongs to one set-up ('reported' or 'fixed') or to the machine; it is drawn only there
        self.anchors = {"reported": (model, self.setup), "fixed": (model, fixed)}
        self.result = estimate.run(model, self.setup)
        s = self.setup
        self.controls = {
            "model": w.Dropdown(options=models.catalogue(), value=model if model in models.catalogue() else None,
                                description="model"),
            "batch": w.IntSlider(s.batch, 1, 64, description="micro batch", continuous_update=False),
            "seq": w.SelectionSlider(options=sorted(set(SEQS + [s.seq])), value=s.seq, description="seq", continuous_update=False),
            "strategy": w.Dropdown(options=STRATEGIES, value=s.strategy, description="strategy"),
            "gpus": w.SelectionSlider(options=sorted(set(GPUS + [s.gpus])), value=s.gpus, description="GPUs", continuous_update=False),
            "tensor_parallel": w.SelectionSlider(options=sorted(set(MODEL_PARALLEL + [s.tensor_parallel])),
                                                 value=s.tensor_parallel, description="TP",
                                                 tooltip="tensor-parallel degree (fsdp2 or ddp)", continuous_update=False),
            "context_parallel": w.SelectionSlider(options=sorted(set(MODEL_PARALLEL + [s.context_parallel])),
                                                  value=s.context_parallel, description="CP",
                                                  tooltip="context-parallel degree: each sequence over N ranks",
                                                  continuous_update=False),
            "precision": w.Dropdown(options=PRECISIONS, value=s.precision, description="precision"),
            "adam_impl": w.Dropdown(options=("default",) + ADAM_IMPLS, value=s.adam_impl or "default",
                                    description="AdamW"),
            "optimizer": w.Dropdown(options=OPTIMIZERS, value=s.optimizer, description="optimizer"),
            "lora_rank": w.SelectionSlider(options=LORA_RANKS, value=s.lora_rank or 0, description="LoRA rank",
                                           tooltip="0: full fine-tuning", continuous_update=False),
            "lora_targets": w.Dropdown(options=sorted({"all-linear", "q,v", "q,k,v,o", s.lora_targets}),
                                       value=s.lora_targets, description="LoRA on", tooltip="with a LoRA rank"),
            "base_weights": w.Dropdown(options=("bf16",) + BASE_WEIGHTS, value=s.base_weights or "bf16",
                                       description="LoRA base", tooltip="nf4: QLoRA's 4-bit base (with a LoRA rank)"),
            "offload_optimizer": w.Checkbox(s.offload_optimizer, description="offload optimizer"),
            "offload_params": w.Checkbox(s.offload_params, description="offload params"),
            "offload_ratio": w.FloatSlider(1.0 if s.offload_ratio is None else s.offload_ratio, min=0, max=1,
                                           step=0.05, description="ratio", continuous_update=False),
            "use_ratio": w.Checkbox(s.offload_ratio is not None, description="partial offload (ratio)"),
            "pin_memory": w.Checkbox(s.pin_memory, description="pin memory"),
            "checkpointing": w.Dropdown(options=CHECKPOINTING, value=s.ac, description="checkpointing"),
            "checkpoint_every": w.SelectionSlider(options=sorted({1, 2, 3, 4, s.checkpoint_every}),
                                                  value=s.checkpoint_every, description="ckpt every",
                                                  tooltip="with checkpointing full: every Nth layer only",
                                                  continuous_update=False),
            "grad_accum": w.SelectionSlider(options=sorted(set(GRAD_ACCUMS + [s.grad_accum])), value=s.grad_accum,
                                            description="grad accum", tooltip="micro batches per optimizer step",
                                            continuous_update=False),
            "fused_ce": w.Checkbox(s.fused_ce, description="fused CE"),
            "attention": w.Dropdown(options=ATTENTIONS, value=s.attention, description="attention"),
            "gpu_gib": w.FloatText(s.gpu_gib or 0.0, description="GPU GiB", tooltip="0: no capacity"),
            "host_gib": w.FloatText(s.host_gib or 0.0, description="host GiB", tooltip="0: no capacity"),
        }
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
        """The set-up the controls show; options without a control (gpus_per_node, resume, DeepSpeed's bucket and
        sub-group sizes, overlap_comm) keep the values the explorer started with."""
        c = {k: v.value for k, v in self.controls.items()}
        return dataclasses.replace(
            self.setup,
            batch=c["batch"], seq=c["seq"], strategy=c["strategy"], gpus=c["gpus"], precision=c["precision"],
            tensor_parallel=c["tensor_parallel"], context_parallel=c["context_parallel"],
            adam_impl=None if c["adam_impl"] == "default" else c["adam_impl"], optimizer=c["optimizer"],
            lora_rank=c["lora_rank"] or None, lora_targets=c["lora_targets"] if c["lora_rank"] else "all-linear",
            base_weights=None if c["base_weights"] == "bf16" or not c["lora_rank"] else c["base_weights"],
            offload_optimizer=c["offload_optimizer"], offload_params=c["offload_params"],
            offload_ratio=c["offload_ratio"] if c["use_ratio"] else None, pin_memory=c["pin_memory"],
            grad_checkpointing=c["checkpointing"] == "full",     # none/full as grad_checkpointing, so a case's
            checkpointing="selective" if c["checkpointing"] == "selective" else None,   # set-up compares equal
            checkpoint_every=c["checkpoint_every"] if c["checkpointing"] == "full" else 1,
            grad_accum=c["grad_accum"], fused_ce=c["fused_ce"], attention=c["attention"],
            gpu_gib=c["gpu_gib"] or None, host_gib=c["host_gib"] or None,
        ).validate()

    def set(self, **values) -> None:
        """Move controls as a reader would (each change redraws); grad_checkpointing=True/False moves the
        checkpointing control to 'full'/'none'."""
        if "grad_checkpointing" in values:
            values["checkpointing"] = "full" if values.pop("grad_checkpointing") else "none"
        for k, v in values.items():
            self.controls[k].value = v

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
            self.verdict.value = f"<b style='color:#B00020'>not a valid set-up:</b> {exc}"
            self.error = str(exc)
            self.verdict_text = f"not a valid set-up: {exc}"
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
        main = grid(["model", "strategy", "gpus", "batch", "seq", "precision", "offload_optimizer", "offload_params",
                     "checkpointing"])
        rest = grid(["tensor_parallel", "context_parallel", "checkpoint_every", "grad_accum", "adam_impl", "optimizer", "lora_rank",
                     "lora_targets", "base_weights", "attention", "fused_ce", "pin_memory", "use_ratio", "offload_ratio",
                     "gpu_gib", "host_gib"])
        if "google.colab" in sys.modules:    # Colab's widget manager does not open an Accordion (colabtools #3571)
            more = w.VBox([w.HTML("<b>more options</b>"), rest])
        else:
            more = w.Accordion([rest], selected_index=None,
                               titles=("more options: TP/CP, accumulation, AdamW, 8-bit, LoRA, QLoRA, attention, "
                                       "fused CE, pinning, ratio, capacities",))
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


def explorer(model: str = "llama-3-8b", setup: TrainSetup | None = None, case: int | None = None) -> Explorer:
    """An Explorer for `model` under `setup`, or preset to a case (its model, set-up and reported figures)."""
    if case is not None:
        from helpers import cases

        c = cases.case(case)
        return Explorer(c["model"], cases.setup(case), reported=c["reported"], source=cases.citation(case),
                        fixed=cases.setup(case, fixed=True))
    return Explorer(model, setup)

"""DeepSpeed's own memory estimators, called as users call them, with their printed tables captured and parsed.

`estimate_zero2_model_states_mem_needs_all_cold` / `estimate_zero3_..._all_cold` (deepspeed.runtime.zero) take a
parameter count and the largest layer's; the `_all_live` variants derive both from a model object with
`model_to_params`, which de-duplicates parameters by `data_ptr()`. They count model states only (weights, gradients,
Adam states; a 1.5x "additional buffer factor" on the host) and print GiB labelled "GB".
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass

from helpers import models
from helpers.errors import InputError

_ROW = re.compile(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$")


@dataclass(frozen=True)
class Row:
    """One line of DeepSpeed's table: host ('per CPU') and per-GPU figures in GiB as printed, and the options."""

    cpu_gib: float
    gpu_gib: float
    options: str

    @property
    def offload_param(self) -> bool:
        return "offload_param=cpu" in self.options

    @property
    def offload_optimizer(self) -> bool:
        return "offload_optimizer=none" not in self.options

    @property
    def zero_init(self) -> bool | None:
        m = re.search(r"zero_init=(\d)", self.options)
        return None if m is None else m.group(1) == "1"


@dataclass(frozen=True)
class Table:
    """DeepSpeed's printed table (`text`) and its rows."""

    stage: int
    total_params: int
    largest_layer_params: int
    text: str
    rows: tuple[Row, ...]

    def row(self, offload_optimizer: bool, offload_param: bool = False, zero_init: bool | None = True) -> Row:
        for r in self.rows:
            if (r.offload_optimizer, r.offload_param) == (offload_optimizer, offload_param) and \
                    (r.zero_init is None or zero_init is None or r.zero_init == zero_init):
                return r
        raise InputError(f"DeepSpeed's ZeRO-{self.stage} table has no row with offload_optimizer={offload_optimizer}, "
                         f"offload_param={offload_param}")


def counts(model, with_head: bool = False) -> tuple[int, int]:
    """(total parameters, largest layer's parameters) of a catalogue model, as DeepSpeed's `model_to_params` would
    count them on a real model: without the output head (an `AutoModel`, the base model) unless `with_head`; the
    largest layer is the largest module's own parameters."""
    m = models.spec(model)
    tensors = [t for t in m.tensors if with_head or not t.name.startswith("lm_head")]
    per_module: dict[str, int] = {}
    for t in tensors:
        module = t.name.rsplit(".", 1)[0]
        per_module[module] = per_module.get(module, 0) + t.numel
    return sum(t.numel for t in tensors), max(per_module.values())


def cold(total_params: int, largest_layer_params: int = 0, stage: int = 3, gpus_per_node: int = 1, nodes: int = 1,
         buffer_factor: float = 1.5) -> Table:
    """Call DeepSpeed's `estimate_zero{stage}_model_states_mem_needs_all_cold` and parse what it prints."""
    for name, value in (("total_params", total_params), ("gpus_per_node", gpus_per_node), ("nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    if stage not in (2, 3):
        raise InputError(f"DeepSpeed has estimators for ZeRO stages 2 and 3, got stage {stage!r}")
    if stage == 3 and (isinstance(largest_layer_params, bool) or not isinstance(largest_layer_params, int)
                       or largest_layer_params < 1):
        raise InputError(f"ZeRO-3's estimator needs largest_layer_params, a positive integer, got {largest_layer_params!r}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if stage == 3:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold

            estimate_zero3_model_states_mem_needs_all_cold(total_params, largest_layer_params, gpus_per_node, nodes,
                                                           buffer_factor)
        else:
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold

            estimate_zero2_model_states_mem_needs_all_cold(total_params, gpus_per_node, nodes, buffer_factor)
    text = out.getvalue()
    rows = tuple(Row(float(m.group(1)), float(m.group(2)), m.group(3).replace("OffloadDeviceEnum.", ""))
                 for m in map(_ROW.match, text.splitlines()) if m)
    return Table(stage, total_params, largest_layer_params, text.replace("OffloadDeviceEnum.", ""), rows)


def live_counts(module) -> tuple[int, int]:
    """DeepSpeed's own `model_to_params` on a model object: what the `_all_live` estimators would use."""
    from deepspeed.runtime.zero.stage3 import model_to_params

    return model_to_params(module)


def meta_model(model, with_head: bool = True):
    """The model built on the meta device (no memory), as one does to avoid loading the weights."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    cls = AutoModelForCausalLM if with_head else AutoModel
    with torch.device("meta"):
        return cls.from_config(models.load_config(models.spec(model).path))


def zero3_bytes(total_params: int, largest_layer_params: int, offload_optimizer: bool, offload_param: bool,
                gpus_per_node: int = 1, nodes: int = 1, buffer_factor: float = 1.5) -> dict[str, int]:
    """DeepSpeed's ZeRO-3 figures in bytes (its unprinted `estimate_zero3_model_states_mem_needs`, zero_init on):
    for models too small to read in the printed GiB."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, gpus_per_node, nodes,
                                                        offload_optimizer, offload_param, True, buffer_factor)
    return {"gpu": gpu, "host": cpu}

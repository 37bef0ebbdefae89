"""DPO's reference model as DeepSpeed's real engine keeps it: a twin prepared the way TRL's `prepare_deepspeed` does
(the policy's DeepSpeed config, its ZeRO stage set to 0 unless it is 3, no optimizer), in this process (gloo, one
rank), and the bytes of its parameters counted where the engine left them, beside the estimate's item for the same
twin (helpers.estimate.reference).

Evidence kind: measured, from the engine's own tensors (the parameters' storage, or ZeRO-3's partitions `ds_tensor`).
One rank only: ZeRO-3's 1/N split is DeepSpeed's partitioning, which the scaled runs measure for the policy; what
this checks is what TRL's preparation makes of the reference (the stage, the dtype cast, where the partitions live).
"""

from __future__ import annotations

import copy
import importlib

import torch

from helpers import estimate, models
from helpers.measure import engines, procgroup, scaled
from helpers.training import TrainSetup


def reference_config(s: TrainSetup) -> dict:
    """The policy's DeepSpeed config as TRL 1.10's prepare_deepspeed turns it into the reference's: a copy, the stage
    0 unless it is 3, and (the engine built without an optimizer) no optimizer block."""
    config = copy.deepcopy(scaled.deepspeed_config(s))
    config.pop("optimizer", None)
    config.pop("zero_allow_untested_optimizer", None)
    if config["zero_optimization"]["stage"] != 3:
        config["zero_optimization"]["stage"] = 0
    return config


def placed(model: str, setup: TrainSetup) -> dict:
    """The reference of `setup` (run 'dpo', a DeepSpeed strategy, one GPU) on `model`'s twin: {'gpu', 'host'}: bytes
    of its parameters on each device as the engine keeps them, measured; 'estimate': the estimate's
    {'gpu', 'host'} for its reference item; 'stage': the stage it was prepared in."""
    import deepspeed
    import transformers

    twin, s = scaled.scaled_setup(model, setup)
    procgroup.ensure("gloo", 1)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    config = reference_config(s)
    net = engines.build_model(str(twin), s.replace(checkpointing="none"), torch.float32, "eager")
    assert isinstance(net, transformers.PreTrainedModel)
    engine, *_ = deepspeed.initialize(model=net, config=config)
    engine.eval()
    out = {"gpu": 0, "host": 0}
    stage = config["zero_optimization"]["stage"]
    for p in engine.module.parameters():
        t = p.ds_tensor if stage == 3 else p
        where = "host" if stage == 3 and s.offload_params else "gpu"   # (one CPU: the config says where it lives)
        out[where] += t.numel() * t.element_size()
        out.setdefault("dtypes", set()).add(str(t.dtype))
    est = estimate.run(str(twin), s, lifecycle=False)
    out["estimate"] = {d: sum(i["bytes"] for i in est.items if i["name"].startswith("reference model")
                              and i["device"] == d) for d in ("gpu", "host")}
    out["stage"], out["dtypes"], out["params"] = stage, sorted(out["dtypes"]), models.spec(str(twin)).params
    out["offload_device"] = (config["zero_optimization"].get("offload_param") or {}).get("device")
    return out

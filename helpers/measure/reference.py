"""DPO's reference model as DeepSpeed's real engine keeps it: a twin prepared the way TRL's `prepare_deepspeed` does
(the policy's DeepSpeed config, its ZeRO stage set to 0 unless it is 3, no optimizer), in this process (gloo, one
rank), and the bytes of its parameters counted where the engine left them, beside the estimate's item for the same
twin (helpers.estimate.reference).

Evidence kind: measured, from the engine's own tensors (the parameters' storage, or ZeRO-3's partitions `ds_tensor`).
One rank only: ZeRO-3's 1/N split is DeepSpeed's partitioning, which the scaled runs measure for the policy; what
this checks is what TRL's preparation makes of the reference (the stage, the dtype cast, where the partitions live).
The engine is built in a fresh process (`python -m helpers.measure.reference --worker`): DeepSpeed's initialisation
patches torch for the rest of a process's life, which would change later dry runs in the same process.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys

import torch

from helpers import estimate, models
from helpers.measure import children, engines, procgroup, scaled
from helpers.training import TrainSetup


def placed(model: str, setup: TrainSetup) -> dict:
    """The reference of `setup` (run 'dpo', a DeepSpeed strategy, one GPU) on `model`'s twin, measured in a fresh
    process: {'gpu', 'host'}: bytes of its parameters on each device as the engine keeps them; 'estimate': the
    estimate's {'gpu', 'host'} for its reference item; 'stage': the stage it was prepared in."""
    given = json.dumps({"model": model, "setup": dataclasses.asdict(setup)})
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = children.run([sys.executable, "-m", "helpers.measure.reference", "--worker", given], env, timeout=600,
                        what="the DPO reference measurement")
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])


def _placed_here(model: str, setup: TrainSetup) -> dict:
    """`placed`, in this process."""
    import deepspeed
    import transformers

    twin, s = scaled.scaled_setup(model, setup)
    procgroup.ensure("gloo", 1)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    config = scaled.reference_config(s)
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


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"] or len(sys.argv) != 3:
        sys.exit("usage: python -m helpers.measure.reference --worker '{\"model\": ..., \"setup\": {...}}'")
    given = json.loads(sys.argv[2])
    print(json.dumps(_placed_here(given["model"], TrainSetup(**given["setup"]))))

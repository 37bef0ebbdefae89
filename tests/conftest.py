import pytest

from helpers.training import TrainSetup


@pytest.fixture
def case1() -> TrainSetup:
    """Case 1 as reported: Llama-3-8B, ZeRO-2, one 80 GiB GPU, bf16, batch 1, seq 128, flash, checkpointing."""
    return TrainSetup(strategy="zero2", gpus=1, precision="bf16-mixed", batch=1, seq=128, attention="flash",
                      grad_checkpointing=True, gpu_gib=80)

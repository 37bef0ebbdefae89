"""The resume transient measured for real (helpers.measure.resume) against the estimate."""

import pytest

from helpers import cases
from helpers.errors import InputError
from helpers.measure import resume


def test_resume_transient_is_the_loaded_shard():
    r = resume.run("qwen2.5-72b", cases.setup(3, gpus=1), variants=("default",))
    e = r["estimate"]["host"]["phases"]
    expected = e["resume"] - e["setup"]
    measured = r["loads"]["default"]["transient"]
    assert abs(measured - expected) <= 0.15 * measured
    assert expected == 12 * r["params"]


@pytest.mark.parametrize("changes,needle", [
    (dict(strategy="fsdp2", offload_optimizer=True, offload_params=True, offload_ratio=None, gpus=2, save_16bit=True),
     "runs DeepSpeed ZeRO"),
    (dict(gpus=8), "gpus=8"),
])
def test_unsupported_set_ups_are_refused(changes, needle):
    with pytest.raises(InputError) as err:
        resume.run("qwen2.5-72b", cases.setup(3, **changes))
    assert needle in str(err.value)


def test_unknown_variant_is_named():
    with pytest.raises(InputError, match="unknown resume variant 'lazy'"):
        resume.run("qwen2.5-72b", cases.setup(3, gpus=1), variants=("lazy",))

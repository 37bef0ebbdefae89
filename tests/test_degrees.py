"""The parallel degrees, computed once (helpers.degrees) and asked by every layer."""

import pytest

from helpers import strategies
from helpers.degrees import Degrees, ceil_div
from helpers.errors import InputError
from helpers.training import TrainSetup


def test_ceil_div_is_exact_where_floating_point_is_not():
    assert [ceil_div(n, 4) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]
    big = 2**60 + 1                                   # float(big) / 3 rounds: math.ceil is off by one here
    assert ceil_div(big, 3) == (big + 2) // 3


@pytest.mark.parametrize("gpus,tp,cp", [(1, 1, 1), (8, 1, 1), (8, 2, 1), (8, 1, 2), (16, 2, 2), (64, 8, 4)])
def test_the_degrees_multiply_to_the_world_size(gpus, tp, cp):
    for name in strategies.names(lambda s: s.model_parallel):
        d = TrainSetup(strategy=name, gpus=gpus, tensor_parallel=tp, context_parallel=cp, seq=2048).degrees
        assert d.tp * d.cp * d.dp == d.world == gpus
        assert d.shard * d.replicate == d.dp * d.cp                  # states are either sharded or replicated there
        assert (d.shard, d.replicate) == ((d.dp * d.cp, 1) if strategies.get(name).sharded else (1, d.dp * d.cp))


def test_each_strategy_shards_over_what_its_engine_shards_over():
    for s in strategies.REGISTRY.values():
        gpus = 8 if s.multi_gpu else 1
        d = TrainSetup(strategy=s.name, gpus=gpus).degrees
        assert d.shard == (gpus if s.sharded else 1) and d.split(10**9 + 1) == ceil_div(10**9 + 1, d.shard)
    # FSDP2 on a 2-D mesh shards each TP-local tensor over the data-parallel ranks (dp_shard_cp)
    assert TrainSetup(strategy="fsdp2", gpus=16, tensor_parallel=4).degrees.shard == 4


def test_describe_names_the_mesh_only_when_there_is_one():
    assert Degrees(8).describe() == ""
    assert Degrees(16, tp=2, cp=2, sharded=True).describe() == " (TP 2 x CP 2 x DP 4)"


def test_a_world_the_model_parallel_group_does_not_divide_is_refused():
    with pytest.raises(InputError, match=r"gpus=6 must be a multiple of tensor_parallel x context_parallel = 4 x 1"):
        TrainSetup(strategy="fsdp2", gpus=6, tensor_parallel=4).validate()

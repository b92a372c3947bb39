"""SamplingParams refuses values that cannot be sampled; the Sampler never lets one row of a
batch fail the others."""

from __future__ import annotations

import math

import pytest
import torch

from mooncake_cli.engine import ModelError, SamplingParams
from mooncake_cli.engine.sampler import Sampler
from mooncake_cli.engine.sampling import MIN_TEMPERATURE


@pytest.mark.parametrize("kw", [
    {"temperature": math.nan}, {"temperature": math.inf}, {"temperature": -0.5},
    {"temperature": MIN_TEMPERATURE / 10}, {"top_p": math.nan}, {"seed": 2**64},
    {"seed": -1},
])
def test_unsamplable_params_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ModelError):
        SamplingParams(**kw)  # type: ignore[arg-type]


def test_edges_are_accepted() -> None:
    assert SamplingParams(temperature=MIN_TEMPERATURE, seed=2**64 - 1).seed == 2**64 - 1
    assert SamplingParams(temperature=0.0, seed=0).greedy


def test_the_smallest_temperature_samples_the_argmax_of_huge_logits() -> None:
    logits = torch.zeros(1, 50)
    logits[0, 7] = 3e38  # / 1e-5 overflows float32: computed in double
    logits[0, 8] = 2e38
    p = SamplingParams(temperature=MIN_TEMPERATURE, seed=1)
    gen = torch.Generator().manual_seed(1)
    assert Sampler()(logits, [p], [gen]) == [7]


def test_a_row_that_cannot_be_sampled_falls_back_to_its_argmax_alone() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    logits[1] = math.nan  # e.g. a model that overflowed on one sequence
    logits[1, 3] = 5.0
    params = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 3)]
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    out = Sampler()(logits, params, gens)
    alone = [Sampler()(logits[i:i + 1], [params[i]], [torch.Generator().manual_seed(s)])[0]
             for i, s in ((0, 1), (2, 3))]
    assert [out[0], out[2]] == alone  # the other rows drew as they would have alone
    assert 0 <= out[1] < 50

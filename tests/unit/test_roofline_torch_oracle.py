"""roofline.torch_counted_flops_per_token: torch's FlopCounterMode on the config's layers agrees
with the closed-form 2N + attention count of lib.registry.models, for every model in data/."""

import dataclasses

import pytest

from lib.perf import roofline
from lib.registry import models

pytest.importorskip("torch")


@pytest.mark.parametrize("key", models.model_names())
@pytest.mark.parametrize("context", [0, 1, 4096])
def test_counted_flops_match_the_closed_form(key, context):
    m = models.model(key)
    got = roofline.torch_counted_flops_per_token(key, context)
    # biases and MLA latent norms: lib files them as 2-FLOP matmul parameters, torch adds them (1e-4)
    assert got == pytest.approx(m.flops_per_token(context), rel=1e-4)


def test_gqa_attention_flops_follow_query_heads_not_kv_heads():
    m = models.model("llama-3.1-70b")
    mha = dataclasses.replace(m, num_kv_heads=m.num_attention_heads)
    extra = lambda mdl: (roofline.torch_counted_flops_per_token(mdl, 1000)  # noqa: E731
                         - roofline.torch_counted_flops_per_token(mdl, 0))
    assert extra(mha) == extra(m) == m.attention_flops_per_token(1000)


def test_counted_flops_see_a_wrong_count():
    """The oracle is not the formula: a model whose FFN lib would count wrongly differs."""
    m = models.model("llama-3.1-8b")
    wider = dataclasses.replace(m, intermediate_size=m.intermediate_size + 1)
    assert roofline.torch_counted_flops_per_token(wider, 0) - roofline.torch_counted_flops_per_token(m, 0) \
        == 2 * 3 * m.hidden_size * m.num_layers


def test_negative_context_refused():
    with pytest.raises(ValueError, match="context"):
        roofline.torch_counted_flops_per_token("llama-3.1-8b", -1)

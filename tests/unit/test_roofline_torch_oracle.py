"""roofline.torch_counted_flops_per_token: torch's FlopCounterMode on the config's layers agrees
with the closed-form 2N + attention count of lib.registry.models, for every model in data/, and with
the matmul-by-matmul count of the flops-per-token-from-config page (its weight matmuls from
prefill.weight_inventory), which the page's checks use in place of torch."""

import dataclasses

import pytest

from lib.perf import prefill, roofline
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


@pytest.mark.parametrize("key", models.model_names())
def test_the_inventory_weight_matmuls_are_what_torch_dispatches(key):
    """The page's second method: 2 FLOPs per active parameter of every matmul tensor in the inventory is
    torch's count at context 0 exactly (neither counts biases or norms)."""
    m = models.model(key)
    weights = sum(r.flops_per_token for r in prefill.weight_inventory(m) if r.kind == "matmul")
    assert roofline.torch_counted_flops_per_token(m, 0) == weights


@pytest.mark.parametrize("key", models.model_names())
def test_break_even_from_two_torch_counts(key):
    """The page's break-even c* = F(0) / (F(1) - F(0)), with F counted by torch, and its attention term at
    the page's default context (8,192 tokens, or the model's window)."""
    m = models.model(key)
    f0, f1 = (roofline.torch_counted_flops_per_token(m, c) for c in (0, 1))
    assert f0 / (f1 - f0) == pytest.approx(m.attention_breakeven_context(), rel=1e-4)
    c = min(8192, m.max_position_embeddings)
    assert roofline.torch_counted_flops_per_token(m, c) - f0 == pytest.approx(m.attention_flops_per_token(c), rel=1e-9, abs=1.0)

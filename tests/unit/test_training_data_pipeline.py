"""lib.training.data_pipeline: the pipeline's byte flows, shard sizing, tokenizer core-days, loader rates."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.registry import assumptions
from lib.training import data_pipeline as dp
from lib.training.flops import training_tokens_per_s


@given(st.integers(2, 2**40))
def test_token_bytes_is_numpys_smallest_unsigned_dtype(vocab):
    # Oracle: numpy's own choice of the smallest unsigned dtype that holds the largest id.
    want = np.min_scalar_type(vocab - 1).itemsize
    assert dp.token_bytes(vocab) == max(want, 1)
    assert (vocab - 1) < 2 ** (8 * dp.token_bytes(vocab))


@pytest.mark.parametrize("vocab, nbytes, bits", [(256, 1, 8), (257, 2, 9), (50_257, 2, 16), (65_536, 2, 16),
                                                 (65_537, 4, 17), (128_256, 4, 17)])
def test_token_bytes_at_the_edges(vocab, nbytes, bits):
    assert dp.token_bytes(vocab) == nbytes
    assert dp.packed_token_bits(vocab) == bits


def test_shard_bytes_equals_a_real_shard_on_disk(tmp_path):
    # Oracle: write the shard and measure the files; read it back through the memory map.
    rng = np.random.default_rng(0)
    for vocab in (32_000, 128_256):
        docs = [rng.integers(0, vocab, size=n) for n in rng.integers(1, 500, size=40)]
        info = dp.write_token_shard(tmp_path / f"s{vocab}", docs, vocab)
        on_disk = sum((tmp_path / f"s{vocab}{ext}").stat().st_size for ext in (".bin", ".idx"))
        assert info["bytes"] == on_disk == dp.shard_bytes(info["tokens"], vocab, docs=len(docs))
        ids, offsets = dp.read_token_shard(tmp_path / f"s{vocab}", vocab)
        for d, doc in enumerate(docs):
            assert np.array_equal(ids[offsets[d]:offsets[d + 1]], doc)
    with pytest.raises(ValueError, match="token ids"):
        dp.write_token_shard(tmp_path / "bad", [[70_000]], 65_536)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 50), st.integers(1, 16), st.integers(0, 40), st.integers(0, 3), st.sampled_from([1, 2, 4]))
def test_resume_reads_the_same_batches_for_any_world_size(n, batch_per_rank, step, seed, world):
    # Oracle: an uninterrupted run's batches, built by concatenating epoch permutations by hand.
    b = batch_per_rank * world
    stream = np.concatenate([dp.sample_order(n, seed, e) for e in range((step + 2) * b // n + 2)])
    want = stream[step * b:(step + 1) * b]
    assert np.array_equal(dp.global_batch_ids(step, b, n, seed), want)
    got = np.concatenate([dp.rank_batch_ids(step, r, world, b, n, seed) for r in range(world)])
    assert np.array_equal(got, want)
    assert sorted(dp.sample_order(n, seed, 1).tolist()) == list(range(n))


def test_pipeline_flows_and_backward_solve():
    stages = dp.pipeline_stages(128_256)
    assert [s.key for s in stages] == list(dp.STAGES)
    raw = dp.raw_bytes_for_tokens(15e12, stages)
    loads = dp.pipeline_loads(raw, stages)
    for a, b in itertools.pairwise(loads):
        assert b.bytes_in == pytest.approx(a.bytes_out)
    text = 15e12 * dp.bytes_per_token()
    assert loads[-1].bytes_in == pytest.approx(text)
    assert loads[-1].bytes_out == pytest.approx(15e12 * 4)  # uint32 ids
    assert sum(ld.core_s for ld in loads) == pytest.approx(sum(ld.bytes_in / ld.stage.core_bytes_per_s for ld in loads))
    top = dp.dominant_stages(loads, 1)[0]
    assert top.stage.key == "extract"  # reads every raw byte at the slowest rate per byte


@settings(max_examples=50, deadline=None)
@given(st.floats(0.01, 100), st.floats(1, 90), st.sampled_from([32_000, 128_256]))
def test_cores_scale_as_bytes_over_time(tokens_t, days, vocab):
    stages = dp.pipeline_stages(vocab)
    loads = dp.pipeline_loads(dp.raw_bytes_for_tokens(tokens_t * 1e12, stages), stages)
    for ld in loads:
        assert ld.cores_for(days * dp.DAY_S) * days == pytest.approx(ld.core_days)
        assert ld.bytes_per_s_for(days * dp.DAY_S) * days * dp.DAY_S == pytest.approx(ld.bytes_in)


def test_tokenizer_core_days_reproduces_the_seven_hundred():
    # 15T tokens x 3.94 bytes at 1 MB/s a core: about 684 core-days.
    days = dp.tokenizer_core_days(15e12 * 3.94)
    assert days == pytest.approx(15e12 * 3.94 / 1e6 / 86400)
    assert 600 < days < 800


def test_loader_bytes_per_s_calls_the_fleet_equation():
    rate = training_tokens_per_s("llama-3.1-405b", 8192, 16384, "h100-sxm", 0.43)
    assert dp.loader_bytes_per_s(rate, 128_256) == pytest.approx(4 * rate)
    assert dp.loader_bytes_per_s(rate, 128_256) < 20e6  # tens of MB/s for the whole job


def test_minhash_rate_and_shuffle():
    ns, w = assumptions.value("training_data.minhash_hash_ns"), assumptions.value("training_data.bytes_per_word")
    assert dp.minhash_core_bytes_per_s(112) == pytest.approx(w / (112 * ns * 1e-9))
    assert dp.minhash_core_bytes_per_s(9000) < dp.minhash_core_bytes_per_s(112)
    assert dp.minhash_shuffle_bytes(1e9, 14) == 1e9 * 14 * 16


def test_overrides_and_refusals():
    s = dp.pipeline_stages(128_256, extract_keep=0.2, tokenize_core_mb_s=3.0)
    assert s[0].keep == 0.2 and s[-1].core_bytes_per_s == 3e6
    with pytest.raises(ValueError, match="unknown stage override"):
        dp.pipeline_stages(128_256, extract_speed=1)
    with pytest.raises(ValueError, match="vocab_size"):
        dp.token_bytes(1)
    with pytest.raises(ValueError, match="tokens"):
        dp.raw_bytes_for_tokens(0, s)
    with pytest.raises(ValueError, match="deadline_s"):
        dp.pipeline_loads(1e15, s)[0].cores_for(0)
    with pytest.raises(ValueError, match="extract_keep"):
        dp.pipeline_stages(128_256, extract_keep=1.5)
    assert math.isfinite(dp.bytes_per_token(4.0, 1.0))


def test_a_pure_python_tokenizer_is_slower_than_the_assumed_rust_rate():
    # Measured: lib.decoding's longest-match toy tokenizer (pure Python) on this machine, best of 3.
    import time

    from lib.decoding.tokenizer import toy_tokenizer

    tok = toy_tokenizer()
    text = " ".join(f"the quick brown fox jumps over the lazy dog {i}" for i in range(2000))
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        tok.encode(text)
        best = min(best, time.perf_counter() - t)
    mb_s = len(text.encode()) / best / 1e6
    assert 0.005 < mb_s < assumptions.value("training_data.tokenize_core_mb_s"), f"measured {mb_s:.3f} MB/s"


_CONFIGS = st.builds(dp.LoaderConfig, st.booleans(), st.sampled_from(["network_storage", "local_nvme"]), st.booleans(),
                     st.integers(0, 8), st.booleans())


@settings(max_examples=60, deadline=None)
@given(_CONFIGS, st.integers(1, 64), st.sampled_from([512, 4096, 32768]), st.floats(0.01, 30))
def test_loader_fixes_never_add_stall_and_the_ladder_ends_clean(cfg, samples, tokens, step_s):
    ladder = dp.loader_fix_ladder(cfg, "h100-sxm", samples, tokens, step_s)
    assert [s for s, _, _ in ladder[1:]] and sorted(s for s, _, _ in ladder[1:]) == sorted(dp.LOADER_SINKS)
    for (_, _, a), (_, _, b) in itertools.pairwise(ladder):
        assert b.exposed_s <= a.exposed_s + 1e-15
    end = ladder[-1][1]
    assert end.tokenized and end.batched_reads and end.pinned and end.workers >= 2


@settings(max_examples=40, deadline=None)
@given(_CONFIGS, st.integers(1, 32), st.floats(0.001, 2.0))
def test_loader_stall_matches_an_event_simulation(cfg, samples, step_s):
    # Oracle: workers making batches back to back, a step loop taking them in order (steady state).
    st_ = dp.loader_step(cfg, "h100-sxm", samples, 4096, step_s)
    work, copy = st_.worker_s, st_.sinks["copy"]
    t_free, stalls = 0.0, []
    for k in range(600):
        ready = t_free + work if cfg.workers == 0 else (k // cfg.workers + 1) * work
        start = max(t_free, ready) + (0.0 if cfg.pinned else copy)
        stalls.append(start - t_free)
        t_free = start + step_s
    assert np.mean(stalls[300:]) == pytest.approx(st_.exposed_s, rel=0.05, abs=1e-3 * step_s)


def test_loader_sinks_by_hand():
    cfg = dp.LoaderConfig()
    s = dp.loader_step(cfg, "h100-sxm", 8, 4096, 1.0)
    text = 8 * 4096 * dp.bytes_per_token()
    assert s.sinks["tokenize"] == pytest.approx(text / 1e6 + text / 50e6)
    assert s.sinks["python"] == pytest.approx(8 * 50e-6)
    assert s.exposed_s == pytest.approx(sum(s.sinks.values()))  # no workers, pageable copy: all serial
    with pytest.raises(ValueError, match="storage"):
        dp.loader_step(dp.LoaderConfig(storage="tape"), "h100-sxm", 8, 4096, 1.0)


def test_tokenize_job_view_states_the_training_rate_it_was_given():
    """A small fleet trains well under 0.01 million tokens/s: the explorer's range takes it, and its
    caption quotes that rate and a core-day count under one with its fraction (not rounded to 0 or 1)."""
    from lib.book.widgets import _REGISTRY
    from lib.explorers.training_data import tokenize_job

    assert _REGISTRY["training.tokenize_job"].domains["train_mtok_s"].valid(3e-4)
    view = tokenize_job(0.1, 3.94, 20.0, 16, 3e-4)
    assert "3.00e-4 million tokens/s" in view.caption
    core_days = view.values["core_days"]
    assert 0 < core_days < 1
    assert "0 core-days" not in view.caption and "1 core-days" not in view.caption

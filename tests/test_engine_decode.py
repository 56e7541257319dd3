"""Self-speculative decoding is lossless, batched and ragged, and records valid traces.

- Greedy: self-speculative output equals plain greedy decoding token for token, for every
  policy, several k and s, a ragged batch (tiny random-weight model; the shipped policies at
  contexts past Vegas' 256-position floor, and small-budget variants so drafts really are
  sparse), through the torch path and through the Triton kernels (interpreter) — and on the
  real SmolLM2 when it can be fetched.
- Sampling: the distribution of the first four generated tokens of 10 000 sequences equals
  plain decoding's exact distribution (enumerated over a 5-token vocabulary), by Pearson's
  chi-square; the same test rejects a sampler that skips the correction.
- Traces, forced acceptance, adaptive k, EOS, prefill reuse, errors.
"""
import dataclasses
import itertools

import numpy as np
import pytest
import torch
from scipy import stats

import specsim.engine.decode as decode
from specsim.engine import (AdaptiveK, Engine, SamplingParams, build_model, forced_prompts,
                            plain_decode, speculative_decode)
from specsim.engine.sampling import GREEDY, choose, next_token, probabilities, sample
from specsim.errors import SpecsimError
from specsim.kernels.selection import vegas_select
from specsim.policies import Policy
from specsim.settings import EngineSettings
from specsim.traces.format import RequestTrace, make_header, read_trace, write_trace

#: The CPU runs of the Triton kernels go through Triton's interpreter, which a machine with a
#: GPU does not use: there tests/test_engine_gpu.py runs the same paths on CUDA.
INTERPRETED_ONLY = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="CPU tensors through Triton's interpreter")

TINY = dict(model_type="qwen3", vocab_size=256, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
            max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False)

#: Small-budget versions of the shipped policies, so that short contexts are really sparse.
SMALL = {
    "vegas": Policy("vegas", min_selected=8, recent=4, collected_rows=2,
                    budget_includes_recent=False),
    "last-token": Policy("last-token", min_selected=8, recent=4, collected_rows=1,
                         budget_includes_recent=False),
    "sparsespec": Policy("sparsespec", sink=2, recent=4, per_kv_head=True, collected_rows=16),
    "streamingllm": Policy("streamingllm", sink=2),
    "quest": Policy("quest", page_size=16, per_kv_head=True, rescore_every_draft=True),
}


@pytest.fixture(scope="module")
def tiny():
    return build_model(TINY, seed=1, std=0.1)


def prompts_of(lengths, vocab=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def ragged():
    return prompts_of((600, 651, 707))


@pytest.fixture(scope="module")
def plain_ragged(tiny, ragged):
    return plain_decode(tiny, ragged, 40)


def check_traces(result, prompts, k):
    for trace, prompt in zip(result.traces, prompts):
        assert trace.context[0] == len(prompt)
        assert np.all(np.diff(trace.context) == trace.m[:-1] + 1)
        assert np.all(trace.k <= k) and np.all(trace.m <= trace.k)
        for m, k_i, accept, h in zip(trace.m, trace.k, trace.accept_prob, trace.entropy):
            assert len(accept) == len(h) == k_i and np.all(h >= 0)
            if m < k_i:  # greedy: the leading ones are the accepted drafts
                assert np.all(accept[:m] == 1) and accept[m] == 0


@pytest.mark.parametrize("policy", ["vegas", "last-token", "sparsespec", "streamingllm",
                                    "quest", "full"])
def test_greedy_lossless_shipped_policies(tiny, ragged, plain_ragged, policy):
    for k, s in ((3, 0.3), (6, 0.6)):
        result = speculative_decode(tiny, ragged, 40, policy=policy, k=k, s=s)
        assert result.tokens == plain_ragged.tokens, (policy, k, s)
        check_traces(result, ragged, k)


@pytest.mark.parametrize("policy", sorted(SMALL))
def test_greedy_lossless_sparse_drafts(tiny, ragged, plain_ragged, policy):
    accepted = []
    for k, s in ((1, 0.05), (4, 0.1), (9, 0.3)):
        result = speculative_decode(tiny, ragged, 40, policy=SMALL[policy], k=k, s=s)
        assert result.tokens == plain_ragged.tokens, (policy, k, s)
        check_traces(result, ragged, k)
        accepted += [m for t in result.traces for m in t.m.tolist()]
        assert result.traces[0].policy == policy and result.traces[0].s == s
    assert 0 < np.mean(accepted) and min(accepted) == 0   # both outcomes exercised


@INTERPRETED_ONLY
@pytest.mark.parametrize("policy", ["vegas", "sparsespec", "quest"])
def test_greedy_lossless_through_triton_kernels(policy, monkeypatch):
    """The GPU path's kernel calls (verify with collected logits + lse, sparse drafts, the
    attention-mass selection, the one-kernel cache append of every draft step and every
    verify pass, which keeps Quest's page bounds incrementally), run by Triton's
    interpreter at head_dim 64."""
    config = dict(TINY, head_dim=64, num_attention_heads=2, num_key_value_heads=1,
                  vocab_size=128)
    model = build_model(config, seed=2, std=0.1)
    prompts = prompts_of((70, 93), vocab=128)
    expected = plain_decode(model, prompts, 10).tokens
    from specsim.kernels.kv_cache import KVCache
    calls, fused_write = [], KVCache._append_rows
    monkeypatch.setattr(KVCache, "_append_rows",
                        lambda self, layer, k, v: calls.append(k.shape[2])
                        or fused_write(self, layer, k, v))
    result = speculative_decode(model, prompts, 10, policy=SMALL[policy], k=3, s=0.3,
                                use_triton=True)
    assert result.tokens == expected
    assert 1 in calls                     # the draft steps' writes
    assert 4 in calls                     # the verify passes' (k + 1 rows)


def test_batch_sequences_are_independent(tiny, ragged, plain_ragged):
    """Each sequence of a batch gets what it gets alone (per-sequence acceptance)."""
    alone = speculative_decode(tiny, ragged[1:2], 40, policy=SMALL["vegas"], k=4, s=0.1)
    batched = speculative_decode(tiny, ragged, 40, policy=SMALL["vegas"], k=4, s=0.1)
    assert alone.tokens[0] == batched.tokens[1] == plain_ragged.tokens[1]
    assert alone.traces[0].m.tolist() == batched.traces[1].m.tolist()


def test_eos_stops_each_sequence(tiny, ragged, plain_ragged):
    eos = plain_ragged.tokens[0][7]
    plain = plain_decode(tiny, ragged, 40, eos_token_ids=[eos])
    spec = speculative_decode(tiny, ragged, 40, policy=SMALL["quest"], k=5, s=0.2,
                              eos_token_ids=[eos])
    assert spec.tokens == plain.tokens
    assert plain.tokens[0][-1] == eos and len(plain.tokens[0]) <= 8


# --------------------------------------------------------------------------------------------
# sampling: the output distribution equals plain decoding's
# --------------------------------------------------------------------------------------------

VOCAB, PROMPT, STEPS, SAMPLES = 5, 40, 4, 10000
SAMPLING = SamplingParams(temperature=0.9, top_p=0.9, top_k=4)


@pytest.fixture(scope="module")
def small_vocab():
    config = dict(TINY, vocab_size=VOCAB, num_hidden_layers=2)
    return build_model(config, seed=4, std=0.5)


def exact_distribution(model, prompt) -> dict[tuple, float]:
    """P(first STEPS tokens) under plain sampling, by enumerating every prefix."""
    probs = {(): 1.0}
    for step in range(STEPS):
        prefixes = list(probs)
        seqs = [prompt + list(p) for p in prefixes]
        engine = Engine(model, batch=len(seqs), max_len=len(seqs[0]) + 2, policy="full",
                        k_max=1)
        with torch.inference_mode():
            logits, _ = engine.prefill(seqs)
        nxt = probabilities(logits, SAMPLING).double().numpy()
        probs = {p + (t,): probs[p] * nxt[i, t] for i, p in enumerate(prefixes)
                 for t in range(VOCAB) if nxt[i, t] > 0}
    return probs


def sampled_counts(model, prompt, policy, k, s, seed) -> tuple[dict[tuple, int], list[int]]:
    """Counts of the first STEPS tokens of SAMPLES sampled sequences (one prefill, shared)."""
    max_len = PROMPT + 2 * STEPS + 2 * k
    state = Engine(model, batch=1, max_len=max_len, policy=policy, s=s, k_max=k).generate(
        [prompt], 1, k=k, keep_prefill=True).prefill
    engine = Engine(model, batch=SAMPLES, max_len=max_len, policy=policy, s=s, k_max=k)
    result = engine.generate([prompt] * SAMPLES, STEPS, k=k, sampling=SAMPLING, seed=seed,
                             prefill=state.subset([0] * SAMPLES))
    counts: dict[tuple, int] = {}
    for tokens in result.tokens:
        counts[tuple(tokens[:STEPS])] = counts.get(tuple(tokens[:STEPS]), 0) + 1
    return counts, [m for t in result.traces for m in t.m.tolist()]


def chi_square(counts: dict, exact: dict) -> float:
    """Pearson's test; outcomes expected fewer than 5 times are pooled into one bin; an
    outcome plain decoding cannot produce gives 0."""
    if not set(counts) <= set(exact):
        return 0.0
    keys = sorted(exact, key=exact.get, reverse=True)
    expected = np.array([exact[key] for key in keys]) * SAMPLES
    observed = np.array([counts.get(key, 0) for key in keys], dtype=float)
    small = expected < 5
    expected = np.append(expected[~small], expected[small].sum())
    observed = np.append(observed[~small], observed[small].sum())
    return float(stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


@pytest.mark.parametrize("policy,k,s", [
    ("vegas", 2, 0.1),
    # the acceptance test is the same code for every policy (the drafts differ): Vegas' case
    # runs by default, these two with -m slow
    pytest.param("quest", 3, 0.3, marks=pytest.mark.slow),
    pytest.param("sparsespec", 3, 0.2, marks=pytest.mark.slow)])
def test_sampling_distribution_equals_plain(small_vocab, policy, k, s):
    prompt = prompts_of((PROMPT,), vocab=VOCAB, seed=5)[0]
    exact = exact_distribution(small_vocab, prompt)
    counts, accepted = sampled_counts(small_vocab, prompt, SMALL[policy], k, s, seed=11)
    assert 0 < np.mean(accepted) < k and min(accepted) == 0  # drafts differ from the target
    assert chi_square(counts, exact) > 1e-3
    tv = 0.5 * sum(abs(counts.get(key, 0) / SAMPLES - p) for key, p in exact.items())
    assert tv < 0.06


@pytest.mark.parametrize("params", [GREEDY, SAMPLING], ids=["greedy", "sampled"])
def test_next_token_draws_what_choose_draws(params):
    """The token alone (the plain step, prefill, refills) is ``choose``'s token: the argmax
    when greedy, else the same draw from the same generator state."""
    logits = torch.randn(5, 3, 50, generator=torch.Generator().manual_seed(3))
    token, probs = choose(logits, params, torch.Generator().manual_seed(9))
    assert torch.equal(next_token(logits, params, torch.Generator().manual_seed(9)), token)
    assert probs.shape == logits.shape


def test_sampling_test_rejects_an_uncorrected_draft(small_vocab, monkeypatch):
    """Power check: accepting every draft (no min(1, p/q) test) is caught."""
    def accept_all(drafts, draft_probs, target_probs, generator=None, k_seq=None):
        batch, k = drafts.shape
        m = torch.full((batch,), k) if k_seq is None else k_seq.clone()
        token = sample(target_probs[torch.arange(batch), m], generator)
        return m, token, torch.ones(batch, k)

    from specsim.engine import loop
    monkeypatch.setattr(loop, "accept_speculative", accept_all)
    prompt = prompts_of((PROMPT,), vocab=VOCAB, seed=5)[0]
    exact = exact_distribution(small_vocab, prompt)
    counts, _ = sampled_counts(small_vocab, prompt, SMALL["vegas"], 2, 0.1, seed=11)
    assert chi_square(counts, exact) < 1e-6


# --------------------------------------------------------------------------------------------
# traces, forced acceptance, adaptive k, prefill reuse, errors
# --------------------------------------------------------------------------------------------


def test_traces_write_and_read_back(tiny, ragged, tmp_path):
    result = speculative_decode(tiny, ragged, 30, policy=SMALL["sparsespec"], k=4, s=0.2,
                                request_ids=["a", "b", "c"])
    path = tmp_path / "t.jsonl"
    write_trace(path, make_header(source="test", model="tiny"), result.traces)
    back = read_trace(path)
    assert [r.id for r in back.requests] == ["a", "b", "c"]
    assert back.requests[1].m.tolist() == result.traces[1].m.tolist()
    assert result.tokens_per_iteration == pytest.approx(
        sum(t.tokens for t in result.traces) / sum(t.iterations for t in result.traces))


def test_forced_acceptance_replays_m(tiny, ragged):
    recorded = speculative_decode(tiny, ragged, 30, policy=SMALL["vegas"], k=5, s=0.1).traces
    prompts = forced_prompts(recorded, TINY["vocab_size"], seed=1)
    assert [len(p) for p in prompts] == [len(p) for p in ragged]
    engine = Engine(tiny, batch=3, max_len=800, policy="streamingllm", s=0.05, k_max=5)
    replay = engine.generate(prompts, 1, forced=recorded)
    for got, want in zip(replay.traces, recorded):
        assert got.m.tolist() == want.m.tolist() and got.k.tolist() == want.k.tolist()
        assert got.context.tolist() == want.context.tolist()
    assert replay.forwards["verify"] == max(t.iterations for t in recorded)


def test_forced_iterations_build_no_device_tensor_from_host_lists(tiny, ragged, monkeypatch):
    """Each forced m goes to the device through the engine's staging buffer: on a GPU a
    ``torch.tensor(list, device=...)`` is a pageable copy that waits for the verify pass (the
    stall the calibration's forced loops carried). None is built while the loop runs."""
    recorded = speculative_decode(tiny, ragged, 20, policy=SMALL["vegas"], k=4, s=0.1).traces
    engine = Engine(tiny, batch=3, max_len=800, policy="vegas", s=0.1, k_max=4)
    built, real = [], torch.tensor

    def spy(*args, **kwargs):
        if kwargs.get("device") is not None:
            built.append(args[0] if args else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(decode.torch, "tensor", spy)
    replay = engine.generate(forced_prompts(recorded, TINY["vocab_size"], seed=3), 1,
                             forced=recorded)
    # the prompts (one prefill each) and the first active mask, at the run's start; none per
    # iteration (before the staging buffer: one more per iteration)
    assert replay.iterations > 5 and len(built) <= len(ragged) + 1, built


def test_forced_replay_of_per_sequence_draft_lengths(tiny, ragged):
    """Traces whose k differs between sequences and iterations (the adaptive controller's)
    replay exactly: each iteration's k and m go to the device through the engine's staging
    buffers, which the next iteration overwrites."""
    recorded = speculative_decode(tiny, ragged, 40, policy=SMALL["vegas"], k=8, s=0.6,
                                  adaptive=AdaptiveK(gamma=0.05)).traces
    ks = [t.k.tolist() for t in recorded]
    assert any(len(set(col)) > 1 for col in zip(*[k[:min(map(len, ks))] for k in ks]))
    prompts = forced_prompts(recorded, TINY["vocab_size"], seed=2)
    engine = Engine(tiny, batch=3, max_len=800, policy="vegas", s=0.1, k_max=8)
    replay = engine.generate(prompts, 1, forced=recorded)
    for got, want in zip(replay.traces, recorded):
        assert got.k.tolist() == want.k.tolist() and got.m.tolist() == want.m.tolist()
    with torch.inference_mode():                   # as inside generate
        staged = engine.transfers.to_device("k", [5, 0, 7])
        assert staged.tolist() == [5, 0, 7]
        assert engine.transfers.to_device("k", [1, 2, 3]).data_ptr() == staged.data_ptr()


def test_a_finished_forced_slot_with_a_longer_k_replays_within_the_iteration(tiny, ragged):
    """A slot whose trace has ended keeps its last k and m (4 of 4) while the others go on
    at k = 1: its forced m stays within the iteration's one draft (it indexed past the
    verify logits), and the others replay theirs."""
    traces = [RequestTrace("a", "vegas", 0.1, np.array([len(ragged[0])]), np.array([4]),
                           np.array([4])),
              RequestTrace("b", "vegas", 0.1, len(ragged[1]) + np.arange(3) * 2,
                           np.full(3, 1), np.full(3, 1)),
              RequestTrace("c", "vegas", 0.1, len(ragged[2]) + np.arange(3) * 2,
                           np.full(3, 1), np.array([1, 0, 1]))]
    engine = Engine(tiny, batch=3, max_len=800, policy="vegas", s=0.1, k_max=4)
    replay = engine.generate(forced_prompts(traces, TINY["vocab_size"], seed=4), 1,
                             forced=traces)
    assert [t.m.tolist() for t in replay.traces] == [[4], [1, 1, 1], [1, 0, 1]]
    assert replay.iterations == 3


def test_adaptive_k_uses_the_analytical_controller(tiny, ragged, plain_ragged, monkeypatch):
    calls = []
    original = decode.adaptive_k

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(decode, "adaptive_k", spy)
    for policy, s in (("full", 1.0), (SMALL["vegas"], 0.6)):
        result = speculative_decode(tiny, ragged, 40, policy=policy, k=8, s=s,
                                    adaptive=AdaptiveK(gamma=0.05))
        assert result.tokens == plain_ragged.tokens and calls
        check_traces(result, ragged, 8)
    # drafts always accepted (full attention): the accepted centre settles, k grows
    ks = [k for t in speculative_decode(tiny, ragged, 40, policy="full", k=8,
                                        adaptive=AdaptiveK(gamma=0.05)).traces
          for k in t.k.tolist()]
    assert len(set(ks)) > 2 and max(ks) <= 8 and ks[-1] > ks[0]


def test_adaptive_k_stop_rule():
    from specsim.analytical import EntropyCentres
    rule = AdaptiveK(gamma=0.05, start=EntropyCentres(accepted=0.5, rejected=3.0))
    assert not rule.stop([0.4], rule.start, 8)        # confident draft: keep drafting
    assert rule.stop([0.4, 3.2], rule.start, 8)       # looks like a rejected one: stop
    assert rule.stop([0.4] * 8, rule.start, 8)        # k_max reached
    moved = rule.update(rule.start, [0.4, 0.6, 2.9], m=2, k=3)
    assert moved.accepted == pytest.approx(0.9 * 0.5 + 0.1 * 0.5)
    assert moved.rejected == pytest.approx(0.9 * 3.0 + 0.1 * 2.9)


def check_prefill_reuse(model, prompts, policy: str, new_tokens: int,
                        settings: EngineSettings = EngineSettings()):
    """A run keeping its prefill, then the last two prompts again from that prefill on a
    smaller engine: the same tokens and acceptance. Returns the first run."""
    first = Engine(model, batch=3, max_len=760, policy=policy, s=0.1, k_max=4,
                   settings=settings)
    a = first.generate(prompts, new_tokens, k=4, keep_prefill=True)
    other = Engine(model, batch=2, max_len=760, policy=policy, s=0.1, k_max=4,
                   settings=settings)
    b = other.generate(prompts[1:], new_tokens, k=4, prefill=a.prefill.subset([1, 2]))
    assert b.tokens == a.tokens[1:]
    assert [t.m.tolist() for t in b.traces] == [t.m.tolist() for t in a.traces[1:]]
    return a


def test_prefill_reuse_gives_the_same_run(tiny, ragged):
    check_prefill_reuse(tiny, ragged, "quest", 20)


def test_timing_and_bytes(tiny, ragged):
    result = speculative_decode(tiny, ragged, 20, policy="vegas", k=4, s=0.3)
    assert set(result.timing) >= {"prefill", "draft", "verify", "selection", "other"}
    assert result.forwards["verify"] == result.iterations
    assert result.bytes_moved["draft"] > 0 and result.bandwidth() > 0
    assert result.tokens_per_second > 0


def test_iteration_log_and_steady_window(tiny, ragged):
    """One log row per iteration: its wall time, the sequences active at its start, the tokens
    it emitted; the steady window is the iterations where the whole (static) batch decodes."""
    recorded = speculative_decode(tiny, ragged, 30, policy=SMALL["vegas"], k=5, s=0.1).traces
    # sequences of 4, 6 and 9 iterations: a tail of 5 iterations with fewer than 3 active
    forced = [dataclasses.replace(t, context=t.context[:n], k=t.k[:n], m=t.m[:n])
              for t, n in zip(recorded, (4, 6, 9))]
    prompts = forced_prompts(forced, TINY["vocab_size"], seed=1)
    engine = Engine(tiny, batch=3, max_len=800, policy="vegas", s=0.1, k_max=5)
    gen = engine.generate(prompts, 1, forced=forced)
    assert len(gen.steps) == gen.iterations == 9
    assert [a for _, a, _ in gen.steps] == [3] * 4 + [2] * 2 + [1] * 3
    assert sum(n for _, _, n in gen.steps) == gen.new_tokens - 3   # + the prefill's token each
    want = [sum(int(t.m[i]) + 1 for t in forced if i < t.iterations) for i in range(9)]
    assert [n for _, _, n in gen.steps] == want
    assert all(sec > 0 for sec, _, _ in gen.steps)
    head = gen.steps[:4]
    assert gen.steady_tokens_per_second == pytest.approx(
        sum(n for _, _, n in head) / sum(sec for sec, _, _ in head))
    assert sum(sec for sec, _, _ in gen.steps) <= gen.wall_seconds
    plain = Engine(tiny, batch=3, max_len=800, policy="full", k_max=1).generate(
        prompts, 5, speculative=False)
    assert [(a, n) for _, a, n in plain.steps] == [(3, 3)] * 4
    assert plain.steady_tokens_per_second > 0


def test_engine_errors(tiny):
    engine = Engine(tiny, batch=1, max_len=100, policy="vegas", k_max=4)
    with pytest.raises(SpecsimError, match="k must lie"):
        engine.generate([[1, 2, 3]], 5, k=5)
    with pytest.raises(SpecsimError, match="cache positions"):
        engine.generate([[1] * 110], 20)
    with pytest.raises(SpecsimError, match="at least 2"):
        Engine(tiny, batch=2, max_len=100, policy="vegas", k_max=4).generate([[1, 2]], 5)
    with pytest.raises(SpecsimError, match="request ids"):
        engine.generate([[1], [2]], 5, request_ids=["a"])
    with pytest.raises(SpecsimError, match="one trace per prompt"):
        engine.generate([[1], [2]], 5, forced=[])
    with pytest.raises(SpecsimError, match="unknown selection policy"):
        Engine(tiny, batch=1, max_len=100, policy="magic")


def test_a_finished_sequence_never_writes_past_the_cache(tiny, monkeypatch):
    """Sequence 0 (the longest prompt) accepts all k every iteration and finishes with k + 1
    tokens past its output; sequence 1 accepts none and goes on, so sequence 0 keeps drafting
    and verifying on its grown cache. An engine sized by ``cache_positions`` holds it (an index
    past max_len raised here, and was a device-side assert on the GPU)."""
    from specsim.engine import loop

    k, max_new = 5, 8
    real = loop.accept_greedy

    def skewed(drafts, logits, k_t, forced_m=None):
        _, _, accept = real(drafts, logits, k_t)
        m = torch.stack([k_t[0], torch.zeros_like(k_t[1])])
        return m, logits.argmax(-1).gather(1, m[:, None]).squeeze(1), accept

    monkeypatch.setattr(loop, "accept_greedy", skewed)
    prompts = prompts_of([30, 12])
    need = decode.cache_positions(30, max_new, k)            # 49: one past a whole page
    # 64 positions: the cache is padded to whole pages only (not to 128), as tight as it gets
    tiny = build_model(dict(TINY, max_position_embeddings=64), seed=1, std=0.1)
    engine = Engine(tiny, batch=2, max_len=need, policy=SMALL["vegas"], s=0.1, k_max=k)
    assert engine.max_len == 64
    peak = [0]
    extend = engine.cache.extend

    def tracked(n):
        extend(n)
        peak[0] = max(peak[0], int(engine.cache.lengths.max()))

    engine.cache.extend = tracked
    gen = engine.generate(prompts, max_new, k=k)
    assert [len(t) for t in gen.tokens] == [max_new, max_new]
    assert gen.iterations == max_new - 1                      # sequence 1: one token each
    assert int(engine.cache.lengths[0]) == 30 + 2 * (k + 1)
    # the old bound (prompt + max_new + k + 2) was too small; the new one holds the peak
    assert 30 + max_new + k + 2 < peak[0] <= need
    with pytest.raises(SpecsimError, match="cache positions"):
        Engine(tiny, batch=2, max_len=need - 1, policy=SMALL["vegas"], s=0.1,
               k_max=k).generate(prompts, max_new, k=k)


# --------------------------------------------------------------------------------------------
# the real SmolLM2 (skipped when it cannot be fetched)
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_greedy_lossless():
    from specsim.engine.fetch import fetch_model
    from specsim.engine.prompts import Tokenizer
    try:
        folder = fetch_model("smollm2")
    except Exception as exc:
        pytest.skip(f"SmolLM2 could not be fetched: {exc}")
    model = build_model(folder, weights="real")
    tokenizer = Tokenizer(folder)
    import inspect
    import json
    prompt = tokenizer.chat("Summarise this code:\n" + inspect.getsource(json.encoder)[:2400])
    plain = plain_decode(model, [prompt], 16)
    assert len(prompt) > 500
    for policy, k in (("vegas", 6), ("quest", 4)):
        result = speculative_decode(model, [prompt], 16, policy=policy, k=k, s=0.05)
        assert result.tokens == plain.tokens, policy
        assert result.tokens_per_iteration > 1.5    # a real model's drafts are accepted


def test_grid_of_k_and_s_small_budget(tiny):
    """Any k (1..12) and s: lossless on a short ragged batch."""
    prompts = prompts_of((50, 77), seed=3)
    expected = plain_decode(tiny, prompts, 24).tokens
    for k, s in itertools.product((1, 2, 7, 12), (0.02, 0.5, 1.0)):
        got = speculative_decode(tiny, prompts, 24, policy=SMALL["vegas"], k=k, s=s).tokens
        assert got == expected, (k, s)


def test_random_prefill_for_timing(tiny):
    """Timing runs at real scale skip the prefill: random cache contents, same shapes."""
    for policy in ("quest", "sparsespec", "vegas"):
        engine = Engine(tiny, batch=2, max_len=700, policy=policy, s=0.1, k_max=4)
        result = engine.generate(prompts_of((500, 640)), 12, k=4, prefill="random")
        assert [len(t) for t in result.tokens] == [12, 12]
        assert result.traces[1].context[0] == 640


def test_counterfactual_truncation(tiny, ragged):
    from specsim.engine.decode import truncate_trace
    import numpy as np

    from specsim.traces.acceptance import replay_tokens, token_acceptance
    recorded = speculative_decode(tiny, ragged[:1], 30, policy="full", k=6).traces[0]
    short = truncate_trace(recorded, 2)
    # followed token by token, as predict replays it, with the contexts its iterations start at
    assert short.k.tolist() == [2] * short.iterations
    assert short.m.tolist() == replay_tokens(token_acceptance(recorded), 2).tolist()
    assert short.context[0] == recorded.context[0]
    assert np.array_equal(np.diff(short.context), short.m[:-1] + 1)
    assert short.tokens >= recorded.tokens
    # a clustered record: the token replay differs from min(m, k) (which starts every
    # replayed iteration after a recorded rejection)
    from specsim.traces.format import RequestTrace
    clustered = RequestTrace("c", "vegas", 0.1, 100 + np.arange(4) * 4, np.full(4, 4),
                             np.array([4, 0, 0, 3]))
    assert truncate_trace(clustered, 2).m.tolist() == [2, 2, 0, 2, 0]   # min(m, k): 2, 0, 0, 2
    varied = RequestTrace("v", "vegas", 0.1, np.array([100, 103, 105]), np.array([3, 2, 3]),
                          np.array([2, 1, 3]))
    assert truncate_trace(varied, 2).m.tolist() == [2, 1, 2]       # variable k: min(m, k)
    # replay at k = 2: the forced run drafts 2 per iteration
    engine = Engine(tiny, batch=1, max_len=800, policy="vegas", s=0.2, k_max=2)
    replay = engine.generate(ragged[:1], 1, forced=[short])
    assert replay.traces[0].m.tolist() == short.m.tolist()


# --------------------------------------------------------------------------------------------
# continuous batching: queued prompts take the slots of finished sequences
# --------------------------------------------------------------------------------------------


#: The tests against the static runs of the queued prompts run on one pytest-xdist
#: worker, which decodes them once.
ON_THE_STATIC_RUNS = pytest.mark.xdist_group("static-queued")


@pytest.fixture(scope="module")
def queued(ragged):
    """Six prompts of six lengths, for two or three slots."""
    return ragged + [p[:-37] for p in ragged]


@pytest.fixture(scope="module")
def static_queued(tiny, queued):
    """Every prompt in its own slot (a static batch of six): the reference per prompt."""
    runs = {name: speculative_decode(tiny, queued, 24, policy=SMALL[name], k=4, s=0.1)
            for name in SMALL}
    return plain_decode(tiny, queued, 24).tokens, runs


@ON_THE_STATIC_RUNS
@pytest.mark.parametrize("policy", sorted(SMALL))
def test_queued_prompts_decode_as_if_alone(tiny, queued, static_queued, policy):
    """Six prompts through two slots: each output equals plain decoding, and each prompt's
    acceptance (m per iteration) equals its run in a slot of its own — so a refilled slot
    drafts from a selection built from its own prompt rows, and the slot beside it keeps the
    lists its last verify gave it (last-token and SparseSpec-L rebuild them differently from
    prompt rows)."""
    expected, static = static_queued
    ids = [f"q{i}" for i in range(len(queued))]
    engine = Engine(tiny, batch=2, max_len=760, policy=SMALL[policy], s=0.1, k_max=4)
    gen = engine.generate(queued, 24, k=4, request_ids=ids)
    assert gen.tokens == expected
    assert [t.id for t in gen.traces] == ids
    check_traces(gen, queued, 4)
    # every answer's 23 iteration tokens, over its iterations: the last iteration's tokens past
    # max_new_tokens are not counted (tokens_per_iteration counts them)
    assert gen.request_iterations == [t.iterations for t in gen.traces]
    assert gen.emitted_tokens_per_iteration == pytest.approx(
        23 * len(queued) / sum(t.iterations for t in gen.traces))
    assert gen.emitted_tokens_per_iteration <= gen.tokens_per_iteration
    assert [t.m.tolist() for t in gen.traces] == [t.m.tolist() for t in static[policy].traces]
    assert [t.context.tolist() for t in gen.traces] == [
        t.context.tolist() for t in static[policy].traces]
    assert gen.timing["prefill"] > 0


@ON_THE_STATIC_RUNS
def test_queued_prompts_plain_and_reused_prefill(tiny, queued, static_queued):
    expected, static = static_queued
    plain = Engine(tiny, batch=3, max_len=760, policy="full", k_max=1)
    assert plain.generate(queued, 24, speculative=False).tokens == expected
    # every prompt's prefill is kept (queued ones as their slot is filled) and reloads
    first = Engine(tiny, batch=2, max_len=760, policy=SMALL["sparsespec"], s=0.1, k_max=4)
    kept = first.generate(queued, 24, k=4, keep_prefill=True).prefill
    assert kept.lengths == [len(p) for p in queued] and kept.logits.shape[0] == len(queued)
    other = Engine(tiny, batch=3, max_len=760, policy=SMALL["last-token"], s=0.1, k_max=4)
    again = other.generate(queued, 24, k=4, prefill=kept)
    assert again.tokens == expected
    assert [t.m.tolist() for t in again.traces] == [
        t.m.tolist() for t in static["last-token"].traces]
    with pytest.raises(SpecsimError, match="other prompts"):
        other.generate(queued[:5], 24, k=4, prefill=kept)


def test_queued_forced_run_keeps_every_slot_busy(tiny, ragged):
    """Forced replay of four traces of 3, 5, 2 and 4 iterations through two slots: slot 0 runs
    prompt 0 (iterations 1–3), then prompt 2 (4–5), then prompt 3 (6–9); slot 1 runs prompt 1
    (1–5) and then idles — so five iterations with both slots busy (the steady window), then
    four with one. Refill prefills are timed apart from the iterations."""
    recorded = speculative_decode(tiny, ragged, 30, policy=SMALL["vegas"], k=5, s=0.1).traces
    forced = [dataclasses.replace(t, id=f"f{i}", context=t.context[:n], k=t.k[:n], m=t.m[:n])
              for i, (t, n) in enumerate(zip(recorded + recorded[:1], (3, 5, 2, 4)))]
    prompts = forced_prompts(forced, TINY["vocab_size"], seed=1)
    for prefill in (None, "random"):
        engine = Engine(tiny, batch=2, max_len=800, policy="quest", s=0.1, k_max=5)
        gen = engine.generate(prompts, 1, forced=forced, prefill=prefill)
        assert gen.batch == 2 and gen.iterations == 9
        assert [a for _, a, _ in gen.steps] == [2] * 5 + [1] * 4
        slot0 = [forced[0]] * 3 + [forced[2]] * 2 + [forced[3]] * 4
        start0 = [0, 0, 0, 3, 3, 5, 5, 5, 5]
        want = [int(slot0[i].m[i - start0[i]]) + 1 + (int(forced[1].m[i]) + 1 if i < 5 else 0)
                for i in range(9)]
        assert [n for _, _, n in gen.steps] == want
        assert [t.m.tolist() for t in gen.traces] == [t.m.tolist() for t in forced]
        assert [len(t) for t in gen.tokens] == [t.tokens + 1 for t in forced]
        window = gen.steady_window
        assert len(window) == 5 and gen.steady_tokens_per_second == pytest.approx(
            sum(n for _, n in window) / sum(sec for sec, _ in window))
        assert sum(sec for sec, _, _ in gen.steps) + gen.timing["prefill"] <= gen.wall_seconds


def test_cache_length_is_aligned_within_the_models_positions(tiny):
    """Caches are padded to 128 positions (Quest page counts a multiple of 8), but never past
    the model's positions when 16-position pages fit."""
    assert Engine(tiny, batch=1, max_len=1000, policy="quest").max_len == 1024
    assert Engine(tiny, batch=1, max_len=2000, policy="vegas").max_len == 2048
    small = build_model(dict(TINY, max_position_embeddings=2000), seed=1)
    assert Engine(small, batch=1, max_len=1930, policy="quest").max_len == 1936   # 16s fit
    with pytest.raises(SpecsimError, match="exceeds"):
        Engine(tiny, batch=1, max_len=2049, policy="vegas")


@ON_THE_STATIC_RUNS
def test_queued_prompts_with_adaptive_k_sampling_and_page_bounds(tiny, queued, static_queued):
    """Continuous batching with SparseSpec-L's adaptive k stays lossless (its entropy centres
    restart with each prompt); sampled decoding through a queue is reproducible by seed and
    emits every prompt's tokens; Quest's page bounds of every slot match a recomputation
    after refills, computed or random."""
    from specsim.kernels.kv_cache import page_bounds_reference
    expected, _ = static_queued
    engine = Engine(tiny, batch=2, max_len=760, policy=SMALL["sparsespec"], s=0.1, k_max=6)
    assert engine.generate(queued, 24, k=6, adaptive=AdaptiveK()).tokens == expected
    params = SamplingParams(temperature=0.8, top_p=0.9)
    sampled = [Engine(tiny, batch=2, max_len=760, policy=SMALL["vegas"], s=0.1,
                      k_max=4).generate(queued, 24, k=4, sampling=params, seed=3)
               for _ in range(2)]
    assert sampled[0].tokens == sampled[1].tokens
    assert [len(t) for t in sampled[0].tokens] == [24] * len(queued)
    for prefill in (None, "random"):
        quest = Engine(tiny, batch=2, max_len=760, policy=SMALL["quest"], s=0.1, k_max=4)
        quest.generate(queued, 24, k=4, prefill=prefill)
        lengths = quest.cache.lengths
        for layer in range(TINY["num_hidden_layers"]):
            low, high = quest.cache.pages(layer)
            ref_low, ref_high = page_bounds_reference(quest.cache.k(layer), lengths, 16)
            for b in range(2):
                pages = (int(lengths[b]) + 15) // 16
                assert torch.equal(low[b, :, :pages], ref_low[b, :, :pages]), (prefill, b)
                assert torch.equal(high[b, :, :pages], ref_high[b, :, :pages]), (prefill, b)


def test_the_collector_is_paused_while_decoding_and_restored(tiny, ragged, monkeypatch):
    """generate pauses Python's cyclic collector for its loop (its pauses landed on random
    iterations) and leaves it as it found it — enabled, disabled, or after an error."""
    import gc

    from specsim.engine import loop

    seen = []
    real = loop.SpeculativeLoop.decode

    def spy(self, *a, **kw):
        seen.append(gc.isenabled())
        return real(self, *a, **kw)

    monkeypatch.setattr(loop.SpeculativeLoop, "decode", spy)
    engine = Engine(tiny, batch=3, max_len=1024, policy="vegas", s=0.2, k_max=4)
    assert gc.isenabled()
    engine.generate(ragged, 6, k=3)
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        engine.generate(ragged, 6, k=3)
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()

    def broken(self, *a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(loop.SpeculativeLoop, "decode", broken)
    with pytest.raises(RuntimeError, match="boom"):
        engine.generate(ragged, 6, k=3)
    assert gc.isenabled()


@INTERPRETED_ONLY
@pytest.mark.parametrize("policy", [pytest.param(p, marks=pytest.mark.slow) if p == "quest"
                                    else p for p in sorted(SMALL)])
def test_radix_ranking_in_the_engine_gives_the_same_run(tiny, ragged, plain_ragged, policy,
                                                        monkeypatch):
    """The radix ranking (the Triton top-K, and Quest's fused selection; "best" resolves to
    it here as on CUDA) drafts from the same lists as torch.topk: the run is lossless and
    accepts exactly as the topk run does. Quest's case takes about 30 s in the interpreter and
    runs with -m slow: its fused selection is checked against the torch path in
    test_kernels_topk, and the engine's radix path by the other policies."""
    from specsim.kernels import selection as S

    monkeypatch.setattr(S, "ranking_for", lambda policy, ranking="best", device=None:
                        "radix" if ranking == "best" else "topk")
    runs = {}
    for ranking in ("topk", "best"):
        runs[ranking] = speculative_decode(tiny, ragged, 12, policy=SMALL[policy], k=4, s=0.1,
                                           settings=EngineSettings(ranking=ranking))
        assert all(a == b[:len(a)] for a, b in zip(runs[ranking].tokens, plain_ragged.tokens))
    assert [t.m.tolist() for t in runs["best"].traces] == \
        [t.m.tolist() for t in runs["topk"].traces]


def check_modes_agree(model, prompts, new_tokens: int, policy: str, setting: str,
                      expected: list, **options) -> None:
    """Each choice of ``setting`` decodes losslessly (every answer a prefix of ``expected``,
    plain decoding's) and accepts exactly as the others do: the same lists up to rounding."""
    runs = [speculative_decode(model, prompts, new_tokens, policy=SMALL[policy],
                               settings=EngineSettings(**{setting: mode}), **options)
            for mode in EngineSettings.choices()[setting]]
    for run in runs:
        assert all(a == b[:len(a)] for a, b in zip(run.tokens, expected))
    assert len({str([t.m.tolist() for t in run.traces]) for run in runs}) == 1


def test_summed_collect_2_query_gives_the_same_run(tiny, ragged, plain_ragged):
    """c2q=sum: Vegas' verify writes one summed row per sequence instead of two rows per
    query head; the refresh ranks the same positions, so the run is lossless and accepts
    exactly as with the rows (torch path); the buffer is [layers, B, 1, 1, n] fp32."""
    rows = EngineSettings(c2q="rows")
    check_modes_agree(tiny, ragged, 24, "vegas", "c2q", plain_ragged.tokens, k=4, s=0.1)
    # a kept prefill (its rows recorded for every policy) feeds the summed buffer alike
    kept = check_prefill_reuse(tiny, ragged, "vegas", 24)
    by_rows = Engine(tiny, batch=3, max_len=760, policy="vegas", s=0.1, k_max=4,
                     settings=rows).generate(ragged, 24, k=4)
    assert [t.m.tolist() for t in kept.traces] == [t.m.tolist() for t in by_rows.traces]
    engine = Engine(tiny, batch=2, max_len=256, policy="vegas", s=0.1, k_max=4)
    assert engine.selection.summed and engine.selection.logits.shape == (
        tiny.args.num_layers, 2, 1, 1, 256)
    assert engine.selection.logits.dtype == torch.float32
    # the proxy check compares the two rows with all rows: it keeps per-head rows
    checked = Engine(tiny, batch=2, max_len=256, policy="vegas", s=0.1, k_max=4,
                     proxy_check=True)
    assert not checked.selection.summed
    assert not Engine(tiny, batch=2, max_len=256, policy="vegas", s=0.1, k_max=4,
                      settings=rows).selection.summed


@INTERPRETED_ONLY
def test_summed_collect_2_query_through_the_kernel():
    """The same with the Triton verify kernel's collect_sum (interpreter, head_dim 64)."""
    config = dict(TINY, head_dim=64, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=128)
    model = build_model(config, seed=2, std=0.1)
    prompts = prompts_of((70, 93), vocab=128)
    expected = plain_decode(model, prompts, 10).tokens
    check_modes_agree(model, prompts, 10, "vegas", "c2q", expected, k=3, s=0.3,
                      use_triton=True)
    # last-token's head-summed rows from the kernel (collect_head_sum) decode as the torch
    # path's sums of its per-head logits
    runs = [speculative_decode(model, prompts, 10, policy=SMALL["last-token"], k=3, s=0.3,
                               use_triton=triton) for triton in (True, False)]
    assert runs[0].tokens == runs[1].tokens
    assert [t.m.tolist() for t in runs[0].traces] == [t.m.tolist() for t in runs[1].traces]


def test_last_token_ranks_the_head_sum_of_its_last_accepted_row(tiny, ragged, plain_ragged):
    """last-token's verify writes each collected row summed over the query heads ([layers, B,
    1, k + 1, n] fp32); the refresh ranks each sequence's last accepted row of it: lossless,
    the same from a kept prefill, and the lists those of that row summed from every head's
    logits in fp32."""
    run = speculative_decode(tiny, ragged, 24, policy=SMALL["last-token"], k=4, s=0.1)
    assert all(a == b[:len(a)] for a, b in zip(run.tokens, plain_ragged.tokens))
    check_prefill_reuse(tiny, ragged, "last-token", 24)
    engine = Engine(tiny, batch=2, max_len=256, policy="last-token", s=0.1, k_max=4)
    selection = engine.selection
    assert selection.head_summed and not selection.summed
    assert selection.logits.shape == (tiny.args.num_layers, 2, 1, 5, 256)
    assert selection.logits.dtype == torch.float32
    heads, generator = tiny.args.num_heads, torch.Generator().manual_seed(5)
    per_head = torch.randn(2, heads, 5, 200, generator=generator)   # [B, H, rows, n]
    for layer in range(tiny.args.num_layers):
        for b in range(2):
            selection.store_prefill_rows(layer, b, per_head[b], torch.zeros(heads, 5), 5)
    lengths, last_row = torch.tensor([200, 170], dtype=torch.int32), torch.tensor([3, 1])
    selection.refresh(lengths, 5, last_row)
    picked = per_head[torch.arange(2), :, last_row].sum(1)           # [B, n]
    chosen, counts = vegas_select(picked[:, None, None], lengths, 0.1, max_context=256,
                                  policy=selection.policy, ranking=selection.ranking)
    for layer in range(tiny.args.num_layers):
        assert selection.counts[layer].tolist() == counts.tolist()
        for b, count in enumerate(counts.tolist()):
            assert sorted(selection.indices[layer, b, :count].tolist()) == \
                sorted(chosen[b, :count].tolist())
    assert not Engine(tiny, batch=2, max_len=256, policy="vegas", s=0.1,
                      k_max=4).selection.head_summed


def test_host_time_is_the_loops_wall_time_less_its_waits(tiny, ragged, monkeypatch):
    """A generate call reports its loop's own CPU time: the iterations' wall time less the time
    blocked in the one device-to-host read an iteration (a plain step's tokens; a speculative
    iteration's packed results). A read made to wait 20 ms is left out of it."""
    import time as clock
    from contextlib import contextmanager

    from specsim.engine import run as run_module

    engine = Engine(tiny, batch=3, max_len=800, policy="vegas", s=0.1, k_max=4)
    for speculative in (True, False):
        fast = engine.generate(ragged, 12, k=4, speculative=speculative)
        assert 0 < fast.host_seconds <= sum(sec for sec, _, _ in fast.steps)
    real = run_module.Run.waiting

    @contextmanager
    def slow_read(self):            # every read now waits 20 ms more for "the GPU"
        with real(self):
            clock.sleep(0.02)
            yield

    monkeypatch.setattr(run_module.Run, "waiting", slow_read)
    for speculative in (True, False):
        slow = engine.generate(ragged, 12, k=4, speculative=speculative)
        walls = sum(sec for sec, _, _ in slow.steps)
        assert walls - slow.host_seconds >= 0.02 * slow.iterations
        assert 0 < slow.host_seconds < walls

"""The engine's GPU path: Triton kernels, CUDA graphs, CUDA-event timing (skipped without CUDA).

Written without a GPU at hand: these tests are the first thing to run on one. CUDA graphs must
replay exactly what eager execution computes (same kernels, same shapes), and greedy
self-speculative decoding must still reproduce plain greedy decoding (fp32 weights, so that
verify (q = k+1) and plain (q = 1) launches agree to far below the logit gaps). The small
model runs as built (``AS_BUILT``: no fused projections, no compiled layers) unless a test
says otherwise.
"""
import pytest
import torch

from specsim.engine import Engine, build_model, plain_decode, speculative_decode
from specsim.settings import EngineSettings

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SMALL_QWEN3 = dict(model_type="qwen3", vocab_size=1024, hidden_size=256, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                   intermediate_size=512, max_position_embeddings=8192, rope_theta=1e6,
                   tie_word_embeddings=False)
AS_BUILT = EngineSettings(fuse_projections=False, compile_layers=False)


def prompts(lengths, vocab=1024):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def model():
    return build_model(SMALL_QWEN3, seed=1, std=0.1, dtype=torch.float32, device="cuda")


@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize("policy", ["vegas", "sparsespec", "streamingllm", "quest",
                                    "last-token"])
def test_graphs_replay_eager_exactly(model, policy, forced):
    """Graphed draft chain, verify and refresh decode what eager execution decodes
    (free-running, or replaying forced m with k varying between sequences and iterations):
    tokens, m, each draft's entropy and acceptance."""
    import numpy as np

    from specsim.traces.format import RequestTrace

    batch = prompts((1500, 2100, 1800))
    traces = None
    if forced:
        ks = [np.roll([6, 3, 6, 2, 5, 6], -b) for b in range(3)]
        ms = [np.roll([1, 0, 0, 2, 1, 0], -b) for b in range(3)]
        traces = [RequestTrace(str(b), policy, 0.1,
                               len(p) + np.concatenate([[0], np.cumsum(m + 1)[:-1]]), k, m)
                  for b, (p, k, m) in enumerate(zip(batch, ks, ms))]
    runs = []
    for graphs in (False, True):
        engine = Engine(model, batch=3, max_len=2200, policy=policy, s=0.1, k_max=6,
                        settings=AS_BUILT.replace(cuda_graphs=graphs))
        assert engine.backend.use_triton
        runs.append(engine.generate(batch, 48, k=6, forced=traces))
    assert runs[0].tokens == runs[1].tokens
    assert [t.m.tolist() for t in runs[0].traces] == [t.m.tolist() for t in runs[1].traces]
    for eager, graphed in zip(runs[0].traces, runs[1].traces):   # the draft chain's entropies
        for a, b in zip(eager.entropy, graphed.entropy):
            assert b == pytest.approx(a, rel=1e-5, abs=1e-6)
        for a, b in zip(eager.accept_prob, graphed.accept_prob):
            assert list(b) == list(a)
    assert runs[1].timing["draft"] > 0 and runs[1].timing["verify"] > 0


@pytest.mark.parametrize("policy", ["vegas", "sparsespec", "last-token", "streamingllm"])
def test_graphed_refresh_builds_the_eager_lists(model, policy):
    """After a verify, the refresh replayed from its CUDA graph leaves exactly the index lists
    an eager refresh leaves (at a second, different cache length too: the graph reads the
    lengths from the static buffer)."""
    batch = prompts((1500, 2100, 1800))
    engines = [Engine(model, batch=3, max_len=2200, policy=policy, s=0.1, k_max=6,
                      settings=AS_BUILT.replace(cuda_graphs=graphs)) for graphs in (False, True)]
    m = torch.tensor([2, 0, 5], device="cuda")
    with torch.inference_mode():
        for engine in engines:
            engine.prefill(batch)
            engine.verify(7)
            engine.cache.rollback((7 - m - 1).int())
            rows = engine.selection.ranked_rows(7)
            engine.refresh(rows, m, slice(7 - rows, 7))
        assert torch.equal(engines[0].selection.counts, engines[1].selection.counts)
        assert torch.equal(engines[0].selection.indices, engines[1].selection.indices)
        for engine in engines:                 # the same graph at other lengths
            engine.cache.rollback(torch.tensor([1, 0, 3], device="cuda", dtype=torch.int32))
            engine.refresh(rows, m, slice(7 - rows, 7))
        assert torch.equal(engines[0].selection.counts, engines[1].selection.counts)
        assert torch.equal(engines[0].selection.indices, engines[1].selection.indices)
        assert len([k for k in engines[1].steps.graphs if k[0] == "refresh"]) == 1


def test_greedy_self_speculation_matches_plain_on_gpu(model):
    batch = prompts((1500, 2100))
    plain = plain_decode(model, batch, 32, settings=AS_BUILT).tokens
    for policy in ("vegas", "quest", "sparsespec"):
        assert speculative_decode(model, batch, 32, policy=policy, k=8, s=0.1,
                                  settings=AS_BUILT).tokens == plain


@pytest.mark.parametrize("policy", ["vegas", "sparsespec", "quest", "last-token"])
def test_queued_prompts_through_graphed_slots(model, policy):
    """Continuous batching on the GPU: five prompts through two slots reproduce plain greedy
    decoding, and the graphed run replays the eager one (refills write into the slots the
    graphs read from; Quest's page bounds kept by the fused appends across rollbacks and
    refills)."""
    queue = prompts((1500, 2100, 1800, 1600, 1900))
    plain = plain_decode(model, queue, 40, settings=AS_BUILT).tokens
    runs = [Engine(model, batch=2, max_len=2200, policy=policy, s=0.1, k_max=6,
                   settings=AS_BUILT.replace(cuda_graphs=graphs)).generate(queue, 40, k=6)
            for graphs in (False, True)]
    assert runs[0].tokens == runs[1].tokens == plain
    assert [t.m.tolist() for t in runs[0].traces] == [t.m.tolist() for t in runs[1].traces]
    assert len(runs[1].traces) == 5 and runs[1].batch == 2


def test_bf16_real_scale_shapes_run():
    """Qwen3-8B-like layer shapes (a few layers) in bf16, prepared as the default settings say
    (fused projections, compiled layers): plans, graphs and timing work (timed after a first
    call, which compiles and captures, as timed runs are)."""
    config = dict(SMALL_QWEN3, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=12288, num_hidden_layers=2, vocab_size=151936,
                  max_position_embeddings=40960)
    net = build_model(config, dtype=torch.bfloat16, device="cuda")
    engine = Engine(net, batch=4, max_len=33000, policy="vegas", s=0.05, k_max=8)
    assert net.fused and net.compiled
    batch = prompts((32000,) * 4, vocab=151936)
    engine.generate(batch, 8, k=8)        # compiles the layers, captures the graphs
    result = engine.generate(batch, 32, k=8)
    assert result.new_tokens == 128 and result.bandwidth() > 1e11


@pytest.mark.parametrize("policy", ["vegas", "quest"])
def test_forced_acceptance_adds_no_host_sync(model, policy):
    """A forced-acceptance iteration synchronises with the GPU as often as a free-running one
    (once, its packed device-to-host read): the forced m goes up through a pinned buffer.
    Copied from pageable memory it waited for the verify pass, so the host queued the rest of
    the iteration only after it: a stall free-running loops do not have, which the
    calibration's forced-loop overheads carried into every prediction."""
    import warnings

    import numpy as np

    from specsim.traces.format import RequestTrace

    batch, k = prompts((1500, 2100)), 4

    def traces(n):  # every iteration drafts k and accepts 2
        return [RequestTrace(str(b), policy, 0.1, len(p) + np.arange(n) * 3, np.full(n, k),
                             np.full(n, 2)) for b, p in enumerate(batch)]

    engine = Engine(model, batch=2, max_len=2200, policy=policy, s=0.1, k_max=k,
                    settings=AS_BUILT)
    engine.generate(batch, 24, k=k, forced=traces(8))         # compile and capture first

    def count(**kw):   # (synchronisations, iterations) of one generate call
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                gen = engine.generate(batch, **kw)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught), gen.iterations

    # per iteration at the margin: the prefill's and the set-up's syncs are paid once per
    # call, and the two modes run different numbers of iterations
    syncs = {}
    for mode, (short, long) in {"free": ({"max_new_tokens": 12}, {"max_new_tokens": 36}),
                                "forced": ({"max_new_tokens": 1, "forced": traces(4)},
                                           {"max_new_tokens": 1, "forced": traces(12)})}.items():
        (s0, i0), (s1, i1) = count(k=k, **short), count(k=k, **long)
        assert i1 > i0, (mode, i0, i1)
        syncs[mode] = (s1 - s0) / (i1 - i0)
    assert syncs["forced"] <= syncs["free"] + 0.05, syncs
    assert syncs["free"] <= 1.05, syncs         # one host synchronisation an iteration at most


@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize("policy", ["vegas", "sparsespec", "quest", "last-token",
                                    "streamingllm"])
def test_an_iteration_synchronises_only_in_its_record_read(model, policy, forced,
                                                           monkeypatch):
    """Every phase of a graphed iteration but the record's one device-to-host read (draft
    chain, verify, acceptance and rollback, the lists' refresh) runs under torch's sync debug
    mode "error", which raises on any host synchronisation; the read itself still happens
    once an iteration."""
    import numpy as np

    from specsim.engine.loop import SpeculativeLoop
    from specsim.traces.format import RequestTrace

    batch, k = prompts((1500, 2100)), 4
    engine = Engine(model, batch=2, max_len=2200, policy=policy, s=0.1, k_max=k,
                    settings=AS_BUILT)
    traces = [RequestTrace(str(b), policy, 0.1, len(p) + np.arange(8) * 3, np.full(8, k),
                           np.full(8, 2)) for b, p in enumerate(batch)] if forced else None
    kw = {"max_new_tokens": 1, "forced": traces} if forced else {"max_new_tokens": 24}
    engine.generate(batch, k=k, **kw)                 # compile, capture
    phases = []

    def strict(name):
        inner = getattr(SpeculativeLoop, name)

        def run(self, *args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return inner(self, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                phases.append(name)
        return run

    for name in ("draft_phase", "verify_phase", "accept_phase", "send_record",
                 "refresh_phase"):
        monkeypatch.setattr(SpeculativeLoop, name, strict(name))
    result = engine.generate(batch, k=k, **kw)
    assert result.iterations > 2
    assert phases.count("verify_phase") == phases.count("refresh_phase") == result.iterations


def test_the_record_copy_waits_only_for_the_work_queued_before_it():
    """``Transfers.to_host`` returns the values once they are copied, while work queued after
    the copy (the refresh, here a long sleep) still runs; a later copy into the same pinned
    buffer leaves the values already returned as they were."""
    from specsim.engine.loop import Transfers

    transfers = Transfers(3, torch.device("cuda"))
    values = torch.arange(12, dtype=torch.float64, device="cuda").view(3, 4)
    sent = transfers.to_host(values)
    torch.cuda._sleep(1 << 30)                         # ~0.5 s of GPU work behind the copy
    got = sent.wait()
    assert not torch.cuda.current_stream().query()     # the host did not wait for the sleep
    again = transfers.to_host(values * 2 + 1).wait()
    assert (got == values.cpu().numpy()).all()
    assert (again == (values * 2 + 1).cpu().numpy()).all()


def test_the_iterations_clock_covers_the_refresh_after_the_last_read(model, monkeypatch):
    """The refresh runs behind the record's read, so the last one before a refill or the
    loop's end would fall outside the loop's clock: the loop drains it into the iteration
    that queued it, and the iterations' wall times add up to at least every phase the CUDA
    events time (here with each refresh made long, and a queued prompt refilled)."""
    import numpy as np

    from specsim.engine.loop import SpeculativeLoop
    from specsim.traces.format import RequestTrace

    batch, k = prompts((1500, 2100, 1800)), 4            # the third waits for a slot
    engine = Engine(model, batch=2, max_len=2200, policy="vegas", s=0.1, k_max=k,
                    settings=AS_BUILT)
    traces = [RequestTrace(str(b), "vegas", 0.1, len(p) + np.arange(n) * 3, np.full(n, k),
                           np.full(n, 2)) for b, (p, n) in enumerate(zip(batch, (2, 4, 2)))]
    engine.generate(batch, 1, k=k, forced=traces)       # compile, capture
    refresh = SpeculativeLoop.refresh_phase

    def slow_refresh(self, m, q_len):
        with self.timer.phase("selection"):
            torch.cuda._sleep(1 << 28)                  # ~0.13 s, longer than the host's work
        refresh(self, m, q_len)

    monkeypatch.setattr(SpeculativeLoop, "refresh_phase", slow_refresh)
    result = engine.generate(batch, 1, k=k, forced=traces)
    clock = sum(seconds for seconds, _, _ in result.steps)
    timed = sum(result.timing[p] for p in ("draft", "verify", "selection", "other"))
    assert result.iterations == 4 and result.timing["prefill"] > 0
    assert clock >= timed * (1 - 1e-3)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("policy", ["quest", "sparsespec", "vegas", "last-token"])
def test_radix_ranking_graphs_and_matches_topk(model, policy, chunked, monkeypatch):
    """The radix kernels (Quest's fused page selection, the radix top-K of the other
    policies' lists), as ranking=best resolves to them, one program per row or spread over
    blocks of the rows (``chunked``, the way of few long rows), capture in the engine's CUDA
    graphs and decode what the torch.topk ranking decodes."""
    import numpy as np

    import specsim.kernels.topk_select as T
    import specsim.policies as P
    monkeypatch.setattr(P, "BEST_RANKING", {policy: "radix"})
    if chunked:
        monkeypatch.setattr(T, "CHUNKED_FROM", 64)     # rows: 2,200 tokens, 138 pages
        monkeypatch.setattr(T, "CHUNKED_ROWS", 1 << 20)
        monkeypatch.setattr(T, "SPLIT_PAGES", 32)
    else:
        monkeypatch.setattr(T, "CHUNKED_FROM", None)
    batch = prompts((1500, 2100, 1800))
    runs = {}
    for ranking in ("topk", "best"):
        engine = Engine(model, batch=3, max_len=2200, policy=policy, s=0.1, k_max=6,
                        settings=AS_BUILT.replace(ranking=ranking))
        runs[ranking] = engine.generate(batch, 48, k=6)
    assert runs["best"].tokens == runs["topk"].tokens                 # lossless either way
    if policy == "quest":
        # the fused kernel sums page scores in another order than the torch matmuls: a page
        # at a ~1e-6 near-tie may swap, which can change a draft; acceptance stays alike
        m = {r: np.mean([x for t in runs[r].traces for x in t.m]) for r in runs}
        assert m["best"] == pytest.approx(m["topk"], rel=0.05)
    else:   # the same scores ranked: the same lists, drafts and acceptance
        assert [t.m.tolist() for t in runs["best"].traces] == \
            [t.m.tolist() for t in runs["topk"].traces]


def test_summed_collected_rows_graph_and_match_the_torch_sums(model):
    """Vegas' summed row (c2q=sum, the kernel's collect_sum) and last-token's rows summed over
    the heads (collect_head_sum) on the GPU path (CUDA graphs, whole-wave splits): Vegas
    decodes and accepts as with per-head rows, last-token as the torch path's sums of its
    per-head logits (fp32 model: the sums differ only by rounding, far below the ranking gaps
    here)."""
    batch = prompts((1500, 2100, 1800))

    def run(policy, settings=AS_BUILT, use_triton=None):
        engine = Engine(model, batch=3, max_len=2200, policy=policy, s=0.1, k_max=6,
                        settings=settings, use_triton=use_triton)
        result = engine.generate(batch, 48, k=6)
        return engine, (result.tokens, [t.m.tolist() for t in result.traces])

    summed, by_sum = run("vegas")
    rows, by_rows = run("vegas", AS_BUILT.replace(c2q="rows"))
    assert summed.selection.summed and not rows.selection.summed and by_sum == by_rows
    kernel, by_kernel = run("last-token")
    torch_path, by_torch = run("last-token", use_triton=False)
    assert kernel.backend.use_triton and not torch_path.backend.use_triton
    assert kernel.selection.head_summed and by_kernel == by_torch


SMALL_MOE = dict(SMALL_QWEN3, model_type="qwen3_moe", num_hidden_layers=3,
                 moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])


@pytest.mark.parametrize("policy", ["vegas", "quest"])
def test_moe_graphs_replay_eager_exactly(policy):
    """Routed experts in bf16 (the grouped GEMM's dtype) replay from CUDA graphs exactly what
    eager execution computes: the routing, the expert counts and the grouped GEMMs all run on
    the device, with no host read inside the captured step."""
    net = build_model(SMALL_MOE, seed=1, std=0.1, dtype=torch.bfloat16, device="cuda")
    assert_graphs_replay_eager(net, policy)


def assert_graphs_replay_eager(net, policy):
    """Three sequences decoded eagerly and from CUDA graphs give the same tokens and the same
    accepted lengths."""
    batch = prompts((1500, 2100, 1800))
    runs = [Engine(net, batch=3, max_len=2200, policy=policy, s=0.1, k_max=6,
                   settings=AS_BUILT.replace(cuda_graphs=graphs)).generate(batch, 48, k=6)
            for graphs in (False, True)]
    assert runs[0].tokens == runs[1].tokens
    assert [t.m.tolist() for t in runs[0].traces] == [t.m.tolist() for t in runs[1].traces]


def test_moe_real_scale_shapes_run():
    """Qwen3-30B-A3B's layer shapes (two layers: 128 experts, 8 per token) in bf16 with the
    default settings (fused projections, compiled layers, CUDA graphs) at 32K."""
    import json

    from specsim.shipped import shipped_path

    config = json.loads(shipped_path("models/qwen3-30b-a3b/config.json").read_text())
    config["num_hidden_layers"] = 2
    net = build_model(config, dtype=torch.bfloat16, device="cuda")
    engine = Engine(net, batch=4, max_len=33000, policy="sparsespec", s=0.05, k_max=8)
    batch = prompts((32000,) * 4, vocab=config["vocab_size"])
    engine.generate(batch, 8, k=8)
    result = engine.generate(batch, 32, k=8)
    assert result.new_tokens == 128 and result.bandwidth() > 1e11


SMALL_GPT_OSS = dict(SMALL_QWEN3, model_type="gpt_oss", num_hidden_layers=4, head_dim=64,
                     num_attention_heads=8, num_key_value_heads=2, intermediate_size=128,
                     num_local_experts=8, num_experts_per_tok=2, experts_per_token=2,
                     layer_types=["sliding_attention", "full_attention"] * 2,
                     sliding_window=128, attention_bias=True, swiglu_limit=7.0,
                     rope_theta=150000.0,
                     rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0,
                                       beta_slow=1.0, original_max_position_embeddings=4096,
                                       truncate=False))


@pytest.mark.parametrize("policy", ["vegas", "sparsespec", "quest", "last-token"])
def test_gpt_oss_graphs_replay_eager_exactly(policy):
    """gpt-oss in bf16 (sinks, window-128 and full layers, biased clamped experts): window
    layers verify through the kernel's window and draft over their window (q = 1), full layers
    draft from the policy's lists; CUDA graphs replay exactly what eager execution computes."""
    net = build_model(SMALL_GPT_OSS, seed=1, std=0.1, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        for layer in net.model.layers:
            layer.self_attn.sinks.mul_(20.0)
    assert_graphs_replay_eager(net, policy)


def test_gpt_oss_greedy_self_speculation_matches_plain_on_gpu():
    """fp32 gpt-oss through the kernels (sinks and windows): lossless as on the CPU."""
    net = build_model(SMALL_GPT_OSS, seed=2, std=0.1, dtype=torch.float32, device="cuda")
    batch = prompts((1500, 2100))
    plain = plain_decode(net, batch, 32, settings=AS_BUILT)
    for policy in ("vegas", "sparsespec", "streamingllm", "quest", "last-token"):
        result = speculative_decode(net, batch, 32, policy=policy, k=4, s=0.1,
                                    settings=AS_BUILT)
        assert result.tokens == plain.tokens, policy


def test_gpt_oss_real_scale_shapes_run():
    """gpt-oss-20b's layer shapes (two layers: one window-128, one full; 32 bf16 experts, 4 per
    token, sinks) with the default settings (fused projections, compiled layers, CUDA graphs)
    at 32K, prefilled for real (full layers on the sink path, window layers in batched chunks)."""
    import json

    from specsim.shipped import shipped_path

    config = json.loads(shipped_path("models/gpt-oss-20b/config.json").read_text())
    config["num_hidden_layers"] = 2
    net = build_model(config, dtype=torch.bfloat16, device="cuda")
    assert net.args.layer_windows == (128, None)
    engine = Engine(net, batch=4, max_len=33000, policy="sparsespec", s=0.05, k_max=8)
    batch = prompts((32000,) * 4, vocab=config["vocab_size"])
    engine.generate(batch, 8, k=8)
    assert net.fused and net.compiled
    result = engine.generate(batch, 32, k=8)
    assert result.new_tokens == 128 and result.bandwidth() > 1e10


@pytest.mark.parametrize("window, sinks", [(None, True), (128, True), (128, False)])
def test_prefill_paths_in_bf16_match_the_definition(window, sinks):
    """The engine's sink and window prefill paths on the GPU in bf16 (gpt-oss's heads: 64
    query, 8 KV, head_dim 64), against the fp32 definition."""
    import math

    from specsim.engine.attention import prefill_attention

    gen = torch.Generator(device="cuda").manual_seed(3)
    t, heads, groups, dim = 700, 64, 8, 64
    q = torch.randn(1, t, heads, dim, device="cuda", generator=gen)
    k = torch.randn(1, t, groups, dim, device="cuda", generator=gen)
    v = torch.randn(1, t, groups, dim, device="cuda", generator=gen)
    sink = torch.randn(heads, device="cuda", generator=gen) if sinks else None
    got = prefill_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), window=window,
                            sinks=sink).float()
    keys = k[0].repeat_interleave(heads // groups, 1)
    values = v[0].repeat_interleave(heads // groups, 1)
    s = torch.einsum("thd,nhd->htn", q[0], keys) / math.sqrt(dim)
    p, n = torch.arange(t, device="cuda")[:, None], torch.arange(t, device="cuda")[None, :]
    s = s.masked_fill(~((n <= p) & ((n > p - window) if window else True)), float("-inf"))
    if sinks:
        s = torch.cat([s, sink[:, None, None].expand(heads, t, 1)], -1)
    want = torch.einsum("htn,nhd->thd", torch.softmax(s, -1)[..., :t], values)[None]
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)

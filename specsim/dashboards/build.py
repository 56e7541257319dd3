"""The `specsim dashboard` page: predict every combination the page's controls offer
(hardware × batch × context), turn the reports into figure data and figures, assemble.

Controls and what they drive:

- hardware, batch, context → the (k, s) heatmap, speedup vs k, the time breakdown and the
  headline (one predict report per combination);
- policy → the heatmap and the two acceptance figures;
- hardware → the regime map (its own batch × context grid; the selected batch and context
  are outlined on it).
"""
from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from specsim import __version__
from specsim.costs import make_cost_model, resolve_cost_source
from specsim.dashboards import data as D
from specsim.dashboards import figures as F
from specsim.atomic import write_text_atomic
from specsim.dashboards.page import Control, Page, Section, Slot, render_page
from specsim.dashboards.validation import ValidationPoint, validation_data
from specsim.predict import DEFAULT_CONTEXT, PredictOptions, predict_trace, workload_contexts
from specsim.report import PredictReport
from specsim.specs import HardwareSpec, ModelSpec
from specsim.traces.format import Trace

TRACE_CONTEXT = "trace"   # context control value: the trace's recorded context lengths
MAX_NOTES = 8             # predict notes listed in the header


@dataclass
class DashboardOptions:
    hardware: str = "h200"                      # key (in the hardware mapping) shown first
    batch: int = 32                             # batch shown first
    context: int | None = None                  # context shown first (None: the trace's)
    batches: Sequence[int] = (1, 8, 32, 64)     # batch control's values (+ batch)
    contexts: Sequence[int] = (4096, 16384, 65536)  # context control's values (+ the trace's)
    regime_batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    regime_contexts: Sequence[int] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    context_bins: int = 8
    tp: int = 1
    k_max: int | None = None
    n_boot: int = 1000
    seed: int = 0
    policy: str | None = None                   # predict's --policy (opaque trace drafters)
    sparsity: float | None = None               # predict's --sparsity (groups without s)
    costs: str = "auto"                         # cost model, as make_cost_model takes it


@dataclass
class Validation:
    points: list[ValidationPoint]
    source: str = ""


@dataclass
class Dashboard:
    """Everything the page shows, before HTML: the page spec and the default report."""

    page: Page
    default_report: PredictReport
    #: "hw|batch|context" → report
    reports: dict[str, PredictReport] = field(default_factory=dict)

    def html(self) -> str:
        return render_page(self.page)

    def write(self, path) -> Path:
        return write_text_atomic(path, self.html())


def _short_name(hw: HardwareSpec) -> str:
    return hw.name.replace("NVIDIA ", "")


def _context_value(context: int | None) -> str:
    return TRACE_CONTEXT if context is None else str(int(context))


#: What each cost source's numbers are, as figure subtitles name them.
PRICED_BY = {"roofline": "roofline costs", "calibration": "calibrated costs (GPU measurements)",
             "operators": "operator-table costs (GPU measurements)",
             "scaled-operators": "another GPU's operator tables, scaled (a prior)"}


def _priced_by(kind: str) -> str:
    return PRICED_BY.get(kind, f"{kind} costs")


def _subtitle(model: ModelSpec, hw: HardwareSpec, batch: int, context_label: str,
              priced_by: str = "") -> str:
    return (f"{model.name} on {_short_name(hw)} · batch {batch} · context {context_label}"
            + (f" · {priced_by}" if priced_by else ""))


def _ms(x: float) -> str:
    return f"{x:.2f} ms"


def _headline(h: dict) -> str:
    e = html.escape
    level = int(round(h["level"] * 100))
    lo, hi = h["speedup_ci"]
    text = (f"Best here: <b>{e(h['policy'])}</b>, s = {e(F.s_label(h['s']))}, k = {h['k']} → "
            f"<b>{h['speedup']:.2f}×</b> [{lo:.2f}, {hi:.2f}] ({level}% CI) over plain "
            f"decoding (T<sub>ar</sub> = {_ms(h['plain_step_ms'])} per step)")
    d = h["distinguishable"]
    if d and not d["distinguishable"]:
        ru = d["runner_up"]
        text += (f"; not distinguishable from {e(ru['policy'])}, s = {e(F.s_label(ru['s']))} "
                 f"(wins {d['share_of_replicates_best_wins'] * 100:.0f}% of replicates)")
    if not h["fits"]:
        text += (f'<br><span class="bad">this batch does not fit: weights + KV need '
                 f'{h["memory_needed_GB"]:.0f} GB, the GPU has {h["memory_GB"]:.0f} GB</span>')
    return text


def build_dashboard(trace: Trace, model: ModelSpec, hardware: Mapping[str, HardwareSpec],
                    opts: DashboardOptions | None = None, validation: Validation | None = None,
                    trace_label: str | None = None,
                    progress: Callable[[str], None] | None = None) -> Dashboard:
    """Predict every (hardware, batch, context) the controls offer and build the page."""
    opts = opts or DashboardOptions()
    say = progress or (lambda _msg: None)
    if opts.hardware not in hardware:
        raise ValueError(f"default hardware '{opts.hardware}' is not among {list(hardware)}")
    batches = sorted({int(b) for b in opts.batches} | {int(opts.batch)})
    contexts: list[int | None] = [None] + sorted(
        {int(c) for c in opts.contexts} | ({int(opts.context)} if opts.context else set()))
    started = time.perf_counter()
    acceptance: dict = {}   # one replay and bootstrap per group, priced on every setting

    def predict(costs, batch, context):
        return predict_trace(trace, costs, PredictOptions(
            batch=batch, context=context, k_max=opts.k_max, n_boot=opts.n_boot,
            seed=opts.seed, policy=opts.policy, sparsity=opts.sparsity), acceptance)

    # the default setting first: it fixes the policy list and the trace's context range
    default_costs, _ = make_cost_model(model, hardware[opts.hardware], opts.tp,
                                                opts.costs)
    default_report = predict(default_costs, opts.batch, opts.context)
    policies = default_report.policy_names
    has_contexts = workload_contexts(trace, PredictOptions(), [])[1] == "trace quantiles"
    trace_ctx_label = "as recorded" if has_contexts else \
        f"assumed {F.tokens_label(DEFAULT_CONTEXT)} (trace has none)"

    def ctx_label(context):
        return trace_ctx_label if context is None else F.tokens_label(context)

    def ctx_subtitle(context, report):
        """The batch's actual context lengths (they follow the trace's quantiles)."""
        if context is not None or not has_contexts:
            return ctx_label(context)
        ctx = report.groups[0].contexts
        lo, hi = F.tokens_label(min(ctx)), F.tokens_label(max(ctx))
        return f"as recorded, {lo}" if lo == hi else f"as recorded, {lo}–{hi}"

    def setting_label(hw, batch, context):
        return f"{_short_name(hw)}, batch {batch}, context {ctx_label(context)}"

    # notes every setting carries go in the page header; the others under their setting's
    # headline, named with it
    shared_notes = [n for n in default_report.notes
                    if "SYNTHETIC" not in n and "does not fit" not in n]
    heat, curves, breakdown, regime, headlines = {}, {}, {}, {}, {}
    reports: dict[str, PredictReport] = {}
    sources = {}
    for hw_key, hw in hardware.items():
        source = resolve_cost_source(model, hw, tp=opts.tp, costs=opts.costs)
        sources[hw_key] = source
        costs = source.cost_model
        say(f"predicting on {hw.name}: {len(batches)} batch sizes × {len(contexts)} contexts")
        for batch in batches:
            for context in contexts:
                key = f"{hw_key}|{batch}|{_context_value(context)}"
                report = (default_report if (hw_key, batch, context) ==
                          (opts.hardware, opts.batch, opts.context) else
                          predict(costs, batch, context))
                reports[key] = report
                sub = _subtitle(model, hw, batch, ctx_subtitle(context, report),
                                _priced_by(source.kind))
                for policy in policies:
                    heat[f"{key}|{policy}"] = F.heatmap_figure(D.heatmap_data(report, policy), sub)
                curves[key] = F.speedup_curves_figure(D.speedup_curves_data(report), sub)
                breakdown[key] = F.breakdown_figure(D.breakdown_data(report), sub)
                headlines[key] = _headline(D.headline_data(report, model, hw, opts.tp))
                own = [n for n in report.notes if n not in shared_notes]
                if own:
                    headlines[key] += ('<ul class="notes">' + "".join(
                        f"<li>{html.escape(n)} <i>({html.escape(setting_label(hw, batch, context))})"
                        f"</i></li>" for n in own[:MAX_NOTES]) + "</ul>")
        say(f"regime map on {hw.name}: {len(opts.regime_batches)} batch sizes × "
            f"{len(opts.regime_contexts)} contexts")
        rd = D.regime_data(trace, default_report, costs, model, hw, opts.regime_batches,
                           opts.regime_contexts, k_max=opts.k_max, tp=opts.tp,
                           reference_k=default_report.best.k)
        regime[hw_key] = F.regime_figure(rd, f"{model.name} on {_short_name(hw)} · tp {opts.tp} "
                                             f"· every sequence at the same context · "
                                             f"{_priced_by(source.kind)}")
    positions = {p: F.position_acceptance_figure(D.position_acceptance_data(default_report, p),
                                                 "from the trace; independent of hardware")
                 for p in policies}
    cad = D.context_acceptance_data(trace, bins=opts.context_bins)
    by_context = {p: F.context_acceptance_figure(cad, p, f"iterations binned by context length "
                                                         f"({len(cad['edges']) - 1} equal-count "
                                                         f"bins)") for p in policies}
    default_policy = default_report.best.policy
    level = int(round(default_report.confidence_level * 100))
    sections = [
        Section("Which draft length k and sparsity s", [
            Slot("fig-heatmap", ("hardware", "batch", "context", "policy"), heat, caption=(
                "Predicted speedup S(k, s) = E[m+1]·T<sub>ar</sub> / T(k, s) for the chosen "
                "policy over every k and the s values the trace recorded. ★ is the joint grid "
                "optimum; the dotted path is Vegas' 3-step tuning (1: s at the largest k until "
                "accepted tokens plateau, 2: best k at that s, 3: best s at that k). Blue is "
                "faster than plain decoding, red slower.")),
            Slot("fig-curves", ("hardware", "batch", "context"), curves, caption=(
                f"Each policy at its best recorded s. Bands: {level}% bootstrap confidence "
                "intervals (resampling requests). ◇ marks the efficiency inversion: the first "
                "k where one more draft adds fewer expected tokens (P<sub>k+1</sub>) than it "
                "costs (γ′·S<sub>k</sub>). Open circles: k beyond what the trace measured "
                "(fitted).")),
        ]),
        Section("Why: cost and acceptance", [
            Slot("fig-breakdown", ("hardware", "batch", "context"), breakdown, caption=(
                "Predicted time of one speculative iteration at each policy's optimum, split "
                "into k draft steps, the verify pass over k+1 tokens, KV selection and fixed "
                "overhead. The black tick is what plain decoding needs for the same expected "
                "tokens; the label is their ratio, the speedup.")),
            Slot("fig-regime", ("hardware",), regime, caption=(
                "Best speedup (over all policies, s and k) when every sequence has the same "
                "context length. Acceptance is the trace's, held fixed across contexts; only "
                "the costs change. The black line marks where the verify pass of "
                f"k = {default_report.best.k} drafts (the best k of the first setting) "
                "turns from memory-bound to compute-bound; grey cells do not fit in GPU "
                "memory. The dotted box is the batch and context chosen above.")),
            Slot("fig-positions", ("policy",), positions, caption=(
                "What the trace shows, per recorded s of the chosen policy: the conditional "
                "acceptance p<sub>i</sub> of each draft position and the survival "
                "P<sub>i</sub>; E[m+1] = 1 + ΣP<sub>i</sub>. Open markers: fewer than "
                f"{D.MIN_SUPPORT} iterations reached that position.")),
            Slot("fig-context", ("policy",), by_context, caption=(
                "Mean tokens emitted per iteration (accepted drafts + 1) by the context length "
                "at the start of the iteration; hover for α, k and the number of iterations. "
                "A falling curve means the sparse draft degrades as the context grows.")),
        ]),
    ]
    if validation is not None:
        vd = validation_data(validation.points, validation.source)
        sections.append(Section("Checking the model", [
            Slot("fig-validation", (), {"": F.validation_figure(vd)}, caption=(
                "Each point is one measured time against specsim's prediction for it; the "
                "dotted lines are ±10%. Error = predicted / measured − 1."
                + (f" Source: {html.escape(validation.source)}." if validation.source
                   else ""))),
            Slot("fig-validation-errors", (), {"": F.validation_errors_figure(vd)}, caption=(
                "The same points by their error, worst over- and under-predictions at the "
                "ends."))]))

    controls = [
        Control("hardware", "Hardware", [(k, _short_name(h)) for k, h in hardware.items()],
                opts.hardware, "GPU whose cost model prices each step (as --costs picks "
                               "it; each figure's subtitle names the source)"),
        Control("batch", "Batch", [(str(b), str(b)) for b in batches], str(opts.batch),
                "sequences decoded together"),
        Control("context", "Context", [(_context_value(c), ctx_label(c)) for c in contexts],
                _context_value(opts.context), "context length per sequence; 'as recorded' "
                                              "follows the trace's distribution (quantiles)"),
        Control("policy", "Policy", [(p, p) for p in policies], default_policy,
                "KV selection policy for the heatmap and the acceptance figures"),
    ]
    groups = default_report.groups
    facts = [
        ("trace", trace_label or str(trace.path or "")),
        ("trace model", str(trace.header.get("model") or "not stated")),
        ("requests / iterations", f"{sum(g.requests for g in groups):,} / "
                                  f"{sum(g.iterations for g in groups):,} in "
                                  f"{len(groups)} (policy, s) groups"),
        ("costed for", f"{model.name} ({model.param_count() / 1e9:.2f} B params, "
                       f"KV {model.kv_bytes_per_token / 1024:.0f} KiB/token), tp {opts.tp}"),
        *[("costs", f"on {_short_name(hardware[k])}: {sources[k].note} "
                    f"({'measured' if hardware[k].ceilings_measured else 'datasheet'} ceilings)"
                    f"; trust: {sources[k].validated}")
          for k in [opts.hardware] + [k for k in hardware if k != opts.hardware]],
    ]
    warning = ""
    if trace.synthetic:
        description = str(trace.header.get("description") or "")
        warning = ("<strong>SYNTHETIC TRACE</strong> — generated, not recorded on a real model: "
                   "its acceptance numbers illustrate the tool and describe no model."
                   + (f" <i>Trace header: “{html.escape(description)}”</i>" if description
                      else ""))
    other_notes = [n for n in shared_notes if all(n in r.notes for r in reports.values())]
    if len(other_notes) > MAX_NOTES:
        other_notes = other_notes[:MAX_NOTES] + [
            f"… and {len(other_notes) - MAX_NOTES} more notes (see `specsim predict`)"]
    footer = (f"specsim {__version__} · {len(reports)} predictions "
              f"({default_report.bootstrap} bootstrap replicates each) in "
              f"{time.perf_counter() - started:.0f} s · times are the cost model's predictions, "
              f"not measurements")
    page = Page(title="specsim dashboard: sparse self-speculative decoding", facts=facts,
                controls=controls, sections=sections,
                headline_deps=("hardware", "batch", "context"), headlines=headlines,
                warning=warning, notes=other_notes, footer=footer, template=F.TEMPLATE)
    return Dashboard(page, default_report, reports)

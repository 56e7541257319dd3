"""`specsim validate`: does specsim predict the throughput it will measure, and pick the right
k and s? Three steps, so that the predictions exist before the GPU runs:

1. ``plan`` (any machine; needs simpy): for each *setup* — a model, a batch, a context and a
   mode — and each configuration (policy, k, s) of its grid, the predictions of ``specsim
   predict`` (the analytical model: expected tokens per iteration from the trace × the cost
   model's iteration time) and of ``specsim simulate`` (the SimPy simulator, replaying the
   same acceptance), priced by the cost source :func:`specsim.costs.source.resolve_cost_source`
   picks (the plan records its kind, note and file). Written to a plan file with everything
   the GPU needs (the model's config where it is not a catalogue model, prompt token ids,
   forced k/m per sequence). :func:`check_setups` refuses a grid the GPU run could not hold
   (unknown policy, a (policy, s) the trace lacks, k beyond the kernels or the trace, a batch
   and context beyond the GPU's memory) in one line.
2. ``measure`` (the GPU; torch only): runs every configuration of the plan with the engine —
   ``forced`` setups replay the plan's per-iteration k and m with random weights of the real
   shapes; ``free`` setups decode freely with real weights (greedy) — and records measured
   decode throughput two ways, each the median of ``repeats`` runs after a warm-up run: over
   the *steady window* (the iterations that start with every slot busy: tokens over their
   wall time) and over the *whole run* (new tokens over the loop's wall time, prefill
   excluded). A free setup with more prompts than slots runs them as a continuous batch (a
   finished sequence's slot takes the next prompt, as a server does), so its steady window
   spans whole answers, start to end; once the queue is empty the run ends in a tail where
   finished sequences hold their slots.
3. ``report``: per setup and policy, MAPE / worst error of each predictor with its worst cell
   (the configuration and its signed error), Pearson r, and the regret of the predicted
   optimum (measured throughput at the predicted best (k, s) — over the whole grid (policy,
   k, s) — over the best measured); the same per policy across every setup of the plan; for
   free-running setups also the acceptance-side error — counterfactual replay (k ≤ the
   trace's k_rec) and the fitted extrapolation (k > k_rec) against the measured tokens per
   iteration.

``predict`` prices a full batch in steady state (tokens / Σ iteration times of the cost model,
which includes the calibrated loop overhead) and is compared with the steady window;
``simulate`` replays the run itself — its prompts through its slots, continuous or static —
and is compared with the whole run. Forced setups truncate every sequence to the same number
of iterations, so there the two windows coincide but for the first iteration's launch.

One module a step: :mod:`~specsim.validate.planning`, :mod:`~specsim.validate.measuring`,
:mod:`~specsim.validate.reporting`; :mod:`~specsim.validate.files` reads and writes their files;
``python -m specsim.validate`` runs a plan on a GPU machine without the CLI installed.
"""
from __future__ import annotations

from specsim.validate.files import (FORMAT_KEY, MEASURED_KEY, merge_measured, read_json, select,
                                    write_json)
from specsim.validate.measuring import machine_probe, measure, slowest_steps
from specsim.validate.planning import (Setup, build_plan, check_setups, file_sha, prompts_from_file,
                                   repo_file)
from specsim.validate.reporting import (PHASES, across_setups, markdown, phase_summary, report,
                                     trace_agreement)

__all__ = ["FORMAT_KEY", "MEASURED_KEY", "PHASES", "Setup", "across_setups", "build_plan",
           "check_setups", "file_sha", "machine_probe", "markdown", "measure", "merge_measured",
           "phase_summary", "prompts_from_file", "read_json", "repo_file", "report", "select",
           "slowest_steps", "trace_agreement", "write_json"]

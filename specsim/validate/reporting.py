"""A plan's predictions against its measurements: errors, regret, phases, the Markdown tables
(the package doc's step 3)."""
from __future__ import annotations

import numpy as np


def _errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    err = pred / meas - 1.0
    r = float(np.corrcoef(pred, meas)[0, 1]) if pred.size > 2 and np.std(pred) > 0 \
        and np.std(meas) > 0 else float("nan")
    return {"mape": float(np.mean(np.abs(err))), "worst": float(np.max(np.abs(err))),
            "bias": float(np.mean(err)), "pearson_r": r}


def _regret(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(meas[int(np.argmax(pred))] / np.max(meas))


def _worst_cell(rows: list[dict], predictor: str, setups: list[str] | None = None) -> dict:
    """The configuration ``predictor`` misses most (largest |predicted / measured − 1|) and
    that signed error; with ``setups`` (each row's setup name), its setup too."""
    errors = [r[predictor] / r[TARGET[predictor]] - 1.0 for r in rows]
    i = int(np.argmax(np.abs(errors)))
    return {**({"setup": setups[i]} if setups else {}),
            **{k: rows[i][k] for k in ("policy", "s", "k")}, "error": float(errors[i])}


#: What each predictor is compared with: ``predict`` prices a full batch in steady state —
#: measured as the steady window's iteration time (every slot busy) with the tokens per
#: iteration of every answer start to end (``measured``; the window's own throughput is
#: ``measured_window``); ``simulate`` replays the run — its prompts through its slots, tail
#: included (the whole decode loop).
TARGET = {"predict": "measured", "simulate": "measured_whole_run"}


def trace_agreement(setup: dict, got: dict, trace) -> dict | None:
    """How many of a free-running setup's answers decoded exactly as the trace recorded them
    (same iterations, same tokens per iteration), over its configurations at the recorded k
    of their (policy, s) group: bf16 near-ties make a prompt's text depend on the batch shape
    it was decoded in, and an answer that went another way carries another acceptance (a
    floor under any prediction from that trace). None where no configuration ran at k_rec or
    the measurements lack per-request figures."""
    prompt_ids = setup.get("prompt_ids")
    if not prompt_ids:
        return None
    from specsim.traces.acceptance import fixed_k
    records = {(r.prompt_id, r.policy, r.s, fixed_k(r)): r for r in trace.requests
               if r.prompt_id and fixed_k(r) is not None}
    per_config, never = [], None
    for c in got["configs"]:
        its, tpis = c.get("request_iterations"), c.get("request_tokens_per_iteration")
        if not its or len(its) != len(prompt_ids):
            continue
        recs = [records.get((p, c["policy"], c["s"], c["k"])) for p in prompt_ids]
        if any(r is None for r in recs):
            continue
        same = [r.iterations == n and abs(r.tokens / r.iterations - t) < 1e-9
                for r, n, t in zip(recs, its, tpis)]
        per_config.append(sum(same))
        off = {p for p, ok in zip(prompt_ids, same) if not ok}
        never = off if never is None else never & off
    if not per_config:
        return None
    return {"configs": len(per_config), "requests": len(prompt_ids),
            "matching_mean": float(np.mean(per_config)), "matching_min": int(min(per_config)),
            "prompts_never_matching": sorted(never)}


def report(plan: dict, measured: dict, trace=None) -> dict:
    """Errors and regrets per setup and policy (and over each setup's whole grid); with the
    plan's ``trace`` (a :class:`~specsim.traces.format.Trace`) also how many answers decoded
    as the trace recorded them (:func:`trace_agreement`)."""
    by_name = {s["name"]: s for s in measured["setups"]}
    out = []
    for entry in plan["setups"]:
        name = entry["setup"]["name"]
        got = by_name.get(name)
        if got is None:
            continue
        meas_by = {(c["policy"], c["s"], c["k"]): c for c in got["configs"]}
        rows = []
        for cfg in entry["configs"]:
            m = meas_by.get((cfg["policy"], cfg["s"], cfg["k"]))
            if m is None:
                continue
            tpi_window = m["tokens_per_iteration"]          # emitted, in the window
            tpi_all = m.get("tokens_per_iteration_whole_run", tpi_window)
            emitted_all = m.get("emitted_per_iteration_whole_run", tpi_all)
            rows.append({**{k: cfg[k] for k in ("policy", "s", "k")},
                         "measured_window": m["tokens_per_second"],
                         # steady state: the window's full-batch iteration time with the
                         # emitted tokens per iteration of every answer, start to end (the
                         # window of a finite queue over-weights answers' beginnings)
                         "measured": m["tokens_per_second"] * emitted_all / tpi_window,
                         "measured_whole_run": m.get("tokens_per_second_whole_run",
                                                     m["tokens_per_second"]),
                         "predict": cfg["predict"],
                         "simulate": cfg.get("simulate"),
                         "tokens_per_iteration": tpi_all,
                         "tokens_per_iteration_window": tpi_window,
                         "tokens_per_iteration_predicted": cfg["tokens_per_iteration_predicted"],
                         "emitted_per_iteration_predicted": cfg.get(
                             "emitted_per_iteration_predicted",
                             cfg["tokens_per_iteration_predicted"]),
                         "acceptance_mode": cfg.get("acceptance_mode", "forced"),
                         "split_predicted_ms": cfg.get("split_predicted_ms"),
                         "split_measured_ms": _measured_split(m)})
        # q = k + 1 beyond the Triton verify kernel runs the engine's torch fallback (eager,
        # no CUDA graph): listed, but not a configuration a user would run or calibrate
        from specsim.settings import MAX_Q_LEN
        excluded = [r for r in rows if r["k"] + 1 > MAX_Q_LEN]
        rows = [r for r in rows if r["k"] + 1 <= MAX_Q_LEN]
        predictors = ["predict"] + (["simulate"] if rows and rows[0]["simulate"] is not None
                                    else [])

        batch = entry["setup"]["batch"]
        for r in rows + excluded:   # the cost side alone: seconds per iteration, steady window
            r["iteration_ms_predicted"] = 1e3 * batch * r["emitted_per_iteration_predicted"] \
                / r["predict"]
            r["iteration_ms_measured"] = 1e3 * batch * r["tokens_per_iteration_window"] \
                / r["measured_window"]

        def summary(sel):
            res = {"configs": len(sel), "best_measured": max(
                sel, key=lambda r: r["measured"])}
            e = np.array([r["iteration_ms_predicted"] / r["iteration_ms_measured"] - 1
                          for r in sel])
            res["iteration_time"] = {"mape": float(np.mean(np.abs(e))),
                                     "worst": float(np.max(np.abs(e))),
                                     "bias": float(np.mean(e))}
            res["phases"] = phase_summary(sel)
            for p in predictors:
                meas = np.array([r[TARGET[p]] for r in sel])
                pred = np.array([r[p] for r in sel])
                best = sel[int(np.argmax(pred))]
                res[p] = {**_errors(pred, meas), "worst_cell": _worst_cell(sel, p),
                          "regret": _regret(pred, meas),
                          "predicted_best": {k: best[k] for k in ("policy", "s", "k")}}
            return res

        policies = sorted({r["policy"] for r in rows})
        item = {"name": name, "setup": {**{k: v for k, v in entry["setup"].items()
                                           if k not in ("prompts", "model_config")},
                                        "requests": len(entry["setup"].get("prompts", ()))
                                        or entry["setup"]["batch"]},
                "costs": entry["costs"], "cost_source": _cost_source(entry),
                "rows": rows, "excluded": excluded,
                "plain": {"measured": got["plain_tokens_per_second"],
                          "measured_whole_run": got.get("plain_tokens_per_second_whole_run",
                                                        got["plain_tokens_per_second"]),
                          **entry["plain"]},
                "per_policy": {p: summary([r for r in rows if r["policy"] == p])
                               for p in policies},
                "all": summary(rows) if rows else None}
        if "prefill" in entry and got.get("prefill_s"):
            measured_s = float(np.median(got["prefill_s"]))
            item["prefill"] = {"tokens": entry["prefill"]["tokens"],
                               "predict_s": entry["prefill"]["predict_s"],
                               "measured_s": measured_s,
                               "error": entry["prefill"]["predict_s"] / measured_s - 1.0}
        if entry["setup"]["mode"] == "free":
            acc = {}
            for mode in ("replay", "fitted"):   # tokens/iteration: the fallback runs count
                sel = [r for r in rows + excluded if r["acceptance_mode"] == mode]
                if sel:
                    e = np.array([r["tokens_per_iteration_predicted"] / r["tokens_per_iteration"]
                                  - 1 for r in sel])
                    acc[mode] = {"configs": len(sel), "mape": float(np.mean(np.abs(e))),
                                 "worst": float(np.max(np.abs(e))), "bias": float(np.mean(e))}
            item["acceptance"] = acc
            if trace is not None:
                item["trace_agreement"] = trace_agreement(entry["setup"], got, trace)
        out.append(item)
    return {"setups": out, "across_setups": across_setups(out)}


def _cost_source(entry: dict) -> dict:
    """What priced a plan's setup: its ``cost_source`` record, or for a plan that has only
    the note, the kind read from it (a calibration file named, else the roofline)."""
    if entry.get("cost_source"):
        return entry["cost_source"]
    path = entry.get("calibration")
    return {"kind": "calibration" if path else "roofline", "note": entry["costs"],
            "path": path, "sha256": entry.get("calibration_sha256"), "fallback": None}


def across_setups(items: list[dict]) -> dict:
    """Per policy and over every policy, each predictor's errors over the cells of every
    setup together (MAPE, the worst cell with its setup) and the regrets of the setups'
    predicted optima (their mean and the lowest, with its setup: each setup is its own
    workload, so the optimum is chosen within it). A predictor counts where every setup
    having rows has it."""
    items = [item for item in items if item["all"]]
    predictors = [p for p in TARGET if items and all(p in item["all"] for item in items)]

    def pooled(policy: str | None) -> dict:
        cells = [(item["name"], r) for item in items for r in item["rows"]
                 if policy is None or r["policy"] == policy]
        summaries = [(item["name"], item["all"] if policy is None
                      else item["per_policy"].get(policy)) for item in items]
        summaries = [(n, sm) for n, sm in summaries if sm]
        res = {"configs": len(cells), "setups": len(summaries)}
        rows = [r for _, r in cells]
        for p in predictors:
            errors = np.array([r[p] / r[TARGET[p]] - 1.0 for r in rows])
            worst = _worst_cell(rows, p, [n for n, _ in cells])
            regrets = [(sm[p]["regret"], n) for n, sm in summaries]
            lowest = min(regrets)
            res[p] = {"mape": float(np.mean(np.abs(errors))), "worst": abs(worst["error"]),
                      "worst_cell": worst,
                      "regret_mean": float(np.mean([r for r, _ in regrets])),
                      "regret_lowest": float(lowest[0]), "regret_lowest_setup": lowest[1]}
        return res

    policies = sorted({r["policy"] for item in items for r in item["rows"]})
    return {"setups": len(items), "per_policy": {p: pooled(p) for p in policies},
            "all": pooled(None) if items else None}


#: Phases of an iteration, as the cost model splits it and the engine times it.
PHASES = ("draft", "verify", "selection", "other")


def _measured_split(m: dict) -> dict[str, float] | None:
    """ms per iteration by phase over the whole run (CUDA-event phase totals; ``other`` also
    takes the host time no phase covered: the loop's own clock less the phases, as the
    calibration measures the loop overhead that prices it; in runs that did not record the
    loop's clock, the call's wall time less its prefill, which also spreads the call's fixed
    costs outside the loop over its iterations), or None for measurements without the
    split."""
    split, iterations = m.get("split_s"), m.get("iterations")
    if not split or not iterations:
        return None
    loop = m["loop_s"] if m.get("loop_s") else m["wall_s"] - split.get("prefill", 0.0)
    out = {p: 1e3 * split.get(p, 0.0) / iterations for p in PHASES[:3]}
    out["other"] = 1e3 * loop / iterations - sum(out.values())
    return out


def phase_summary(rows: list[dict]) -> dict[str, dict[str, float]] | None:
    """Mean ms per iteration by phase, measured and predicted, over rows having both."""
    both = [r for r in rows if r.get("split_measured_ms") and r.get("split_predicted_ms")]
    if not both:
        return None
    return {p: {"measured": float(np.mean([r["split_measured_ms"][p] for r in both])),
                "predicted": float(np.mean([r["split_predicted_ms"][p] for r in both]))}
            for p in PHASES}


def markdown(rep: dict, measured: dict) -> str:
    """The tables of VALIDATION.md."""
    probe = measured.get("probe") or {}
    lines = [f"GPU: {measured.get('gpu')}, torch {measured.get('torch')}"
             + (f", copy bandwidth {probe['copy_bandwidth_Bps'] / 1e12:.2f} TB/s"
                if probe.get("copy_bandwidth_Bps") else "") + ".", ""]
    for item in rep["setups"]:
        st = item["setup"]
        requests = st.get("requests", st["batch"])
        what = (f"{st['model']}, batch {st['batch']}, "
                + (f"context {st['context']}, forced acceptance ({st['iterations']} iterations, "
                   f"random weights)" if st["mode"] == "forced" else
                   f"real weights, free-running greedy, {st['max_new_tokens']} new tokens"
                   + (f", {requests} prompts as a continuous batch" if requests > st["batch"]
                      else "")))
        lines += [f"### {item['name']}: {what}", "",
                  f"Costs: {item['costs']}. Plain decoding: measured "
                  f"{item['plain']['measured']:.0f} tokens/s (steady window; whole run "
                  f"{item['plain']['measured_whole_run']:.0f}), predicted "
                  f"{item['plain']['predict']:.0f}"
                  + (f", simulated {item['plain']['simulate']:.0f}"
                     if item["plain"].get("simulate") else "") + "."
                  + (f" Prefill of one {item['prefill']['tokens']}-token prompt: measured "
                     f"{item['prefill']['measured_s'] * 1e3:.1f} ms, predicted "
                     f"{item['prefill']['predict_s'] * 1e3:.1f} ms "
                     f"({item['prefill']['error'] * 100:+.1f}%)." if "prefill" in item else ""),
                  ""]
        preds = [p for p in ("predict", "simulate") if item["all"] and p in item["all"]]
        head = "| policy | configs | " + " | ".join(
            f"{p} MAPE | {p} worst | {p} r | {p} regret" for p in preds) + " |"
        lines += [head, "|" + "---|" * (2 + 4 * len(preds))]
        for name, sm in [*item["per_policy"].items(), ("all", item["all"])]:
            cells = [name, str(sm["configs"])]
            for p in preds:
                e = sm[p]
                cells += _error_cells(e, name) + [f"{e['pearson_r']:.3f}", f"{e['regret']:.3f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("Cost side alone (seconds per iteration in the steady window, predicted vs "
                     "measured): " + "; ".join(
                         f"{name} MAPE {sm['iteration_time']['mape'] * 100:.1f}%, bias "
                         f"{sm['iteration_time']['bias'] * 100:+.1f}%"
                         for name, sm in [*item["per_policy"].items(), ("all", item["all"])])
                     + ".")
        lines.append("")
        phases = {name: sm.get("phases")
                  for name, sm in [*item["per_policy"].items(), ("all", item["all"])]}
        if any(phases.values()):
            lines += ["Cost side by phase (ms per iteration over the whole run, mean over the "
                      "configurations; measured / predicted):", "",
                      "| policy | " + " | ".join(PHASES) + " |", "|---|" + "---|" * len(PHASES)]
            for name, ph in phases.items():
                if ph:
                    lines.append(f"| {name} | " + " | ".join(
                        f"{ph[p]['measured']:.2f} / {ph[p]['predicted']:.2f}" for p in PHASES)
                        + " |")
            lines.append("")
        if item.get("acceptance"):
            lines.append("Acceptance side (tokens per iteration, predicted vs measured): "
                         + "; ".join(f"{m}: MAPE {v['mape'] * 100:.1f}%, worst "
                                     f"{v['worst'] * 100:.1f}%, bias {v['bias'] * 100:+.1f}% "
                                     f"({v['configs']} configs)"
                                     for m, v in item["acceptance"].items()) + ".")
            lines.append("")
        agree = item.get("trace_agreement")
        if agree:
            never = agree["prompts_never_matching"]
            lines.append(f"Answers decoded exactly as the trace recorded them (configurations at "
                         f"the recorded k, {agree['configs']}): {agree['matching_mean']:.1f} of "
                         f"{agree['requests']} on average (fewest {agree['matching_min']})"
                         + (f"; never: {', '.join(never)}" if never else "") + ".")
            lines.append("")
        lines += ["<details><summary>every configuration</summary>", "",
                  "| policy | s | k | measured tok/s (steady state) | predict | window tok/s | "
                  "measured tok/s (whole run) | simulate | tok/iter (all answers) | tok/iter "
                  "(window) | tok/iter predicted |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in item["rows"]:
            sim = f"{r['simulate']:.0f}" if r["simulate"] is not None else ""
            lines.append(f"| {r['policy']} | {r['s']} | {r['k']} | {r['measured']:.0f} | "
                         f"{r['predict']:.0f} | {r['measured_window']:.0f} | "
                         f"{r['measured_whole_run']:.0f} | {sim} | "
                         f"{r['tokens_per_iteration']:.2f} | "
                         f"{r['tokens_per_iteration_window']:.2f} | "
                         f"{r['tokens_per_iteration_predicted']:.2f} |")
        if item.get("excluded"):
            lines += ["", "Excluded (q = k + 1 above the verify kernel's 16: the engine's eager "
                      "torch fallback runs them): " + ", ".join(
                          f"{r['policy']} s={r['s']} k={r['k']} measured {r['measured']:.0f} "
                          f"vs predicted {r['predict']:.0f}" for r in item["excluded"]) + "."]
        lines += ["", "</details>", ""]
    across = rep.get("across_setups")
    if across and across["setups"] > 1:
        preds = [p for p in TARGET if p in across["all"]]
        lines += [f"### Across the {across['setups']} setups", "",
                  "Every setup's cells together; regret is each setup's own (its predicted "
                  "best against its measured best), the mean and the lowest.", "",
                  "| policy | configs | " + " | ".join(
                      f"{p} MAPE | {p} worst | {p} regret mean | {p} regret lowest"
                      for p in preds) + " |", "|" + "---|" * (2 + 4 * len(preds))]
        for name, sm in [*across["per_policy"].items(), ("all", across["all"])]:
            cells = [name, str(sm["configs"])]
            for p in preds:
                e = sm[p]
                cells += _error_cells(e, name) + [
                    f"{e['regret_mean']:.3f}",
                    f"{e['regret_lowest']:.3f} ({e['regret_lowest_setup']})"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _error_cells(summary: dict, name: str) -> list[str]:
    """A summary's MAPE and worst-cell columns (the worst cell named, with its setup in the
    ``all`` row)."""
    return [f"{summary['mape'] * 100:.1f}%",
            f"{summary['worst'] * 100:.1f}% ({_cell_label(summary['worst_cell'], name == 'all')})"]


def _cell_label(cell: dict, policy: bool = True) -> str:
    """A worst cell as the tables name it: its setup, its policy (where the row is not that
    policy's), s and k, and the signed miss (+: predicted faster than measured)."""
    where = f"{cell['setup']} " if cell.get("setup") else ""
    what = f"{cell['policy']} " if policy else ""
    return f"{where}{what}s={cell['s']} k={cell['k']}, {cell['error'] * 100:+.1f}%"

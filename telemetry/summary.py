"""What ``poolsim calibrate --measured``, ``validate --measured`` and ``record`` print (the CLI only echoes it)."""

from __future__ import annotations


def _pct(x, signed: bool = False) -> str:
    return "-" if x is None else (f"{x:+.1f} %" if signed else f"{x:.1f} %")


def calibrate_lines(rec: dict, out) -> list[str]:
    f = rec["fit"]
    se = f.get("rel_se") or {}
    fitted = ", ".join(f"{n} {rec['coefficients'][n]:.4g} (+-{se[n]:.1%})" if n in se else n for n in f["fitted"])
    e = f["heldout_error_pct"]
    lines = [f"{m['path']} ({m['format']}): {m['steps']} steps, {m['usable']} usable" for m in rec["measured"]]
    lines += [f"fit ({f['arch']}): {fitted or f.get('note') or 'nothing identifiable'}",
              "kept: " + (", ".join(rec["kept_defaults"]) or "-") + f" (why: {out}/calibration.json kept_defaults)",
              f"held-out ({f['n_heldout']} steps, {f['heldout']}): median |error| {_pct(e['median_abs'])}, "
              f"p90 {_pct(e['p90_abs'])}, median signed {_pct(e['median_signed'], True)}; MAPE train "
              f"{f['mape_train']:.2%}, held-out {f['mape_heldout']:.2%} (before: {f['before']['mape_heldout']:.2%})"]
    if rec["skipped"]:
        lines.append("not fitted: " + "; ".join(f"{n} x {why}" for why, n in rec["skipped"].items()))
    lines.append(f"wrote {out}/calibration.json (use: poolsim run --calibration {out}/calibration.json)")
    return lines


def validate_lines(result: dict) -> list[str]:
    lines = []
    if "steps" in result:
        lines.append(f"step times ({result['coefficients']}): predicted vs measured, 100 (predicted / measured - 1)")
        lines.append(f"{'kind':<8} {'steps':>7} {'median |err|':>13} {'p90 |err|':>10} {'median':>9}")
        rows = [("all", {"steps": result["steps"], **result["step_time_error_pct"]}), *result["by_kind"].items()]
        for kind, s in rows:
            lines.append(f"{kind:<8} {s['steps']:>7} {_pct(s['median_abs']):>13} {_pct(s['p90_abs']):>10} "
                         f"{_pct(s['median_signed'], True):>9}")
        for reason, n in result["skipped"].items():
            lines.append(f"  skipped {n} x {reason} (first at {result['first_skipped_at'][reason]})")
        g = result.get("cuda_graph")
        if g and g["disagree"]:
            lines.append(f"  cuda graph: {g['disagree']} of {g['lines']} log lines disagree with poolsim's "
                         f"(graphs up to batch {g['poolsim_cuda_graph_max_bs']}; first at {g['first_disagreement']})")
        for s in result.get("sizes", []):
            diff = [f"{k} log {v['log']} vs poolsim {v['poolsim']}" for k, v in s.items()
                    if isinstance(v, dict) and v["log"] != v["poolsim"]]
            lines.append(f"  sizes at {s['file']}:{s['line']}: " + ("equal to poolsim's plan" if not diff else
                                                                    "; ".join(diff) + " (are the flags the server's?)"))
    for run in result.get("runs", []):
        w = run["workload"]
        lines.append(f"{run['file']}:{run['line']}: {w['dataset_name']} {w['num_prompts']} prompts, rate "
                     f"{w['request_rate']}, max concurrency {w['max_concurrency'] or '-'}")
        if "not_replayed" in run:
            lines.append(f"  not replayed: {run['not_replayed']}")
            continue
        lines.append(f"  seed {run['seed']} ({run['seed_from']})" + (f"; {run['lengths']}" if "lengths" in run else ""))
        lines.append(f"  {'metric':<24} {'measured':>11} {'poolsim':>11} {'error':>9}")
        for name, m in run["metrics"].items():
            lines.append(f"  {name:<24} {m['measured']:>11.2f} {m['poolsim']:>11.2f} {_pct(m['error_pct'], True):>9}")
        wc = run["workload_check"]
        off = [f"{k} measured {v['measured']:g} vs poolsim {v['poolsim']:g}" for k, v in wc.items()
               if v["measured"] is not None and v["poolsim"] is not None and v["measured"] != v["poolsim"]]
        if off:
            lines.append("  workload differs: " + "; ".join(off))
        if "per_request" in run:
            p = run["per_request"]["ttft_error_pct"]
            lines.append(f"  per request ({run['per_request']['requests']}): TTFT median |error| "
                         f"{_pct(p['median_abs'])}, median signed {_pct(p['median_signed'], True)}")
    return lines


def record_line(summary: dict) -> str:
    bad = "; ".join(f"{n} x {why}" for why, n in summary["undecodable"].items())
    return (f"wrote {summary['written']} messages to {summary['out']} in {summary['elapsed_s']:.1f} s (stopped after "
            f"{summary['stopped_after']}; " + ", ".join(f"{ep}: {n}" for ep, n in summary["by_endpoint"].items())
            + (f"; not written: {bad}" if bad else "") + ")")

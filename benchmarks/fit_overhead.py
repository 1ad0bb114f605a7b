"""Print the overhead fit and the validation tables as Markdown (the source of docs/accuracy.md).

    python benchmarks/fit_overhead.py            # fit + tables from the shipped reports
    python benchmarks/fit_overhead.py --write    # also rewrite profiles/overhead.json (= kvplan validate --fit)

Nothing here is timed; it prints figures.
"""

from __future__ import annotations

import sys

from kvplan.plan.overhead import load_overhead
from kvplan.units import format_range
from kvplan.validate.fit import run_fit, write_overhead
from kvplan.validate.reports import DEFAULT_REPORTS
from kvplan.validate.runner import validate


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.2f}%"


def main(argv: list[str]) -> int:
    fit = run_fit()
    if "--write" in argv:
        print(f"<!-- wrote {write_overhead(fit, DEFAULT_REPORTS)} -->")
        load_overhead.cache_clear()
    print("## Fitted coefficients\n")
    print("| coefficient | value |\n|---|---|")
    print(f"| sampler bytes per logit | {fit.sampler_bytes_per_logit} |")
    print(f"| activation range (sampler) | -{fit.sampler_spread[0]:.1%} / +{fit.sampler_spread[1]:.1%} |")
    print(f"| non-torch, TP = 1 | {fit.non_torch_gib_single} GiB |")
    print(f"| non-torch, TP > 1 | {fit.non_torch_gib_multi} GiB |")
    print(f"| non-torch range | ± {fit.non_torch_spread_gib} GiB |")
    print("\n## Fit residuals\n")
    print("| case | used for | B/logit | non-torch GiB | predicted KV GiB | reported | error | left out because |")
    print("|---|---|---|---|---|---|---|---|")
    for r in fit.rows:
        print(f"| {r.case_id} | {', '.join(r.used_for)} | {'' if r.bytes_per_logit is None else r.bytes_per_logit} | "
              f"{'' if r.non_torch_gib is None else r.non_torch_gib} | "
              f"{'' if r.predicted_kv_gib is None else r.predicted_kv_gib} | {r.kv_gib if r.kv_gib is not None else ''} | "
              f"{_pct(r.kv_error_pct)} | {r.excluded or ''} |")
    result = validate()
    print("\n## Page math (reported available KV memory in)\n")
    print("| case | model | rules | KV tokens pred / reported | error | blocks pred / reported | "
          "concurrency pred / reported | rounding bound |")
    print("|---|---|---|---|---|---|---|---|")
    for c in (c for c in result.cases if c.mode == "page" and c.comparisons):
        t, b, q = c.get("tokens"), c.get("blocks"), c.get("concurrency")
        print(f"| {c.case_id} | {c.model}{' (hybrid)' if c.hybrid else ''} | {c.vllm_rules} | "
              f"{f'{int(t.predicted):,} / {int(t.reported):,}' if t else ''} | {_pct(t.error_pct) if t else ''} | "
              f"{f'{int(b.predicted):,} / {int(b.reported):,}' if b else ''} | "
              f"{f'{q.predicted:.2f} / {q.reported:.2f}' if q else ''} | ±{c.rounding_bound_pct:.3f}% |")
    print("\n## Full budget (GPU and settings in)\n")
    print("| case | model | GPU | rules | available KV pred / reported | error | range | LOO error | "
          "weights/GPU pred / reported | error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in (c for c in result.cases if c.mode == "full"):
        kv, w = c.get("available_kv_gib"), c.get("weights_gib")
        if kv is None:
            print(f"| {c.case_id} | {c.model} | | {c.vllm_rules} | {c.status} | | | | | |")
            continue
        rng = format_range(kv.low, kv.high) + ("" if kv.in_range else " (out)")
        print(f"| {c.case_id} | {c.model} | {c.gpu} | {c.vllm_rules} | {kv.predicted:.2f} / {kv.reported:.2f} | "
              f"{_pct(kv.error_pct)} | {rng} | {_pct(kv.loo_error_pct)} | "
              f"{f'{w.predicted:.2f} / {w.reported:.2f}' if w else ''} | {_pct(w.error_pct) if w else ''} |")
    print("\n## Summary (absolute % error)\n")
    print("| mode | quantity | reports | n | median | p90 | max | LOO median | LOO p90 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in result.summaries:
        if s.n:
            loo_m = "" if s.loo_median_abs_pct is None else f"{s.loo_median_abs_pct:.2f}%"
            loo_p = "" if s.loo_p90_abs_pct is None else f"{s.loo_p90_abs_pct:.2f}%"
            print(f"| {s.mode} | {s.quantity} | {s.subset} | {s.n} | {s.median_abs_pct:.2f}% | {s.p90_abs_pct:.2f}% | "
                  f"{s.max_abs_pct:.2f}% | {loo_m} | {loo_p} |")
    print("\n## Goals\n")
    for g in result.goals:
        print(f"- {'met' if g.met else 'MISSED'}: {g.name}: {g.target}; got {g.achieved}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

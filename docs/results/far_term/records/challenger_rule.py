"""The challenger rule of docs/results/far_term README ("Two more exact heads … design", applied from 2026-12-01):
a challenger's test-split study judged bar by bar beside the shipped student's, and the verdict.

    python docs/results/far_term/records/challenger_rule.py CHALLENGER SHIPPED [--bar4 STUDY] [--unpaired]
    e.g. docs/results/far_term/long1k_fresh_test/comparison.json docs/results/far_term/heads_test/comparison.json \
        --bar4 docs/results/far_term/long1k_test/comparison.json

Each bar as issue #45 words it, on each study's own fits, (a), (b) and teacher (``test_study_pairing.per_seed``):
  1. the student below its equal-state window (b) by more than 2 seed SDs (mean log ratio over seeds, at 256–511
     and at in-document 2048–4095);
  2. >= 60% of the (a)–teacher log gap closed (mean over seeds, at each position);
  3. passkey >= 0.5 at 2k and at 4k (depths 0.25–0.75, pooled over the fits' prompts) where the teacher is >= 0.9,
     with a decode state at 4k <= 25% of the teacher's fp32 KV cache there (the largest fit's); "3, every fit" asks
     the same passkey rates of each fit alone;
  4. every fit under 60 min on 2 cores and its dims from the DoF. ``--bar4 STUDY`` reads the fit times from another
     study of the challenger's recipe (its fits on the 2-core machine the shipped student's were timed on) when the
     challenger's own fits ran on a slower machine; its own fit times are printed beside.
The challenger replaces the shipped student if it meets every bar the shipped one meets and either (i) meets one the
shipped one misses, or (ii) is better on bars 1 and 2 at both positions with no fewer bar passkeys on the mean and a
state within bar 3. With the same seeds, (ii) is paired per seed and asks every seed; with different seeds (fresh
fits) it is read unpaired: the challenger's mean better than the shipped one's by more than 2 standard errors of the
difference, sqrt(SE_1^2 + SE_2^2) over seeds.
"""

import argparse
import math
import statistics as st
import sys
from pathlib import Path

from test_study_pairing import BUCKETS, bar_cells, cells, per_seed, se

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tools"))
from state_retrieval_plot import state_at  # noqa: E402  (the repository's tools/, not a package)

CONTEXTS = ("2k", "4k")


def state_share(cell, teacher, tokens=4096):
    """A cell's decode state at ``tokens`` over the teacher's fp32 KV cache there (closed form: bytes + growth)."""
    return state_at(cell, cell["state"], tokens) / state_at(teacher, teacher["state"], tokens)


def pooled_bar(rows):
    """Bar passkey rates at 2k and 4k pooled over the fits' prompts (hits / prompts)."""
    return [sum(r["bar"][0][i] for r in rows.values()) / sum(r["bar"][1][i] for r in rows.values()) for i in (0, 1)]


def bars(study, bar4_study=None):
    """({bar: (met, what)}, its per-seed rows, whether its largest decode state at 4k is within bar 3's 25%)."""
    rows, teacher = per_seed(study), study[("teacher", None)]
    out = {}
    for bucket in BUCKETS:
        logs = [r[bucket]["log_b"] for r in rows.values() if bucket in r]
        gaps = [100 * r[bucket]["gap"] for r in rows.values() if bucket in r]
        if len(logs) < 3:
            out[f"1 at {bucket}"] = out[f"2 at {bucket}"] = (False, f"{len(logs)} fits measured; the bar asks >= 3")
            continue
        below = -st.mean(logs) / st.stdev(logs)
        out[f"1 at {bucket}"] = (below > 2, f"/(b) {math.exp(st.mean(logs)):.3f}, {below:.1f} seed SDs below")
        out[f"2 at {bucket}"] = (st.mean(gaps) >= 60, f"{st.mean(gaps):.1f}% ± {se(gaps):.1f}% closed")
    teacher_bar = [x / n for x, n in zip(*bar_cells(teacher))]
    pooled = pooled_bar(rows)
    share = max(state_share(study[("student", s)], teacher) for s in rows)
    ok_teacher, ok_state = all(t >= 0.9 for t in teacher_bar), share <= 0.25
    out["3 on the mean"] = (
        ok_teacher and ok_state and all(p >= 0.5 for p in pooled),
        f"{pooled[0]:.2f} · {pooled[1]:.2f} (teacher {teacher_bar[0]:.2f} · {teacher_bar[1]:.2f}); "
        f"state {100 * share:.1f}%",
    )
    per_fit = {s: [h / n for h, n in zip(*r["bar"])] for s, r in rows.items()}
    out["3 every fit"] = (
        ok_teacher and ok_state and all(p >= 0.5 for v in per_fit.values() for p in v),
        ", ".join(f"seed {s} {h[0]}/{n[0]} · {h[1]}/{n[1]}" for s, (h, n) in ((s, rows[s]["bar"]) for s in rows)),
    )
    fits = [study[("student", s)]["fit"] for s in rows]
    timed = [c["fit"] for (kind, _), c in bar4_study.items() if kind == "student"] if bar4_study else fits
    minutes = [f["wall_seconds"] / 60 for f in timed]
    own = ", ".join(f"{f['wall_seconds'] / 60:.0f}" for f in fits)
    source = f"timed by the other study: {', '.join(f'{m:.0f}' for m in minutes)} min; its own fits {own} min"
    out["4"] = (
        max(minutes) < 60 and all(f["strategy"] == "dof" for f in fits + timed),
        source if bar4_study else f"fits {own} min",
    )
    return out, rows, ok_state


def better(challenger_rows, shipped_rows, unpaired=False):
    """(ii): {what: (better, how)} on bars 1 and 2 at both positions and the bar passkeys on the mean; paired per
    seed where both studies have the same seeds, unless ``unpaired``."""
    paired = set(challenger_rows) == set(shipped_rows) and not unpaired
    out = {}
    for bucket in BUCKETS:
        for bar, key, scale in (("1", "log_b", -1), ("2", "gap", 100)):  # lower log ratio, more gap points: better
            c = {s: scale * r[bucket][key] for s, r in challenger_rows.items()}
            d = {s: scale * r[bucket][key] for s, r in shipped_rows.items()}
            if paired:
                diffs = [c[s] - d[s] for s in c]
                out[f"{bar} at {bucket}"] = (all(x > 0 for x in diffs), "paired per seed: " + _fmt(diffs, key))
            else:
                diff = st.mean(c.values()) - st.mean(d.values())
                err = math.hypot(se(list(c.values())), se(list(d.values())))
                out[f"{bar} at {bucket}"] = (
                    diff > 2 * err,
                    f"unpaired: {_fmt([diff], key)}, 2 SE {_fmt([2 * err], key).lstrip('+')}",
                )
    rates = [pooled_bar(challenger_rows), pooled_bar(shipped_rows)]
    out["passkeys on the mean"] = (
        all(c >= s for c, s in zip(*rates)),
        " · ".join(f"{c:.2f} vs {s:.2f}" for c, s in zip(*rates)),
    )
    return out


def _fmt(values, key):
    """Differences as log ratios (bar 1) or gap points (bar 2), the better direction positive."""
    unit = "{:+.4f}" if key == "log_b" else "{:+.1f} points"
    return ", ".join(unit.format(v) for v in values)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("challenger", help="the challenger's test-split study (comparison.json)")
    parser.add_argument("shipped", help="the shipped student's test-split study (comparison.json)")
    parser.add_argument("--bar4", help="a study of the challenger's recipe whose fits time bar 4")
    parser.add_argument("--unpaired", action="store_true", help="read (ii) unpaired even where the seeds match")
    args = parser.parse_args()
    ch, ch_rows, ch_state = bars(cells(args.challenger), cells(args.bar4) if args.bar4 else None)
    sh, sh_rows, _ = bars(cells(args.shipped))
    print(f"challenger seeds {sorted(ch_rows)}, shipped seeds {sorted(sh_rows)}")
    for bar in ch:
        print(
            f"bar {bar}: challenger {'met' if ch[bar][0] else 'MISSED'} ({ch[bar][1]}) · "
            f"shipped {'met' if sh[bar][0] else 'MISSED'} ({sh[bar][1]})"
        )
    keeps = all(ch[b][0] for b in sh if sh[b][0])
    more = [b for b in ch if ch[b][0] and not sh[b][0]]
    ii = better(ch_rows, sh_rows, args.unpaired)
    for what, (ok, how) in ii.items():
        print(f"(ii) {what}: {'better' if ok else 'not better'} ({how})")
    ii_ok = all(ok for ok, _ in ii.values()) and ch_state
    print(f"meets every bar the shipped student meets: {keeps}; (i) meets more: {more or 'none'}; (ii): {ii_ok}")
    print(
        "verdict: the challenger "
        + ("replaces" if keeps and (more or ii_ok) else "does not replace")
        + " the shipped student"
    )

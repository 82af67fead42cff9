"""A test-split study's numbers against the bars, per seed and over seeds, from its committed comparison.json — and,
given a second study, the first study's student paired with the second's of the same seed (same blocks, documents and
prompts).

    python docs/results/far_term/records/test_study_pairing.py STUDY [OTHER] [--borrow]
    e.g. docs/results/far_term/reach_test/comparison.json docs/results/far_term/heads_test/comparison.json

Per seed: the student's log-perplexity ratio to its equal-state window (b) at 256–511 (sliding perplexity, paired
over the blocks) and at in-document 2048–4095 (long documents, paired over the documents), the share of the
(a)–teacher log gap closed there, passkey at 2k / 4k at depths 0.25–0.75 (the bar's cells), passkey and recall over
all prompts and paired with (b). Over seeds: mean ± SE, and the bar's "more than 2 seed SDs" (the SD over seeds of the
per-seed log ratio against its mean). The quickstart_heads study's table (README, "seeds 0, 1 and 2") is what this
prints for docs/results/far_term/heads_test/comparison.json. With ``--borrow``, an (a) or (b) of STUDY without long
documents takes OTHER's record of the same control (same seed, window, sinks, state bytes and test-split perplexity:
the same teacher-weight model, measured once).
"""

import argparse
import json
import math
import statistics as st
from pathlib import Path

BUCKETS = ("256-511", "2048-4095")


def cells(path):
    """{(kind, seed): cell} of one study: kind "student", "a", "b", "teacher" (seed None)."""
    out = {}
    for c in json.loads(Path(path).read_text())["cells"]:
        kind = {"student": "student", "teacher": "teacher"}.get(c["kind"])
        if c["kind"] == "control":
            kind = {"window_sinks": "a", "equal_state": "b"}.get(c["row"].split(":")[-1])
        if kind:
            out[(kind, c["seed"])] = c
    return out


def nll(cell, bucket):
    """Per-block (256–511: sliding blocks) or per-document (2048–4095) mean NLL lists of a bucket, or None."""
    if bucket == "256-511":
        return (cell.get("by_position") or {}).get("buckets", {}).get(bucket, {}).get("block_nll")
    return ((cell.get("long_documents") or {}).get("buckets") or {}).get(bucket, {}).get("block_nll")


def se(x):
    """Standard error of the mean."""
    return st.stdev(x) / math.sqrt(len(x)) if len(x) > 1 else float("nan")


def items(cell, task):
    """The 0/1 items of a retrieval task, or None."""
    record = (cell.get("retrieval") or {}).get(task)
    return record["items"] if record else None


def bar_cells(cell):
    """Passkey hits at 2048 and 4096 over depths 0.25, 0.5, 0.75 (and the prompts there)."""
    record = (cell.get("retrieval") or {}).get("passkey")
    if not record:
        return None
    cs = record["cells"]
    hits = [round(sum(cs[c][k]["mean"] * cs[c][k]["n"] for k in ("0.25", "0.5", "0.75"))) for c in ("2048", "4096")]
    n = [sum(cs[c][k]["n"] for k in ("0.25", "0.5", "0.75")) for c in ("2048", "4096")]
    return hits, n


def per_seed(study):
    """{seed: the bar numbers of its student} (README table rows)."""
    teacher = study[("teacher", None)]
    rows = {}
    for (kind, seed), student in sorted(study.items(), key=lambda kv: str(kv[0])):
        if kind != "student":
            continue
        a, b = study.get(("a", seed)), study.get(("b", seed))
        r = {"ppl": student["ppl"], "state_4k": (student.get("state") or {}).get("bytes")}
        for bucket in BUCKETS:
            s, t, aa, bb = (nll(x, bucket) if x else None for x in (student, teacher, a, b))
            if not (s and t and aa and bb):
                continue
            d = [x - y for x, y in zip(s, bb)]
            r[bucket] = {
                "ppl": math.exp(st.mean(s)),
                "log_b": st.mean(d),
                "ratio_b": math.exp(st.mean(d)),
                "ratio_b_se": math.exp(st.mean(d)) * se(d),
                "gap": 1 - (st.mean(s) - st.mean(t)) / (st.mean(aa) - st.mean(t)),
            }
        for task in ("passkey", "recall"):
            si, bi = items(student, task), items(b, task) if b else None
            if si:
                r[task] = 100 * st.mean(si)
                if bi:
                    r[f"{task}-b"] = 100 * (st.mean(si) - st.mean(bi))
        r["bar"] = bar_cells(student)
        rows[seed] = r
    return rows


def summary(name, rows):
    """Print the per-seed rows and the over-seed lines."""
    print(f"== {name}: seeds {sorted(rows)}")
    for seed, r in sorted(rows.items()):
        parts = [f"seed {seed}: ppl {r['ppl']:.2f}"]
        for bucket in BUCKETS:
            if bucket in r:
                x = r[bucket]
                ratio = f"/(b) {x['ratio_b']:.3f} ± {x['ratio_b_se']:.3f}"
                parts.append(f"{bucket}: ppl {x['ppl']:.2f}, {ratio}, gap {100 * x['gap']:.0f}%")
        for key in ("passkey", "passkey-b", "recall", "recall-b"):
            if key in r:
                parts.append(f"{key} {r[key]:+.0f}" if key.endswith("-b") else f"{key} {r[key]:.0f}%")
        if r["bar"]:
            (h2, h4), (n2, n4) = r["bar"]
            parts.append(f"passkey bar 2k {h2}/{n2} 4k {h4}/{n4}")
        print(" · ".join(parts))
    for bucket in BUCKETS:
        have = [r[bucket] for r in rows.values() if bucket in r]
        if len(have) < 2:
            continue
        logs = [x["log_b"] for x in have]
        ratios, gaps = [x["ratio_b"] for x in have], [100 * x["gap"] for x in have]
        below = -st.mean(logs) / st.stdev(logs)  # seed SDs the mean log ratio lies below (b)
        print(
            f"{bucket} over {len(have)} seeds: /(b) {st.mean(ratios):.3f} ± {se(ratios):.3f} "
            f"(mean log {st.mean(logs):+.4f}, seed SD {st.stdev(logs):.4f}, "
            f"below by {below:.2f} SDs: > 2 SDs {below > 2}); "
            f"gap closed {st.mean(gaps):.1f}% ± {se(gaps):.1f}%"
        )
    bars = [r["bar"] for r in rows.values() if r["bar"]]
    if bars:
        for i, context in enumerate(("2k", "4k")):
            hits, n = sum(b[0][i] for b in bars), sum(b[1][i] for b in bars)
            print(f"passkey bar {context}: {hits}/{n} = {hits / n:.2f} over {len(bars)} seeds")
    for key in ("passkey", "passkey-b", "recall", "recall-b"):
        vals = [r[key] for r in rows.values() if key in r]
        if len(vals) > 1:
            print(f"{key}: {st.mean(vals):.0f} ± {se(vals):.0f} over {len(vals)} seeds")


def against(study, other):
    """Print each seed's student paired with the other study's student of the same seed."""
    print("== paired with the other study's student, the same seed")
    over = {}  # bucket or task -> per-seed ratio or points
    for seed in sorted(s for (k, s) in study if k == "student"):
        x, y = study[("student", seed)], other.get(("student", seed))
        if not y:
            print(f"seed {seed}: the other study has no student")
            continue
        parts = [f"seed {seed}"]
        for bucket in BUCKETS:
            a, b = nll(x, bucket), nll(y, bucket)
            if a and b:
                d = [p - q for p, q in zip(a, b)]
                ratio = math.exp(st.mean(d))
                parts.append(f"{bucket} ratio {ratio:.3f} ± {ratio * se(d):.3f}")
                over.setdefault(bucket, []).append(ratio)
        for task in ("passkey", "recall"):
            a, b = items(x, task), items(y, task)
            if a and b:
                parts.append(f"{task} {100 * (st.mean(a) - st.mean(b)):+.0f} points")
                over.setdefault(task, []).append(100 * (st.mean(a) - st.mean(b)))
        print(" · ".join(parts))
    for key, vals in over.items():
        if len(vals) > 1:
            unit = ".3f" if key in BUCKETS else ".0f"
            print(f"{key} over {len(vals)} seeds: {st.mean(vals):{unit}} ± {se(vals):{unit}}")


def borrow_long_documents(study, other):
    """Give each (a)/(b) cell of ``study`` without long documents the other study's record of the same control —
    the same seed, window, sinks and state bytes, and the same test-split perplexity to the last digit: the same
    teacher-weight model (the same exact heads) — and say which were borrowed."""
    for (kind, seed), cell in study.items():
        twin = other.get((kind, seed))
        if kind not in ("a", "b") or cell.get("long_documents") or not twin or not twin.get("long_documents"):
            continue
        keys = ("window", "sink_tokens", "state_bytes", "student_state_bytes")
        same_ppl = cell.get("ppl") is not None and cell.get("ppl") == twin.get("ppl")  # the same test-split blocks
        if same_ppl and all(cell["control"].get(k) == twin["control"].get(k) for k in keys):
            cell["long_documents"] = twin["long_documents"]
            print(
                f"({kind}) seed {seed}: long documents from the other study's same control (window "
                f"{cell['control']['window']} + {cell['control']['sink_tokens']})"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", help="a test-split study's comparison.json")
    parser.add_argument("other", nargs="?", help="a second study's, for the same-seed pairing")
    parser.add_argument("--borrow", action="store_true", help="take missing (a)/(b) long documents from OTHER")
    args = parser.parse_args()
    study = cells(args.study)
    other = cells(args.other) if args.other else None
    if args.borrow and other:
        borrow_long_documents(study, other)
    summary(args.study, per_seed(study))
    if other:
        against(study, other)

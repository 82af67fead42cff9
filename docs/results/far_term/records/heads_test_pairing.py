"""Per-seed and over-seed numbers of the quickstart_heads test-split study (docs/results/far_term README, "seeds 0,
1 and 2"), from the study's cells: python docs/results/far_term/records/heads_test_pairing.py [OUT]  (default
runs/far_term_test)."""

import json
import math
import statistics as st
import sys
from pathlib import Path

R = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/far_term_test")
EX = "exact6.0-7.2-8.0-14.0.1-15.2-17.0.1-18.2-19.1-20.1.2-21.0.1.2-22.1.2-23.0"
A, B = R / f"controls/teacher_window64_sinks4_{EX}", R / f"controls/teacher_window104_sinks4_{EX}"
T = R / "C64/teacher"


def cell(row, s):
    return R / "C64" / (row if s == 0 else f"seed{s}/{row}")


def load(p):
    return json.loads(p.read_text()) if p.exists() else None


def nll(d, bucket, key="by_position"):
    b = (d["by_position"]["buckets"] if key == "by_position" else d["buckets"])[bucket]
    return b["block_nll"]


def items(p, task):
    d = load(p / "retrieval" / f"{task}.json")
    return d["items"]["exact_match"] if d else None


def bar(p, task):
    d = load(p / "retrieval" / f"{task}.json")
    if not d:
        return None
    return [
        round(sum(d["cells"][c][k]["mean"] * d["cells"][c][k]["n"] for k in ("0.25", "0.5", "0.75")))
        for c in ("2048", "4096")
    ]


def se(x):
    return st.stdev(x) / math.sqrt(len(x)) if len(x) > 1 else float("nan")


def paired_ratio(a, b):
    d = [x - y for x, y in zip(a, b)]
    return math.exp(st.mean(d)), math.exp(st.mean(d)) * se(d)


tp, ap, bp = load(T / "ppl.json"), load(A / "ppl.json"), load(B / "ppl.json")
tl, al, bl = load(T / "long_documents.json"), load(A / "long_documents.json"), load(B / "long_documents.json")
rows = {}
for s in (0, 1, 2):
    p = cell("quickstart_heads", s)
    sp = load(p / "ppl.json")
    if not sp:
        print("seed", s, "no ppl yet")
        continue
    r = {"ppl": sp["ppl"]}
    st_, tt, aa, bb = (nll(x, "256-511") for x in (sp, tp, ap, bp))
    r["ratio_b_256"] = paired_ratio(st_, bb)
    r["over_teacher_256"] = math.exp(st.mean(st_) - st.mean(tt))
    r["gap_256"] = 1 - (st.mean(st_) - st.mean(tt)) / (st.mean(aa) - st.mean(tt))
    sl = load(p / "long_documents.json")
    if sl and bl:
        for bucket in ("512-2047", "2048-4095"):
            x, t_, a_, b_ = (nll(d, bucket, "long") for d in (sl, tl, al, bl))
            r[f"long_{bucket}"] = (
                math.exp(st.mean(x)),
                paired_ratio(x, b_),
                1 - (st.mean(x) - st.mean(t_)) / (st.mean(a_) - st.mean(t_)),
            )
    for task in ("passkey", "recall"):
        si, bi = items(p, task), items(B, task)
        if si:
            r[task] = 100 * st.mean(si)
            r[f"{task}_bar"] = bar(p, task)
            d = [100 * (x - y) for x, y in zip(si, bi)]
            r[f"{task}-b"] = (st.mean(d), se(d))
            qi = items(cell("quickstart_retrieval", s), task)
            if qi:
                d = [100 * (x - y) for x, y in zip(si, qi)]
                r[f"{task}-qr"] = (st.mean(d), se(d))
    qp = load(cell("quickstart_retrieval", s) / "ppl.json")
    if qp:
        r["ratio_qr_256"] = paired_ratio(st_, nll(qp, "256-511"))
    for name in ("tail_only", "far_only"):
        c = load(p / "controls" / name / "ppl.json")
        r[name + "_ppl"] = c["ppl"] if c else None
        if name == "tail_only":
            r["c_passkey"], r["c_recall"] = (
                100 * st.mean(items(p / "controls" / name, t)) if items(p / "controls" / name, t) else None
                for t in ("passkey", "recall")
            )
    f = load(p / "fit.json")
    r["fit_s"] = f.get("wall_seconds") if f else None
    rows[s] = r
    print(f"seed {s}:", json.dumps(r, default=lambda x: x)[:2000])


def over(key, f=lambda v: v):
    v = [f(rows[s][key]) for s in rows if rows[s].get(key) is not None]
    return (st.mean(v), se(v), len(v)) if v else None


print("over seeds:")
for key, f in [
    ("ppl", None),
    ("over_teacher_256", None),
    ("gap_256", None),
    ("ratio_b_256", lambda v: v[0]),
    ("passkey", None),
    ("passkey_bar", lambda v: sum(v) / 12),
    ("passkey-b", lambda v: v[0]),
    ("recall", None),
    ("recall-b", lambda v: v[0]),
    ("ratio_qr_256", lambda v: v[0]),
    ("passkey-qr", lambda v: v[0]),
    ("recall-qr", lambda v: v[0]),
    ("long_2048-4095", lambda v: v[1][0]),
    ("long_512-2047", lambda v: v[1][0]),
]:
    o = over(key, f or (lambda v: v))
    print(f"  {key}: {o}")
o = over("long_2048-4095", lambda v: v[2])
print("  long gap 2048-4095:", o)
o = over("ratio_b_256", lambda v: math.log(v[0]))
print(
    "  log ratio b 256 mean, SE:",
    o,
    " seed SD:",
    st.stdev([math.log(rows[s]["ratio_b_256"][0]) for s in rows]) if len(rows) > 1 else None,
)
o = over("long_2048-4095", lambda v: math.log(v[1][0]))
print(
    "  log ratio b long:",
    o,
    " SD:",
    st.stdev([math.log(rows[s]["long_2048-4095"][1][0]) for s in rows if "long_2048-4095" in rows[s]])
    if sum("long_2048-4095" in rows[s] for s in rows) > 1
    else None,
)

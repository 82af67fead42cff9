"""A long-document choosing set outside the test split: trained students beside their controls, far into long
articles of the *training* split that no fit reads (issue #45, bar 2; docs/results/far_term README).

The long-document test set reports bar 2 and the validation split holds two articles of ≥ 16,000 characters, so
trained candidates are chosen here instead: the **last** ``--articles`` training-split articles of the corpus file
with at least ``LONG_DOCUMENT_CHARS`` characters and 4096 tokens (the other half of the long articles, which the
training split keeps), truncated to 4096 tokens and scored from their first token by in-document position
(``long_document_perplexity``, buckets 0–63, 64–511, 512–2047, 2048–4095). A fit streams the training split from
the start of the file through a shuffle buffer of 1024 documents and reads < 1M tokens, so these articles, near the
end of a file of tens of thousands of training articles, are never trained on (the script prints their indices).

For each student: the student, its (a) window + sinks and its (b) equal-state window (``control_models``, the
student's exact KV heads exact in both), and the teacher once; per bucket the perplexities, the student's paired
ratios to (a), (b) and the teacher (± SE over articles) and the share of the (a)–teacher log-gap it closes.

Run: ``python docs/results/far_term/records/long_choice.py <corpus> NAME=STUDENT_DIR ... --out long_choice.json``
(resumable: the teacher and the students already in ``--out``, on the same articles, are kept).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from lit_dof.data.sources import last_long_documents
from lit_dof.evaluation.controls import control_info, control_models
from lit_dof.evaluation.loading import load_model
from lit_dof.evaluation.long_documents import long_document_perplexity
from lit_dof.evaluation.position_perplexity import bucket_ratios
from lit_dof.students.surgery import exact_heads
from lit_dof.teacher.loading import load_teacher

T = 4096
EDGES = (0, 64, 512, 2048, 4096)


class Chosen:
    """A document source holding the chosen texts (``long_document_perplexity`` reads it as it reads a split)."""

    def __init__(self, texts: list[str], label: str) -> None:
        self.texts, self.label = texts, label

    def select(self, *args, **kwargs):
        """The chosen texts, whatever split is asked for."""
        return iter(self.texts)

    def __str__(self) -> str:
        """The label recorded as the source."""
        return self.label


def closed(student: dict, a: dict, teacher: dict, bucket: str) -> float | None:
    """The share of (a)'s log-perplexity gap to the teacher that the student closes in ``bucket`` (``None`` where
    there is no gap: (a) is the teacher inside its window + sinks)."""
    s, w, t = (math.log(r["buckets"][bucket]["ppl"]) for r in (student, a, teacher))
    return (w - s) / (w - t) if abs(w - t) > 1e-4 else None


def control_key(student, window: int, sinks: int) -> str:
    """What makes two students' window controls one model: the window, the sinks, the softmax layers and the exact
    KV heads (the teacher's weights are shared)."""
    return json.dumps([window, sinks, list(student.config.softmax_layers or []), exact_heads(student.model)])


def main() -> None:
    """Choose the articles, measure the teacher and each student beside its (a) and (b), write the record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("students", nargs="+", help="NAME=exported student directory")
    parser.add_argument("--articles", type=int, default=12)
    parser.add_argument("--out", default="long_choice.json")
    args = parser.parse_args()
    teacher, tokenizer = load_teacher()
    texts, indices, total = last_long_documents(args.corpus, tokenizer, args.articles, min_tokens=T)
    print(f"{len(texts)} articles, training-split indices {indices[0]}..{indices[-1]} of {total}", flush=True)
    source = Chosen(texts, f"the last {len(texts)} long training articles of {args.corpus}")

    def measure(model) -> dict:
        return long_document_perplexity(model, tokenizer, source, max_tokens=T, edges=EDGES, progress=False)

    record = {"articles": len(texts), "train_indices": indices, "train_documents": total, "tokens": T}
    if os.path.exists(args.out):  # resumable: the teacher and the students already measured on these articles
        with open(args.out) as handle:
            done = json.load(handle)
        if done["train_indices"] == indices:
            record = done
    start = time.time()
    if "teacher" not in record:
        record["teacher"] = measure(teacher)
        print(f"teacher {time.time() - start:.0f} s", flush=True)
    for spec in args.students:
        name, path = spec.split("=", 1)
        if name in record:
            print(f"{name}: measured already ({args.out})")
            continue
        student = load_model(path)[0].eval()
        controls = control_models(student, teacher, tail=False)
        entry = {"path": path, "student": measure(student)}
        for key, label in (("window_sinks", "a"), ("equal_state", "b")):
            info = control_info(controls[key])
            same = control_key(student, info.window, info.sink_tokens)
            earlier = [e[k] for e in record.values() if isinstance(e, dict) for k in ("a", "b") if k in e]
            entry[label] = next((e for e in earlier if e.get("control") == same), None) or {
                "window": info.window,
                "sinks": info.sink_tokens,
                "control": same,  # the same model for every student with this key: measured once
                **measure(controls[key]),
            }
        entry["state_bytes"] = control_info(controls["equal_state"]).student_state_bytes
        entry["vs"] = {k: bucket_ratios(entry["student"], entry[k]) for k in ("a", "b")}
        entry["vs"]["teacher"] = bucket_ratios(entry["student"], record["teacher"])
        entry["closed"] = {
            b: closed(entry["student"], entry["a"], record["teacher"], b) for b in entry["student"]["buckets"]
        }
        record[name] = entry
        print(f"{name} ({time.time() - start:.0f} s): (b) window {entry['b']['window']} + {entry['b']['sinks']}")
        for bucket in entry["student"]["buckets"]:
            ppl = [r["buckets"][bucket]["ppl"] for r in (entry["student"], entry["a"], entry["b"], record["teacher"])]
            vs = {k: entry["vs"][k].get(bucket) for k in ("a", "b", "teacher")}
            text = " ".join(f"/{k} {v['ratio']:.3f}±{v['stderr']:.3f}" for k, v in vs.items() if v)
            print(
                f"  {bucket:>9}: student {ppl[0]:.2f} (a) {ppl[1]:.2f} (b) {ppl[2]:.2f} teacher {ppl[3]:.2f} {text}"
                f" closed {entry['closed'][bucket] or 0:.1%}",
                flush=True,
            )
        del student, controls
        with open(args.out, "w") as handle:
            json.dump(record, handle, indent=1)


if __name__ == "__main__":
    main()

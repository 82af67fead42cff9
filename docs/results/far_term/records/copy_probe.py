"""Can a student copy from beyond its window? A probe on validation text, no training (issue #45, bar 3).

Each of the first 16 validation blocks of ``T`` tokens gets one repeat of 16 of its own tokens
(``lit_dof.data.repeated_spans.RepeatedSpans(share=1, min_length=16, max_length=16, min_distance=D)``, keyed
``probe/<T>/<i>``: the same repeats for every model), the repeat starting at least D tokens after its source ends.
Scored on the repeat's tokens 2–16 (the first cannot be known to be a copy): greedy top-1 accuracy and mean NLL, for
the teacher, each student and the student's (a) control (the teacher behind the student's window + sinks, its exact
KV heads exact). Two settings: T = 512, D = 128 (the distances a 512-token training block holds) and T = 2048,
D = 1024 (the passkey's distances at 2k).

Run: ``python docs/results/far_term/records/copy_probe.py <corpus> NAME=STUDENT_DIR ... --out copy_probe.json``
(resumable; ``--report`` prints the record's figures without measuring).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from lit_dof.data.datamodule import WikipediaDataModule
from lit_dof.data.repeated_spans import RepeatedSpans
from lit_dof.evaluation.controls import control_info, control_models
from lit_dof.evaluation.loading import load_model
from lit_dof.students.surgery import exact_heads
from lit_dof.teacher.loading import load_teacher

SETTINGS = ((512, 128, 16), (2048, 1024, 16))  # (T, D, blocks)


def probe_blocks(corpus: str, tokenizer, T: int, D: int, blocks: int):
    """``[(ids (T,), SpanCopy)]``: the data module's first ``blocks`` validation blocks, one 16-token repeat each."""
    spans = RepeatedSpans(share=1.0, min_length=16, max_length=16, min_distance=D)
    module = WikipediaDataModule(path=corpus, seq_len=T, val_blocks=blocks)
    module.tokenizer = tokenizer
    out = []
    for i, batch in enumerate(module.val_dataloader()):
        key = f"probe/{T}/{i}"
        (copy,) = spans.draw(T, key)
        out.append((spans(batch["input_ids"][0], key), copy))
    return out


def report(result: dict) -> None:
    """Print the record's table and, per model, the nats it wins back of what (a) loses against the teacher."""
    teacher = result["teacher"]
    for name, entry in result.items():
        if "same_as" in entry:
            continue
        cells = []
        for setting, score in ((k, v) for k, v in entry.items() if k.startswith("T")):
            line = f"{setting}: {score['accuracy']:.3f} / {score['nll']:.2f}"
            control = result.get(f"{name}:window_sinks")
            if control:
                a = result[control.get("same_as", f"{name}:window_sinks")][setting]["nll"]
                lost = a - teacher[setting]["nll"]
                line += f" (wins back {a - score['nll']:.2f} of (a)'s {lost:.2f} nats)"
            cells.append(line)
        print(f"{name}: " + "; ".join(cells))


@torch.no_grad()
def score(model, items) -> dict:
    """Top-1 accuracy and mean NLL over the repeats' tokens 2–16."""
    hits, nll, n = 0, 0.0, 0
    for ids, copy in items:
        logits = model(ids[None]).logits[0].float()
        positions = torch.arange(copy.target + 1, copy.target + copy.length)  # predicted from position p - 1
        pred = logits[positions - 1]
        targets = ids[positions]
        hits += int((pred.argmax(-1) == targets).sum())
        nll += float(torch.nn.functional.cross_entropy(pred, targets, reduction="sum"))
        n += len(positions)
    return {"accuracy": hits / n, "nll": nll / n, "tokens": n}


def main() -> None:
    """Measure the teacher, each student and its (a) once; write the record after each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus")
    parser.add_argument("students", nargs="*", help="NAME=STUDENT_DIR")
    parser.add_argument("--out", required=True)
    parser.add_argument("--report", action="store_true", help="print the record's figures; measure nothing")
    args = parser.parse_args()
    if args.report:
        report(json.loads(open(args.out).read()))
        return
    teacher, tokenizer = load_teacher()
    teacher.eval()
    settings = {f"T{T}_D{D}": probe_blocks(args.corpus, tokenizer, T, D, blocks) for T, D, blocks in SETTINGS}
    result = json.loads(open(args.out).read()) if os.path.exists(args.out) else {}

    def measure(name, model):
        """Score ``model`` in both settings unless the record has it; write the record."""
        if name in result:
            return
        start = time.time()
        result[name] = {key: score(model, items) for key, items in settings.items()}
        result[name]["seconds"] = time.time() - start
        print(name, json.dumps(result[name]), flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    measure("teacher", teacher)
    for spec in args.students:
        name, path = spec.split("=", 1)
        student = load_model(path)[0].eval()
        measure(name, student)
        control = control_models(student, teacher, tail=False)["window_sinks"]
        info = control_info(control)  # one model for every student with the same window, sinks and exact heads
        layers = list(student.config.softmax_layers or [])
        key = json.dumps([info.window, info.sink_tokens, layers, exact_heads(student.model)])
        same = next((n for n, e in result.items() if n.endswith(":window_sinks") and e.get("control") == key), None)
        if same and f"{name}:window_sinks" not in result:
            result[f"{name}:window_sinks"] = {"same_as": same}
        measure(f"{name}:window_sinks", control)
        result[f"{name}:window_sinks"]["control"] = key
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    report(result)


if __name__ == "__main__":
    main()

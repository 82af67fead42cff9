"""The long-heads probe's second part (issue #45): the fit-time choice and what each choice recalls, untrained.

Reads ``long_heads_probe.json`` (``long_heads_probe.py``): scores the window error again on the fit's own terms —
8 packed **validation** blocks of 1024 tokens, queries 512–1023 (``LongRangeHeads``' defaults) — and compares its
18 heads with the 4096-token choice on training articles; then, for each choice, the untrained teacher behind window
64 + 4 sinks with those 18 KV heads exact recalls 20 made-up facts placed in validation blocks of 2048 tokens
(``document_recall_items`` with seed 1, skipping the first 40 blocks: after the retrieval probe's and the hybrid
search's blocks), beside no exact heads and the teacher.

Run: ``python docs/results/far_term/records/long_heads_recall.py <corpus> long_heads_probe.json --out
long_heads_recall.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from long_heads_probe import score_heads, windowed  # noqa: E402

from lit_dof.data.sources import split_documents  # noqa: E402
from lit_dof.hybrid.recall_items import document_recall_items, recalled  # noqa: E402
from lit_dof.pipeline.exact_heads import top_heads  # noqa: E402
from lit_dof.teacher.loading import load_teacher  # noqa: E402


def main() -> None:
    """Score the fit-time choice, measure each choice's recall and write the record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("probe", help="long_heads_probe.json")
    parser.add_argument("--out", default="long_heads_recall.json")
    args = parser.parse_args()
    teacher, tok = load_teacher()
    record = json.loads(Path(args.probe).read_text())
    ids: list[int] = []
    for text in split_documents(args.corpus, "validation"):
        ids += tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= 8 * 1024:
            break
    blocks = [torch.tensor(ids[i * 1024 : (i + 1) * 1024]) for i in range(8)]
    err1024, _ = score_heads(teacher, blocks, slice(512, 1024))
    shipped = {int(i): h for i, h in record["choices"]["retrieval (shipped)"].items()}
    sets = {
        "retrieval (shipped)": shipped,
        "window_error 4096 train": top_heads(torch.tensor(record["window_error"]), 18),
        "window_error 1024 val": top_heads(err1024, 18),
        "interleaved": {int(i): h for i, h in record["choices"]["retrieval + window_error, interleaved"].items()},
    }

    def flat(chosen):
        return {(i, h) for i, heads in chosen.items() for h in heads}

    for name, chosen in sets.items():
        same = len(flat(chosen) & flat(sets["window_error 4096 train"]))
        print(name, "shares with the 4096 choice:", same, "with the shipped:", len(flat(chosen) & flat(shipped)))
    items = document_recall_items(split_documents(args.corpus, "validation"), tok, 2048, 20, 1, 40, name="validation")
    out = {"err1024": err1024.tolist(), "sets": {n: {str(i): h for i, h in s.items()} for n, s in sets.items()}}
    out["recall"] = {}
    for name, chosen in [("none (a)", {})] + list(sets.items()):
        model, start = windowed(teacher, chosen), time.time()
        with torch.no_grad():
            hits = [bool(recalled(model(it["input_ids"], use_cache=False).logits, it)) for it in items]
        out["recall"][name] = hits
        print(name, "recall", sum(hits), "/", len(hits), f"{time.time() - start:.0f}s", flush=True)
    with torch.no_grad():
        hits = [bool(recalled(teacher(it["input_ids"], use_cache=False).logits, it)) for it in items]
    out["recall"]["teacher"] = hits
    print("teacher recall", sum(hits))
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

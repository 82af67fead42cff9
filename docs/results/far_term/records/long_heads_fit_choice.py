"""The long-heads probe's third part (issue #45): the fit-time choice (``LongRangeHeads``' 18 heads, from 8
validation blocks of 1024 tokens, ``long_heads_recall.json``'s ``window_error 1024 val``) on the same long training
articles as ``long_heads_probe.json``'s choices, untrained, window 64 + 4 sinks.

Run: ``python docs/results/far_term/records/long_heads_fit_choice.py <corpus> long_heads_probe.json
long_heads_recall.json --out long_heads_fit_choice.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from long_heads_probe import bucket_nll, long_training_documents, windowed  # noqa: E402

from lit_dof.teacher.loading import load_teacher  # noqa: E402


def main() -> None:
    """Measure the fit-time choice and write its record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("probe", help="long_heads_probe.json")
    parser.add_argument("recall", help="long_heads_recall.json")
    parser.add_argument("--out", default="long_heads_fit_choice.json")
    args = parser.parse_args()
    probe = json.loads(Path(args.probe).read_text())
    chosen = {int(i): h for i, h in json.loads(Path(args.recall).read_text())["sets"]["window_error 1024 val"].items()}
    teacher, tokenizer = load_teacher()
    docs = long_training_documents(args.corpus, tokenizer, probe["select_articles"] + probe["measure_articles"])
    nll = bucket_nll(windowed(teacher, chosen), docs[probe["select_articles"] :])
    Path(args.out).write_text(json.dumps({"choice": {str(i): h for i, h in chosen.items()}, "nll": nll}, indent=1))
    print(json.dumps(nll))


if __name__ == "__main__":
    main()

"""The quickstart's exact heads found at fit start, checked against the 18 the far-term study listed.

RetrievalHeads(share=0.2) with its defaults (configs/quickstart.yaml) on SmolLM2-135M-Instruct and the corpus's
validation documents, against the 18 heads the far-term study listed and fitted (docs/results/far_term README,
Update 3). Writes retrieval_heads_auto.json beside this file.
Usage: python docs/results/far_term/records/retrieval_heads_auto.py CORPUS"""

import json
import sys
import time
from pathlib import Path

from lit_dof.data.sources import split_documents
from lit_dof.pipeline.exact_heads import RetrievalHeads
from lit_dof.teacher.families import attention_layers
from lit_dof.teacher.loading import load_teacher

STUDIED = {
    6: [0],
    7: [2],
    8: [0],
    14: [0, 1],
    15: [2],
    17: [0, 1],
    18: [2],
    19: [1],
    20: [1, 2],
    21: [0, 1, 2],
    22: [1, 2],
    23: [0],
}  # the list quickstart_heads was fitted and measured with (2026-11-28)
teacher, tokenizer = load_teacher("smollm2-135m-instruct")
probe, start = RetrievalHeads(share=0.2), time.time()
chosen = probe.select(
    teacher, tokenizer, split_documents(sys.argv[1], "validation"), [a.index for a in attention_layers(teacher)]
)
record = {
    "probe": repr(probe),
    "corpus": Path(sys.argv[1]).name,
    "chosen": chosen,
    "studied": STUDIED,
    "equal": chosen == STUDIED,
    "seconds": round(time.time() - start, 1),
    "note": "seconds on the 2-core VM with one torch thread, beside another job",
}
Path(__file__).with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
print(record)

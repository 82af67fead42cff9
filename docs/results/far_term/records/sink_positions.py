"""Sinks at their positions in the cache (StreamingLLM, Xiao et al. 2024, §3.2) instead of in the text: a probe,
inference only, on the long choosing set (docs/results/far_term README, "Sinks at cache positions").

Every sliding-window layer scores its sink tokens with the query rotated to position min(p, s + w − 1) — where it
would sit in a cache of s sinks followed by w window tokens — instead of its own position p; the window keys keep
their distances. Measured on a trained student and its (a) window + sinks (``control_models``; the student's exact
KV heads exact), each at original and at cache positions, by in-document bucket on the 12 articles of
long_choice.py, with the paired ratio cache / original (``bucket_ratios``: ± its SE over the articles). Inference
only: a prefill from position 0 (``long_document_perplexity`` scores each article in one forward), the probe patches
the window softmax of this process (nothing in the package changes).

Run: ``python docs/results/far_term/records/sink_positions.py <corpus> <student dir> --out sink_positions.json``
(resumable: the models already in ``--out`` are kept).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
from long_choice import EDGES, Chosen, T
from transformers.models.llama.modeling_llama import rotate_half

import lit_dof.attention.ops.sliding_window.chunked as chunked
from lit_dof.attention.layers.sliding_window import SlidingWindowLinearAttention
from lit_dof.attention.ops.rotary import unrotate
from lit_dof.attention.ops.sliding_window import softmax
from lit_dof.data.sources import last_long_documents
from lit_dof.evaluation.controls import control_models
from lit_dof.evaluation.loading import load_model
from lit_dof.evaluation.long_documents import long_document_perplexity
from lit_dof.evaluation.position_perplexity import bucket_ratios
from lit_dof.teacher.loading import load_teacher

PROBE = {"cache": False, "sink_q": None}
LAYER_FORWARD = SlidingWindowLinearAttention.forward


def forward(self, q, k, v, state=None, key_padding_mask=None, *, rotary=None):
    """The layer's forward, the sink queries of a prefill from position 0 set aside first (cache positions)."""
    PROBE["sink_q"] = None
    c = self.sink_tokens + self.window - 1  # the query's cache position once the cache is full
    if PROBE["cache"] and state is None and self.sink_tokens and rotary is not None and q.shape[2] > c:
        cos, sin = rotary
        r = cos.shape[-1]
        base = unrotate(q, rotary).float()
        cc, sc = cos[:, c : c + 1][:, None].float(), sin[:, c : c + 1][:, None].float()
        moved = torch.cat([base[..., :r] * cc + rotate_half(base[..., :r]) * sc, base[..., r:]], -1)
        p = torch.arange(q.shape[2], device=q.device)[None, None, :, None]
        PROBE["sink_q"] = torch.where(p >= c, moved.to(q.dtype), q)
    return LAYER_FORWARD(self, q, k, v, state, key_padding_mask, rotary=rotary)


def band_and_sinks(q, keys, values, valid, sink_k, sink_v, sink_ok, position, offset, window, chunk):
    """``softmax.band_and_sinks_softmax`` with the sink logits from the set-aside queries, if any."""
    o, log_z = softmax.band_softmax(q, keys, values, valid, offset, window, chunk)
    if not sink_k.shape[2]:
        return o, log_z
    qs = q if PROBE["sink_q"] is None else PROBE["sink_q"].to(q.dtype).view(q.shape)
    positions = position + torch.arange(q.shape[3], device=q.device)
    outside = torch.arange(sink_k.shape[2], device=q.device)[None, :] <= positions[:, None] - window
    logits = (qs @ sink_k.to(q.dtype).transpose(-1, -2)[:, :, None]) / math.sqrt(q.shape[-1])
    mask = outside[None, None, None] & sink_ok[:, None, None, None, :]
    o_s, log_z_s = softmax.masked_softmax_part(logits, mask, sink_v.to(q.dtype)[:, :, None])
    return softmax.merge_normalized(o, log_z, o_s, log_z_s)


def main() -> None:
    """Measure the student and its (a) at original and cache positions, write and print the record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("student")
    parser.add_argument("--out", default="sink_positions.json")
    args = parser.parse_args()
    SlidingWindowLinearAttention.forward = forward
    chunked.band_and_sinks_softmax = band_and_sinks
    teacher, tokenizer = load_teacher()
    texts, indices, _ = last_long_documents(args.corpus, tokenizer, 12, min_tokens=T)
    source = Chosen(texts, f"the last {len(texts)} long training articles of {args.corpus}")
    record = {"student": args.student, "train_indices": indices}
    if os.path.exists(args.out):
        with open(args.out) as handle:
            done = json.load(handle)
        if done["train_indices"] == indices and done["student"] == args.student:
            record = done
    student = load_model(args.student)[0].eval()
    models = {"student": student, "a": control_models(student, teacher, tail=False)["window_sinks"]}
    for name, model in models.items():
        for mode in ("original", "cache"):
            key = f"{name}_{mode}"
            if key not in record:
                PROBE["cache"], start = mode == "cache", time.time()
                with torch.no_grad():
                    record[key] = long_document_perplexity(
                        model, tokenizer, source, max_tokens=T, edges=EDGES, progress=False
                    )
                print(f"{key}: {time.time() - start:.0f} s", flush=True)
                with open(args.out, "w") as handle:
                    json.dump(record, handle, indent=1)
    for name in models:
        a, b = record[f"{name}_original"], record[f"{name}_cache"]
        ratios = bucket_ratios(b, a)  # paired over the articles
        for bucket in a["buckets"]:
            ratio, se = ratios[bucket]["ratio"], ratios[bucket]["stderr"]
            print(
                f"{name:>7} {bucket:>9}: original {a['buckets'][bucket]['ppl']:.2f}"
                f" cache {b['buckets'][bucket]['ppl']:.2f} cache/original {ratio:.3f} ± {se:.3f}"
            )


if __name__ == "__main__":
    main()

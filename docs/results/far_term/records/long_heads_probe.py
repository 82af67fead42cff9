"""Which KV heads should stay exact for long documents? An untrained probe on SmolLM2-135M (issue #45, bar 2).

The quickstart keeps exact the 18 KV heads whose answer attends most to a made-up fact (``RetrievalHeads``). This
probe scores every KV head instead by what windowing it costs **far into natural long documents**: on selection
documents (long articles of the *training* split — never the test or long-document test sets), at query positions
2048–4095, the residual-stream change of the head's group when its attention is cut to window 64 + 4 sinks
(renormalised), ``‖W_o,g (o_full − o_window)‖²`` averaged over positions (``window_error``), and the plain attention
mass beyond the window + sinks (``far_mass``, max over the group's query heads). It then measures, on *other*
training long articles, the untrained teacher behind window 64 + 4 sinks with 18 exact KV heads chosen each way
(and mixes), beside no exact heads (a) and the teacher, by in-document position bucket.

Run: ``python docs/results/far_term/records/long_heads_probe.py <corpus> --out long_heads_probe.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time

import torch

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.data.sources import split_documents
from lit_dof.evaluation.long_documents import document_nll
from lit_dof.pipeline.exact_heads import top_heads
from lit_dof.students.modeling import linearize
from lit_dof.teacher.families import attention_layers
from lit_dof.teacher.loading import load_teacher

WINDOW, SINKS, T = 64, 4, 4096
QUERIES = slice(2048, 4096)
EDGES = (0, 512, 2048, 4096)


def long_training_documents(corpus: str, tokenizer, count: int) -> list[torch.Tensor]:
    """The first ``count`` training-split articles of at least ``T`` tokens, truncated to ``T``."""
    out = []
    for text in split_documents(corpus, "train"):
        if len(text) < 12_000:
            continue
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= T:
            out.append(torch.tensor(ids[:T]))
        if len(out) == count:
            return out
    raise SystemExit(f"only {len(out)} training articles of ≥ {T} tokens")


@torch.no_grad()
def score_heads(model, documents, queries: slice = QUERIES) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L, Hk)`` window error and far mass (module docstring) at ``queries``, averaged over documents (each of
    the same length)."""
    T = documents[0].numel()
    layers = attention_layers(model)
    hq, hk = layers[0].num_heads, layers[0].num_kv_heads
    group, d = hq // hk, model.config.hidden_size // hq
    error = torch.zeros(len(layers), hk, dtype=torch.float64)
    mass = torch.zeros_like(error)
    values: dict[int, torch.Tensor] = {}
    hooks = []
    pos = torch.arange(T)
    keep = (pos[None, :] > pos[queries, None] - WINDOW) | (pos[None, :] < SINKS)  # (Tq, T) window + sinks
    keep &= pos[None, :] <= pos[queries, None]
    for index, attention in enumerate(layers):
        module = attention.module
        hooks.append(module.v_proj.register_forward_hook(lambda m, a, out, i=index: values.__setitem__(i, out)))

        def on_attention(m, args, output, i=index):
            weights = output[1][0, :, queries]  # (Hq, Tq, T)
            v = values.pop(i)[0].view(T, hk, d)  # (T, Hk, d)
            v = v.repeat_interleave(group, dim=1).transpose(0, 1)  # (Hq, T, d)
            windowed = weights * keep
            inside = windowed.sum(-1, keepdim=True)  # (Hq, Tq, 1)
            diff = weights @ v - (windowed @ v) / inside  # (Hq, Tq, d)
            w_o = m.o_proj.weight.view(-1, hq, d)  # (hidden, Hq, d)
            resid = torch.einsum("hqd,ohd->hqo", diff, w_o).view(hk, group, -1, w_o.shape[0]).sum(1)
            error[i] += resid.double().pow(2).sum(-1).mean(-1)
            far = (1 - inside[..., 0]).double().mean(-1)  # (Hq,)
            mass[i] += far.view(hk, group).amax(-1)

        hooks.append(module.register_forward_hook(on_attention))
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        for ids in documents:
            model(ids[None], use_cache=False)
    finally:
        model.set_attn_implementation(previous)
        for h in hooks:
            h.remove()
    return error / len(documents), mass / len(documents)


def windowed(teacher, exact: dict[int, list[int]]):
    """The untrained teacher behind window 64 + 4 sinks, ``exact`` KV heads full."""
    import copy

    shared = copy.deepcopy(teacher, {id(t): t for t in (*teacher.parameters(), *teacher.buffers())})
    sw = SlidingWindow(window=WINDOW, sink_tokens=SINKS, far_term=False)
    return linearize(shared, LearnedPRF, 1, sliding_window=sw, seed=0, exact_heads=exact).eval()


def bucket_nll(model, documents) -> dict:
    """Per bucket: per-document mean NLL (nats)."""
    rows = [document_nll(model, ids, EDGES)[1] for ids in documents]
    return {f"{a}-{b - 1}": [r[k][0] for r in rows] for k, (a, b) in enumerate(zip(EDGES, EDGES[1:]))}


def interleave(*rankings: list, k: int) -> dict[int, list[int]]:
    """The first ``k`` distinct heads taking one from each ranking in turn."""
    chosen: list = []
    for head in itertools.chain.from_iterable(itertools.zip_longest(*rankings)):
        if head is not None and head not in chosen:
            chosen.append(head)
    exact: dict[int, list[int]] = {}
    for i, h in sorted(chosen[:k]):
        exact.setdefault(i, []).append(h)
    return exact


def ranking(scores: torch.Tensor) -> list:
    """Every ``(layer, KV head)``, highest score first (ties by position)."""
    flat = [(float(scores[i, h]), (i, h)) for i in range(scores.shape[0]) for h in range(scores.shape[1])]
    return [ih for _, ih in sorted(flat, key=lambda s: (-s[0], s[1]))]


def main() -> None:
    """Score the heads, measure each choice on the other articles and write the record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("--select", type=int, default=6, help="selection articles (scoring)")
    parser.add_argument("--measure", type=int, default=8, help="other articles (measuring the choices)")
    parser.add_argument("--retrieval", default="docs/results/far_term/records/retrieval_heads_auto.json")
    parser.add_argument("--out", default="long_heads_probe.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    teacher, tokenizer = load_teacher()
    docs = long_training_documents(args.corpus, tokenizer, args.select + args.measure)
    select, measure = docs[: args.select], docs[args.select :]
    start = time.time()
    error, mass = score_heads(teacher, select)
    print(f"scored {len(select)} articles in {time.time() - start:.0f} s", flush=True)
    with open(args.retrieval) as handle:
        retrieval = {int(i): h for i, h in json.load(handle)["chosen"].items()}
    k = sum(len(h) for h in retrieval.values())
    retrieval_rank = [(i, h) for i in sorted(retrieval) for h in retrieval[i]]
    choices = {
        "none (a)": {},
        "retrieval (shipped)": retrieval,
        "window_error": top_heads(error, k),
        "far_mass": top_heads(mass, k),
        "retrieval + window_error, interleaved": interleave(retrieval_rank, ranking(error), k=k),
    }
    record = {
        "window": WINDOW,
        "sinks": SINKS,
        "tokens": T,
        "select_articles": len(select),
        "measure_articles": len(measure),
        "window_error": error.tolist(),
        "far_mass": mass.tolist(),
        "choices": {name: {str(i): h for i, h in c.items()} for name, c in choices.items()},
        "nll": {"teacher": bucket_nll(teacher, measure)},
    }
    for name, exact in choices.items():
        start = time.time()
        record["nll"][name] = bucket_nll(windowed(teacher, exact), measure)
        print(f"{name}: {time.time() - start:.0f} s", flush=True)
    base, top = record["nll"]["none (a)"], record["nll"]["teacher"]
    for name, nll in record["nll"].items():
        parts = []
        for bucket in nll:
            gap = [a - t for a, t in zip(base[bucket], top[bucket])]
            closed = [a - x for a, x in zip(base[bucket], nll[bucket])]
            mean = sum(nll[bucket]) / len(nll[bucket])
            parts.append(f"{bucket}: ppl {math.exp(mean):.2f} closed {sum(closed) / sum(gap):.0%}")
        print(f"{name:40s} " + " · ".join(parts))
    with open(args.out, "w") as handle:
        json.dump(record, handle, indent=1)


if __name__ == "__main__":
    main()

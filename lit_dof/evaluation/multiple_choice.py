"""Multiple-choice scoring as lm-eval's ``multiple_choice`` does it: each option is a continuation of the prompt
(or, for partial-evaluation tasks, the shared continuation after each option-filled context), and its score
is the summed log-probability of the continuation tokens. ``acc`` is the argmax of the scores, ``acc_norm``
the argmax of score / continuation length in characters.

Used by the per-task fine-tuning (:mod:`lit_dof.evaluation.finetune`) and the hybrid search's scorer
(:mod:`lit_dof.hybrid.scoring`).
"""

from __future__ import annotations

import torch


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's causal split: trailing context spaces move to the continuation, whose tokens are the tail of
    the joint encoding after the context's own encoding."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = tokenizer(context)["input_ids"]
    return context_ids, tokenizer(context + continuation)["input_ids"][len(context_ids) :]


def option_pairs(doc: dict) -> list[tuple[str, str]]:
    """(context, continuation) per option: ``query`` + " " + choice, or each context + " " + continuation."""
    if "choices" in doc:
        return [(doc["query"], " " + choice) for choice in doc["choices"]]
    return [(context, " " + doc["continuation"]) for context in doc["contexts"]]


def collate_choices(docs: list[dict], tokenizer, max_length: int) -> dict:
    """Batch every option of ``docs``: ``input_ids``/``targets`` ``(P, T)`` (targets −100 outside the
    continuation), ``doc_index``/``option_index`` ``(P,)``, ``gold`` ``(D,)``, ``lengths`` ``(P,)`` (characters
    of each continuation, for acc_norm). Over-long pairs keep their last ``max_length`` tokens."""
    rows, targets, doc_index, option_index, lengths = [], [], [], [], []
    for d, doc in enumerate(docs):
        for o, (context, continuation) in enumerate(option_pairs(doc)):
            context_ids, continuation_ids = encode_pair(tokenizer, context, continuation)
            ids = (context_ids + continuation_ids)[-max_length:]
            n = min(len(continuation_ids), len(ids) - 1)
            rows.append(ids)
            targets.append([-100] * (len(ids) - n) + ids[len(ids) - n :])
            doc_index.append(d)
            option_index.append(o)
            lengths.append(len(continuation.strip()))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return {
        "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
        "targets": torch.tensor([t + [-100] * (width - len(t)) for t in targets]),
        "doc_index": torch.tensor(doc_index),
        "option_index": torch.tensor(option_index),
        "gold": torch.tensor([doc["gold"] for doc in docs]),
        "lengths": torch.tensor(lengths, dtype=torch.float),
    }


def option_scores(model, batch: dict) -> torch.Tensor:
    """Summed log p(continuation) per option ``(P,)`` (right padding: causal, so padding never leaks in)."""
    return option_scores_from_logits(model(batch["input_ids"], use_cache=False).logits, batch)


def option_scores_from_logits(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """:func:`option_scores` from already computed logits ``(P, T, V)``."""
    logits = logits[:, :-1].float()
    targets = batch["targets"][:, 1:]
    logprobs = logits.log_softmax(-1).gather(-1, targets.clamp_min(0)[..., None])[..., 0]
    return (logprobs * (targets != -100)).sum(-1)


def score_matrix(scores: torch.Tensor, batch: dict) -> torch.Tensor:
    """``(D, max options)`` option scores, −inf where a document has fewer options."""
    D = len(batch["gold"])
    width = int(batch["option_index"].max()) + 1
    matrix = torch.full((D, width), float("-inf"), dtype=scores.dtype, device=scores.device)
    matrix[batch["doc_index"], batch["option_index"]] = scores
    return matrix

"""Exact KV heads chosen for the teacher at hand: the retrieval-head probe as a step of the fit.

DuoAttention (Xiao et al. 2024, "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming
Heads", arXiv 2410.10819, §3) keeps the full KV cache of the few heads that fetch far facts and a window + sinks in
every other head; "Retrieval Head Mechanistically Explains Long-Context Factuality" (Wu et al. 2024, arXiv
2404.15574, §2) finds those heads by the attention they put on the needle while the answer is copied. A student
whose ``exact_heads`` is a :class:`RetrievalHeads` does the same before its feature dims are planned: on made-up
facts placed in blocks of the corpus's **validation** documents (:func:`lit_dof.hybrid.recall_items.
document_recall_items`, never trained on), it scores each KV head of the layers the student linearises by
:func:`head_scores` and keeps the top ``share`` of them exact (:func:`top_heads`, then
:func:`lit_dof.students.surgery.with_exact_heads`). A list of heads found for one teacher is that teacher's own;
the probe finds another teacher's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from lit_dof.teacher.families import attention_layers, text_config


@torch.no_grad()
def head_scores(model: nn.Module, items: Sequence[dict]) -> torch.Tensor:
    """Per KV head, the attention mass the answer puts on the fact: for each item, the mass each query head puts on
    the fact's tokens (``item["fact"]`` up to ``item["fact_end"]``) from the positions that predict the answer
    (``item["answer"]``, shifted by one), averaged over those positions; a KV head's score is the **max** over its
    query heads (one query head that copies needs its KV head's whole cache), averaged over items. Wu et al. 2024,
    §2, with attention mass in place of their copy-paste count.

    Args:
        model: a supported causal LM (its attention implementation is switched to ``"eager"`` for the probe and
            restored after it).
        items: recall items ``{"input_ids": (1, T), "answer": (start, stop), "fact", "fact_end"}``.

    Returns:
        ``(L, Hk)`` float64 scores in [0, 1], one row per attention layer (every layer of the teacher, in order).

    Raises:
        ValueError: no items, or layers with different head counts.
    """
    if not items:
        raise ValueError("head_scores needs at least one recall item")
    layers = attention_layers(model)
    if len({(a.num_heads, a.num_kv_heads) for a in layers}) != 1:
        raise ValueError("head_scores needs the same query and KV head counts in every layer")
    group = layers[0].num_heads // layers[0].num_kv_heads
    total = torch.zeros(len(layers), layers[0].num_kv_heads, dtype=torch.float64)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")  # the attention weights themselves (SDPA does not return them)
    try:
        for item in items:
            (start, stop), device = item["answer"], model.get_input_embeddings().weight.device
            needle = torch.arange(item["fact"], item["fact_end"], device=device)
            ids = item["input_ids"].to(device)
            attentions = model(ids, output_attentions=True, use_cache=False).attentions  # L × (1, Hq, T, T)
            for index, weights in enumerate(attentions):
                mass = weights[0, :, start - 1 : stop - 1][:, :, needle].sum(-1).mean(-1)  # (Hq,)
                total[index] += mass.double().view(-1, group).amax(-1).cpu()
    finally:
        model.set_attn_implementation(previous)
    return total / len(items)


def top_heads(scores: torch.Tensor, k: int, layers: Iterable[int] | None = None) -> dict[int, list[int]]:
    """The ``k`` KV heads of highest score, among those of ``layers``.

    Args:
        scores: ``(L, Hk)`` (:func:`head_scores`).
        k: how many KV heads, ``0 <= k <=`` the candidates.
        layers: the layers whose heads may be chosen (default: all); ties go to the lower layer, then head.

    Returns:
        ``{layer: [KV head, …]}``, layers and heads ascending (no entry for a layer with none chosen).

    Raises:
        ValueError: ``k`` outside 0..the number of candidate heads, or a layer outside 0..L−1.
    """
    num_layers, kv_heads = scores.shape
    allowed = sorted(set(range(num_layers) if layers is None else layers))
    if any(not 0 <= i < num_layers for i in allowed):
        raise ValueError(f"layers {allowed} must lie in 0..{num_layers - 1}")
    candidates = [(i, h) for i in allowed for h in range(kv_heads)]
    if not 0 <= k <= len(candidates):
        raise ValueError(f"k = {k} KV heads: there are {len(candidates)} to choose from")
    chosen = sorted(candidates, key=lambda ih: (-float(scores[ih]), ih))[:k]  # stable: ties by position
    exact: dict[int, list[int]] = {}
    for i, h in sorted(chosen):
        exact.setdefault(i, []).append(h)
    return exact


@torch.no_grad()
def window_errors(
    model: nn.Module,
    blocks: Sequence[torch.Tensor],
    window: int,
    sink_tokens: int = 0,
    start: int | None = None,
    layers: Iterable[int] | None = None,
    rows: int = 256,
) -> torch.Tensor:
    """Per KV head, what cutting it to the student's exact window + sinks changes in the residual stream: at each
    query position ``p ≥ start`` of each block, ``‖Σ_h W_o,h (o_h,p − ô_h,p)‖²`` over the query heads ``h`` of the KV
    head's group, where ``o_h,p`` is the head's softmax output, ``ô_h,p`` the same softmax renormalised over the keys
    ``t`` with ``p − window < t ≤ p`` or ``t < sink_tokens`` (0 where none), and ``W_o,h`` the head's columns of the
    output projection; averaged over positions and blocks. DuoAttention (Xiao et al. 2024, arXiv 2410.10819, §3.1)
    keeps full the heads whose output deviates most when made streaming (window + sinks); here each head is scored
    alone, in closed form, on natural text instead of their optimised gates on synthetic passkeys.

    Args:
        model: a supported causal LM (probed through lit-dof's attention function:
            :func:`lit_dof.teacher.capture.capture_attention`).
        blocks: token ids, each ``(T,)`` or ``(1, T)``, all of the same length ``T``.
        window: the student's exact window in tokens (0: none).
        sink_tokens: its exact sink tokens.
        start: the first scored query position (default ``T // 2``: positions with ``T/2`` keys or more).
        layers: the layers scored (default: all); the others' rows are 0.
        rows: query positions per step (memory ``Hq · rows · T`` floats).

    Returns:
        ``(L, Hk)`` float64 scores ≥ 0, one row per attention layer, in the residual stream's units squared.

    Raises:
        ValueError: no blocks, blocks of different lengths, ``start`` outside ``0..T−1``, ``window`` or
            ``sink_tokens`` < 0, or layers with different head counts.
    """
    from lit_dof.teacher.capture import capture_attention
    from lit_dof.teacher.families import output_projection

    ids = [b.reshape(1, -1) for b in blocks]
    if not ids or len({b.shape[1] for b in ids}) != 1:
        raise ValueError(f"window_errors needs blocks of one length, got {[b.shape[1] for b in ids]}")
    T = ids[0].shape[1]
    start = T // 2 if start is None else start
    if not 0 <= start < T or window < 0 or sink_tokens < 0:
        raise ValueError(f"window_errors: start {start} must lie in 0..{T - 1}, window and sink_tokens be >= 0")
    attention = attention_layers(model)
    if len({(a.num_heads, a.num_kv_heads) for a in attention}) != 1:
        raise ValueError("window_errors needs the same query and KV head counts in every layer")
    hq, hk = attention[0].num_heads, attention[0].num_kv_heads
    scored = set(range(len(attention)) if layers is None else layers)
    total = torch.zeros(len(attention), hk, dtype=torch.float64)
    keys = torch.arange(T)

    def record(index: int, captured) -> None:
        if index not in scored:
            return
        q, k, v = captured.q[0], captured.k[0], captured.v[0]  # (Hq, T, d), (Hk, T, d), (Hk, T, D)
        k = k.repeat_interleave(hq // hk, 0).float().transpose(-1, -2)  # (Hq, d, T)
        values = v.repeat_interleave(hq // hk, 0).float()  # (Hq, T, D)
        projection = output_projection(attention[index].module)
        D, t = v.shape[-1], keys.to(q.device)
        zero = projection(v.new_zeros(1, hq * v.shape[-1]))  # its bias, if any
        for first in range(start, T, rows):
            p = t[first : first + rows, None]  # (r, 1) query positions
            logits = (q[:, first : first + rows].float() @ k) / q.shape[-1] ** 0.5  # (Hq, r, T)
            weights = logits.masked_fill(t > p, float("-inf")).softmax(-1)
            kept = weights * ((t > p - window) | (t < sink_tokens))  # window + sinks (causal: weights are 0 above)
            mass = kept.sum(-1, keepdim=True)
            cut = kept / mass.clamp_min(torch.finfo(mass.dtype).tiny) * (mass > 0)
            diff = ((weights - cut) @ values).transpose(0, 1).to(v.dtype)  # (r, Hq, D)
            for g in range(hk):
                group = slice(g * (hq // hk), (g + 1) * (hq // hk))
                only = torch.zeros_like(diff)
                only[:, group] = diff[:, group]
                change = projection(only.reshape(-1, hq * D)) - zero  # (r, hidden)
                total[index, g] += change.double().pow(2).sum().cpu()

    with capture_attention(model, record):
        for block in ids:
            model(block.to(model.get_input_embeddings().weight.device), use_cache=False)
    return total / (len(ids) * (T - start))


class HeadProbe:
    """What chooses a student's exact KV heads at fit start (``exact_heads: {class_path: …}``): a subclass scores the
    teacher's KV heads on validation documents (:meth:`scores`) and :meth:`select` keeps the top ``share`` of those of
    the linearised layers (:class:`RetrievalHeads`, :class:`LongRangeHeads`).

    Args:
        share: the fraction of the linearised layers' KV heads kept exact, in [0, 1] (rounded to the nearest count).
        block: tokens per probed block; at least 64, at most the teacher's positions.

    Raises:
        ValueError: ``share`` outside [0, 1] or ``block`` < 64.
    """

    def __init__(self, share: float, block: int):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{type(self).__name__} share must lie in [0, 1] (a fraction of KV heads), got {share}")
        if block < 64:
            raise ValueError(f"{type(self).__name__} needs block >= 64; got {block}")
        self.share, self.block = share, block

    def scores(
        self, teacher: nn.Module, tokenizer, documents: Iterable[str], layers: list[int], window: tuple[int, int] | None
    ) -> torch.Tensor:
        """``(L, Hk)`` scores of the teacher's KV heads (higher: keep exact); arguments as :meth:`select`'s."""
        raise NotImplementedError

    def select(
        self,
        teacher: nn.Module,
        tokenizer,
        documents: Iterable[str],
        linearized: Iterable[int],
        window: tuple[int, int] | None = None,
    ) -> dict[int, list[int]]:
        """Score the teacher's KV heads and choose the exact ones.

        Args:
            teacher: the frozen teacher (read only; nothing changes).
            tokenizer: its tokenizer.
            documents: validation documents (e.g. ``lit_dof.data.sources.split_documents(source, "validation")``).
            linearized: the layers the student linearises (not its softmax layers, nor a teacher's own
                sliding-window layers).
            window: the student's ``(window, sink_tokens)`` in tokens (a probe that scores against it needs it).

        Returns:
            ``{layer: [KV head, …]}`` for :func:`lit_dof.students.surgery.with_exact_heads`.

        Raises:
            ValueError: ``block`` beyond the teacher's positions, too few validation tokens, or a probe's own
                requirement (:class:`LongRangeHeads`: a ``window``).
        """
        layers = sorted(set(linearized))
        positions = getattr(text_config(teacher), "max_position_embeddings", None)
        if positions is not None and self.block > positions:
            raise ValueError(
                f"{type(self).__name__} block = {self.block} tokens is beyond the teacher's {positions} positions: "
                f"pass --model.init_args.exact_heads.init_args.block={positions} or fewer"
            )
        k = round(self.share * attention_layers(teacher)[0].num_kv_heads * len(layers))
        if k == 0:
            return {}
        return top_heads(self.scores(teacher, tokenizer, documents, layers, window), k, layers)


class RetrievalHeads(HeadProbe):
    """``exact_heads`` found by the probe: the top ``share`` of the linearised layers' KV heads by
    :func:`head_scores` on ``items`` recall items of ``block`` tokens from the validation documents.

    Args:
        share: the fraction of the linearised layers' KV heads kept exact, in [0, 1] (rounded to the nearest count;
            SmolLM2-135M's quickstart: 0.2, 18 of its 90).
        items: recall items scored (one forward each, with attention weights: ``L · Hq · block²`` floats).
        block: tokens per item; at most the teacher's positions.
        skip: validation blocks passed over first (``tools/retrieval_heads_probe.py``'s default: the blocks a
            ``lit-dof hybrid --metric recall`` search scores).
        seed: the facts' names, codes and depths.

    Raises:
        ValueError: ``share`` outside [0, 1], ``items`` < 1, ``block`` < 64 or ``skip`` < 0.
    """

    def __init__(self, share: float = 0.2, items: int = 16, block: int = 1024, skip: int = 32, seed: int = 0):
        super().__init__(share, block)
        if items < 1 or skip < 0:
            raise ValueError(f"RetrievalHeads needs items >= 1, skip >= 0; got {items}, {skip}")
        self.items, self.skip, self.seed = items, skip, seed

    def __repr__(self) -> str:
        return f"RetrievalHeads(share={self.share}, items={self.items}, block={self.block}, skip={self.skip})"

    def scores(
        self, teacher: nn.Module, tokenizer, documents: Iterable[str], layers: list[int], window: tuple[int, int] | None
    ) -> torch.Tensor:
        """:func:`head_scores` on the recall items placed in the validation ``documents`` (``window`` not used).

        Raises:
            ValueError: too few validation tokens for the items.
        """
        from lit_dof.hybrid.recall_items import document_recall_items

        items = document_recall_items(
            documents, tokenizer, self.block, self.items, self.seed, self.skip, name="the validation documents"
        )
        return head_scores(teacher, items)


class LongRangeHeads(HeadProbe):
    """``exact_heads`` found by :func:`window_errors`: the top ``share`` of the linearised layers' KV heads whose
    output the student's exact window + sinks change most, in the second half of ``blocks`` validation blocks of
    ``block`` tokens (documents packed, EOS between them). Where :class:`RetrievalHeads` keeps the heads that copy a
    made-up fact, this keeps the heads that natural text needs far back: on SmolLM2-135M the two lists share half
    their heads; which recipe each serves: docs/results/far_term.

    Args:
        share: the fraction of the linearised layers' KV heads kept exact, in [0, 1] (rounded to the nearest count).
        blocks: validation blocks scored (one forward each, the scores ``Hq · rows · block`` floats at a time).
        block: tokens per block; at most the teacher's positions.

    Raises:
        ValueError: ``share`` outside [0, 1], ``blocks`` < 1 or ``block`` < 64.
    """

    def __init__(self, share: float = 0.2, blocks: int = 8, block: int = 1024):
        super().__init__(share, block)
        if blocks < 1:
            raise ValueError(f"LongRangeHeads needs blocks >= 1; got {blocks}")
        self.blocks = blocks

    def __repr__(self) -> str:
        return f"LongRangeHeads(share={self.share}, blocks={self.blocks}, block={self.block})"

    def scores(
        self, teacher: nn.Module, tokenizer, documents: Iterable[str], layers: list[int], window: tuple[int, int] | None
    ) -> torch.Tensor:
        """:func:`window_errors` of ``layers`` against the student's ``window`` on ``blocks`` packed validation blocks.

        Raises:
            ValueError: no ``window``, or too few validation tokens for the blocks.
        """
        from lit_dof.evaluation.perplexity import text_tokens

        if window is None:
            raise ValueError(f"exact_heads: {self!r} needs the student's window (window, sink_tokens) to score against")
        tokens = text_tokens(documents, tokenizer, max_tokens=self.block * self.blocks)
        if tokens.numel() < self.block * self.blocks:
            raise ValueError(
                f"the validation documents give only {tokens.numel() // self.block} blocks of {self.block} tokens; "
                f"LongRangeHeads asks for {self.blocks}: pass fewer blocks"
            )
        blocks = tokens[: self.block * self.blocks].view(self.blocks, self.block)
        return window_errors(teacher, list(blocks), *window, layers=layers)


def resolve_exact_heads(
    spec: dict[int, list[int]] | HeadProbe | None,
    teacher: nn.Module,
    tokenizer,
    datamodule,
    softmax_layers: Iterable[int] = (),
    window: tuple[int, int] | None = None,
) -> dict[int, list[int]]:
    """A student's exact heads, checked against the teacher before any expensive step: ``spec`` itself when it lists
    them, else what the :class:`RetrievalHeads` probe chooses among the layers the student linearises.

    Args:
        spec: ``{layer: [KV head, …]}``, a :class:`RetrievalHeads`, or ``None`` (none).
        teacher: the frozen teacher.
        tokenizer: its tokenizer.
        datamodule: the run's data module; the probe reads its validation documents (``documents`` and
            ``val_every``, as :class:`~lit_dof.data.datamodule.WikipediaDataModule` has them).
        softmax_layers: the student's softmax layers (no exact heads there: the whole layer is).
        window: the student's ``(window, sink_tokens)`` (a :class:`LongRangeHeads` probe scores against it).

    Returns:
        ``{layer: [KV head, …]}`` (empty: none).

    Raises:
        ValueError: listed heads outside the teacher's layers or KV heads
            (:func:`lit_dof.students.surgery.with_exact_heads`); a probe without a data module that has documents.
    """
    from lit_dof.students.surgery import with_exact_heads

    layers = attention_layers(teacher)
    if isinstance(spec, HeadProbe):
        documents = getattr(datamodule, "documents", None)
        if documents is None:
            raise ValueError(
                f"exact_heads: {spec!r} reads the validation documents of the data module (WikipediaDataModule); "
                f"{type(datamodule).__name__} has none: pass the heads themselves, {{layer: [KV head, …]}}"
            )
        from lit_dof.data.sources import split_documents

        softmax = set(softmax_layers)
        linearized = [a.index for a in layers if a.linearizable and a.index not in softmax]
        split = split_documents(documents, "validation", getattr(datamodule, "val_every", 100))
        spec = spec.select(teacher, tokenizer, split, linearized, window)
    exact = {int(i): [int(h) for h in heads] for i, heads in (spec or {}).items()}
    with_exact_heads([1] * len(layers), exact, [a.num_kv_heads for a in layers])  # bad indices: a clear error now
    return exact

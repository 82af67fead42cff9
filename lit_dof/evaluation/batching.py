"""Loglikelihood batches bounded by the bytes of their logits, for lm-eval's ``HFLM``.

lm-eval scores a batch of loglikelihood requests by one forward and ``log_softmax`` over the whole ``(B, T, V)``
logits, padded to the batch's longest request. With a fixed batch size that tensor grows with the task's prompts:
16 five-shot MMLU prompts of up to 3,040 tokens against SmolLM2's 49,152-token vocabulary are 9.6 GB of float32
logits, twice over with their log-softmax — more than a 24 GiB machine holds, and on a CPU nothing catches it (the
kernel's OOM killer ends the process; lm-eval's ``batch_size="auto"`` halves the batch only on a raised error,
which CUDA gives and a CPU does not). :class:`BoundedBatchLM` instead sizes each call's batch from its longest
request: at most ``batch_size`` requests and at most ``max_logits_bytes`` of float32 logits, never fewer than one.

Requires lm-eval (the ``eval`` extra); imported by :func:`~lit_dof.evaluation.harness.evaluate_model` only.
"""

from __future__ import annotations

from lit_dof.evaluation.extra import require_lm_eval

require_lm_eval("bounded evaluation batches")  # before lm_eval's import: the install line, not a traceback

from lm_eval.models.huggingface import HFLM  # noqa: E402

DEFAULT_LOGITS_BYTES = 2**31
"""Default bound on one batch's float32 logits (2 GiB; lm-eval's log-softmax holds a second copy)."""


def bounded_batch_size(batch_size: int, longest: int, vocab_size: int, max_logits_bytes: int) -> int:
    """Requests per forward for a call whose longest request has ``longest`` tokens.

    Args:
        batch_size: the most requests per forward.
        longest: the longest request's tokens, as the model sees it (context + continuation, truncated to the
            model's length, less the last token).
        vocab_size: the logits' last dimension V.
        max_logits_bytes: the most bytes of one batch's ``(B, T, V)`` float32 logits.

    Returns:
        ``max(1, min(batch_size, max_logits_bytes // (4 · V · longest)))``.

    Raises:
        ValueError: a batch size, vocabulary or byte bound below 1.
    """
    if min(batch_size, vocab_size, max_logits_bytes) < 1:
        raise ValueError(
            f"batch_size {batch_size}, vocab_size {vocab_size} and max_logits_bytes {max_logits_bytes} must be ≥ 1"
        )
    return max(1, min(batch_size, max_logits_bytes // (4 * vocab_size * max(longest, 1))))


class BoundedBatchLM(HFLM):
    """lm-eval's ``HFLM`` whose loglikelihood batches hold at most ``max_logits_bytes`` of float32 logits.

    Each call of ``_loglikelihood_tokens`` (one task's requests, or one document's rolling windows) runs at
    :func:`bounded_batch_size` of its longest request; everything else is lm-eval's. Results depend on the batch
    size only through floating-point order (padding), as lm-eval's own do.

    Args:
        *args: ``HFLM``'s.
        max_logits_bytes: the bound (default :data:`DEFAULT_LOGITS_BYTES`).
        **kwargs: ``HFLM``'s (``batch_size`` an int: the most requests per forward).

    Raises:
        ValueError: ``batch_size`` is not a positive int (``"auto"`` probes by running out of memory).
    """

    def __init__(self, *args, max_logits_bytes: int = DEFAULT_LOGITS_BYTES, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.batch_size_per_gpu, int) or self.batch_size_per_gpu < 1:
            raise ValueError(f"BoundedBatchLM needs an int batch_size ≥ 1, got {self.batch_size_per_gpu!r}")
        self.max_logits_bytes = max_logits_bytes
        self.batch_sizes_used: list[int] = []  # one per call, for the record and the tests

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        if not requests:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        longest = max(
            len((context + continuation)[-(self.max_length + 1) :][:-1]) for _, context, continuation in requests
        )
        most = self.batch_size_per_gpu  # lm-eval ignores override_bs unless batch_size is "auto"; so does this
        size = bounded_batch_size(most, longest, self._vocab_size(), self.max_logits_bytes)
        self.batch_sizes_used.append(size)
        self.batch_size_per_gpu = size
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        finally:
            self.batch_size_per_gpu = most

    def _vocab_size(self) -> int:
        """The logits' width: the output embedding's rows (the config's ``vocab_size`` where there is none)."""
        head = self.model.get_output_embeddings()
        if head is not None:
            return int(head.weight.shape[0])
        config = getattr(self.model.config, "text_config", None) or self.model.config
        return int(config.vocab_size)

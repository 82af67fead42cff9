"""The ``recall`` retrieval task (lit_dof.evaluation.recall) against models whose answer is known in closed form: an
oracle that predicts every next token recalls every item, one a token late none, and one that knows only the codes
of some items recalls exactly those; the grid, the split and the record's fields."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from lit_dof.data.sources import split_documents
from lit_dof.evaluation.perplexity import text_tokens
from lit_dof.evaluation.recall import recall_record
from lit_dof.hybrid.recall_items import placed_items
from tests.conftest import TINYSTORIES, WIKIPEDIA

needs_data = pytest.mark.skipif(not WIKIPEDIA.is_file(), reason="../shared/data not present")


class Oracle(torch.nn.Module):
    """Logits one-hot on the next token (``late``: on the token itself), unless its position's item is not known."""

    def __init__(self, vocab: int, late: bool = False, known: set | None = None, max_positions: int = 4096):
        super().__init__()
        self.vocab, self.late, self.known = vocab, late, known
        self.config = SimpleNamespace(max_position_embeddings=max_positions)
        self.weight = torch.nn.Parameter(torch.zeros(1))  # a device to read

    def forward(self, ids):
        nxt = ids if self.late else torch.cat([ids[:, 1:], ids[:, -1:]], 1)
        if self.known is not None and tuple(ids[0, :8].tolist()) not in self.known:
            nxt = torch.zeros_like(nxt)  # guesses token 0 everywhere
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float())


@needs_data
def test_recall_counts_exactly_the_items_whose_code_is_predicted():
    tokenizer = AutoTokenizer.from_pretrained(TINYSTORIES)
    grid = dict(contexts=[128, 192, 8192], depths=[0.0, 0.5, 1.0], trials=2, split="validation")
    vocab = tokenizer.vocab_size
    record = recall_record(Oracle(vocab, max_positions=256), tokenizer, WIKIPEDIA, **grid)
    assert record["n"] == 12 and record["exact_match"] == 1.0 and record["split"] == "validation"
    assert set(record["cells"]) == {"128", "192"} and set(record["cells"]["128"]) == {"0", "0.5", "1"}
    assert all(e["generation"] == e["answers"][0] for e in record["examples"])  # 8192 > 256 positions: dropped
    assert all(0 <= e["needle_token"] < e["prompt_tokens"] for e in record["examples"])
    assert record["exact_match_stderr"] == 0.0
    assert recall_record(Oracle(vocab, late=True), tokenizer, WIKIPEDIA, **grid)["exact_match"] == 0.0
    items = placed_items(WIKIPEDIA, tokenizer, 128, [0.0, 0.5, 1.0], 2, split="validation")
    known = {tuple(items[i]["input_ids"][0, :8].tolist()) for i in (1, 4)}
    partial = recall_record(Oracle(vocab, known=known, max_positions=128), tokenizer, WIKIPEDIA, **grid)
    assert partial["items"]["exact_match"] == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert partial["exact_match_stderr"] == pytest.approx((1 / 3 * 2 / 3 / 5) ** 0.5)
    assert partial["cells"]["128"]["0"] == {"n": 2, "mean": 0.5, "se": 0.5}
    test = recall_record(Oracle(vocab, max_positions=128), tokenizer, WIKIPEDIA, **{**grid, "split": "test"})
    assert test["split"] == "test" and test["n"] == 6
    for split in ("validation", "test"):  # each item's filler is the next block of that split's documents
        first = text_tokens(split_documents(WIKIPEDIA, split), tokenizer, max_tokens=128)
        item = placed_items(WIKIPEDIA, tokenizer, 128, [1.0], 1, split=split)[0]
        assert torch.equal(item["input_ids"][0, :64], first[:64])
    with pytest.raises(ValueError, match="no recall context fits the model's 100 positions"):
        recall_record(Oracle(vocab, max_positions=100), tokenizer, WIKIPEDIA, **grid)

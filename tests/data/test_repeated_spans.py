"""Repeated spans: one exact repeat beyond the distance, the rest of the block untouched, deterministic by key,
replayed on resume, never in validation or the planner's capture blocks."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader

from lit_dof.data.datamodule import PackedBlocks, WikipediaDataModule
from lit_dof.data.repeated_spans import RepeatedSpans


def _repeats(plain: torch.Tensor, out: torch.Tensor, length_range, min_distance) -> list[tuple[int, int, int]]:
    """The (source, target, length) that explain ``out`` as ``plain`` with one span copied later — found by search,
    independently of the draw: the changed positions form one stretch lying inside a target window."""
    changed = (plain != out).nonzero().flatten().tolist()
    found = []
    n = plain.shape[0]
    for length in range(length_range[0], length_range[1] + 1):
        for target in range(n - length + 1):
            if changed and not (target <= changed[0] and changed[-1] < target + length):
                continue
            for source in range(0, target - length - min_distance + 1):
                if torch.equal(out[target : target + length], plain[source : source + length]):
                    found.append((source, target, length))
    return found


def test_a_chosen_block_holds_one_exact_repeat_beyond_the_distance_and_nothing_else_changes():
    spans = RepeatedSpans(share=1.0, min_length=3, max_length=6, min_distance=10)
    plain = torch.arange(100, 140)  # distinct tokens: a repeat is unambiguous
    for i in range(50):
        out = spans(plain, f"k{i}")
        (copy,) = spans.draw(40, f"k{i}")
        assert torch.equal(plain, torch.arange(100, 140))  # the input is not changed in place
        assert 3 <= copy.length <= 6 and copy.target >= copy.source + copy.length + 10
        assert copy.target + copy.length <= 40
        assert (copy.source, copy.target, copy.length) in _repeats(plain, out, (3, 6), 10)
        keep = torch.ones(40, dtype=torch.bool)
        keep[copy.target : copy.target + copy.length] = False
        assert torch.equal(out[keep], plain[keep])


def test_the_share_of_chosen_blocks_and_determinism_by_key():
    spans = RepeatedSpans(share=0.3, min_length=2, max_length=4, min_distance=4)
    chosen = sum(bool(spans.draw(32, f"block{i}")) for i in range(2000))
    assert abs(chosen / 2000 - 0.3) < 4 * (0.3 * 0.7 / 2000) ** 0.5  # binomial: within 4 SE
    assert [spans.draw(32, f"block{i}") for i in range(20)] == [spans.draw(32, f"block{i}") for i in range(20)]
    assert RepeatedSpans(share=0.0).draw(512, "x") == []
    draws = {tuple(RepeatedSpans(share=1.0).draw(512, f"b{i}")) for i in range(20)}
    assert len(draws) > 15  # different keys, different spans


def test_bad_settings_are_refused_before_any_work():
    for kwargs, match in (
        (dict(share=1.5), "share=1.5"),
        (dict(copies=0), "copies=0"),
        (dict(min_length=0), "min_length=0"),
        (dict(min_length=8, max_length=4), "max_length=4"),
        (dict(min_distance=-1), "min_distance=-1"),
    ):
        with pytest.raises(ValueError, match=match):
            RepeatedSpans(**kwargs)
    with pytest.raises(ValueError, match=r"seq_len=64.*raise --data.init_args.seq_len"):
        WikipediaDataModule(path="unused", seq_len=64, repeated_spans=RepeatedSpans(max_length=32, min_distance=128))


class _Tokenizer:
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(w) for w in text.split()]}


def _documents():  # 40 documents of 39 distinct tokens + EOS
    return iter(" ".join(str(1000 * i + j) for j in range(1, 40)) for i in range(40))


def test_the_stream_repeats_spans_and_a_resumed_stream_draws_the_same_ones():
    spans = RepeatedSpans(share=0.5, min_length=2, max_length=5, min_distance=8)
    kwargs = dict(documents=_documents, tokenizer=_Tokenizer(), seq_len=24, split="train", val_every=10)
    plain = [b["input_ids"] for b in PackedBlocks(**kwargs)]
    full = [b["input_ids"] for b in PackedBlocks(**kwargs, repeated_spans=spans)]
    changed = [not torch.equal(a, b) for a, b in zip(plain, full)]
    assert len(plain) == len(full) > 30 and 0.25 < sum(changed) / len(changed) < 0.75
    for i, (a, b) in enumerate(zip(plain, full)):
        if changed[i]:
            assert _repeats(a, b, (2, 5), 8)

    def loader(**kw):
        return list(DataLoader(PackedBlocks(**kwargs, **kw, repeated_spans=spans), batch_size=2, num_workers=2))

    whole, resumed = loader(batch_size=2), loader(batch_size=2, skip_batches=3)
    for a, b in itertools.zip_longest(whole[3:], resumed):
        assert torch.equal(a["input_ids"], b["input_ids"])
    val = dict(kwargs, split="val")
    pairs = list(zip(PackedBlocks(**val), PackedBlocks(**val, repeated_spans=spans)))
    assert len(pairs) >= 3 and all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in pairs)


def test_the_data_module_repeats_spans_in_training_only(tmp_path):
    (tmp_path / "c.txt").write_text("\n\n".join(" ".join(str(1000 * i + j) for j in range(1, 40)) for i in range(200)))
    spans = RepeatedSpans(share=1.0, min_length=2, max_length=4, min_distance=8)

    def make(**kw):
        return WikipediaDataModule(path=str(tmp_path / "c.txt"), seq_len=24, val_every=10, val_blocks=4, **kw)

    plain, module = make(), make(repeated_spans=spans)
    for m in (plain, module):
        m.tokenizer, m._checked = _Tokenizer(), True

    def ids(loader):
        return [b["input_ids"] for b in loader]

    train_plain, train = ids(plain.train_dataloader())[:10], ids(module.train_dataloader())[:10]
    assert all(_repeats(a[0], b[0], (2, 4), 8) for a, b in zip(train_plain, train))
    assert all(not torch.equal(a, b) for a, b in zip(train_plain, train))  # share 1: every block
    assert torch.equal(module.train_batch(4)["input_ids"], train[4])  # a teacher capture's batch, read again
    for a, b in zip(ids(plain.val_dataloader()), ids(module.val_dataloader())):
        assert torch.equal(a, b)
    for a, b in zip(ids(plain.predict_dataloader()), ids(module.predict_dataloader())):
        assert torch.equal(a, b)  # the planner's DoF capture reads plain text


def test_a_fit_with_repeated_spans_checkpoints_safely_and_resumes(tmp_path):
    """Through the CLI (``class_path``): the checkpoint loads with ``weights_only`` (the data module's settings are
    recorded as plain values, not the object) and ``--ckpt_path last`` resumes the same experiment."""
    from lit_dof.pipeline.cli import build_cli
    from lit_dof.pipeline.resume import ResumeMismatchError
    from tests.pipeline.conftest import fit_args

    spans = (
        "--data.init_args.repeated_spans={class_path: lit_dof.data.repeated_spans.RepeatedSpans, "
        "init_args: {share: 1.0, min_length: 2, max_length: 4, min_distance: 16}}"
    )
    build_cli(fit_args(tmp_path, steps=2, extra=[spans]))
    last = tmp_path / "lit-dof" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["datamodule_hyper_parameters"]["repeated_spans"]["min_distance"] == 16
    resumed = build_cli(fit_args(tmp_path, steps=3, extra=[spans, "--ckpt_path=last"]))
    assert resumed.trainer.global_step == 3 and resumed.trainer.log_dir.endswith("version_0")
    other = spans.replace("min_distance: 16", "min_distance: 20")
    with pytest.raises(ResumeMismatchError, match="repeated_spans"):  # other repeats: another experiment
        build_cli(fit_args(tmp_path, steps=4, extra=[other, "--ckpt_path=last"]))


def test_a_data_module_built_in_python_records_plain_settings():
    module = WikipediaDataModule(path="unused", seq_len=512, repeated_spans=RepeatedSpans(copies=2))
    assert module.hparams["repeated_spans"] == {
        "share": 0.5,
        "copies": 2,
        "min_length": 8,
        "max_length": 32,
        "min_distance": 128,
    }

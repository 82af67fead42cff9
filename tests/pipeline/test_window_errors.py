"""The long-range-head probe (lit_dof.pipeline.exact_heads.window_errors, LongRangeHeads): its scores against an
independent float64 reference — the teacher run again with one KV head's query heads masked to window + sinks in
SDPA, the attention module's own output (after its output projection) compared — for Llama (GQA), Gemma 3 (q/k
norms, its own sliding-window layers not scored), GPT-2 (c_proj, a Conv1D) and GPT-NeoX (dense) — the choice of
the share, its errors, and a fit that keeps the heads its own window scores top."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_dof.pipeline.exact_heads import LongRangeHeads, resolve_exact_heads, window_errors
from lit_dof.teacher.families import attention_layers
from tests.conftest import tiny_model
from tests.pipeline.test_exact_heads_probe import _Data, _Tokenizer

_REFERENCE = "lit_dof_test_windowed_head"


def _reference(model, blocks, window: int, sinks: int, start: int, layers) -> torch.Tensor:
    """Per (layer, KV head): the float64 model run with that head's query heads behind window + sinks (a boolean
    SDPA mask per head), the squared change of that layer's attention output at positions ≥ start, averaged."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    model = copy.deepcopy(model).double()
    attention = attention_layers(model)
    hq, hk = attention[0].num_heads, attention[0].num_kv_heads
    target: dict = {}

    def windowed(module, query, key, value, attention_mask, **kwargs):
        if target.get("layer") == module.layer_idx:
            T = query.shape[2]
            p, t = torch.arange(T)[:, None], torch.arange(T)[None, :]
            causal = t <= p
            mask = causal.expand(1, hq, T, T).clone()
            group = slice(target["head"] * (hq // hk), (target["head"] + 1) * (hq // hk))
            mask[0, group] = causal & ((t > p - window) | (t < sinks))
            attention_mask = mask
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(_REFERENCE, windowed)
    AttentionMaskInterface.register(_REFERENCE, sdpa_mask)
    model.set_attn_implementation(_REFERENCE)
    outputs: dict = {}
    hooks = [
        a.module.register_forward_hook(lambda m, args, out, i=a.index: outputs.__setitem__(i, out[0]))
        for a in attention
    ]
    scores = torch.zeros(len(attention), hk, dtype=torch.float64)
    for ids in blocks:
        target.clear()
        model(ids[None], use_cache=False)
        full = dict(outputs)
        for layer in layers:
            for head in range(hk):
                target.update(layer=layer, head=head)
                model(ids[None], use_cache=False)
                change = (outputs[layer] - full[layer])[0, start:]
                scores[layer, head] += float(change.pow(2).sum(-1).mean())
    for hook in hooks:
        hook.remove()
    return scores / len(blocks)


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt2", "gpt_neox"])
def test_window_errors_match_a_float64_rerun_with_one_head_windowed(family):
    model = tiny_model(family)
    g = torch.Generator().manual_seed(1)
    blocks = [torch.randint(3, 97, (48,), generator=g) for _ in range(2)]
    layers = [a.index for a in attention_layers(model) if a.linearizable]
    scores = window_errors(model, blocks, window=8, sink_tokens=2, start=20, layers=layers, rows=7)
    expected = _reference(model, blocks, 8, 2, 20, layers)
    assert scores.shape == expected.shape and (scores[layers] > 0).all()
    torch.testing.assert_close(scores, expected, rtol=2e-4, atol=1e-9)
    skipped = sorted(set(range(len(attention_layers(model)))) - set(layers))
    assert (scores[skipped] == 0).all()  # Gemma 3's own sliding-window layers
    assert model.config._attn_implementation == "sdpa"  # restored
    wide = window_errors(model, blocks, window=48, sink_tokens=0, start=20, layers=layers)
    assert wide.max() < 1e-6 * scores[layers].min()  # a window that holds every key changes nothing (rounding)


def test_window_errors_refuse_bad_input():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="blocks of one length"):
        window_errors(model, [torch.arange(3, 20), torch.arange(3, 21)], window=4)
    with pytest.raises(ValueError, match="start 30 must lie in 0..16"):
        window_errors(model, [torch.arange(3, 20)], window=4, start=30)


@torch.no_grad()
def test_long_range_heads_choose_the_top_share_of_the_window_errors():
    texts = ["filler text of a validation document " * 12] * 8  # every second one is validation (val_every = 2)
    llama = tiny_model("llama")  # 3 layers x 2 KV heads
    probe = LongRangeHeads(share=0.5, blocks=2, block=64)
    chosen = resolve_exact_heads(probe, llama, _Tokenizer(), _Data(texts), softmax_layers=[1], window=(8, 2))
    ids = torch.tensor(_Tokenizer()(" ".join(texts[::2]))["input_ids"])
    scores = window_errors(llama, [ids[:64], ids[64:128]], window=8, sink_tokens=2, layers=[0, 2])
    flat = sorted(((float(scores[i, h]), (i, h)) for i in (0, 2) for h in range(2)), reverse=True)[:2]
    assert sorted(chosen.items()) == sorted(
        {i: sorted(h for s, (j, h) in flat if j == i) for i in {i for _, (i, _) in flat}}.items()
    )
    with pytest.raises(ValueError, match="share must lie in"):
        LongRangeHeads(share=-0.1)
    with pytest.raises(ValueError, match="needs the student's window"):
        resolve_exact_heads(probe, llama, _Tokenizer(), _Data(texts))
    with pytest.raises(ValueError, match="LongRangeHeads block = 1024 tokens is beyond the teacher's 256 positions"):
        resolve_exact_heads(LongRangeHeads(), llama, _Tokenizer(), _Data(texts), window=(8, 2))
    with pytest.raises(ValueError, match=r"give only \d+ blocks of 64 tokens; LongRangeHeads asks for 99"):
        resolve_exact_heads(LongRangeHeads(blocks=99, block=64), llama, _Tokenizer(), _Data(texts), window=(8, 2))


def test_a_fit_keeps_exact_the_heads_whose_output_its_own_window_changes_most(tmp_path):
    """The student module hands the probe its own window + sinks (64 + 4 in methods/swa_sink_linear.yaml)."""
    from lit_dof.data.sources import split_documents
    from lit_dof.evaluation.perplexity import text_tokens
    from lit_dof.pipeline.exact_heads import top_heads
    from lit_dof.students import load_student
    from lit_dof.students.surgery import exact_heads
    from lit_dof.teacher.loading import load_teacher
    from tests.conftest import TINYSTORIES, WIKIPEDIA
    from tests.pipeline.test_cli import _run

    probe = "{class_path: lit_dof.pipeline.exact_heads.LongRangeHeads, init_args: {share: 0.25, blocks: 2, block: 128}}"
    _, log_dir = _run(
        tmp_path, "methods/swa_sink_linear.yaml", steps=2, extra=[f"--model.init_args.exact_heads={probe}"]
    )
    teacher, tokenizer = load_teacher(str(TINYSTORIES))
    tokens = text_tokens(split_documents(str(WIKIPEDIA), "validation"), tokenizer, max_tokens=256)
    scores = window_errors(teacher, list(tokens[:256].view(2, 128)), window=64, sink_tokens=4)
    expected = top_heads(scores, 2)  # round(0.25 * 4 KV heads * 2 layers)
    assert exact_heads(load_student(log_dir / "student").model) == expected and sum(map(len, expected.values())) == 2

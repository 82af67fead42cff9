"""What an exported student's model card says about the fit that made it (checked after the pipeline tests' fits)."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import ModelCard

from lit_dof.students.state_bytes import decode_state_bytes


def check_card_of_the_fit(cli, folder: Path, student) -> None:
    """The exported student's card says what this 3-step fit did (the recipes' LoRA: rank 8, α 16, q/k/v/o; the
    tests' budget: blocks of 64 tokens, 2 per step, the last of 3 steps end to end), what the run logged, and the
    decode state at the teacher's 512 positions beside its KV cache (2 layers × K and V × 4 heads × 16 × 4 bytes per
    token)."""
    card = ModelCard.load(folder / "README.md")
    assert card.data.license == "apache-2.0"  # TinyStories-656K's README; local teacher and corpus: no hub ids
    assert card.data.base_model is None and card.data.datasets is None
    metrics = cli.trainer.callback_metrics
    loss = type(cli.model.layer_loss).__name__
    for expected in (
        f"- Recipe: `LayerwiseDistillation` (lit-dof): each twin learns its teacher layer's attention (`{loss}`), "
        "then the last 1 of 3 steps train end to end (logit distillation against the teacher, temperature 1)",
        f"- Steps: 3 optimizer steps, {3 * 2 * 64} training tokens through the teacher (blocks of 64 tokens, 2 "
        "blocks per rank and step, 1 rank)",
        "- Data: a local corpus file (`enwiki_wikiextractor_AA.txt.gz`)",
        "- LoRA tail: rank 8, α 16 on q_proj, k_proj, v_proj, o_proj; trained in the 1 end-to-end step; merged into "
        "the weights",
        f"2 held-out blocks of 64 tokens): student {float(metrics['val/ppl_student']):.3f}, teacher "
        f"{float(metrics['val/ppl_teacher']):.3f}",
        f"| 512 | {decode_state_bytes(student, 512) / 1024:.1f} KiB | {512 * 2 * 2 * 4 * 16 * 4 / 1024:.1f} KiB |",
        "The student's state is the same at any context from",
        'from_pretrained("path/to/student", trust_remote_code=True)',
        "import lit_dof",
    ):
        assert expected in card.text, expected

"""``lit-dof fit`` under the half precisions: the whole run (DoF estimate, allocation, layer-wise steps,
validation, end-to-end tail, export) on the real TinyStories teacher, with float32 feature maps throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lit_dof.pipeline.cli import build_cli
from lit_dof.students import load_student
from tests.pipeline.conftest import fit_args

_SAFETENSORS = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed needs a GPU (Lightning runs bf16 on a CPU)")


def _twin_names(model) -> list[str]:
    return [n for n, _ in model.named_parameters() if ".feature_map." in n]


def _check_export(student_dir: Path, teacher_dtype: torch.dtype) -> None:
    """The saved student: config records the teacher weights' dtype, twins float32 in the file and after
    ``load_student`` (default dtype and the other half dtype), finite logits."""
    from safetensors import safe_open

    config = json.loads((student_dir / "config.json").read_text())
    name = str(teacher_dtype).removeprefix("torch.")
    assert config["dtype"] == name and config["text_config"]["dtype"] == name
    with safe_open(str(student_dir / "model.safetensors"), "pt") as f:
        dtypes = {key: f.get_slice(key).get_dtype() for key in f.keys()}
        saved_twins = {key: f.get_tensor(key) for key in dtypes if ".feature_map." in key}
    assert saved_twins and {dtypes[k] for k in saved_twins} == {"F32"}
    assert {d for k, d in dtypes.items() if k not in saved_twins} == {_SAFETENSORS[teacher_dtype]}
    for kwargs in ({}, {"dtype": torch.float16}):
        student = load_student(student_dir, **kwargs)
        params = dict(student.named_parameters())
        twins = _twin_names(student)
        assert student.dtype == kwargs.get("dtype", teacher_dtype)
        for n in twins:  # exactly the saved float32 values, whatever the teacher's dtype
            assert params[n].dtype == torch.float32 and torch.equal(params[n], saved_twins[n])
        vocab = student.config.text_config.vocab_size
        ids = torch.randint(3, vocab, (1, 24), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            logits = student(ids, use_cache=False).logits
        assert torch.isfinite(logits.float()).all()


@pytest.mark.parametrize(
    "precision, teacher_dtype, accelerator",
    [("bf16-true", torch.bfloat16, "cpu"), ("bf16-mixed", torch.float32, "cpu"), ("16-true", torch.float16, "cpu"),
     pytest.param("16-mixed", torch.float32, "gpu", marks=_CUDA)],
    ids=["bf16-true", "bf16-mixed", "16-true", "16-mixed-gpu"],
)  # fmt: skip  # parametrize table
def test_half_precision_fit_runs_end_to_end(tmp_path, precision, teacher_dtype, accelerator):
    """2 steps (one layer-wise, one end-to-end) and a validation (about a second each on a CPU): the teacher
    is loaded in the precision's dtype, the optimizer's master weights and Adam state are float32, the
    metrics finite."""
    extra = [
        f"--trainer.precision={precision}",
        f"--trainer.accelerator={accelerator}",
        "--model.init_args.finetune_fraction=0.5",
    ]
    args = fit_args(tmp_path, steps=2, extra=extra)
    cli = build_cli(args)
    module = cli.model
    assert cli.trainer.global_step == 2 and module.finetune_start() == 1  # both phases ran
    assert module.resolved_teacher_dtype() == teacher_dtype
    assert module.student.model.get_input_embeddings().weight.dtype == teacher_dtype
    optimizer = cli.trainer.optimizers[0]
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    assert all(optimizer.state[p]["exp_avg"].dtype == torch.float32 for p in trained)
    metrics = cli.trainer.callback_metrics
    for key in ("train/loss", "train/logit_kd", "val/ppl_student", "val/ppl_teacher"):
        assert torch.isfinite(metrics[key]), key
    assert module.val_ppl_student.total_log_probs.dtype == torch.float32  # bf16-true converted it to bf16
    _check_export(Path(cli.trainer.log_dir) / "student", teacher_dtype)

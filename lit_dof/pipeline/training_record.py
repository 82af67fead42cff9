"""What a fit knows about the student it exports, for the model card: the training record.

:func:`training_record` reads it from the LightningModule and its trainer at ``on_fit_end``; the record's keys are
those lit_dof.students.card_training renders (its module docstring), and
:func:`~lit_dof.students.card.write_model_card` keeps it in the student folder as ``lit_dof_training.json``.
"""

from __future__ import annotations

import math
import os

_SCHEDULE = ("lr_z", "lr_alpha", "lr", "warmup_steps", "min_lr_ratio")


def training_record(module) -> dict:
    """The training record of a finished fit.

    Args:
        module: a :class:`~lit_dof.pipeline.module.StudentModule` attached to the trainer that ran the fit.

    Returns:
        a JSON-ready dict: ``recipe``, ``layer_loss``, ``end_to_end``, ``steps``, ``tokens`` (this rank's count
        × the world size: every rank's blocks have one size), ``seq_len``, ``batch_size``, ``world_size``,
        ``datasets`` / ``corpus``, ``hyperparameters``, ``lora`` and ``validation`` (the last validation's
        perplexities; absent when the fit ran none). Settings a module does not have are left out.
    """
    trainer = module.trainer
    world = int(trainer.world_size)
    steps = int(trainer.global_step)
    data = getattr(trainer, "datamodule", None)
    tail = _end_to_end_steps(module, steps)
    record = {
        "recipe": type(module).__name__,
        "layer_loss": _layer_loss(module),
        "end_to_end": {"steps": tail, "objective": _objective(module)} if tail else None,
        "steps": steps,
        "tokens": int(module.tokens_seen) * world,
        "seq_len": int(module.seq_len),
        "batch_size": getattr(data, "batch_size", None),
        "world_size": world,
        **_data(data),
        "hyperparameters": _hyperparameters(module, tail),
        "lora": _lora(module, tail),
        "validation": _validation(trainer, data, world),
    }
    return {key: value for key, value in record.items() if value is not None or key == "lora"}


def _end_to_end_steps(module, steps: int) -> int:
    """Optimizer steps that trained through the whole model: all of a direct fit's, the tail of a layer-wise one."""
    from lit_dof.pipeline.direct import DirectDistillation

    if isinstance(module, DirectDistillation):
        return steps
    if not getattr(module, "finetune_fraction", 0) or not hasattr(module, "finetune_start"):
        return 0
    return max(0, steps - module.finetune_start())


def _layer_loss(module) -> str | None:
    from lit_dof.pipeline.direct import DirectDistillation

    loss = getattr(module, "layer_loss", None)
    return None if loss is None or isinstance(module, DirectDistillation) else type(loss).__name__


def _objective(module) -> str:
    temperature = getattr(module, "kd_temperature", 1.0)
    logit_kd = getattr(module, "logit_kd", None)
    if logit_kd is None:  # the layer-wise tail
        return f"logit distillation against the teacher, temperature {temperature:g}"
    text = "next-token cross-entropy"
    if logit_kd:
        text += f" + {logit_kd:g} × the teacher-logit KL, temperature {temperature:g}"
    return text + f"; trains `{getattr(module, 'trainable', 'feature_maps')}`"


def _data(data) -> dict:
    if data is None:
        return {}
    if getattr(data, "path", None):
        return {"datasets": [], "corpus": f"a local corpus file (`{os.path.basename(str(data.path))}`)"}
    dataset, config = getattr(data, "hub_dataset", None), getattr(data, "hub_config", None)
    if not dataset:
        return {}
    return {"datasets": [dataset], "corpus": f"`{dataset}`" + (f" ({config})" if config else "") + ", streamed"}


def _hyperparameters(module, tail: int) -> dict:
    keys = list(_SCHEDULE)
    if getattr(module, "lora", None) is not None:
        keys.append("lr_lora")
    if tail and getattr(module, "logit_kd", None) is None:  # a layer-wise tail runs at finetune_lr_ratio
        keys.append("finetune_lr_ratio")
    return {key: getattr(module, key) for key in keys if getattr(module, key, None) is not None}


def _lora(module, tail: int) -> dict | None:
    settings = getattr(module, "lora", None)
    if settings is None:
        return None
    return {
        "rank": settings.rank,
        "alpha": settings.alpha,
        "target_modules": list(settings.target_modules) if settings.target_modules is not None else None,
        "trained_steps": tail,
        "merged": True,  # StudentModule.on_fit_end exports merged_state_dict whenever adapters exist
    }


def _validation(trainer, data, world: int) -> dict | None:
    metrics = trainer.callback_metrics
    values = {key: metrics.get(f"val/{key}") for key in ("ppl_student", "ppl_teacher")}
    values = {key: float(value) for key, value in values.items() if value is not None}
    if not math.isfinite(values.get("ppl_student", math.nan)):
        return None
    blocks = getattr(data, "val_blocks", None)
    if isinstance(blocks, int):
        values["blocks"] = blocks // world * world  # the validation loader's equal shares
        values["block_tokens"] = getattr(data, "seq_len", None)
    return values

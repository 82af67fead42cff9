"""The model card's "Training" section, from the fit's training record (``lit_dof_training.json``).

``lit-dof fit`` writes the record when it exports a student (lit_dof.pipeline.training_record); its keys, each
optional (a missing key is left out of the card, never guessed):

* ``recipe`` (the LightningModule's class), ``layer_loss`` (the layer-wise loss's class, if any);
* ``end_to_end``: ``{"steps": k, "objective": text}`` — the optimizer steps that trained through the whole model;
* ``steps`` (optimizer steps), ``tokens`` (training tokens the teacher processed, all ranks), ``seq_len``,
  ``batch_size`` (blocks per rank and step), ``world_size``;
* ``datasets`` (hub ids of the training data: the card's ``datasets`` metadata), ``corpus`` (how the data are
  described in the text);
* ``hyperparameters``: learning rates and schedule (``lr_z``, ``lr_alpha``, ``lr``, ``lr_lora``, ``warmup_steps``,
  ``min_lr_ratio``, ``finetune_lr_ratio``);
* ``lora``: ``{"rank", "alpha", "target_modules", "trained_steps", "merged"}`` or ``None`` (no LoRA tail);
* ``validation``: ``{"ppl_student", "ppl_teacher", "blocks", "block_tokens"}`` — the fit's last validation.
"""

from __future__ import annotations

from lit_dof.students.card_sources import number

_RATES = (("lr_z", "z"), ("lr_alpha", "α"), ("lr", "other"), ("lr_lora", "LoRA"))


def training_lines(record: dict | None) -> list[str]:
    """The card's "## Training" section.

    Args:
        record: the training record (keys in the module docstring), or ``None``.

    Returns:
        markdown lines ending with a blank line; ``[]`` without a record.
    """
    if not isinstance(record, dict):
        return []
    lines = ["## Training", ""]
    lines += _recipe(record)
    steps, tokens = record.get("steps"), record.get("tokens")
    if steps is not None:
        shape = [
            text.format(record[key])
            for key, text in (("seq_len", "blocks of {} tokens"), ("batch_size", "{} blocks per rank and step"))
            if record.get(key) is not None
        ]
        if isinstance(record.get("world_size"), int):
            shape.append(f"{record['world_size']} rank{'s' if record['world_size'] != 1 else ''}")
        shown = f"- Steps: {steps} optimizer steps"
        shown += f", {tokens:,} training tokens through the teacher" if isinstance(tokens, int) else ""
        lines.append(shown + (f" ({', '.join(shape)})" if shape else ""))
    if record.get("corpus"):
        lines.append(f"- Data: {record['corpus']}")
    lines += _rates(record.get("hyperparameters"))
    if "lora" in record:
        lines.append(_lora(record["lora"]))
    lines += _validation(record.get("validation"))
    return [*lines, ""]


def _recipe(record: dict) -> list[str]:
    recipe = record.get("recipe")
    if not recipe:
        return []
    text = f"- Recipe: `{recipe}` (lit-dof)"
    end_to_end = record.get("end_to_end") if isinstance(record.get("end_to_end"), dict) else {}
    e2e_steps, steps = end_to_end.get("steps"), record.get("steps")
    objective = end_to_end.get("objective")
    if record.get("layer_loss"):
        text += f": each twin learns its teacher layer's attention (`{record['layer_loss']}`)"
        if e2e_steps:
            text += f", then the last {e2e_steps} of {steps} steps train end to end ({objective})"
        else:
            text += "; no end-to-end steps"
    elif objective:
        text += f": every step end to end ({objective})"
    return [text]


def _rates(hyperparameters) -> list[str]:
    if not isinstance(hyperparameters, dict):
        return []
    rates = [
        f"{label} {hyperparameters[key]:g}" for key, label in _RATES if number(hyperparameters.get(key)) is not None
    ]
    if not rates:
        return []
    text = f"- Learning rates: {', '.join(rates)}"
    if hyperparameters.get("warmup_steps") is not None:
        text += f"; linear warm-up over {hyperparameters['warmup_steps']} steps"
    if number(hyperparameters.get("min_lr_ratio")) is not None:
        text += f", cosine decay to {hyperparameters['min_lr_ratio']:g}×"
    if number(hyperparameters.get("finetune_lr_ratio")) is not None:
        text += f"; the end-to-end steps from {hyperparameters['finetune_lr_ratio']:g}× those rates"
    return [text]


def _lora(lora) -> str:
    if not isinstance(lora, dict):
        return "- LoRA tail: none"
    targets = ", ".join(lora.get("target_modules") or []) or "peft's default projections"
    alpha = lora.get("alpha")
    text = f"- LoRA tail: rank {lora.get('rank')}, α {alpha:g} on {targets}" if number(alpha) is not None else ""
    text = text or f"- LoRA tail: rank {lora.get('rank')} on {targets}"
    trained = lora.get("trained_steps")
    if trained:
        text += f"; trained in the {trained} end-to-end step{'s' if trained != 1 else ''}"
    elif trained is not None:
        text += "; never trained (no end-to-end steps), so its update is zero"
    if lora.get("merged"):
        text += "; merged into the weights (the folder holds plain weights, no adapters)"
    return text


def _validation(validation) -> list[str]:
    if not isinstance(validation, dict):
        return []
    student, teacher = number(validation.get("ppl_student")), number(validation.get("ppl_teacher"))
    if student is None:
        return []
    where = ""
    if validation.get("blocks") is not None and validation.get("block_tokens") is not None:
        where = f", {validation['blocks']} held-out blocks of {validation['block_tokens']} tokens"
    shown = f"student {student:.3f}" + (f", teacher {teacher:.3f}" if teacher is not None else "")
    return [f"- Validation perplexity (the fit's last validation{where}): {shown}"]

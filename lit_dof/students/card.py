"""A saved student's model card: ``README.md`` with Hub metadata and what the student is.

The card is read from the files of the student directory (:mod:`lit_dof.students.card_sources`): ``config.json``
(feature map, window, sinks, per-layer feature dims, softmax layers, teacher, ``auto_map``), a DoF report
(``dof.json`` in the directory, or one folder up when its allocations include the student's feature dims, as
``lit-dof fit`` lays them out), the fit's training record (``lit_dof_training.json``: recipe, steps, tokens, data,
LoRA tail, validation perplexities) and measurement records (``ppl.json``-like records with a ``ppl``, ``lit-dof
eval --output`` records with ``tasks``, and ``eval/<task>.json``). Its metadata name the teacher's hub id as
``base_model`` (where one is known: never a local path), the teacher's license (the student's weights are the
teacher's, modified; ``other`` where unknown) and the training data on the hub as ``datasets``; its text adds the
decode state per sequence and both ways to load the folder.
:meth:`~lit_dof.students.LitDofForCausalLM.save_pretrained` writes it inside its atomic save;
:func:`write_model_card` rewrites it (atomically) once more is known. :func:`push_folder` uploads a saved
directory as it is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from lit_dof.attention.layers.window_options import SlidingWindow
from lit_dof.io import atomic_write_json, atomic_write_text
from lit_dof.students.card_sources import (
    TRAINING_FILE,
    DecodeState,
    TeacherSource,
    decode_state,
    find_dof_report,
    find_results,
    first,
    read_json,
    read_training,
    teacher_source,
)
from lit_dof.students.card_training import training_lines
from lit_dof.students.remote_code import CONFIG_CODE_FILE, writer_version
from lit_dof.students.surgery import layer_mean_dims, teacher_sliding_layers, twin_layer_dims

CARD_FILE = "README.md"
TAGS = ("lit-dof", "linear-attention")
LAM_KEYS = ("lam", "lambda", "λ", "ridge")
STRATEGY_KEYS = ("strategy", "allocation", "allocator", "allocation_strategy")


def model_card(
    config: dict,
    *,
    dof: dict | None = None,
    strategy: str | None = None,
    results: tuple[list, dict] = ([], {}),
    model_id: str = "path/to/student",
    training: dict | None = None,
    state: DecodeState | None = None,
    teacher: TeacherSource | None = None,
    required_version: str | None = None,
) -> ModelCard:
    """The model card of a student.

    Args:
        config: the student's ``config.json`` (a :class:`~lit_dof.students.LitDofConfig` as a dict).
        dof: its DoF report (``dof.json``; keys are read tolerantly), if known.
        strategy: the allocation strategy (``dof``, ``dof_clip``, ``fix``, ``dof_head``), if known; else read
            from ``dof`` or inferred from which of its ``allocations`` equals the student's dims.
        results: :func:`find_results` of the directory.
        model_id: what the card's loading snippets pass to ``from_pretrained`` (the Hub repo id when pushed).
        training: the fit's training record (``lit_dof_training.json``), if any.
        state: the decode state per sequence (:func:`~lit_dof.students.card_sources.decode_state`), if known.
        teacher: where the teacher came from (default: :func:`~lit_dof.students.card_sources.teacher_source` of
            ``config["teacher"]``).
        required_version: the lit-dof version the folder's code files require (default: this lit-dof's).

    Returns:
        A ``huggingface_hub.ModelCard`` whose metadata has ``library_name: transformers``, the tags
        :data:`TAGS`, ``pipeline_tag: text-generation``, ``license`` (the teacher's, else ``other``),
        ``base_model`` (the teacher's hub id, only where known) and ``datasets`` (the training data's hub ids,
        only where the training record names some).
    """
    teacher = teacher or teacher_source(config.get("teacher") or None)
    datasets = [d for d in (training or {}).get("datasets") or [] if isinstance(d, str)]
    data = ModelCardData(
        library_name="transformers",
        tags=list(TAGS),
        pipeline_tag="text-generation",
        license=teacher.license or "other",
        base_model=teacher.hub_id,
        datasets=datasets or None,
    )
    dims = list(config.get("feature_dims") or [])
    lines = [f"# {model_id.rstrip('/').rpartition('/')[2]}", ""]
    source = teacher.label or "a pretrained causal Transformer"
    lines += [
        (
            f"A linear-attention student of {source}, made with lit-dof: the teacher's weights (projections, "
            "positions, MLPs) with a linear-attention twin per attention layer; layers listed as softmax keep "
            "exact attention."
        ),
        "",
    ]
    lines += ["## Method", "", *_method_lines(config, dims), ""]
    lines += _dof_lines(dims, dof, strategy)
    lines += training_lines(training)
    lines += _state_lines(state)
    lines += _results_lines(*results)
    lines += _load_lines(model_id, bool(config.get("auto_map")), required_version or writer_version())
    lines += _license_lines(teacher)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


def _method_lines(config: dict, dims: list) -> list[str]:
    spec = config.get("feature_map") or {}
    name = str(spec.get("class", "?")).rpartition(".")[2]
    kwargs = ", ".join(f"{k}={v!r}" for k, v in (spec.get("kwargs") or {}).items())
    options = SlidingWindow.from_dict(config.get("window_options") or config)  # older files: top-level keys
    softmax = list(config.get("softmax_layers") or [])
    lines = [f"- Feature map: `{name}`" + (f" ({kwargs})" if kwargs else "")]
    if options.enabled:
        far = "a linear far term" if options.far_term else "no far term"
        if options.far_term and options.far_gate:
            far += f" with a learned forget gate (started at a {options.far_decay:g}-token decay)"
        elif options.far_term and options.far_decay is not None:
            far += f" decaying over {options.far_decay:g} tokens past the window"
        if options.far_term and options.far_memory == "delta":
            far += ", its values read from a delta-rule memory"
        if options.far_cache:
            rank = "the most novel keys" if options.far_cache_score == "novelty" else "the window's heaviest"
            far += f", and {options.far_cache} far tokens per head kept exactly ({rank})"
        if options.far_term and not options.far_rope:
            far += " on un-rotated queries and keys (position-free)"
        lines.append(
            f"- Attention: sliding window of {options.window} tokens + {options.sink_tokens} sink tokens, {far}"
        )
    else:
        lines.append("- Attention: linear (window 0, sink tokens 0)")
    lines.append(f"- Softmax layers: {', '.join(map(str, softmax)) if softmax else 'none'}")
    exact = {i: [h for h, x in enumerate(m) if x == 0] for i, m in enumerate(dims) if isinstance(m, list) and 0 in m}
    if exact:  # M = 0: full causal softmax in those KV heads (lit_dof.attention.layers.exact)
        heads = "; ".join(f"layer {i}: {', '.join(map(str, h))}" for i, h in exact.items())
        lines.append(f"- Exact KV heads (M = 0: full softmax attention, a growing KV cache): {heads}")
    kinds = (config.get("text_config") or {}).get("layer_types") or []
    sliding = teacher_sliding_layers(kinds)  # the teacher's own: stay softmax
    if dims:
        lines += ["", "| layer | M |", "|---|---|"]
        own = "– (the teacher's sliding window: softmax)"
        for i, m in enumerate(dims):
            lines.append(f"| {i}{' (softmax)' if i in softmax else ''} | {own if i in sliding else m} |")
        twins = twin_layer_dims(dims, kinds)
        total = sum(layer_mean_dims(twins))
        lines += [
            "",
            (
                f"Total ΣM = {total:g} over {len(twins)} layers (softmax layers' twins included; a layer with "
                "one M per KV head counts their mean)."
            ),
        ]
    return lines


def _dof_lines(dims: list, dof: dict | None, strategy: str | None) -> list[str]:
    dof = dof or {}
    allocations = dof.get("allocations") if isinstance(dof.get("allocations"), dict) else {}
    recorded = first(dof, STRATEGY_KEYS)
    if isinstance(recorded, dict):  # e.g. a saved allocator section: {"strategy": "dof", ...}
        recorded = first(recorded, STRATEGY_KEYS)
    strategy = strategy or (recorded if isinstance(recorded, str) else None)
    if strategy is None:
        matching = [name for name, alloc in allocations.items() if alloc == dims]
        strategy = " = ".join(matching) or None
    lam = first(dof, LAM_KEYS)
    if strategy is None and lam is None:
        return []
    lines = ["## DoF allocation", ""]
    if strategy is not None:
        lines.append(f"- Strategy: `{strategy}`")
    if lam is not None:
        rule = ", ".join(f"{k} {dof[k]}" for k in ("lam_rule", "relative_to") if dof.get(k) is not None)
        lines.append(f"- λ = {lam:g}" if isinstance(lam, (int, float)) else f"- λ = {lam}")
        lines[-1] += f" ({rule})" if rule else ""
    for key, label in (
        ("num_samples", "query/key samples per head (J)"),
        ("pooling", "pooling"),
        ("tokens", "tokens captured"),
    ):
        if dof.get(key) is not None:
            lines.append(f"- {label}: {dof[key]}")
    layer_dof = dof.get("layer_dof")
    if isinstance(layer_dof, list) and layer_dof:
        shown = ", ".join(
            "–" if n is None else f"{n:.1f}" if isinstance(n, (int, float)) else str(n) for n in layer_dof
        )
        lines.append(f"- DoF per layer: {shown}")
    return [*lines, ""]


def _results_lines(perplexities: list, tasks: dict) -> list[str]:
    if not perplexities and not tasks:
        return []
    lines = ["## Measured", ""]
    if perplexities:
        lines += ["| record | perplexity | tokens |", "|---|---|---|"]
        lines += [
            f"| {name} | {ppl:.3f} | {tokens if tokens is not None else '–'} |" for name, ppl, tokens in perplexities
        ]
        lines.append("")
    if tasks:
        lines += ["| task | metric | value | n |", "|---|---|---|---|"]
        for task, (metric, value, stderr, n) in tasks.items():
            shown = f"{value:.4f} ± {stderr:.4f}" if stderr is not None else f"{value:.4f}"
            lines.append(f"| {task} | {metric} | {shown} | {n if n is not None else '–'} |")
        lines.append("")
    return lines


def _state_lines(state: DecodeState | None) -> list[str]:
    if state is None:
        return []
    lines = ["## Decode state per sequence", "", "| context (tokens) | student | teacher's KV cache |", "|---|---|---|"]
    lines += [f"| {t:,} | {_size(student)} | {_size(teacher)} |" for t, student, teacher in state.rows]
    tokens = f"{state.full_context:,} token{'s' if state.full_context > 1 else ''}"
    if state.constant:
        lines += ["", f"The student's state is the same at any context from {tokens} on."]
    else:
        lines += ["", "The student's state grows with the context (layers that keep a KV cache)."]
    return [*lines, ""]


def _size(count: int) -> str:
    """``count`` bytes for the card: exact below 1 KiB, else in KiB, MiB or GiB (binary units)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,} bytes"


def _load_lines(model_id: str, has_code: bool, version: str) -> list[str]:
    plain = [
        "```python",
        'import lit_dof  # registers the "lit_dof" model type',
        "from transformers import AutoModelForCausalLM",
        "",
        f'model = AutoModelForCausalLM.from_pretrained("{model_id}")',
        "```",
        "",
    ]
    if not has_code:  # a folder saved before the code files: lit-dof's own route only
        return ["## How to load", "", f'With lit-dof installed (`pip install "lit-dof>={version}"`):', "", *plain]
    return [
        "## How to load",
        "",
        (
            f'With lit-dof installed (`pip install "lit-dof>={version}"`), transformers loads this folder through '
            "its `configuration_lit_dof.py` and `modeling_lit_dof.py`, which import the installed lit-dof and hold "
            "no model code:"
        ),
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, pipeline",
        "",
        f'model = AutoModelForCausalLM.from_pretrained("{model_id}", trust_remote_code=True)',
        f'generator = pipeline("text-generation", model="{model_id}", trust_remote_code=True)',
        "```",
        "",
        "or, without `trust_remote_code`, after importing lit-dof:",
        "",
        *plain,
        (
            f"lm-eval: `lm_eval --model hf --model_args pretrained={model_id},trust_remote_code=True --tasks "
            f"arc_easy`, or `lit-dof lm-eval --model lit_dof --model_args pretrained={model_id} --tasks arc_easy`."
        ),
        "",
    ]


def _license_lines(teacher: TeacherSource) -> list[str]:
    own = f"`{teacher.license}`, the teacher's license" if teacher.license else "the teacher's license"
    unknown = "" if teacher.license else " (lit-dof could not read it: check the teacher's model card)"
    return ["## License", "", f"The student's weights are the teacher's, modified: {own} applies{unknown}.", ""]


def _required_version(directory: Path) -> str | None:
    """The lit-dof version the folder's ``configuration_lit_dof.py`` requires, if it has one."""
    path = directory / CONFIG_CODE_FILE
    match = (
        re.search(r'^LIT_DOF_REQUIRED = "([^"]+)"', path.read_text(encoding="utf-8"), re.M) if path.is_file() else None
    )
    return match.group(1) if match else None


def write_model_card(
    directory: str | os.PathLike,
    *,
    dof: dict | None = None,
    strategy: str | None = None,
    model_id: str | None = None,
    training: dict | None = None,
) -> Path:
    """Write (or rewrite) ``README.md`` of a saved student, atomically.

    Args:
        directory: a student directory (``config.json`` with ``model_type: lit_dof``).
        dof: the DoF report to describe (default: :func:`find_dof_report`).
        strategy: the allocation strategy, if known (see :func:`model_card`).
        model_id: what the loading snippets load (default ``path/to/<directory name>``).
        training: the fit's training record, written to ``lit_dof_training.json`` in ``directory`` (atomically) so
            that later rewrites keep it (default: the record already there, if any).

    Returns:
        The card's path.

    Raises:
        FileNotFoundError: no ``config.json`` in ``directory``.
    """
    directory = Path(directory)
    config = read_json(directory / "config.json")
    if config is None:
        raise FileNotFoundError(f"{directory / 'config.json'} is missing or unreadable: write the student first")
    if dof is None:
        dof = find_dof_report(directory, list(config.get("feature_dims") or []))
    if training is not None:
        atomic_write_json(directory / TRAINING_FILE, training)
    card = model_card(
        config,
        dof=dof,
        strategy=strategy,
        results=find_results(directory),
        model_id=model_id or f"path/to/{directory.name}",
        training=training if training is not None else read_training(directory),
        state=decode_state(config),
        required_version=_required_version(directory),
    )
    path = directory / CARD_FILE
    atomic_write_text(path, str(card))
    return path


HUB_KWARGS = ("commit_message", "commit_description", "private", "token", "revision", "create_pr")
"""The keywords of :meth:`~lit_dof.students.LitDofForCausalLM.save_pretrained` that go to :func:`push_folder`."""


def push_folder(folder: str | os.PathLike, repo_id: str, **kwargs) -> str:
    """Upload a saved directory to the Hub as it is: ``HfApi.create_repo`` (``exist_ok``) then ``upload_folder``.

    Args:
        folder: the directory to upload.
        repo_id: the repository (created if needed; a bare name goes to the token's namespace).
        **kwargs: :data:`HUB_KWARGS`.

    Returns:
        The repository id the Hub resolved.
    """
    from huggingface_hub import HfApi

    api = HfApi(token=kwargs.get("token"))
    repo = api.create_repo(repo_id, private=kwargs.get("private"), exist_ok=True).repo_id
    api.upload_folder(
        repo_id=repo,
        folder_path=str(folder),
        revision=kwargs.get("revision"),
        commit_message=kwargs.get("commit_message") or "Upload lit-dof student",
        commit_description=kwargs.get("commit_description"),
        create_pr=kwargs.get("create_pr"),
    )
    return repo

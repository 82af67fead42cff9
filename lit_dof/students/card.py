"""A saved student's model card: ``README.md`` with Hub metadata and what the student is.

The card is read from the files of the student directory: ``config.json`` (feature map, window, sinks, per-layer
feature dims, softmax layers, teacher), a DoF report (``dof.json`` in the directory, or one folder up when its
allocations include the student's feature dims, as ``lit-dof fit`` lays them out) and measurement records in the
directory (``ppl.json``-like records with a ``ppl``, ``lit-dof eval --output`` records with ``tasks``, and
``eval/<task>.json``). Records whose keys differ are read where they can be and skipped where they cannot.
:meth:`~lit_dof.students.LitDofForCausalLM.save_pretrained` writes it inside its atomic save;
:func:`write_model_card` rewrites it (atomically) once more is known. :func:`push_folder` uploads a saved
directory as it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from lit_dof.attention.layers.window_options import SlidingWindow
from lit_dof.io import atomic_write_text
from lit_dof.students.surgery import layer_mean_dims

CARD_FILE = "README.md"
TAGS = ("lit-dof", "linear-attention")
LAM_KEYS = ("lam", "lambda", "λ", "ridge")
STRATEGY_KEYS = ("strategy", "allocation", "allocator", "allocation_strategy")
RESULT_METRICS = ("acc_norm", "acc")
"""Task metrics shown, in order of preference (lm-eval's usual headline: acc_norm where defined)."""
_NOT_RESULTS = {
    "config.json",
    "generation_config.json",
    "dof.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "model.safetensors.index.json",
}
_MAX_RECORD_BYTES = 20 * 2**20


def _read_json(path: Path) -> dict | None:
    """``path`` parsed as a JSON object, or ``None`` (missing, too large, unreadable or not an object)."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_RECORD_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _first(record: dict, keys) -> object:
    return next((record[k] for k in keys if record.get(k) is not None), None)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def find_dof_report(directory: str | os.PathLike, feature_dims: list) -> dict | None:
    """The DoF report describing the student in ``directory``.

    Args:
        directory: the student directory.
        feature_dims: the student's feature dims (``config.json``).

    Returns:
        ``directory/dof.json``; else ``dof.json`` one folder up if one of its ``allocations`` equals
        ``feature_dims`` (so a report about another model is not shown); else ``None``.
    """
    directory = Path(directory)
    own = _read_json(directory / "dof.json")
    if own is not None:
        return own
    parent = _read_json(directory.parent / "dof.json")
    allocations = (parent or {}).get("allocations")
    if isinstance(allocations, dict) and feature_dims in allocations.values():
        return parent
    return None


def find_results(directory: str | os.PathLike) -> tuple[list[tuple[str, float, object]], dict[str, tuple]]:
    """Measurements recorded in ``directory``.

    Args:
        directory: the student directory.

    Returns:
        ``(perplexities, tasks)``: ``[(record name, ppl, tokens or None)]`` from JSON records with a numeric
        ``ppl``, and ``{task: (metric, value, stderr or None, n or None)}`` from records with ``tasks`` (``lit-dof
        eval --output``) and from ``eval/<task>.json``; unreadable or unrecognised records are skipped.
    """
    directory = Path(directory)
    perplexities, tasks = [], {}
    records = [(p.stem, _read_json(p)) for p in sorted(directory.glob("*.json")) if p.name not in _NOT_RESULTS]
    for name, record in records:
        if record is None:
            continue
        ppl = _number(record.get("ppl"))
        if ppl is not None:
            perplexities.append((name, ppl, record.get("tokens")))
        if isinstance(record.get("tasks"), dict):
            for task, entry in record["tasks"].items():
                _add_task(tasks, str(task), entry)
    for path in sorted(directory.glob("eval/*.json")):
        _add_task(tasks, path.stem, _read_json(path))
    return perplexities, tasks


def _add_task(tasks: dict, task: str, entry) -> None:
    if not isinstance(entry, dict):
        return
    metric = next((m for m in RESULT_METRICS if _number(entry.get(m)) is not None), None)
    if metric is not None:
        tasks[task] = (metric, float(entry[metric]), _number(entry.get(f"{metric}_stderr")), entry.get("n"))


def model_card(
    config: dict,
    *,
    dof: dict | None = None,
    strategy: str | None = None,
    results: tuple[list, dict] = ([], {}),
    model_id: str = "path/to/student",
) -> ModelCard:
    """The model card of a student.

    Args:
        config: the student's ``config.json`` (a :class:`~lit_dof.students.LitDofConfig` as a dict).
        dof: its DoF report (``dof.json``; keys are read tolerantly), if known.
        strategy: the allocation strategy (``dof``, ``dof_clip``, ``fix``, ``dof_head``), if known; else read
            from ``dof`` or inferred from which of its ``allocations`` equals the student's dims.
        results: :func:`find_results` of the directory.
        model_id: what the card's loading snippet passes to ``from_pretrained`` (the Hub repo id when pushed).

    Returns:
        A ``huggingface_hub.ModelCard`` whose metadata has ``library_name: transformers``, the tags
        :data:`TAGS`, ``base_model`` (the teacher source) and ``pipeline_tag: text-generation``.
    """
    teacher = config.get("teacher") or None
    data = ModelCardData(
        library_name="transformers", tags=list(TAGS), base_model=teacher, pipeline_tag="text-generation"
    )
    dims = list(config.get("feature_dims") or [])
    lines = [f"# {model_id.rstrip('/').rpartition('/')[2]}", ""]
    source = f"`{teacher}`" if teacher else "a pretrained causal Transformer"
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
    lines += _results_lines(*results)
    lines += [
        "## How to load",
        "",
        "```python",
        'import lit_dof  # registers the "lit_dof" model type',
        "from transformers import AutoModelForCausalLM",
        "",
        f'model = AutoModelForCausalLM.from_pretrained("{model_id}")',
        "```",
        "",
    ]
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
        if options.far_term and options.far_decay is not None:
            far += f" decaying over {options.far_decay:g} tokens past the window"
        if options.far_term and not options.far_rope:
            far += " on un-rotated queries and keys (position-free)"
        lines.append(
            f"- Attention: sliding window of {options.window} tokens + {options.sink_tokens} sink tokens, {far}"
        )
    else:
        lines.append("- Attention: linear (window 0, sink tokens 0)")
    lines.append(f"- Softmax layers: {', '.join(map(str, softmax)) if softmax else 'none'}")
    if dims:
        lines += ["", "| layer | M |", "|---|---|"]
        lines += [f"| {i}{' (softmax)' if i in softmax else ''} | {m} |" for i, m in enumerate(dims)]
        total = sum(layer_mean_dims(dims))
        lines += [
            "",
            (
                f"Total ΣM = {total:g} over {len(dims)} layers (softmax layers' twins included; a layer with "
                "one M per KV head counts their mean)."
            ),
        ]
    return lines


def _dof_lines(dims: list, dof: dict | None, strategy: str | None) -> list[str]:
    dof = dof or {}
    allocations = dof.get("allocations") if isinstance(dof.get("allocations"), dict) else {}
    recorded = _first(dof, STRATEGY_KEYS)
    if isinstance(recorded, dict):  # e.g. a saved allocator section: {"strategy": "dof", ...}
        recorded = _first(recorded, STRATEGY_KEYS)
    strategy = strategy or (recorded if isinstance(recorded, str) else None)
    if strategy is None:
        matching = [name for name, alloc in allocations.items() if alloc == dims]
        strategy = " = ".join(matching) or None
    lam = _first(dof, LAM_KEYS)
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


def write_model_card(
    directory: str | os.PathLike, *, dof: dict | None = None, strategy: str | None = None, model_id: str | None = None
) -> Path:
    """Write (or rewrite) ``README.md`` of a saved student, atomically.

    Args:
        directory: a student directory (``config.json`` with ``model_type: lit_dof``).
        dof: the DoF report to describe (default: :func:`find_dof_report`).
        strategy: the allocation strategy, if known (see :func:`model_card`).
        model_id: what the loading snippet loads (default ``path/to/<directory name>``).

    Returns:
        The card's path.

    Raises:
        FileNotFoundError: no ``config.json`` in ``directory``.
    """
    directory = Path(directory)
    config = _read_json(directory / "config.json")
    if config is None:
        raise FileNotFoundError(f"{directory / 'config.json'} is missing or unreadable: write the student first")
    if dof is None:
        dof = find_dof_report(directory, list(config.get("feature_dims") or []))
    card = model_card(
        config,
        dof=dof,
        strategy=strategy,
        results=find_results(directory),
        model_id=model_id or f"path/to/{directory.name}",
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

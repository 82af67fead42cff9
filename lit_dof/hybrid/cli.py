"""``lit-dof hybrid``: Distill-then-Replace's search over a bank of linear twins, end to end and resumable.

    lit-dof fit --config configs/quickstart.yaml --config configs/hybrid/twins.yaml     # 1. the twin bank
    lit-dof hybrid --bank runs/hybrid/twins/version_0/student --task arc_easy \\
        --data_dir ../shared/data --out runs/hybrid/search                               # 2. search + report

Step 2, in order (each result is written to ``<out>/search.json`` atomically as soon as it exists, so a
killed run resumes where it stopped and a finished one only rewrites the report):

1. **Items.** Search items (``search_items`` of the task's validation split: ARC Dev, LogiQA Eval, MMLU val;
   other tasks a seeded half of their evaluation set) and disjoint held-out items (``heldout_items`` of the
   test split, or the other half). With ``metric: perplexity`` the items are token blocks of held-out
   documents of ``corpus`` instead.
2. **Layer statistics.** The local loss of every twin on the search items
   (:func:`~lit_dof.hybrid.local.local_losses`) and each layer's DoF (the bank's ``dof.json``; else its
   feature dims, which the DoF allocation made proportional to the DoF).
3. **Greedy search** (:func:`~lit_dof.hybrid.search.greedy_replacement`) on the search items, prefix-cached,
   with an optional shortlist (``shortlist_k`` lowest local loss or DoF), a tolerance and ``max_linear``;
   each round goes to ``search.json`` and TensorBoard (``<out>/tensorboard``: score, linear fraction, layer
   chosen, evaluations per round).
4. **Export** the best-scoring and the most-linear hybrid as students (``<out>/best``, ``<out>/most_linear``).
5. **Held-out comparison**: the teacher, both exported hybrids, and the five orderings — greedy (its rounds'
   prefixes), DoF-guided, local-loss-guided, uniform, random — at equal numbers of linear layers
   (``counts``), scored on the held-out items.
6. **Verification** (``verify_items``): the teacher and the exported hybrids once more on a larger held-out
   set (e.g. the whole test split); then ``report_dir``/hybrid.{md,json,png} (:mod:`lit_dof.hybrid.report`).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

from lit_dof.evaluation import task_data
from lit_dof.io import atomic_write_json, library_versions

ORDERINGS = ("greedy", "dof", "loss", "uniform", "random")
_VALIDATION_SPLITS = {
    "arc_easy": lambda d: (task_data.arc(d, "Easy", "Dev"), task_data.arc(d, "Easy", "Test")),
    "arc_challenge": lambda d: (task_data.arc(d, "Challenge", "Dev"), task_data.arc(d, "Challenge", "Test")),
    "logiqa": lambda d: (task_data.logiqa(d, "Eval"), task_data.logiqa(d, "Test")),
    "mmlu": lambda d: (task_data.mmlu(d, "val"), task_data.mmlu(d, "test")),
}


def task_items(
    task: str, data_dir: str | os.PathLike, search_items: int, heldout_items: int, seed: int = 0, confirm_items: int = 0
) -> tuple[list[dict], list[dict], list[dict], str]:
    """Disjoint search, confirmation and held-out items of ``task``, and a sentence saying where they come from.

    Tasks with a validation split search on it and hold out items of the test split; the others split a
    seeded permutation of their evaluation set. Search and held-out items are seeded samples of the requested
    sizes (all when smaller); confirmation items are a seeded sample of the validation items the search
    does not use.

    Returns:
        ``(search, confirm, heldout, where)``.

    Raises:
        ValueError: an unknown task, or sizes < 1 (confirmation: < 0). FileNotFoundError: missing data files.
    """
    if task not in task_data.TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(task_data.TASKS)}")
    if search_items < 1 or heldout_items < 1 or confirm_items < 0:
        raise ValueError(f"search_items and heldout_items must be >= 1 and confirm_items >= 0, got "
                         f"{search_items}, {heldout_items}, {confirm_items}")  # fmt: skip
    rng = random.Random(seed)
    if task in _VALIDATION_SPLITS:
        validation, test = _VALIDATION_SPLITS[task](data_dir)
        where = f"search: {task} validation split ({len(validation)}); held out: its test split ({len(test)})"
    else:
        docs = task_data.load_task(task, data_dir)
        order = list(range(len(docs)))
        rng.shuffle(order)
        half = len(docs) // 2
        validation, test = [docs[i] for i in order[:half]], [docs[i] for i in order[half:]]
        where = f"search and held-out items: the two halves of a seeded permutation of {task} ({len(docs)})"

    def sample(pool: list[int], n: int) -> list[int]:
        return pool if n >= len(pool) else sorted(rng.sample(pool, n))

    search = sample(list(range(len(validation))), search_items)
    heldout = sample(list(range(len(test))), heldout_items)
    confirm = sample(sorted(set(range(len(validation))) - set(search)), confirm_items) if confirm_items else []
    if confirm_items and len(confirm) < confirm_items:
        where += f"; only {len(confirm)} validation items are left for confirmation"
    return [validation[i] for i in search], [validation[i] for i in confirm], [test[i] for i in heldout], where


def text_blocks(
    corpus: str | os.PathLike, tokenizer, block: int, search_items: int, heldout_items: int, confirm_items: int = 0
) -> tuple[list[dict], list[dict], list[dict], str]:
    """Non-overlapping ``(1, block)`` token blocks of ``corpus``'s held-out documents: the first
    ``search_items`` for the search, the next ``heldout_items`` held out, then ``confirm_items`` for
    confirmation. Returns ``(search, confirm, heldout, where)``."""
    from lit_dof.evaluation.perplexity import heldout_documents, text_tokens

    total = search_items + heldout_items + confirm_items
    tokens = text_tokens(heldout_documents(corpus), tokenizer, max_tokens=block * total)
    blocks = [{"input_ids": tokens[None, i : i + block]} for i in range(0, tokens.numel() - block + 1, block)]
    if len(blocks) < total:
        raise ValueError(f"{corpus} gives only {len(blocks)} blocks of {block} tokens; ask for fewer items")
    where = f"blocks of {block} tokens from held-out documents of {Path(corpus).name}"
    h = search_items + heldout_items
    return blocks[:search_items], blocks[h:total], blocks[search_items:h], where


def layer_dof(bank: Path, feature_dims: list[int]) -> tuple[dict[int, float], str]:
    """Per-layer DoF from the bank's ``dof.json`` (next to it or one folder up), else its feature dims."""
    for candidate in (bank / "dof.json", bank.parent / "dof.json"):
        if candidate.is_file():
            report = json.loads(candidate.read_text())
            return {i: float(n) for i, n in enumerate(report["layer_dof"])}, candidate.name
    return {i: float(m) for i, m in enumerate(feature_dims)}, "feature dims (no dof.json)"


def bank_recipe(bank: Path) -> str | None:
    """How the bank was trained, from the ``config.yaml`` that ``lit-dof fit`` saved one folder up (``None``
    when absent): loss, layer-wise steps and the end-to-end tail, e.g.
    ``"softmax loss, 400 steps, no end-to-end tail"``."""
    import yaml

    config = bank.parent / "config.yaml"
    if not config.is_file():
        return None
    saved = yaml.safe_load(config.read_text()) or {}
    model = (saved.get("model") or {}).get("init_args") or {}
    steps = (saved.get("trainer") or {}).get("max_steps")
    tail = float(model.get("finetune_fraction") or 0.0)
    parts = [f"{model.get('loss', 'softmax')} loss"]
    if isinstance(steps, int) and steps > 0:
        parts.append(f"{steps} steps")
    parts.append(f"end-to-end tail {tail:.0%} of the steps" if tail else "no end-to-end tail")
    return ", ".join(parts)


def default_counts(most_linear: int, num_layers: int) -> list[int]:
    """Four evenly spaced counts of linear layers up to the greedy search's most-linear hybrid (at least 4)."""
    top = max(most_linear, min(4, num_layers))
    return sorted({max(1, round(top * j / 4)) for j in range(1, 5)})


def hybrid_key(linear) -> str:
    """The key of a hybrid in ``search.json``: its sorted linear layers, comma-separated (``"teacher"``: none)."""
    return ",".join(str(i) for i in sorted(linear)) or "teacher"


class _State:
    """``search.json``: settings, then every measured number, written atomically on each change."""

    def __init__(self, path: Path, settings: dict) -> None:
        self.path = path
        if path.is_file():
            self.data = json.loads(path.read_text())
            if self.data.get("settings") != settings:
                changed = sorted(k for k in settings if self.data.get("settings", {}).get(k) != settings[k])
                raise ValueError(f"{path} was written with other settings ({', '.join(changed)}): "
                                 "pass a new --out or delete it")  # fmt: skip
        else:
            self.data = {"settings": settings, "rounds": [], "heldout": {}, "timing": {}}

    def save(self) -> None:
        atomic_write_json(self.path, self.data)

    def timed(self, key: str, seconds: float) -> None:
        self.data["timing"][key] = self.data["timing"].get(key, 0.0) + seconds

    def scores_on(self, name: str, items: int) -> dict:
        """``data[name]`` (``{"items": items, "scores": {...}}`` plus what the caller adds), emptied first when
        it was measured on another number of items: those scores do not apply."""
        entry = self.data.setdefault(name, {})
        if entry.get("items") != items:
            entry.clear()
            entry.update(items=items, scores={})
        return entry

    def memoised(self, store: dict, scorer):
        """``score(linear layers)`` that looks in ``store`` first (keyed by :func:`hybrid_key`) and otherwise
        scores, records ``{"score", "seconds"}`` and saves the state."""

        def score(linear) -> float:
            key = hybrid_key(linear)
            if key not in store:
                start = time.perf_counter()
                value = scorer(frozenset(linear))
                store[key] = {"score": value, "seconds": time.perf_counter() - start}
                self.save()
            return store[key]["score"]

        return score


def search(
    bank: str = "runs/hybrid/twins/version_0/student",
    task: str = "arc_easy",
    data_dir: str | None = None,
    metric: str = "accuracy",
    corpus: str | None = None,
    block: int = 512,
    search_items: int = 240,
    heldout_items: int = 480,
    tolerance: float = 0.03,
    relative: bool = False,
    shortlist: str | None = "loss",
    shortlist_k: int = 4,
    max_linear: int | None = None,
    confirm_items: int = 0,
    verify_items: int = 0,
    counts: list[int] | None = None,
    orderings: list[str] = list(ORDERINGS),
    prefix_cache: bool = True,
    batch_size: int = 8,
    seed: int = 0,
    out: str = "runs/hybrid/search",
    report_dir: str | None = None,
    command: str | None = None,
) -> dict:
    """Search a hybrid within ``tolerance`` of the teacher, export it, compare orderings on held-out items.

    Args:
        bank: a student directory whose every layer has a linear twin (``lit-dof fit`` with
            ``configs/hybrid/twins.yaml``).
        task: the target task (:data:`~lit_dof.evaluation.task_data.TASKS`), for the accuracy metrics.
        data_dir: folder laid out like ../shared/data (default ``$LIT_DOF_DATA``).
        metric: ``accuracy`` (lm-eval's acc), ``acc_norm`` or ``perplexity`` (on ``corpus``).
        corpus: text corpus for ``perplexity`` (its held-out documents; WikiExtractor or plain text).
        block: tokens per perplexity block.
        search_items, heldout_items: items (or blocks) scored per search evaluation / per held-out evaluation.
        tolerance, relative: the acceptance rule (:class:`~lit_dof.hybrid.search.Tolerance`): a hybrid passes
            within ``tolerance`` of the teacher's score (score units, or a fraction of it with ``relative``).
        shortlist: rank the remaining layers by ``loss`` (local loss) or ``dof`` and score only the
            ``shortlist_k`` lowest each round; ``None``: every remaining layer.
        max_linear: stop the greedy search after this many swaps.
        confirm_items: validation items the search does not use (0: off). The search's trajectory is re-scored
            on them from its most linear hybrid down, and the exported ``most_linear`` is the most linear
            one that passes there too: each round keeps the best of several noisy scores, so the search's
            own scores are optimistic (the winner's curse), and this is the check against it.
        verify_items: after everything else, score the teacher and the exported hybrids on this many test
            items (the whole test split when larger; 0: off) without the prefix cache — one precise final
            check of the exports, where ``heldout_items`` is sized for the many scores of the orderings'
            curves. With ``perplexity``: that many further blocks after all others.
        counts: numbers of linear layers for the held-out comparison (default: four up to the search's
            most-linear hybrid).
        orderings: which of greedy, dof, loss, uniform, random to compare.
        prefix_cache: reuse the teacher's hidden states before the first linear layer.
        batch_size: items per forward.
        seed: item sampling and the random ordering.
        out: run directory (``search.json``, ``tensorboard/``, ``best/``, ``most_linear/``).
        report_dir: also write ``hybrid.md``/``.json``/``.png`` there (default: ``out``).
        command: the command line recorded in the report (``lit-dof hybrid`` fills it in).

    Returns:
        the contents of ``search.json``.

    Raises:
        ValueError: bad settings (unknown metric/ordering/shortlist, a bank without twins), or an ``out``
            written with other settings. FileNotFoundError: missing bank or data.
    """
    from lightning.pytorch.loggers import TensorBoardLogger

    from lit_dof.hybrid import report as hybrid_report
    from lit_dof.hybrid.local import local_losses
    from lit_dof.hybrid.scoring import METRICS, HybridScorer, choice_batches
    from lit_dof.hybrid.search import Tolerance, dof_order, greedy_replacement, loss_order, random_order, uniform_order
    from lit_dof.students import load_student
    from lit_dof.teacher.loading import load_tokenizer

    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if shortlist not in (None, "loss", "dof"):
        raise ValueError(f"shortlist must be 'loss', 'dof' or null, got {shortlist!r}")
    unknown = sorted(set(orderings) - set(ORDERINGS))
    if unknown:
        raise ValueError(f"unknown orderings {unknown}; choose from {', '.join(ORDERINGS)}")
    bank_path = Path(bank)
    if not (bank_path / "config.json").is_file():
        raise FileNotFoundError(f"no student at {bank}: run `lit-dof fit --config configs/quickstart.yaml "
                                "--config configs/hybrid/twins.yaml` and pass its version_*/student")  # fmt: skip
    out_path = Path(out)
    out_path.mkdir(parents=True, exist_ok=True)
    settings = {"bank": str(bank), "task": task if metric != "perplexity" else None, "metric": metric,
                "corpus": str(corpus) if metric == "perplexity" else None, "search_items": search_items,
                "heldout_items": heldout_items, "tolerance": tolerance, "relative": relative, "shortlist": shortlist,
                "shortlist_k": shortlist_k, "max_linear": max_linear, "prefix_cache": prefix_cache, "seed": seed}  # fmt: skip
    state = _State(out_path / "search.json", settings)
    data = state.data

    student = load_student(bank).eval().requires_grad_(False)
    tokenizer = load_tokenizer(bank)
    candidates = sorted(student.linear_modules())
    if not candidates:
        raise ValueError(f"{bank} has no linear twins to swap in")
    num_layers = len(student.linear_layers)
    if metric == "perplexity":
        if corpus is None:
            raise ValueError("metric 'perplexity' needs --corpus (a text file)")
        search_batches, confirm_batches, heldout_batches, where = text_blocks(corpus, tokenizer, block, search_items,
                                                                              heldout_items, confirm_items)
        n_confirm = len(confirm_batches)
    else:
        data_dir = data_dir or os.environ.get("LIT_DOF_DATA")
        if data_dir is None:
            raise ValueError("no data directory: pass --data_dir (laid out like ../shared/data) or set LIT_DOF_DATA")
        search_docs, confirm_docs, heldout_docs, where = task_items(task, data_dir, search_items, heldout_items, seed,
                                                                    confirm_items)
        search_batches = choice_batches(search_docs, tokenizer, batch_size)
        confirm_batches = choice_batches(confirm_docs, tokenizer, batch_size) if confirm_docs else []
        n_confirm = len(confirm_docs)
        heldout_batches = choice_batches(heldout_docs, tokenizer, batch_size)
    data["items"] = where
    data["bank_recipe"] = bank_recipe(bank_path)
    rule = Tolerance(tolerance, relative, higher_is_better=metric != "perplexity")

    # 2. layer statistics
    if "local_loss" not in data:
        start = time.perf_counter()
        data["local_loss"] = {str(i): v for i, v in local_losses(student, search_batches).items()}
        state.timed("local_loss", time.perf_counter() - start)
        state.save()
    loss = {int(i): v for i, v in data["local_loss"].items()}
    dof, dof_source = layer_dof(bank_path, student.feature_dims)
    dof = {i: dof[i] for i in candidates}
    data["layer_dof"], data["dof_source"] = {str(i): v for i, v in dof.items()}, dof_source

    # 3. greedy search, round by round
    scorer = HybridScorer(student, search_batches, metric, prefix_cache=prefix_cache)
    logger = TensorBoardLogger(str(out_path), name="tensorboard", version=0, default_hp_metric=False)
    if "teacher_search_score" not in data:
        start = time.perf_counter()
        data["teacher_search_score"] = scorer(frozenset())
        state.timed("search", time.perf_counter() - start)
        data["search_evaluations"] = 1
        state.save()
    rank = {"loss": loss, "dof": dof}.get(shortlist or "")

    def pick(current: frozenset, remaining: list[int]) -> list[int]:
        return sorted(remaining, key=lambda i: (rank[i], i))[:shortlist_k]

    round_started = [time.perf_counter()]

    def on_round(round_) -> None:
        seconds = time.perf_counter() - round_started[0]
        entry = {**round_.__dict__, "seconds": seconds}
        data["rounds"].append(entry)
        data["search_evaluations"] = data.get("search_evaluations", 0) + round_.evaluations
        state.timed("search", seconds)
        state.save()
        if round_.passed:
            logger.log_metrics({"search/score": round_.score, "search/linear_fraction": len(round_.linear) / num_layers,
                                "search/chosen_layer": round_.chosen, "search/evaluations": round_.evaluations},
                               step=len(round_.linear))  # fmt: skip
            logger.save()
        round_started[0] = time.perf_counter()

    saved_rounds = [{k: v for k, v in r.items() if k != "seconds"} for r in data["rounds"]]
    result = greedy_replacement(candidates, scorer, rule, shortlist=pick if rank else None, max_linear=max_linear,
                                teacher_score=data["teacher_search_score"], resume=saved_rounds, on_round=on_round)  # fmt: skip
    del scorer  # each scorer's prefix cache holds (L + 1) hidden states per item: keep one set alive at a time
    data["search"] = {k: v for k, v in result.to_json().items() if k != "rounds"}
    data["search"]["evaluations"] = data.get("search_evaluations", 0)
    data["search"]["seconds"] = data["timing"].get("search", 0.0)
    state.save()

    # 3b. confirmation on validation items the search did not see
    most_linear = sorted(result.most_linear)
    trajectory = [sorted(r["linear"]) for r in data["rounds"] if r["passed"]]
    if confirm_items:
        confirm = state.scores_on("confirm", n_confirm)
        confirm_scorer = HybridScorer(student, confirm_batches, metric, prefix_cache=prefix_cache)

        confirmed = state.memoised(confirm["scores"], confirm_scorer)
        teacher_confirm = confirmed(())
        confirm["threshold"] = rule.threshold(teacher_confirm)
        most_linear = []
        for linear in reversed(trajectory):  # most linear first; stop at the first that passes
            if rule.passes(confirmed(linear), teacher_confirm):
                most_linear = linear
                break
        confirm["most_linear"] = most_linear
        data["timing"]["confirm"] = sum(v["seconds"] for v in confirm["scores"].values())
        state.save()
        del confirm_scorer, confirmed

    # 4. export
    hybrids = {"best": sorted(result.best), "most_linear": most_linear}
    for name, linear in hybrids.items():
        target = out_path / name
        if (target / "config.json").is_file() and json.loads((target / "config.json").read_text()).get("softmax_layers") == [i for i in range(num_layers) if i not in linear]:
            continue
        student.set_softmax_layers([i for i in range(num_layers) if i not in linear])
        student.save_pretrained(target)
        tokenizer.save_pretrained(target)
    data["exported"] = {name: {"path": str(out_path / name), "linear": linear} for name, linear in hybrids.items()}
    state.save()

    # 5. held-out comparison at equal numbers of linear layers
    greedy_sequence = [r["chosen"] for r in data["rounds"] if r["passed"]]
    orders = {"greedy": greedy_sequence, "dof": dof_order(dof), "loss": loss_order(loss),
              "uniform": uniform_order(candidates), "random": random_order(candidates, seed)}  # fmt: skip
    data["orders"] = {name: orders[name] for name in orderings}
    counts = counts or default_counts(len(greedy_sequence), len(candidates))
    data["counts"] = counts
    heldout_scorer = HybridScorer(student, heldout_batches, metric, prefix_cache=prefix_cache)
    memo = data["heldout"]

    heldout = state.memoised(memo, heldout_scorer)
    teacher_heldout = heldout(())
    for linear in [*hybrids.values(), sorted(result.most_linear)]:  # also the search's own most-linear hybrid
        heldout(linear)
    curves: dict[str, dict[str, float]] = {}
    for name in orderings:
        order = orders[name]
        curves[name] = {str(k): heldout(order[:k]) for k in counts if k <= len(order)}
    data["curves"] = curves
    data["heldout_threshold"] = rule.threshold(teacher_heldout)
    data["teacher_heldout"] = teacher_heldout
    del heldout_scorer, heldout

    # 6. a final, precise check of the exported hybrids on more held-out items
    if verify_items:
        if metric == "perplexity":
            first = search_items + heldout_items + n_confirm  # after every block used so far
            verify_batches = text_blocks(corpus, tokenizer, block, first, verify_items)[2]
            count = len(verify_batches)
        else:
            verify_docs = task_items(task, data_dir, search_items, verify_items, seed)[2]
            verify_batches, count = choice_batches(verify_docs, tokenizer, batch_size), len(verify_docs)
        verify = state.scores_on("verify", count)
        # no prefix cache: it would hold (L + 1) hidden states of every item, and exports mostly start at layer 0
        verified = state.memoised(verify["scores"], HybridScorer(student, verify_batches, metric, prefix_cache=False))
        verify["threshold"] = rule.threshold(verified(()))
        for linear in hybrids.values():
            verified(linear)
        data["timing"]["verify"] = sum(v["seconds"] for v in verify["scores"].values())
        state.save()
    data["num_layers"] = num_layers
    data["versions"] = library_versions()
    state.save()
    if command:
        data["command"] = command
    state.save()
    hybrid_report.write(data, Path(report_dir) if report_dir else out_path, data.get("command"))
    return data


def main(args: list[str] | None = None) -> None:
    """``lit-dof hybrid``: :func:`search` from the command line (jsonargparse; ``--config`` works). The
    command line is recorded in the report, without this machine's paths."""
    import sys

    from jsonargparse import auto_cli

    from lit_dof.io import portable

    args = sys.argv[2:] if args is None else list(args)
    auto_cli(search, args=[*args, "--command", portable(["lit-dof", "hybrid", *args])], prog="lit-dof hybrid")

"""Distill-then-Replace's search over a bank of linear twins, end to end and resumable: :class:`HybridSearch`
holds the settings (:class:`~lit_dof.hybrid.settings.SearchSettings`, ``lit-dof hybrid``'s options) and runs the
stages in order. Each result is written to
``<out>/search.json`` (:class:`~lit_dof.hybrid.state.SearchState`) as soon as it exists, so a killed run
resumes where it stopped and a finished one only rewrites the report.

1. **Items** (:meth:`HybridSearch.open`). Search items (``search_items`` of the task's validation split: ARC
   Dev, LogiQA Eval, MMLU val; other tasks a seeded half of their evaluation set) and disjoint held-out items
   (``heldout_items`` of the test split, or the other half); :mod:`lit_dof.hybrid.items`. With
   ``metric: perplexity`` the items are token blocks of held-out documents of ``corpus`` instead.
2. **Layer statistics** (:meth:`~HybridSearch.layer_statistics`). The local loss of every twin on the search
   items (:func:`~lit_dof.hybrid.local.local_losses`) and each layer's DoF (the bank's ``dof.json``; else its
   feature dims, which the DoF allocation made proportional to the DoF).
3. **Greedy search** (:meth:`~HybridSearch.greedy`, :func:`~lit_dof.hybrid.search.greedy_replacement`) on the
   search items, prefix-cached, with an optional shortlist (``shortlist_k`` lowest local loss or DoF), a
   tolerance and ``max_linear``; each round goes to ``search.json`` and TensorBoard (``<out>/tensorboard``:
   score, linear fraction, layer chosen, evaluations per round). Optionally the trajectory is
   **confirmed** on validation items the search did not use (:meth:`~HybridSearch.confirm`).
4. **Export** (:meth:`~HybridSearch.export`) the best-scoring and the most-linear hybrid as students
   (``<out>/best``, ``<out>/most_linear``).
5. **Held-out comparison** (:meth:`~HybridSearch.compare`): the teacher, both exported hybrids, and the five
   orderings — greedy (its rounds' prefixes), DoF-guided, local-loss-guided, uniform, random — at equal
   numbers of linear layers (``counts``), scored on the held-out items.
6. **Verification** (:meth:`~HybridSearch.verify`, ``verify_items``): the teacher and the exported hybrids
   once more on a larger held-out set (e.g. the whole test split); then ``report_dir``/hybrid.{md,json,png}
   (:mod:`lit_dof.hybrid.report`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lit_dof.devices import device_label
from lit_dof.hybrid import report
from lit_dof.hybrid.bank import bank_recipe, check_bank, layer_dof
from lit_dof.hybrid.items import Items, task_items, text_blocks
from lit_dof.hybrid.local import local_losses
from lit_dof.hybrid.orderings import all_orders, default_counts
from lit_dof.hybrid.recall_items import recall_blocks
from lit_dof.hybrid.record import Exported, Exports, SearchRecord, SearchSummary
from lit_dof.hybrid.scoring import HybridScorer, choice_batches
from lit_dof.hybrid.search import SearchResult, Tolerance, greedy_replacement
from lit_dof.hybrid.settings import SearchSettings
from lit_dof.hybrid.state import SEARCH_FILE, SearchState
from lit_dof.hybrid.workspace import RoundLog, Workspace
from lit_dof.io import library_versions
from lit_dof.progress import Progress
from lit_dof.students import load_student
from lit_dof.students.config import LitDofConfig
from lit_dof.teacher.loading import load_tokenizer


def _on(batches: list[dict], device: torch.device) -> list[dict]:
    """``batches`` with every tensor moved to ``device`` (the scorers index logits with them)."""
    return [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in batches]


def _lowest(rank: dict[int, float], k: int, current: frozenset, remaining: list[int]) -> list[int]:
    """The shortlist of a round: the ``k`` remaining layers of lowest ``rank`` (ties by index)."""
    return sorted(remaining, key=lambda i: (rank[i], i))[:k]


@dataclass
class HybridSearch(SearchSettings):
    """A hybrid search: its settings and its stages.

    The settings are :class:`~lit_dof.hybrid.settings.SearchSettings`' fields; :meth:`run` runs the stages in
    order.

    Raises:
        ValueError: an unknown metric, shortlist or ordering.
        DeviceError: an unknown device or dtype, or CUDA where there is none.
    """

    def scorer(self, ws: Workspace, batches: list[dict], prefix_cache: bool | None = None) -> HybridScorer:
        """A scorer of hybrids of the bank on ``batches`` (``prefix_cache`` defaults to the setting)."""
        cache = self.prefix_cache if prefix_cache is None else prefix_cache
        return HybridScorer(ws.student, batches, self.metric, prefix_cache=cache)

    def load_items(self, tokenizer) -> Items:
        """Stage 1: the search, confirmation and held-out items, batched.

        Raises:
            ValueError: ``perplexity`` without ``corpus``, or no data directory. FileNotFoundError: missing data.
        """
        if self.perplexity:
            if self.corpus is None:
                raise ValueError(f"metric {self.metric!r} needs --corpus (a text file)")
            blocks = recall_blocks if self.metric == "recall" else text_blocks
            search, confirm, heldout, where = blocks(
                self.corpus, tokenizer, self.block, self.search_items, self.heldout_items, self.confirm_items
            )
            on = functools.partial(_on, device=self.torch_device)
            return Items(on(search), on(confirm), on(heldout), len(confirm), where)
        search, confirm, heldout, where = task_items(
            self.task, self.task_data_dir(), self.search_items, self.heldout_items, self.seed, self.confirm_items
        )

        def batch(docs):
            return _on(choice_batches(docs, tokenizer, self.batch_size), self.torch_device)

        return Items(batch(search), batch(confirm) if confirm else [], batch(heldout), len(confirm), where)

    def open(self) -> Workspace:
        """Check the bank, open (or resume) ``<out>/search.json``, load the bank and the items.

        Raises:
            FileNotFoundError: no student at ``bank``. ValueError: ``out`` written with other settings, a bank
            without twins, or items that cannot be had (:meth:`load_items`).
        """
        check_bank(self.bank)
        out = Path(self.out)
        out.mkdir(parents=True, exist_ok=True)
        state = SearchState(out / SEARCH_FILE, self.settings)
        dtype = {} if self.torch_dtype is None else {"dtype": self.torch_dtype}
        student = load_student(self.bank, **dtype).to(self.torch_device).eval().requires_grad_(False)
        tokenizer = load_tokenizer(self.bank)
        candidates = sorted(student.linear_modules())
        if not candidates:
            raise ValueError(f"{self.bank} has no linear twins to swap in")
        items = self.load_items(tokenizer)
        state.record.items, state.record.bank_recipe = items.where, bank_recipe(Path(self.bank))
        state.record.teacher = student.config.teacher
        rule = Tolerance.for_metric(self.metric, self.tolerance, self.relative)
        return Workspace(out, state, student, tokenizer, candidates, items, rule)

    def layer_statistics(self, ws: Workspace) -> tuple[dict[int, float], dict[int, float]]:
        """Stage 2: every twin's local loss on the search items (measured once) and each candidate's DoF.

        Returns:
            ``(local loss, DoF)``, each keyed by layer index.
        """
        record = ws.state.record
        if record.local_loss is None:
            start = time.perf_counter()
            record.local_loss = local_losses(ws.student, ws.items.search)
            record.timing.local_loss += time.perf_counter() - start
            ws.state.save()
        dof, record.dof_source = layer_dof(Path(self.bank), ws.student.feature_dims)
        record.layer_dof = {i: dof[i] for i in ws.candidates}
        return dict(record.local_loss), dict(record.layer_dof)

    def greedy(self, ws: Workspace, loss: dict[int, float], dof: dict[int, float]) -> SearchResult:
        """Stage 3: the greedy search on the search items, round by round, resuming the recorded rounds."""
        record = ws.state.record
        scorer = self.scorer(ws, ws.items.search)
        logger = TensorBoardLogger(str(ws.out), name="tensorboard", version=0, default_hp_metric=False)
        if record.teacher_search_score is None:
            start = time.perf_counter()
            record.teacher_search_score = scorer(frozenset())
            record.timing.search += time.perf_counter() - start
            record.search_evaluations = 1
            ws.state.save()
        rank = {"loss": loss, "dof": dof}.get(self.shortlist) if self.shortlist else None
        shortlist = functools.partial(_lowest, rank, self.shortlist_k) if rank else None
        saved = list(record.rounds)
        rounds = Progress("hybrid", min(self.max_linear or len(ws.candidates), len(ws.candidates)), "round")
        rounds.done = len(saved)  # recorded by an earlier run: replayed, not scored
        result = greedy_replacement(
            ws.candidates,
            scorer,
            ws.rule,
            shortlist=shortlist,
            max_linear=self.max_linear,
            teacher_score=record.teacher_search_score,
            resume=saved,
            on_round=RoundLog(ws.state, logger, ws.num_layers, rounds),
        )
        record.search = SearchSummary(
            teacher_score=result.teacher_score,
            threshold=result.threshold,
            best=sorted(result.best),
            best_score=result.best_score,
            most_linear=sorted(result.most_linear),
            most_linear_score=result.most_linear_score,
            evaluations=record.search_evaluations,
            seconds=record.timing.search,
        )
        ws.state.save()
        return result  # the scorer and its prefix cache go with this frame: one cache alive at a time

    def confirm(self, ws: Workspace, result: SearchResult) -> list[int]:
        """Stage 3b: re-score the search's trajectory on the confirmation items, most linear first.

        Returns:
            the most linear hybrid that passes there too (the search's own without ``confirm_items``).
        """
        most_linear = sorted(result.most_linear)
        if not self.confirm_items:
            return most_linear
        trajectory = [sorted(r.linear) for r in ws.state.record.rounds if r.passed]
        confirm = ws.state.scores_on("confirm", ws.items.confirm_count)
        confirmed = ws.state.memoised(confirm.scores, self.scorer(ws, ws.items.confirm))
        teacher_confirm = confirmed(())
        confirm.threshold = ws.rule.threshold(teacher_confirm)
        most_linear = []
        for linear in reversed(trajectory):  # most linear first; stop at the first that passes
            if ws.rule.passes(confirmed(linear), teacher_confirm):
                most_linear = linear
                break
        confirm.most_linear = most_linear
        ws.state.record.timing.confirm = sum(v.seconds for v in confirm.scores.values())
        ws.state.save()
        return most_linear

    def export(self, ws: Workspace, result: SearchResult, most_linear: list[int]) -> dict[str, list[int]]:
        """Stage 4: save the best-scoring and the most linear hybrid as students (unless already there).

        Returns:
            ``{"best": linear layers, "most_linear": linear layers}``.
        """
        hybrids = {"best": sorted(result.best), "most_linear": most_linear}
        for name, linear in hybrids.items():
            target = ws.out / name
            softmax = [i for i in range(ws.num_layers) if i not in linear]
            if (target / "config.json").is_file() and LitDofConfig.from_pretrained(target).softmax_layers == softmax:
                continue
            ws.student.set_softmax_layers(softmax)
            ws.student.save_pretrained(target)
            ws.tokenizer.save_pretrained(target)
        exported = {name: Exported(str(ws.out / name), linear) for name, linear in hybrids.items()}
        ws.state.record.exported = Exports(**exported)
        ws.state.save()
        return hybrids

    def compare(
        self,
        ws: Workspace,
        result: SearchResult,
        hybrids: dict[str, list[int]],
        loss: dict[int, float],
        dof: dict[int, float],
    ) -> None:
        """Stage 5: the teacher, the hybrids and each ordering's first ``k`` layers on the held-out items."""
        record = ws.state.record
        greedy_sequence = [r.chosen for r in record.rounds if r.passed]
        orders = all_orders(greedy_sequence, dof, loss, ws.candidates, self.seed)
        record.orders = {name: orders[name] for name in self.orderings}
        counts = self.counts or default_counts(len(greedy_sequence), len(ws.candidates))
        record.counts = list(counts)
        heldout = ws.state.memoised(record.heldout, self.scorer(ws, ws.items.heldout))
        teacher_heldout = heldout(())
        for linear in [*hybrids.values(), sorted(result.most_linear)]:  # also the search's own most-linear hybrid
            heldout(linear)
        curves: dict[str, dict[int, float]] = {}
        for name in self.orderings:
            order = orders[name]
            curves[name] = {k: heldout(order[:k]) for k in counts if k <= len(order)}
        record.curves = curves
        record.heldout_threshold = ws.rule.threshold(teacher_heldout)
        record.teacher_heldout = teacher_heldout

    def verify_batches(self, ws: Workspace) -> tuple[list[dict], int]:
        """The verification items, batched, and their number: ``verify_items`` test items, or that many
        blocks after every block used so far."""
        if self.perplexity:
            first = self.search_items + self.heldout_items + ws.items.confirm_count
            if self.metric == "recall":
                batches = recall_blocks(self.corpus, ws.tokenizer, self.block, 0, self.verify_items, skip=first)[2]
            else:
                batches = text_blocks(self.corpus, ws.tokenizer, self.block, first, self.verify_items)[2]
            return _on(batches, self.torch_device), len(batches)
        docs = task_items(self.task, self.task_data_dir(), self.search_items, self.verify_items, self.seed)[2]
        return _on(choice_batches(docs, ws.tokenizer, self.batch_size), self.torch_device), len(docs)

    def verify(self, ws: Workspace, hybrids: dict[str, list[int]]) -> None:
        """Stage 6: a final, precise check of the teacher and the exported hybrids on more held-out items."""
        batches, count = self.verify_batches(ws)
        verify = ws.state.scores_on("verify", count)
        # no prefix cache: it would hold (L + 1) hidden states of every item, and exports mostly start at layer 0
        verified = ws.state.memoised(verify.scores, self.scorer(ws, batches, prefix_cache=False))
        verify.threshold = ws.rule.threshold(verified(()))
        for linear in hybrids.values():
            verified(linear)
        ws.state.record.timing.verify = sum(v.seconds for v in verify.scores.values())
        ws.state.save()

    def finish(self, ws: Workspace) -> None:
        """Record the model size, versions and command; write the report (``report_dir``, else ``out``)."""
        record = ws.state.record
        record.num_layers = ws.num_layers
        record.versions = library_versions()
        record.device = device_label(self.torch_device)
        record.dtype = str(ws.student.dtype).removeprefix("torch.")
        record.command = self.command or record.command
        ws.state.save()
        report.write(record, Path(self.report_dir) if self.report_dir else ws.out)

    def run(self) -> SearchRecord:
        """Every stage in order (see the module's docstring).

        Returns:
            the record, as written to ``search.json``.
        """
        stages = Progress("hybrid", 6 + bool(self.verify_items), "stage")  # stderr: stage k/n, elapsed, ETA
        stages.begin("bank, items and teacher")
        ws = self.open()
        stages.begin("local losses and DoF of the candidate layers")
        loss, dof = self.layer_statistics(ws)
        stages.begin("greedy search")
        result = self.greedy(ws, loss, dof)
        stages.begin("confirmation")
        most_linear = self.confirm(ws, result)
        hybrids = self.export(ws, result, most_linear)
        stages.begin("orderings on the held-out items")
        self.compare(ws, result, hybrids, loss, dof)
        if self.verify_items:
            stages.begin("verification")
            self.verify(ws, hybrids)
        stages.begin("report")
        self.finish(ws)
        stages.end("search.json and the report written")
        return ws.state.record

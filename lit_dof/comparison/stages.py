"""The evaluation stages of a comparison cell — zero-shot tasks, retrieval, held-out, long-context and
long-document perplexity — each record written once and atomically, so a re-run skips what is finished. Mixed into
:class:`~lit_dof.comparison.cells.Comparison`, whose settings they read."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from lit_dof.comparison.rows import Row
from lit_dof.data.splits import check_record_split
from lit_dof.evaluation.loading import load_model
from lit_dof.evaluation.task_data import TASKS
from lit_dof.io import atomic_write_json, portable
from lit_dof.students.state_bytes import STATE_LAYOUT, state_growth


class EvaluationStages:
    """The stages that measure a cell's model (a teacher, an exported student, or a student's control)."""

    def load(self, row: Row, budget: int):
        """The cell's model and tokenizer on the comparison's device: the teacher, the student its fit exported,
        or — a control row (:func:`~lit_dof.comparison.rows.control_rows`) — that control of its student
        (:func:`~lit_dof.evaluation.controls.control_models`, the student's tokenizer).

        Args:
            row: the cell's row.
            budget: its feature budget C.

        Returns:
            ``(model, tokenizer)``.

        Raises:
            ValueError: a control the student does not have (a pure linear student has no window + sinks control;
                one without a tail no tail-only control).
        """
        if row.kind != "control":
            return load_model(self.model_source(row, budget), device=self.device)
        from lit_dof.evaluation.controls import control_models

        student, tokenizer = load_model(self.model_source(self.known_rows[row.of], budget), device=self.device)
        controls = control_models(student)
        if row.control not in controls:
            raise ValueError(f"{row.of}'s student has no {row.control} control (it has {', '.join(controls)})")
        return controls[row.control], tokenizer

    def evaluate(self, row: Row, budget: int, tasks: Sequence[str] = TASKS) -> dict:
        """Zero-shot results of the cell's model, one ``eval/<task>.json`` per task (finished tasks skipped; the
        answered requests of an unfinished one are kept in ``eval/cache``, so a killed task resumes), with the
        share of the task's examples longer than the model's exact positions (``beyond_exact``: the only ones a
        window + sinks student can score differently from its teacher; ``None`` for full attention).

        Args:
            row: the cell's row.
            budget: its feature budget C.
            tasks: the tasks to evaluate.

        Returns:
            ``{task: eval/<task>.json's content}``.
        """
        from lit_dof.evaluation.harness import evaluate_model
        from lit_dof.evaluation.retrieval import beyond_exact_share, exact_positions

        def measure(model, tokenizer, task: str, cache: Path) -> dict:
            result = evaluate_model(
                model,
                tokenizer,
                [task],
                data_dir=self.data_dir,
                limit=self.eval_limit,
                batch_size=self.eval_batch_size,
                mmlu_per_subject=self.mmlu_per_subject,
                cache_dir=cache,
            )
            entry = {**result["tasks"][task], "provenance": result["provenance"]}
            exact = entry["provenance"]["exact_positions"] = exact_positions(model)
            entry["beyond_exact"] = beyond_exact_share(entry.get("tokens") or [], exact)  # those it can get wrong
            return entry

        return self._per_task(row, budget, "eval", tasks, measure)

    def retrieval_stage(self, row: Row, budget: int) -> dict:
        """Retrieval of the cell's model by greedy generation (:attr:`retrieval_tasks` on the :attr:`retrieval`
        grid of contexts × needle depths), one ``retrieval/<task>.json`` per task (the score of every example, its
        needle position and generation, and the context × depth cells) and its heatmap ``retrieval/<task>.png``;
        finished tasks are skipped, the answered requests of an unfinished one kept in ``retrieval/cache``.

        Args:
            row: the cell's row.
            budget: its feature budget C.

        Returns:
            ``{task: retrieval/<task>.json's content}``.
        """
        from lit_dof.evaluation.harness import evaluate_model
        from lit_dof.evaluation.recall import TASK as RECALL
        from lit_dof.evaluation.retrieval import beyond_exact, exact_positions, heatmap

        def measure(model, tokenizer, task: str, cache: Path) -> dict:
            if task == RECALL:  # natural-text recall, teacher-forced (no generation, no request cache)
                entry = self._recall(model, tokenizer)
            else:
                result = evaluate_model(
                    model,
                    tokenizer,
                    [task],
                    batch_size=self.retrieval_batch_size,
                    retrieval=self.retrieval,
                    cache_dir=cache,
                )
                entry = {**result["tasks"][task], "provenance": result["provenance"]}
            entry["provenance"]["exact_positions"] = exact_positions(model)
            options = getattr(model.config, "window_options", None) or {}
            if options.get("window"):  # which needles lie beyond its window
                for example in entry["examples"]:
                    example["beyond_window"] = beyond_exact(example, options["window"], options.get("sink_tokens", 0))
            heatmap(entry["cells"], cache.parent / f"{task}.png", title=f"{task}: {row.name} (C={budget})")
            return entry

        records = self._per_task(row, budget, "retrieval", self.retrieval_tasks, measure)
        if RECALL in records:  # its documents are a split: a record of the other one is refused, not reused
            where = self.cell_dir(row, budget) / "retrieval" / f"{RECALL}.json"
            check_record_split(records[RECALL], self.ppl_split, where)
        return records

    def _recall(self, model, tokenizer) -> dict:
        """The ``recall`` task's record (:func:`lit_dof.evaluation.recall.recall_record`) on the retrieval grid,
        its filler from the ``ppl_split`` documents of the corpus."""
        from lit_dof.evaluation.harness import provenance
        from lit_dof.evaluation.recall import recall_record

        grid = self.retrieval.settings()
        entry = recall_record(model, tokenizer, self._corpus("the recall task"), **grid, split=self.ppl_split)
        where = {"tasks": ["recall"], "seconds": entry.pop("seconds"), "device": self.device_label()}
        entry["provenance"] = provenance(**where, retrieval=grid, split=self.ppl_split)
        return entry

    def _corpus(self, what: str) -> str:
        """``--corpus`` or ``$LIT_DOF_CORPUS``; FileNotFoundError naming ``what`` needs it where neither is set."""
        corpus = self.corpus or os.environ.get("LIT_DOF_CORPUS")
        if not corpus:
            raise FileNotFoundError(f"no corpus for {what}: pass --corpus or set LIT_DOF_CORPUS")
        return corpus

    def _per_task(self, row: Row, budget: int, name: str, tasks: Sequence[str], measure) -> dict:
        """The cell's ``<name>/<task>.json`` records: each missing one is ``measure(model, tokenizer, task, cache)``
        with the cell's model (loaded once, only if a record is missing), written atomically one task at a time (a
        kill loses at most one task's work; ``<name>/cache`` keeps the answered requests of an unfinished one)."""
        folder = self.cell_dir(row, budget) / name
        todo = [t for t in tasks if not (folder / f"{t}.json").is_file()]
        if todo:
            model, tokenizer = self.load(row, budget)
            for task in todo:
                atomic_write_json(folder / f"{task}.json", measure(model, tokenizer, task, folder / "cache"))
        return {t: json.loads((folder / f"{t}.json").read_text()) for t in tasks}

    def _measured(self, row: Row, budget: int, name: str, measure) -> dict:
        """The cell's ``name`` record: read back if written, else ``measure(model, tokenizer, corpus)`` with the
        cell's model on the comparison's device, timed, written atomically."""
        path = self.cell_dir(row, budget) / name
        if path.is_file():
            record = json.loads(path.read_text())
            return record if name == "long_documents.json" else check_record_split(record, self.ppl_split, path)
        corpus = self._corpus(name)
        model, tokenizer = self.load(row, budget)
        start = time.time()
        result = measure(model, tokenizer, corpus)
        result.update(seconds=time.time() - start, device=self.device_label())
        if "source" in result:  # recorded without this machine's paths, as the commands are
            result["source"] = portable([str(result["source"])])
        atomic_write_json(path, result)
        return result

    def perplexity(self, row: Row, budget: int) -> dict:
        """Sliding-window perplexity on the held-out documents of the corpus (``ppl.json``).

        Args:
            row: the cell's row.
            budget: its feature budget C.

        Returns:
            ``ppl.json``'s content.

        Raises:
            FileNotFoundError: no corpus (``--corpus`` or ``$LIT_DOF_CORPUS``).
        """
        record = self._measured(row, budget, "ppl.json", self._perplexity)
        state = record.get("state")
        if state is not None and state.get("layout") != STATE_LAYOUT:  # counted in another state layout (or no growth)
            from lit_dof.students.cache import prefill_cache_nbytes

            model, context = self.load(row, budget)[0], state["context"]
            before = {"bytes": state["bytes"], "layout": state.get("layout", 1)}
            state.update(bytes=prefill_cache_nbytes(model, context), growth=state_growth(model, context))
            state.update(layout=STATE_LAYOUT, before=before)  # the perplexity is the same function's: kept
            atomic_write_json(self.cell_dir(row, budget) / "ppl.json", record)
        return record

    def _perplexity(self, model, tokenizer, corpus: str) -> dict:
        from lit_dof.evaluation.position_perplexity import heldout_perplexity
        from lit_dof.students.cache import prefill_cache_nbytes

        result = heldout_perplexity(
            model,
            tokenizer,
            corpus,
            max_tokens=self.ppl_tokens,
            window=self.ppl_window,
            stride=self.ppl_stride,
            split=self.ppl_split,
        )
        # what decoding keeps per sequence at the scored context (a teacher's KV cache; a student's state), and what
        # it grows per further token (the softmax layers' KV caches): its bytes at any longer context
        nbytes, growth = prefill_cache_nbytes(model, self.ppl_window), state_growth(model, self.ppl_window)
        result["state"] = {"context": self.ppl_window, "bytes": nbytes, "growth": growth, "layout": STATE_LAYOUT}
        return result

    def long_context(self, row: Row, budget: int) -> dict:
        """Perplexity by position at every context of ``long_contexts``, returned and written as ``long.json``
        (arguments and errors as :meth:`perplexity`): the held-out documents concatenated (EOS between them) and
        cut into disjoint blocks of that many tokens, ``ppl_tokens`` tokens per context, buckets 0–63 / 64–255 /
        256–511 / 512–2047 / 2048–4095 / 4096–8191 within the block."""
        return self._measured(row, budget, "long.json", self._long_context)

    def _long_context(self, model, tokenizer, corpus: str) -> dict:
        from lit_dof.evaluation.position_perplexity import long_context_perplexity

        return long_context_perplexity(model, tokenizer, corpus, self.long_contexts, self.ppl_tokens, self.ppl_split)

    def long_document_perplexity(self, row: Row, budget: int) -> dict:
        """The long-document test set by in-document position, written as ``long_documents.json`` (arguments and
        errors as :meth:`perplexity`; :func:`lit_dof.evaluation.long_documents.long_document_perplexity`, the first
        :attr:`long_documents` documents, each truncated to the model's max positions)."""
        return self._measured(row, budget, "long_documents.json", self._long_documents)

    def _long_documents(self, model, tokenizer, corpus: str) -> dict:
        from lit_dof.evaluation.long_documents import long_document_perplexity

        return long_document_perplexity(model, tokenizer, corpus, max_documents=self.long_documents)

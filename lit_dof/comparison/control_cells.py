"""The controls of a student cell as cells of their own (``lit-dof compare --controls``): where each one's records
are, and its ``control.json`` — what the control is (:class:`~lit_dof.evaluation.controls.Control`: window, sinks,
weights, decode-state bytes beside the student's), or why the student has none.

A control's folder is ``<student cell>/controls/<name>/``. The controls with the teacher's own weights — (a) the
teacher behind the student's window + sinks, (b) the teacher behind the equal-state window + sinks — depend only on
that window, those sinks and the layers kept softmax, so their records are measured once in
``<out>/controls/teacher_window<W>_sinks<S>[_softmax<layers>][_exact<heads>]/`` and shared by every seed, row and
budget with the same window, softmax layers and exact KV heads (``control.json`` names the folder). (c), the student's
own LoRA-merged weights with full attention, keeps its records in its own folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from lit_dof.comparison.cell_records import ControlRecord
from lit_dof.comparison.rows import CONTROLS, Row
from lit_dof.io import atomic_write_json

if TYPE_CHECKING:
    from lit_dof.comparison.cells import Comparison

CONTROL_FILE = "control.json"
"""The file in a control's folder saying what it is (``control``: the record, or ``None`` with ``why``) and where
its records are (``records``: a folder relative to it)."""


def control_folder(comparison: Comparison, row: Row, budget: int, seed: int | None = None) -> Path:
    """``<student cell>/controls/<control>``: the folder of a control row's ``control.json``.

    Args:
        comparison: the comparison.
        row: a control row (:func:`~lit_dof.comparison.rows.control_rows`).
        budget: its feature budget C.
        seed: its seed (default: the comparison's).

    Returns:
        The folder (not created).
    """
    return comparison.cell_dir(comparison.known_rows[row.of], budget, seed) / "controls" / row.control


def read_control(folder: Path) -> ControlRecord | None:
    """A control folder's ``control.json`` (``None`` before :func:`describe_controls` wrote it).

    Args:
        folder: :func:`control_folder`.

    Returns:
        The record, or ``None``.
    """
    path = folder / CONTROL_FILE
    return ControlRecord.load(path) if path.is_file() else None


def records_folder(comparison: Comparison, row: Row, budget: int, seed: int | None = None) -> Path:
    """Where a control row's records (``ppl.json``, ``eval/``, ``retrieval/``, …) are: the shared folder of a
    teacher-weight control, else (and before ``control.json`` exists) its own folder.

    Args:
        comparison: the comparison.
        row: a control row.
        budget: its feature budget C.
        seed: its seed (default: the comparison's).

    Returns:
        The folder (not created).
    """
    own = control_folder(comparison, row, budget, seed)
    info = read_control(own)
    return Path(os.path.normpath(own / info.records)) if info and info.records else own


def shared_folder(
    comparison: Comparison,
    window: int,
    sinks: int,
    softmax_layers: Sequence[int] = (),
    exact_heads: Mapping[int, Sequence[int]] | None = None,
) -> Path:
    """``<out>/controls/teacher_window<W>_sinks<S>``: the records of the teacher behind that window + sinks, with
    ``_softmax<i>-<j>-…`` appended when the student keeps layers softmax and ``_exact<layer>.<head>.…-…`` when it
    keeps KV heads exact (its controls keep both, so they are other models than the same window's controls of a
    student without them).

    Args:
        comparison: the comparison.
        window: exactly attended tokens besides the sinks.
        sinks: sink tokens.
        softmax_layers: the student's layers with full softmax attention (``config.softmax_layers``).
        exact_heads: ``{layer: [KV head, …]}`` the student keeps exact (:func:`lit_dof.students.surgery.exact_heads`).

    Returns:
        The folder (not created).
    """
    layers = f"_softmax{'-'.join(str(i) for i in sorted(softmax_layers))}" if softmax_layers else ""
    heads = "-".join(".".join(map(str, [i, *sorted(h)])) for i, h in sorted((exact_heads or {}).items()) if h)
    return (
        Path(comparison.out)
        / "controls"
        / f"teacher_window{window}_sinks{sinks}{layers}{'_exact' + heads if heads else ''}"
    )


def describe_controls(comparison: Comparison, student_row: Row, budget: int) -> dict[str, ControlRecord]:
    """Write the ``control.json`` of each control of a fitted student cell (loading the student and its teacher
    once), unless all are written in the current decode-state layout; returns them. One written in another layout
    (:data:`~lit_dof.students.state_bytes.STATE_LAYOUT`: its (b) window was sized to other bytes) is kept beside as
    ``control.json.layout<N>`` and described again.

    Args:
        comparison: the comparison (its seed is the cell's).
        student_row: a student row whose cell has a ``fit.json``.
        budget: its feature budget C.

    Returns:
        ``{control name: its control.json}`` for every name of :data:`~lit_dof.comparison.rows.CONTROLS`.
    """
    from lit_dof.students.state_bytes import STATE_LAYOUT

    folders = {name: comparison.cell_dir(student_row, budget) / "controls" / name for name in CONTROLS}
    found = {name: read_control(folder) for name, folder in folders.items()}
    if all(record is not None and record.state_layout == STATE_LAYOUT for record in found.values()):
        return found
    from lit_dof.evaluation.controls import control_info, control_models
    from lit_dof.evaluation.loading import load_model
    from lit_dof.students.surgery import exact_heads

    for name, record in found.items():  # counted in another decode-state layout: kept beside, described again
        if record is not None and record.state_layout != STATE_LAYOUT:
            path = folders[name] / CONTROL_FILE
            os.replace(path, path.with_name(f"{CONTROL_FILE}.layout{record.state_layout or 1}"))

    student, _ = load_model(comparison.model_source(student_row, budget), device=comparison.device)
    models = control_models(student)
    for name, folder in folders.items():
        model = models.get(name)
        control = control_info(model) if model is not None else None
        records = None
        if control is not None and control.weights == "teacher":
            softmax, exact = student.config.softmax_layers, exact_heads(student.model)
            shared = shared_folder(comparison, control.window, control.sink_tokens, softmax, exact)
            records = os.path.relpath(shared, folder)
        why = None if model is not None else _absent_reason(name)
        found[name] = ControlRecord(control, why, records, STATE_LAYOUT)
        atomic_write_json(folder / CONTROL_FILE, found[name].to_json())
    return found


def _absent_reason(name: str) -> str:
    return {
        "window_sinks": "a pure linear student has no window: the teacher behind it would attend to nothing",
        "tail_only": "the student's weights are the teacher's (no tail trained them)",
        "far_only": "the student has no window or no far term: nothing to cut",
    }.get(name, "not built for this student")

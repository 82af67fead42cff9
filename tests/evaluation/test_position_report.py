"""Position and long-context tables of the comparison report: ratios paired over blocks, against a closed form."""

from __future__ import annotations

import math
import statistics

from lit_dof.evaluation.position_report import long_context_lines, position_lines


def _result(nll: list[float], late: list[float], block: int = 512) -> dict:
    buckets = {"0-255": {"ppl": 10.0, "block_nll": nll},
               "256-511": {"ppl": math.exp(statistics.mean(late)), "block_nll": late}}  # fmt: skip  # compact dict
    return {"block": block, "blocks": len(nll), "ppl": math.exp(statistics.mean(nll)), "block_nll": nll,
            "buckets": buckets}  # fmt: skip  # compact dict


def test_position_table_pairs_each_row_with_the_teacher_and_its_reference():
    teacher = _result([3.0, 3.2, 2.8], [2.9, 3.1, 2.7])
    control = _result([3.3, 3.4, 3.0], [3.2, 3.3, 3.0])
    student = _result([3.1, 3.3, 2.9], [3.0, 3.2, 2.8])
    models = [
        {"label": "teacher", "reference": None, "by_position": teacher},
        {"label": "swa_sink", "reference": "teacher", "by_position": control},
        {"label": "student", "reference": "swa_sink", "by_position": student},
        {"label": "unmeasured", "reference": None},
    ]
    lines = position_lines(models, "teacher")
    text = "\n".join(lines)
    assert "3 disjoint blocks of 512" in text and "unmeasured" not in text
    row = next(line for line in lines if line.startswith("| student |")).split(" | ")
    diffs = [0.1, 0.1, 0.1]  # student − teacher, per block: ratio e^0.1 with a zero standard error
    assert row[4] == f"{math.exp(statistics.mean(diffs)):.3f} ± 0.000"
    late = [
        a - b for a, b in zip(student["buckets"]["256-511"]["block_nll"], control["buckets"]["256-511"]["block_nll"])
    ]
    ratio, se = math.exp(statistics.mean(late)), statistics.stdev(late) / math.sqrt(3)
    assert row[-1].rstrip(" |") == f"{ratio:.3f} ± {ratio * se:.3f}" and "(swa_sink)" in row[6]
    teacher_row = next(line for line in lines if line.startswith("| teacher |"))
    assert teacher_row.count("–") == 4  # no ratio with itself, no reference
    assert position_lines([{"label": "a", "reference": None}], "a") == []
    other = {**student, "buckets": {"0-299": {"ppl": 5.0, "block_nll": [1.0] * 3}}}  # another ppl_window's record
    row = next(
        line
        for line in position_lines([*models[:2], {**models[2], "by_position": other}], "teacher")
        if line.startswith("| student |")
    )
    assert row.split(" | ")[2:4] == ["–", "–"]  # its buckets are not the columns: shown as missing, no crash


def test_long_context_sections_one_table_per_context():
    models = [{"label": "teacher", "reference": None, "long": {"2048": _result([2.0, 2.2], [2.0, 2.1], 2048)}},
              {"label": "student", "reference": None, "long": {"2048": _result([2.5, 2.4], [2.6, 2.5], 2048),
                                                                "512": _result([3.0, 3.0], [3.0,
                                                                3.0])}}]  # fmt: skip  # compact list
    text = "\n".join(long_context_lines(models, "teacher"))
    assert text.index("Context 512 tokens") < text.index("Context 2048 tokens") and "(2 blocks)" in text
    row = next(
        line
        for line in text.splitlines()[text.splitlines().index("Context 2048 tokens (2 blocks):") :]
        if line.startswith("| student |")
    )
    assert f"{math.exp(0.35):.3f} ± {math.exp(0.35) * 0.15:.3f}" in row  # diffs 0.5, 0.2: mean 0.35, SE 0.15
    assert long_context_lines([{"label": "x", "reference": None}], None) == []

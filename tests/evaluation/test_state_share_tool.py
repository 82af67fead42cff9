"""tools/state_share.py: a student's decode state against its teacher's KV cache, checked against the caches a real
prefill leaves behind."""

import torch

from lit_dof.evaluation.loading import load_model
from lit_dof.students.cache import prefill_cache_nbytes
from lit_dof.teacher.loading import load_teacher
from tests.conftest import TINYSTORIES, load_script
from tests.evaluation.students import save_window_student


def test_state_share_matches_the_prefilled_caches(tmp_path, capsys):
    student_dir = save_window_student(tmp_path / "student", window=16, sink_tokens=2, exact_heads={0: [0]})
    context = 48  # beyond window + sinks: the far term's state, and the exact head's cache growing with T
    (own, teacher), (plain, plain_teacher) = load_script("state_share", "tools").main(
        [str(student_dir), str(TINYSTORIES), "--context", str(context)]
    )
    student, _ = load_model(str(student_dir))
    model, _ = load_teacher(str(TINYSTORIES))
    assert next(model.parameters()).dtype == torch.float32
    assert own == prefill_cache_nbytes(student, context)
    assert teacher == plain == plain_teacher == prefill_cache_nbytes(model, context)
    assert 0 < own < teacher
    assert f"{own / teacher:.2%}" in capsys.readouterr().out

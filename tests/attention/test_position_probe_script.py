"""tools/position_probe.py: under rotary positions the teacher and the window-plus-sink control score a block
the same at every position shift; the learned far term's maps see the absolute rotation and do not."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.students import linearize
from tests.conftest import TINYSTORIES, load_script


def _script():
    return load_script("position_probe", "tools")


def _student():
    teacher = AutoModelForCausalLM.from_pretrained(TINYSTORIES, dtype=torch.float32).eval()
    return linearize(teacher, LearnedPRF, 8, sliding_window=SlidingWindow(window=4, sink_tokens=1), seed=0).eval()


def test_teacher_and_control_are_shift_invariant_and_the_far_term_is_not(tmp_path):
    probe, student = _script(), _student()
    blocks = torch.randint(3, 2048, (2, 40), generator=torch.Generator().manual_seed(0))
    nll = {
        (mode, shift): probe.block_nll(student, blocks, shift, mode, first=8)
        for mode in ("teacher", "control", "student")
        for shift in (0, 300)
    }
    torch.testing.assert_close(nll["teacher", 300], nll["teacher", 0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(nll["control", 300], nll["control", 0], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(nll["control", 0], nll["teacher", 0], atol=1e-3)  # 40 tokens reach past window + sink
    assert not torch.allclose(nll["student", 300], nll["student", 0], atol=1e-4)  # φ sees absolute rotations
    assert all(t.far_term for t in student.linear_modules().values())  # the control restored the far terms

    # The whole script on a saved student and a small corpus: one line per shift, the same numbers.
    student.save_pretrained(tmp_path / "student")
    tokenizer = AutoTokenizer.from_pretrained(TINYSTORIES)
    tokenizer.save_pretrained(tmp_path / "student")
    text = " ".join(["Once upon a time there was a little dog who liked to run in the park with his friends."] * 12)
    (tmp_path / "corpus.txt").write_text(text + "\n\nA second document.\n")
    result = probe.main([str(tmp_path / "student"), "--corpus", str(tmp_path / "corpus.txt"), "--shifts", "0", "300",
                         "--blocks", "2", "--block", "40", "--from", "8"])  # fmt: skip  # packed args
    assert set(result) == {0, 300}
    assert abs(result[300]["teacher"] - result[0]["teacher"]) < 1e-4
    assert abs(result[0]["student_minus_control"] - (result[0]["student"] - result[0]["control"])) < 1e-5


def test_unrotating_every_pair_makes_the_student_shift_invariant_and_none_changes_nothing():
    """Rotating every RoPE pair back by its position leaves the far features position-free (and the window is
    relative already): the student scores a block the same at every shift. A period longer than any pair's
    un-rotates nothing."""
    probe, student = _script(), _student()
    blocks = torch.randint(3, 2048, (2, 40), generator=torch.Generator().manual_seed(1))
    nll = {
        shift: probe.block_nll(student, blocks, shift, "student", first=8, unrotate_period=0.0) for shift in (0, 300)
    }
    torch.testing.assert_close(nll[300], nll[0], rtol=1e-4, atol=1e-4)
    plain = probe.block_nll(student, blocks, 300, "student", first=8)
    assert not torch.allclose(nll[300], plain, atol=1e-4)
    untouched = probe.block_nll(student, blocks, 300, "student", first=8, unrotate_period=1e30)
    torch.testing.assert_close(untouched, plain, rtol=1e-6, atol=1e-6)
    assert "exact_log_features" not in vars(next(iter(student.linear_modules().values())))  # patch removed


def test_long_context_mode_pairs_the_student_with_its_own_control(tmp_path):
    """Without a remedy the student's per-block NLL is the plain position perplexity's; the control's equals the
    student with its far terms off; the ratio is their paired ratio."""
    from lit_dof.evaluation.position_perplexity import position_perplexity

    probe, student = _script(), _student()
    tokens = torch.randint(3, 2048, (96,), generator=torch.Generator().manual_seed(2))
    result = probe.long_context(student, tokens, [32], None)[32]
    with torch.no_grad():
        plain = position_perplexity(student, tokens, block=32, edges=[0, 32], batch_size=1)
    assert result["student"]["block_nll"] == plain["block_nll"]
    assert result["control"]["block_nll"] != plain["block_nll"] and result["ratio"]["blocks"] == 3


def test_device_and_dtype_options(tmp_path, capsys):
    import pytest

    probe, student = _script(), _student()
    student.save_pretrained(tmp_path / "student")
    AutoTokenizer.from_pretrained(TINYSTORIES).save_pretrained(tmp_path / "student")
    text = " ".join(["Once upon a time there was a little dog who liked to run in the park with his friends."] * 12)
    (tmp_path / "corpus.txt").write_text(text + "\n\nA second document.\n")
    args = [str(tmp_path / "student"), "--corpus", str(tmp_path / "corpus.txt"), "--shifts", "0", "--blocks", "2",
            "--block", "40", "--from", "8"]  # fmt: skip  # packed args
    default = probe.main(args)
    assert probe.main([*args, "--device", "cpu", "--dtype", "float32"]) == default  # the recorded dtype: float32
    half = probe.main([*args, "--device", "cpu", "--dtype", "bfloat16"])
    assert half[0]["teacher"] == pytest.approx(default[0]["teacher"], abs=0.1)
    for option, value in (("--device", "gpu"), ("--dtype", "half")):
        with pytest.raises(SystemExit) as exit_:
            probe.main([str(tmp_path / "missing"), "--corpus", "x", option, value])
        assert exit_.value.code == 2 and value in capsys.readouterr().err

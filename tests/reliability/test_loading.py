"""Damaged model folders fail clearly: the message names the file, what is wrong with it and the fix.

A teacher (a copy of the real TinyStories-656K folder) and a student linearised from it are damaged on disk the
ways files get damaged — a ``config.json`` that is not JSON or not a config, a ``model.safetensors`` cut in half or
with a garbage header length, tensor bytes overwritten (NaN) — and loaded through every public path.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_dof.attention import LearnedPRF
from lit_dof.cli import main
from lit_dof.evaluation.loading import load_model
from lit_dof.model_files import CorruptModelFileError
from lit_dof.students import LitDofForCausalLM, linearize, load_student
from lit_dof.students.integrity import NonFiniteStudentError, check_finite
from lit_dof.teacher.loading import gguf_cache_target, load_teacher, load_tokenizer
from tests.conftest import DATA, TINYSTORIES

pytestmark = pytest.mark.skipif(not TINYSTORIES.is_dir(), reason="../shared not present")

IDS = torch.tensor([[1, 412, 87, 1203, 9, 33, 640, 2, 77, 5, 1500]])
BROKEN_CONFIGS = {  # config.json content → what the message must say about it
    "not_json": ('{"model_type": "llama",\n  "hidden_size": 128,,\n}', "is not valid JSON (Expecting property name"),
    "array": ("[]", "holds an array, not a JSON object"),
    "no_model_type": ('{"hidden_size": 128}', "has no model_type"),
}
TEACHER_FIX = "download it again (hf download"
STUDENT_FIX = "Re-export the student (student.save_pretrained(DIR)"


def copy_folder(source: Path, target: Path) -> Path:
    """A writable copy of a model folder (the shared one is read-only)."""
    shutil.copytree(source, target)
    for path in [target, *target.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def garble_header_length(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(b"\xfe\xff\xff\xff\xff\xff\xff\x7f" + data[8:])


DAMAGES = {"truncated": truncate, "header": garble_header_length}


def overwrite_tensor(file: Path, name: str, byte: bytes = b"\xff") -> None:
    """Overwrite one tensor's bytes in place (0xFF bytes are NaN in every float dtype)."""
    data = bytearray(file.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    begin, end = json.loads(data[8 : 8 + length])[name]["data_offsets"]
    data[8 + length + begin : 8 + length + end] = byte * (end - begin)
    file.write_bytes(bytes(data))


def check_json_position(message: str, text: str) -> None:
    """The message gives the JSON error's own line and column."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        assert f"at line {exc.lineno}, column {exc.colno}" in message
        assert exc.lineno == 2  # the broken line, not the first


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``(teacher copy, student folder, the student's logits on IDS before saving)``."""
    root = tmp_path_factory.mktemp("loading")
    teacher_dir = copy_folder(TINYSTORIES, root / "teacher")
    teacher, tokenizer = load_teacher(str(teacher_dir))
    student = linearize(teacher, LearnedPRF, 16, seed=0)
    generator = torch.Generator().manual_seed(0)
    for lin in student.linear_modules().values():  # saved twins that differ from a fresh init
        for p in lin.feature_map.parameters():
            p.data.add_(0.05 * torch.randn(p.shape, generator=generator))
    with torch.no_grad():
        logits = student(IDS).logits
    student.save_pretrained(root / "student")
    tokenizer.save_pretrained(root / "student")
    return teacher_dir, root / "student", logits


@pytest.mark.parametrize("broken", BROKEN_CONFIGS)
def test_teacher_with_invalid_config_names_the_file(saved, tmp_path, broken):
    text, problem = BROKEN_CONFIGS[broken]
    folder = copy_folder(saved[0], tmp_path / "teacher")
    (folder / "config.json").write_text(text)
    for load in (load_teacher, load_tokenizer, load_model):
        with pytest.raises(CorruptModelFileError) as error:
            load(str(folder))
        message = str(error.value)
        assert message.startswith(f"{folder / 'config.json'} {problem}")
        assert "(offline or not cached)" not in message
        assert (TEACHER_FIX if load is not load_model else "download it again if it is a teacher") in message
    if broken == "not_json":
        check_json_position(message, text)
        assert isinstance(error.value.__cause__, json.JSONDecodeError)


@pytest.mark.parametrize("broken", BROKEN_CONFIGS)
def test_student_with_invalid_config_names_the_file(saved, tmp_path, broken):
    text, problem = BROKEN_CONFIGS[broken]
    folder = copy_folder(saved[1], tmp_path / "student")
    (folder / "config.json").write_text(text)
    with pytest.raises(CorruptModelFileError) as error:
        load_student(folder)
    assert str(error.value).startswith(f"{folder / 'config.json'} {problem}") and STUDENT_FIX in str(error.value)
    if broken == "not_json":
        check_json_position(str(error.value), text)
    for load in (
        lambda: load_model(str(folder)),
        lambda: main(["generate", "--model", str(folder), "--prompt", "Once", "--device", "cpu", "--no_stream"]),
        lambda: main(["eval", "--model", str(folder), "--tasks", "[wsc273]", "--data_dir", str(DATA)]),
    ):  # folders that may be a student or a teacher: the fix names both
        with pytest.raises(CorruptModelFileError, match="re-export it if it is a lit-dof student") as error:
            load()
        assert str(error.value).startswith(f"{folder / 'config.json'} {problem}")


@pytest.mark.parametrize("damage", DAMAGES)
def test_teacher_with_damaged_weights_names_the_file(saved, tmp_path, damage):
    folder = copy_folder(saved[0], tmp_path / "teacher")
    DAMAGES[damage](folder / "model.safetensors")
    with pytest.raises(CorruptModelFileError) as error:
        load_teacher(str(folder))
    message = str(error.value)
    assert message.startswith(f"{folder / 'model.safetensors'} is truncated or corrupt")
    assert "safetensors: Error while deserializing header" in message and TEACHER_FIX in message
    assert load_tokenizer(str(folder)).vocab_size == 2048  # the tokenizer needs no weights


def test_damaged_gguf_conversion_says_to_delete_the_cache_folder(saved, tmp_path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))  # never read beyond its fingerprint: the conversion is cached
    cache = gguf_cache_target(gguf, tmp_path / "cache")
    copy_folder(saved[0], cache)
    (cache / "lit_dof_source.json").write_text(json.dumps({"gguf_file": str(gguf)}))
    assert load_teacher(str(gguf), cache_dir=tmp_path / "cache")[0].config.model_type == "llama"
    truncate(cache / "model.safetensors")
    with pytest.raises(CorruptModelFileError, match="truncated or corrupt") as error:
        load_teacher(str(gguf), cache_dir=tmp_path / "cache")
    assert f"lit-dof's conversion of a GGUF teacher: delete the folder {cache} and load" in str(error.value)


@pytest.mark.parametrize("damage", DAMAGES)
def test_student_with_damaged_weights_names_the_file(saved, tmp_path, damage):
    folder = copy_folder(saved[1], tmp_path / "student")
    DAMAGES[damage](folder / "model.safetensors")
    for load in (lambda: load_student(folder), lambda: load_model(str(folder))):
        with pytest.raises(CorruptModelFileError) as error:
            load()
        message = str(error.value)
        assert message.startswith(f"{folder / 'model.safetensors'} is truncated or corrupt") and STUDENT_FIX in message


@pytest.mark.parametrize(
    "tensor",
    [
        "model.model.layers.1.mlp.down_proj.weight",  # a teacher weight
        "model.model.layers.0.self_attn.lit_dof.linear.feature_map.log_alpha",  # a twin's parameter
        "model.model.layers.1.self_attn.lit_dof.linear.feature_map.z",  # a twin's buffer
    ],
)
def test_student_with_nan_bytes_is_refused_naming_the_tensor(saved, tmp_path, tensor):
    folder = copy_folder(saved[1], tmp_path / "student")
    overwrite_tensor(folder / "model.safetensors", tensor)
    with pytest.raises(NonFiniteStudentError) as error:
        load_student(folder)
    message = str(error.value)
    assert "has NaN or infinite values in 1 of its" in message and f"tensors: {tensor}. " in message
    assert STUDENT_FIX[:-1] in message and "check_finite=False" in message
    with pytest.raises(NonFiniteStudentError, match=tensor.replace(".", r"\.")):
        load_model(str(folder))
    inspected = load_student(folder, check_finite=False)  # loads anyway, for inspection
    assert torch.isnan(inspected.state_dict()[tensor]).all()


def test_many_nonfinite_tensors_are_counted_and_ten_named(saved):
    student = load_student(saved[1])
    names = [name for name, _ in student.named_parameters()][:12]
    with torch.no_grad():
        for name in names:
            student.get_parameter(name).fill_(float("inf"))
    with pytest.raises(NonFiniteStudentError) as error:
        check_finite(student, saved[1])
    assert "in 12 of its" in str(error.value) and ", … (2 more)" in str(error.value)
    assert names[9] in str(error.value) and names[10] not in str(error.value)


@pytest.mark.parametrize(
    "weight",
    [
        "model.model.norm.weight",  # the LM head's sums overflow
        "model.model.layers.0.self_attn.q_proj.weight",  # infinite queries reach a feature map
    ],
)
def test_finite_weights_with_overflowing_logits_are_refused(saved, weight):
    student = load_student(saved[1])
    with torch.no_grad():
        student.get_parameter(weight).fill_(3e38)  # finite
    with pytest.raises(NonFiniteStudentError, match="logits on a 8-token probe although its weights are finite"):
        check_finite(student, saved[1])
    assert all(lin.feature_map.check_inputs for lin in student.linear_modules().values())  # restored


def test_healthy_student_loads_with_the_same_logits(saved):
    _, folder, logits = saved
    for loaded in (load_student(folder), load_model(str(folder))[0], AutoModelForCausalLM.from_pretrained(folder)):
        assert isinstance(loaded, LitDofForCausalLM)
        with torch.no_grad():
            torch.testing.assert_close(loaded(IDS).logits, logits, rtol=0, atol=0)
    half = load_student(folder, dtype=torch.bfloat16)
    assert half.model.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(half(IDS).logits.float(), logits, rtol=0.1, atol=0.5)

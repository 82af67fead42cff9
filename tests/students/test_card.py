"""Hub-ready students: the model card written with every save, the Hub push of the final directory, and the
teacher recorded as the source the user gave."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import HfApi, ModelCard
from transformers import AutoModelForCausalLM

from lit_dof.attention import LearnedPRF, PerformerFeatureMap, SlidingWindow
from lit_dof.students import LitDofForCausalLM, linearize
from lit_dof.students.card import find_results, write_model_card
from lit_dof.students.state_bytes import decode_state_bytes
from lit_dof.teacher import loading
from tests.conftest import TINYSTORIES, save_tokenizer, tiny_model

needs_tinystories = pytest.mark.skipif(not TINYSTORIES.is_dir(), reason="needs ../shared/models/TinyStories-656K")


@needs_tinystories
def test_tinystories_student_has_a_card_and_loads_through_auto_classes(tmp_path):
    import lit_dof  # noqa: F401  (registers "lit_dof", as the card says)

    teacher, _ = loading.load_teacher(TINYSTORIES)
    student = linearize(teacher, LearnedPRF, [8, 12], seed=0, softmax_layers=[1])
    for lin in student.linear_modules().values():  # saved parameters differ from a fresh init
        for p in lin.feature_map.parameters():
            p.data.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(3, 2000, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = student(ids).logits
    target = tmp_path / "tiny-student"
    student.save_pretrained(target)

    card = ModelCard.load(target / "README.md")
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert {"lit-dof", "linear-attention"} <= set(card.data.tags)
    assert card.data.base_model is None  # a local folder is never a hub id; the card names the folder only
    assert card.data.license == ModelCard.load(TINYSTORIES / "README.md").data.license == "apache-2.0"
    assert json.loads((target / "config.json").read_text())["teacher"] == str(TINYSTORIES)  # provenance kept
    assert str(TINYSTORIES) not in card.text
    # At its 512 positions: the real cache after one token, plus the softmax layer's keys and values, 2 × Hk 4 × d 16
    # × 4 bytes per further token; the teacher's KV cache, 2 layers × 2 × 4 × 16 × 4 bytes per token.
    student_bytes, teacher_bytes = decode_state_bytes(student, 1) + 511 * 2 * 4 * 16 * 4, 512 * 2 * 2 * 4 * 16 * 4
    for expected in (
        "A linear-attention student of `TinyStories-656K` (a local folder)",
        "`LearnedPRF`",
        "window 0, sink tokens 0",
        "Softmax layers: 1",
        "| 0 | 8 |",
        "| 1 (softmax) | 12 |",
        "Total ΣM = 20 over 2 layers",
        f"| 512 | {student_bytes / 1024:.1f} KiB | {teacher_bytes / 1024:.1f} KiB |",
        "The student's state grows with the context",
        'AutoModelForCausalLM.from_pretrained("path/to/tiny-student", trust_remote_code=True)',
        'pipeline("text-generation", model="path/to/tiny-student", trust_remote_code=True)',
        "import lit_dof",
        'from_pretrained("path/to/tiny-student")',
        "`apache-2.0`, the teacher's license applies.",
    ):
        assert expected in card.text, expected
    absent = ("## DoF allocation", "## Measured", "## Training")
    assert not any(section in card.text for section in absent)  # nothing known: nothing claimed

    auto = AutoModelForCausalLM.from_pretrained(target)
    assert isinstance(auto, LitDofForCausalLM)
    with torch.no_grad():
        torch.testing.assert_close(auto(ids).logits, logits, rtol=0, atol=0)


def test_import_lit_dof_is_all_the_card_asks_for(tmp_path):
    """In a fresh interpreter, ``import lit_dof`` (which imports neither torch nor transformers) is enough for
    transformers' Auto classes to load a student: the registration follows transformers' import."""
    linearize(tiny_model("llama"), LearnedPRF, 8).save_pretrained(tmp_path / "s")
    probe = (
        "import sys, lit_dof\nlight = 'transformers' not in sys.modules\n"
        "from transformers import AutoModelForCausalLM\n"
        f"print(light, type(AutoModelForCausalLM.from_pretrained({str(tmp_path / 's')!r})).__name__)"
    )
    env_path = str(Path(__file__).resolve().parents[2])
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": env_path, "HF_HUB_OFFLINE": "1"},
    )
    assert result.stdout.split()[-2:] == ["True", "LitDofForCausalLM"]


def test_sliding_window_card_names_window_and_sinks(tmp_path):
    student = linearize(
        tiny_model("llama"), PerformerFeatureMap, 8, sliding_window=SlidingWindow(window=4, sink_tokens=2)
    )
    student.save_pretrained(tmp_path / "s")
    text = (tmp_path / "s" / "README.md").read_text()
    assert "`PerformerFeatureMap`" in text and "sliding window of 4 tokens + 2 sink tokens" in text
    assert "Exact KV heads" not in text
    exact = linearize(tiny_model("llama"), LearnedPRF, 8, sliding_window=SlidingWindow(window=4), exact_heads={2: [1]})
    exact.save_pretrained(tmp_path / "e")
    text = (tmp_path / "e" / "README.md").read_text()
    assert "- Exact KV heads (M = 0: full softmax attention, a growing KV cache): layer 2: 1" in text
    assert "| 2 | [8, 0] |" in text


def test_card_marks_the_teachers_own_sliding_window_layers_as_softmax(tmp_path):
    """Gemma 3's sliding-window layers stay softmax (never linearised): the card's M column says so, not a dim."""
    student = linearize(tiny_model("gemma3_text"), LearnedPRF, [8, 12, 6, 10], sliding_window=SlidingWindow(window=4))
    student.save_pretrained(tmp_path / "s")
    lines = (tmp_path / "s" / "README.md").read_text().splitlines()
    start = lines.index("| layer | M |") + 2
    assert lines[start : start + 5] == [
        "| 0 | – (the teacher's sliding window: softmax) |",
        "| 1 | 12 |",
        "| 2 | – (the teacher's sliding window: softmax) |",
        "| 3 | 10 |",
        "",
    ]
    assert any(line.startswith("Total ΣM = 22 over 2 layers") for line in lines)  # the twins' layers only


def test_card_reads_a_dof_report_and_measurements_tolerantly(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    dims = [6, 10, 7]
    (run / "dof.json").write_text(
        json.dumps(
            {"lambda": 0.25, "allocations": {"dof_clip": dims, "fix": [16, 16, 16]}, "layer_dof": [4.5, None, 3.0]}
        )
    )
    student = linearize(tiny_model("llama"), LearnedPRF, dims)
    student.save_pretrained(run / "student")  # the report one folder up describes these dims
    text = (run / "student" / "README.md").read_text()
    assert "Strategy: `dof_clip`" in text and "λ = 0.25" in text and "DoF per layer: 4.5, –, 3.0" in text

    other = tmp_path / "other"
    other.mkdir()
    (other / "dof.json").write_text(json.dumps({"lam": 1.0, "allocations": {"dof": [99, 99, 99]}}))
    student.save_pretrained(other / "student")  # a report about other dims is not claimed
    assert "## DoF allocation" not in (other / "student" / "README.md").read_text()

    folder = run / "student"
    (folder / "ppl.json").write_text(json.dumps({"ppl": 12.3456, "tokens": 4096}))
    (folder / "eval.json").write_text(
        json.dumps({"tasks": {"piqa": {"acc": 0.6, "acc_norm": 0.61, "acc_norm_stderr": 0.01, "n": 100}}})
    )
    (folder / "eval").mkdir()
    (folder / "eval" / "arc_easy.json").write_text(json.dumps({"acc": 0.4, "n": 50}))
    (folder / "broken.json").write_text("{not json")
    (folder / "list.json").write_text("[1, 2]")
    perplexities, tasks = find_results(folder)
    assert perplexities == [("ppl", 12.3456, 4096)]
    assert tasks == {"piqa": ("acc_norm", 0.61, 0.01, 100), "arc_easy": ("acc", 0.4, None, 50)}

    write_model_card(folder, dof={"lam": 0.5, "lam_rule": "auto"}, strategy="dof")  # what the pipeline knows
    text = (folder / "README.md").read_text()
    assert "Strategy: `dof`" in text and "λ = 0.5 (lam_rule auto)" in text
    assert "| ppl | 12.346 | 4096 |" in text and "| piqa | acc_norm | 0.6100 ± 0.0100 | 100 |" in text
    assert "| arc_easy | acc | 0.4000 | 50 |" in text
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []  # atomic: no temporaries


@pytest.fixture
def hub(monkeypatch):
    """A Hub that records what would be created and uploaded (the real Hub is unreachable here)."""
    calls = SimpleNamespace(created=[], uploads=[])

    def create_repo(self, repo_id, **kwargs):
        calls.created.append((repo_id, kwargs))
        return SimpleNamespace(repo_id=repo_id if "/" in repo_id else f"me/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        folder = Path(folder_path)
        files = {p.name: p.read_text() if p.name == "README.md" else None for p in folder.iterdir()}
        calls.uploads.append(SimpleNamespace(repo_id=repo_id, folder=folder, files=files, kwargs=kwargs))

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def test_push_to_hub_uploads_the_final_directory_named_after_it(tmp_path, hub):
    student = linearize(tiny_model("llama"), LearnedPRF, 8)
    target = tmp_path / "my-student"
    student.save_pretrained(target, push_to_hub=True, commit_message="first", private=True)
    assert hub.created == [("my-student", {"private": True, "exist_ok": True})]  # not the temporary name
    (upload,) = hub.uploads
    assert upload.repo_id == "me/my-student" and upload.folder == target
    assert {"config.json", "model.safetensors", "README.md"} <= set(upload.files)
    assert 'from_pretrained("my-student")' in upload.files["README.md"]
    assert upload.kwargs["commit_message"] == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-student"]

    student.save_pretrained(tmp_path / "local", push_to_hub=True, repo_id="org/named")
    assert hub.uploads[-1].repo_id == "org/named" and hub.uploads[-1].folder == tmp_path / "local"
    assert 'from_pretrained("org/named")' in hub.uploads[-1].files["README.md"]

    assert student.push_to_hub("org/direct") == "org/direct"  # transformers' entry point keeps lit-dof's card
    assert hub.uploads[-1].folder.name == "direct" and "lit-dof" in hub.uploads[-1].files["README.md"]
    assert not hub.uploads[-1].folder.exists()  # a temporary directory, removed after the upload


def test_no_push_without_push_to_hub(tmp_path, hub):
    linearize(tiny_model("llama"), LearnedPRF, 8).save_pretrained(tmp_path / "s", repo_id="org/unused")
    assert hub.created == [] and hub.uploads == []
    assert 'from_pretrained("path/to/s")' in (tmp_path / "s" / "README.md").read_text()


def test_teacher_is_recorded_as_the_source_not_the_cache_path(tmp_path, monkeypatch):
    cache = tmp_path / "cache" / "gguf" / "converted-0123456789ab"
    tiny_model("llama").save_pretrained(cache)
    save_tokenizer(cache)
    resolve = loading.resolve_source
    monkeypatch.setattr(
        loading, "resolve_source", lambda name, cache_dir: cache if name == "tiny-alias" else resolve(name, cache_dir)
    )
    teacher, _ = loading.load_teacher("tiny-alias")  # an alias resolved to a conversion in the cache
    assert teacher.name_or_path == teacher.config.name_or_path == "tiny-alias"
    linearize(teacher, LearnedPRF, 8).save_pretrained(tmp_path / "s")
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert config["teacher"] == "tiny-alias" and config["text_config"]["_name_or_path"] == "tiny-alias"
    assert str(cache) not in (tmp_path / "s" / "config.json").read_text()
    card = ModelCard.load(tmp_path / "s" / "README.md")
    assert card.data.base_model is None and "student of `tiny-alias`" in card.text  # not a hub id: named only


def test_card_names_hub_sources_and_keeps_the_training_record(tmp_path):
    """``base_model`` is a hub id only where one is known (the embedded alias's model, a hub id, a hub-cache
    snapshot, a folder whose config names one), never a local path; the training data's hub ids become
    ``datasets``; the fit's training record stays in the folder, so a later rewrite keeps its section."""
    from lit_dof.students.card_sources import teacher_source

    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "0123abc"
    tiny_model("llama").config.save_pretrained(snapshot)
    named = tmp_path / "named"  # a folder saved by transformers 4.x, whose config.json keeps the hub id
    tiny_model("llama").config.save_pretrained(named)
    config = json.loads((named / "config.json").read_text())
    (named / "config.json").write_text(json.dumps({**config, "_name_or_path": "org/named-model"}))
    gguf = tmp_path / "teacher.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    hub_ids = {
        "smollm2-135m-instruct": ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0"),
        "some-org/some-model": ("some-org/some-model", None),  # not a local path: a hub id (no cached card)
        str(snapshot): ("org/tiny", None),
        str(named): ("org/named-model", None),
        str(gguf): (None, None),
        "runs/../x": (None, None),
    }
    for teacher, expected in hub_ids.items():
        assert (teacher_source(teacher).hub_id, teacher_source(teacher).license) == expected, teacher

    student = linearize(tiny_model("llama"), LearnedPRF, 8)
    student.config.teacher = "smollm2-135m-instruct"
    folder = tmp_path / "s"
    student.save_pretrained(folder)
    record = {
        "recipe": "LayerwiseDistillation",
        "layer_loss": "SoftmaxRowLoss",
        "end_to_end": None,
        "steps": 640,
        "tokens": 640 * 8 * 512,
        "datasets": ["wikimedia/wikipedia"],
        "corpus": "`wikimedia/wikipedia` (20231101.en), streamed",
        "lora": None,
        "validation": {"ppl_student": 31.4159, "ppl_teacher": 20.0},
    }
    write_model_card(folder, training=record)
    write_model_card(folder)  # e.g. after `lit-dof eval` added a record: the training section stays
    card = ModelCard.load(folder / "README.md")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and card.data.license == "apache-2.0"
    assert card.data.datasets == ["wikimedia/wikipedia"]
    for expected in (
        "student of `HuggingFaceTB/SmolLM2-135M-Instruct` (lit-dof's embedded `smollm2-135m-instruct`)",
        "`SoftmaxRowLoss`); no end-to-end steps",
        f"- Steps: 640 optimizer steps, {640 * 8 * 512:,} training tokens through the teacher",
        "- Data: `wikimedia/wikipedia` (20231101.en), streamed",
        "- LoRA tail: none",
        "- Validation perplexity (the fit's last validation): student 31.416, teacher 20.000",
    ):
        assert expected in card.text, expected
    assert json.loads((folder / "lit_dof_training.json").read_text()) == record
    assert find_results(folder) == ([], {})  # the training record is no measurement record


def test_twin_layer_dims_drop_only_the_teachers_own_sliding_window_layers():
    from lit_dof.students.surgery import twin_layer_dims

    dims = [8, [4, 6], 16, 5]
    kinds = ["sliding_attention", "full_attention", "sliding_attention"]  # shorter: layer 3 has a twin
    assert twin_layer_dims(dims, kinds) == [[4, 6], 5]
    assert twin_layer_dims(dims, None) == dims

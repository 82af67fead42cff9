"""The feature-map registry: a saved config names a registered class or is refused, never imported."""

from __future__ import annotations

import json
import sys

import pytest

from lit_dof.attention import (
    DiJiangFeatureMap,
    HedgehogFeatureMap,
    LearnedPRF,
    PerformerFeatureMap,
    register_feature_map,
)
from lit_dof.attention.feature_maps import registry
from lit_dof.students import linearize, load_student
from lit_dof.students.surgery import feature_map_class, feature_map_spec
from tests.conftest import tiny_model


class ThirdPartyPRF(LearnedPRF):
    """A map defined outside lit-dof (here: in a test module)."""


@pytest.fixture
def clean_registry(monkeypatch):
    """Registrations made by a test end with it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


@pytest.mark.parametrize("cls", [LearnedPRF, PerformerFeatureMap, DiJiangFeatureMap, HedgehogFeatureMap])
def test_builtin_maps_resolve_by_recorded_and_public_names(cls):
    recorded = f"{cls.__module__}.{cls.__qualname__}"  # what every saved student has recorded
    assert recorded.startswith("lit_dof.attention.feature_maps.")
    for name in (recorded, f"lit_dof.attention.{cls.__name__}", f"lit_dof.attention.feature_maps.{cls.__name__}"):
        assert feature_map_class({"class": name}) is cls


def test_unknown_module_is_refused_without_being_imported(tmp_path, monkeypatch):
    flag = tmp_path / "imported.flag"
    (tmp_path / "evil_feature_maps.py").write_text(f"open({str(flag)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="register_feature_map") as info:
        feature_map_class({"class": "evil_feature_maps.Map", "kwargs": {}})
    assert "evil_feature_maps.Map" in str(info.value) and "not registered" in str(info.value)
    assert not flag.exists() and "evil_feature_maps" not in sys.modules


def test_saved_config_naming_an_unknown_module_does_not_load(tmp_path, monkeypatch):
    flag = tmp_path / "imported.flag"
    (tmp_path / "evil_maps_2.py").write_text(f"open({str(flag)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    linearize(tiny_model("llama"), LearnedPRF, 8).save_pretrained(tmp_path / "s")
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    config["feature_map"]["class"] = "evil_maps_2.LearnedPRF"
    (tmp_path / "s" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="register_feature_map"):
        load_student(tmp_path / "s")
    assert not flag.exists() and "evil_maps_2" not in sys.modules


@pytest.mark.usefixtures("clean_registry")
def test_third_party_map_loads_once_registered(tmp_path):
    student = linearize(tiny_model("llama"), ThirdPartyPRF, 8)
    assert feature_map_spec(next(iter(student.linear_modules().values())).feature_map)["class"] == (
        f"{__name__}.ThirdPartyPRF"
    )
    with pytest.warns(UserWarning, match="register_feature_map"):
        student.save_pretrained(tmp_path / "s")
    with pytest.raises(ValueError, match="register_feature_map"):
        load_student(tmp_path / "s")
    assert register_feature_map(ThirdPartyPRF) is ThirdPartyPRF
    register_feature_map(ThirdPartyPRF)  # idempotent
    loaded = load_student(tmp_path / "s")
    assert {type(t.feature_map) for t in loaded.linear_modules().values()} == {ThirdPartyPRF}


@pytest.mark.usefixtures("clean_registry")
def test_register_rejects_non_maps_and_name_clashes():
    with pytest.raises(TypeError, match="FeatureMap subclass"):
        register_feature_map(dict)

    class Other(LearnedPRF):
        pass

    with pytest.raises(ValueError, match="already registered"):
        register_feature_map(Other, aliases=["lit_dof.attention.LearnedPRF"])
    assert feature_map_class({"class": "lit_dof.attention.LearnedPRF"}) is LearnedPRF

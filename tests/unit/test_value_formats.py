"""Value formats: the codec registry (`distro.values.kinds.ValueKind`), the names runs choose
them by (`psyche_common.config.value_format`), and `value_format` against the older booleans
of the Distro and SparseLoCo tables."""

from __future__ import annotations

import pickle
import tomllib
from pathlib import Path
from typing import Any, get_args

import pytest
import tomli_w
from psyche_client.distro.values import ValueCodec, ValueKind, value_kind_named
from psyche_client.training.trainer import optimizer_settings
from psyche_common.config import (
    ConfigError,
    DistroOptimizer,
    SparseLocoOptimizer,
    parse_state,
    validate_state,
)
from psyche_common.config.optimizer import DISTRO_SPELLINGS, SPARSELOCO_SPELLINGS
from psyche_common.config.value_format import VALUE_FORMATS, ValueFormatConflict

from tests.unit.test_config_optimizers import SPARSELOCO, state_with

REPO_ROOT = Path(__file__).resolve().parents[2]
DISTRO: dict[str, Any] = tomllib.loads((REPO_ROOT / "state.toml.example").read_text())["model"][
    "LLM"
]["optimizer"]["Distro"]
BASE = "model.LLM.optimizer"


def test_every_kind_has_one_codec_and_the_config_knows_every_name() -> None:
    codecs = [kind.codec for kind in ValueKind]
    assert all(isinstance(codec, ValueCodec) for codec in codecs)
    assert len({type(codec) for codec in codecs}) == len(codecs)
    # the config's names (torch-free, for validate-config) are the codecs', in byte order
    assert tuple(codec.name for codec in codecs) == VALUE_FORMATS
    assert [int(kind) for kind in ValueKind] == list(range(len(codecs)))
    for kind in ValueKind:
        assert value_kind_named(kind.codec.name) is kind
        assert ValueKind(int(kind)) is kind
        assert pickle.loads(pickle.dumps(kind)) is kind  # LoadModel/Apply commands carry kinds
    with pytest.raises(ValueError, match="unknown value format '3-bit'"):
        value_kind_named("3-bit")


def test_only_signs_are_aggregated_without_normalisation() -> None:
    assert [k for k in ValueKind if not k.codec.carries_magnitudes] == [ValueKind.ONE_BIT]


def test_each_table_offers_the_formats_its_booleans_spell() -> None:
    for model, spellings in (
        (DistroOptimizer, DISTRO_SPELLINGS),
        (SparseLocoOptimizer, SPARSELOCO_SPELLINGS),
    ):
        offered = get_args(get_args(model.model_fields["value_format"].annotation)[0])
        assert offered == tuple(spellings)
        assert set(offered) <= set(VALUE_FORMATS)


@pytest.mark.parametrize("table", ["Distro", "SparseLoCo"])
def test_value_format_and_the_booleans_it_replaces_give_the_same_settings(table: str) -> None:
    base, spellings = (
        (DISTRO, DISTRO_SPELLINGS) if table == "Distro" else (SPARSELOCO, SPARSELOCO_SPELLINGS)
    )
    older = {field for spelled in spellings.values() for field in spelled}
    plain = {key: value for key, value in base.items() if key not in older}
    for name, spelled in spellings.items():
        named = state_with({table: {**plain, "value_format": name}})
        spelt = state_with({table: {**plain, **spelled}})
        assert validate_state(named).ok and validate_state(spelt).ok
        assert named.model.optimizer.resolved_value_format() == name  # type: ignore[union-attr]
        assert spelt.model.optimizer.resolved_value_format() == name  # type: ignore[union-attr]
        settings = optimizer_settings(named.model.optimizer)
        assert settings == optimizer_settings(spelt.model.optimizer)
        assert settings.value_kind is value_kind_named(name)  # type: ignore[attr-defined]
        # written back as it was given: value_format stays, no booleans appear
        toml = named.model.optimizer.to_toml()[table]
        assert toml["value_format"] == name and not older & set(toml)
        assert parse_state(tomllib.loads(tomli_w.dumps(named.to_toml_dict()))) == named


def test_value_format_with_agreeing_booleans_is_fine() -> None:
    # a reference Distro table that names value_format keeps its quantize_1bit
    state = state_with({"Distro": {**DISTRO, "quantize_1bit": False, "value_format": "2-bit"}})
    assert validate_state(state).ok
    assert optimizer_settings(state.model.optimizer).value_kind is ValueKind.TWO_BIT  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("table", "values", "field", "words"),
    [
        (
            "SparseLoCo",
            {"value_format": "4-bit", "quantize_2bit": True},
            "value_format",
            'value_format = "4-bit" contradicts model.LLM.optimizer.SparseLoCo.quantize_2bit = true',
        ),
        (
            "SparseLoCo",
            {"value_format": "2-bit", "quantize_codebook": True},
            "value_format",
            "contradicts model.LLM.optimizer.SparseLoCo.quantize_codebook = true",
        ),
        (
            "Distro",
            {"value_format": "bf16", "quantize_1bit": True},
            "value_format",
            "contradicts model.LLM.optimizer.Distro.quantize_1bit = true",
        ),
        (
            "Distro",
            {"quantize_1bit": True, "quantize_2bit": True},
            "quantize_2bit",
            "quantize_2bit and quantize_1bit cannot both be true",
        ),
    ],
)
def test_contradicting_spellings_are_an_error_naming_the_fields(
    table: str, values: dict[str, Any], field: str, words: str
) -> None:
    base = DISTRO if table == "Distro" else SPARSELOCO
    state = state_with({table: {**base, **values}})
    report = validate_state(state)
    assert [p.field for p in report.errors] == [f"{BASE}.{table}.{field}"]
    assert words in report.errors[0].message
    with pytest.raises(ValueFormatConflict, match=r"contradicts|cannot both"):
        optimizer_settings(state.model.optimizer)  # a client never trains with it either
    assert "value format in conflict" in str(state.model.optimizer)


@pytest.mark.parametrize(
    ("table", "main"), [("Distro", "quantize_1bit"), ("SparseLoCo", "quantize_2bit")]
)
def test_a_table_naming_no_value_format_is_refused(table: str, main: str) -> None:
    base = DISTRO if table == "Distro" else SPARSELOCO
    with pytest.raises(ConfigError, match=rf"needs value_format \(or the older {main}\)"):
        state_with({table: {k: v for k, v in base.items() if k != main}})


def test_a_format_the_table_cannot_send_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"SparseLoCo\.value_format"):
        state_with({"SparseLoCo": {**SPARSELOCO, "value_format": "1-bit"}})
    with pytest.raises(ConfigError, match=r"Distro\.value_format"):
        state_with({"Distro": {**DISTRO, "value_format": "4-bit"}})

"""Model I/O: sources (local dir, builtin presets, mocked Hub), seeded weights, hashes,
checkpoints that transformers reloads, raw parameter bytes, mocked Hub upload."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import CommitInfo
from psyche_client.training.model import loading as model_io
from psyche_client.training.model.device import DeviceError, resolve_device
from psyche_client.training.model.loading import (
    ModelLoadError,
    build_model_from_config,
    builtin_config,
    list_builtin_presets,
    load_model,
    load_parameter_bytes,
    model_parameters_manifest,
    parameter_bytes,
    save_checkpoint,
    upload_to_hub,
    weights_hash,
)
from transformers import AutoModelForCausalLM

torch.set_num_threads(1)
TINY = "builtin:llama-tiny"


def write_config_dir(path: Path, preset: str = "llama-tiny") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(builtin_config(preset)))
    return path


def test_presets_have_the_promised_sizes() -> None:
    assert {"llama-tiny", "llama-2m", "llama-20m"} <= set(list_builtin_presets())
    two_m = builtin_config("llama-2m")
    assert two_m["vocab_size"] == 256 and two_m["max_position_embeddings"] == 512
    _, tiny_info = load_model(TINY)
    assert 100_000 <= tiny_info.num_parameters <= 300_000
    _, info = load_model("builtin:llama-2m")
    assert 1_500_000 <= info.num_parameters <= 2_500_000
    assert info.kind == "builtin" and info.seeded and info.seed == model_io.DEFAULT_SEED


def test_unknown_preset_is_a_clear_error() -> None:
    with pytest.raises(ModelLoadError, match=r"builtin:nope.*llama-tiny"):
        load_model("builtin:nope")


def test_same_seed_same_hash_different_seed_different_hash() -> None:
    torch.manual_seed(0)
    a, _ = load_model(TINY, seed=7)
    torch.manual_seed(12345)  # the global RNG must not matter
    b, _ = load_model(TINY, seed=7)
    c, _ = load_model(TINY, seed=8)
    assert weights_hash(a) == weights_hash(b)
    assert weights_hash(a) != weights_hash(c)


def test_seeded_build_leaves_global_rng_alone() -> None:
    torch.manual_seed(99)
    expected = torch.rand(3)
    torch.manual_seed(99)
    load_model(TINY)
    assert torch.equal(torch.rand(3), expected)


def test_seeded_init_shape_of_values() -> None:
    model, _ = load_model(TINY)
    params = dict(model.named_parameters())
    assert torch.all(params["model.norm.weight"] == 1)
    std = params["model.embed_tokens.weight"].std().item()
    assert 0.015 < std < 0.025


def test_hash_changes_with_one_value() -> None:
    model, _ = load_model(TINY)
    before = weights_hash(model)
    with torch.no_grad():
        model.get_parameter("lm_head.weight")[0, 0] += 1e-3
    assert weights_hash(model) != before


def test_bf16_load() -> None:
    model, _ = load_model(TINY, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.training


def test_local_config_only_directory_is_seeded(tmp_path: Path) -> None:
    directory = write_config_dir(tmp_path / "cfg")
    model, info = load_model(str(directory), seed=model_io.DEFAULT_SEED)
    builtin, _ = load_model(TINY)
    assert info.kind == "local" and info.seeded
    assert weights_hash(model) == weights_hash(builtin)


def test_save_then_transformers_reload_equal(tmp_path: Path) -> None:
    model, _ = load_model(TINY, seed=3)
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text('{"version": "1.0"}')
    out = save_checkpoint(model, tmp_path / "ckpt", tokenizer_path=tokenizer)
    assert (out / "config.json").is_file()
    assert list(out.glob("*.safetensors"))
    assert (out / "tokenizer.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert weights_hash(reloaded) == weights_hash(model)
    # ... and through our own loader, as a local directory with weights.
    ours, info = load_model(str(out))
    assert not info.seeded and info.kind == "local"
    assert weights_hash(ours) == weights_hash(model)
    assert out / "tokenizer.json" in info.tokenizer_files


def test_hub_source_uses_snapshot_download(tmp_path: Path, monkeypatch) -> None:
    model, _ = load_model(TINY, seed=5)
    snapshot = save_checkpoint(model, tmp_path / "snapshot")
    calls: list[tuple[str, str | None]] = []

    def fake_snapshot_download(repo_id: str, revision: str | None = None, **_: object) -> str:
        calls.append((repo_id, revision))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    loaded, info = load_model("org/some-model", revision="abc123")
    assert calls == [("org/some-model", "abc123")]
    assert info.kind == "hub" and info.revision == "abc123" and not info.seeded
    assert weights_hash(loaded) == weights_hash(model)


def test_hub_failure_message(monkeypatch) -> None:
    def offline(repo_id: str, revision: str | None = None, **_: object) -> str:
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelLoadError) as err:
        load_model("org/missing")
    text = str(err.value)
    assert "could not download org/missing from the Hugging Face Hub" in text
    assert "network is unreachable" in text and "pass a local directory" in text


def test_a_repo_id_goes_to_the_hub_even_when_a_local_directory_has_its_name(
    tmp_path: Path, monkeypatch
) -> None:
    """Whoever sets the checkpoint's repo id must not point clients at their own disks: a
    repo id is never resolved as a local path; a local directory is written as a path."""
    write_config_dir(tmp_path / "org" / "model")
    monkeypatch.chdir(tmp_path)
    calls: list[str] = []

    def offline(repo_id: str, revision: str | None = None, **_: object) -> str:
        calls.append(repo_id)
        raise OSError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelLoadError, match="from the Hugging Face Hub"):
        load_model("org/model")
    assert calls == ["org/model"]
    for written_as_path in ("./org/model", str(tmp_path / "org" / "model")):
        _, info = load_model(written_as_path)
        assert info.kind == "local"
    assert calls == ["org/model"]


def test_a_missing_local_path_is_an_error_naming_it(tmp_path: Path, monkeypatch) -> None:
    def must_not_be_called(*_: object, **__: object) -> str:
        raise AssertionError("snapshot_download called for a local path")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", must_not_be_called)
    missing = str(tmp_path / "nothing-here")
    with pytest.raises(ModelLoadError, match="written as a local path but is not a directory"):
        load_model(missing)


def test_tied_embeddings_load_with_the_shared_tensor_once(tmp_path: Path) -> None:
    """A tied model (Llama-3.2 style) is seeded, hashed and saved with its shared tensor once,
    under the input embedding's name, and reloads tied."""
    config = builtin_config("llama-tiny") | {"tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model, info = load_model(str(tmp_path))
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    names = [entry.name for entry in model_parameters_manifest(model)]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    untied, _ = load_model(str(write_config_dir(tmp_path / "untied")))
    assert info.num_parameters == sum(p.numel() for p in untied.parameters()) - (
        untied.get_output_embeddings().weight.numel()
    )
    saved = save_checkpoint(model, tmp_path / "checkpoint")
    reloaded, reloaded_info = load_model(str(saved))
    assert not reloaded_info.seeded
    assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    assert weights_hash(reloaded) == weights_hash(model)


def test_a_model_that_is_no_causal_lm_is_refused_naming_its_type(tmp_path: Path) -> None:
    config = {"model_type": "t5", "vocab_size": 64, "d_model": 16, "num_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="model_type 't5' is not a causal language model"):
        load_model(str(tmp_path))


def test_parameter_bytes_round_trip() -> None:
    source, _ = load_model(TINY, seed=1, dtype=torch.bfloat16)
    target, _ = load_model(TINY, seed=2, dtype=torch.bfloat16)
    manifest = model_parameters_manifest(source)
    assert [e.name for e in manifest] == sorted(e.name for e in manifest)
    for name, dtype, shape, _sha in manifest:
        assert dtype == "bfloat16"
        assert tuple(source.get_parameter(name).shape) == shape
        load_parameter_bytes(target, name, parameter_bytes(source, name))
    assert weights_hash(target) == weights_hash(source)
    assert model_parameters_manifest(target) == manifest


def test_parameter_bytes_errors() -> None:
    model, _ = load_model(TINY)
    with pytest.raises(ValueError, match=r"model.norm.weight: got 3 bytes"):
        load_parameter_bytes(model, "model.norm.weight", b"abc")
    with pytest.raises(KeyError, match=r"no\.such"):
        parameter_bytes(model, "no.such")


def test_build_from_shared_config_json() -> None:
    """A late joiner rebuilds the model from the config JSON a peer shares."""
    model, _ = load_model(TINY)
    config = json.loads(model.config.to_json_string())
    rebuilt = build_model_from_config(config, seed=model_io.DEFAULT_SEED)
    assert weights_hash(rebuilt) == weights_hash(model)


def test_upload_to_hub_with_mocked_api(tmp_path: Path, monkeypatch) -> None:
    uploads: list[dict] = []

    class FakeApi:
        def __init__(self, token: str | None = None) -> None:
            self.token = token

        def upload_folder(self, **kwargs: object) -> CommitInfo:
            uploads.append({"token": self.token, **kwargs})
            url = f"https://huggingface.co/{kwargs['repo_id']}/commit/f00d"
            return CommitInfo(url, commit_message="", commit_description="", oid="f00d")

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    revision = upload_to_hub(tmp_path, "org/ckpt", "hf_token", commit_message="step 9")
    assert revision == "f00d"
    assert uploads == [
        {
            "token": "hf_token",
            "folder_path": str(tmp_path),
            "repo_id": "org/ckpt",
            "commit_message": "step 9",
        }
    ]


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else None
    if expected is None:
        assert resolve_device("auto").type in {"cpu", "mps"}
        with pytest.raises(DeviceError, match="CUDA is not available"):
            resolve_device("cuda:0")
    with pytest.raises(DeviceError, match="invalid --device"):
        resolve_device("tpu")
    with pytest.raises(DeviceError, match="cuda:N"):
        resolve_device("cuda:x")


def test_load_model_config_resolves_like_load_model(tmp_path: Path, monkeypatch) -> None:
    assert model_io.load_model_config("builtin:llama-tiny") == builtin_config("llama-tiny")
    (tmp_path / "config.json").write_text(json.dumps(builtin_config("llama-tiny")))
    assert model_io.load_model_config(str(tmp_path)) == builtin_config("llama-tiny")

    def offline(*args, **kwargs):
        raise OSError("offline")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(ModelLoadError, match=r"config\.json of someone/model@main"):
        model_io.load_model_config("someone/model", "main")


def test_raw_parameters_match_the_manifest_without_hashing() -> None:
    model = build_model_from_config(builtin_config("llama-tiny"), seed=3)
    rows = model_io.raw_parameters(model)
    manifest = model_parameters_manifest(model)
    assert [(name, dtype, shape) for name, dtype, shape, _ in rows] == [
        (entry.name, entry.dtype, entry.shape) for entry in manifest
    ]
    assert all(data == parameter_bytes(model, name) for name, _, _, data in rows)
    assert model_io.parameter_names(model) == {entry.name for entry in manifest}

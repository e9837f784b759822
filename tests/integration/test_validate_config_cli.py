"""`psyche-server validate-config`: exit codes, summary on stdout, errors and warnings on stderr."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
from click.testing import CliRunner
from psyche_server.cli import main

from tests.support.model_families import short_directory, write_family


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["validate-config", *args])
    return result.exit_code, result.stdout, result.stderr


def test_example_is_valid(repo_root: Path) -> None:
    code, out, err = run("--state", str(repo_root / "state.toml.example"))
    assert code == 0, err
    assert out.startswith("Configs are OK!")
    for words in (
        "run id:",
        "tiny-cpu-demo",
        "HfLlama",
        "builtin:llama-2m",
        "python-stdlib",
        "DisTrO",
        "total steps: 200",
        "8 samples",
        "3 to start an epoch",
    ):
        assert words in out
    assert err == ""


def test_sparseloco_example_is_valid_without_warnings(repo_root: Path) -> None:
    code, out, err = run("--state", str(repo_root / "state.sparseloco.toml.example"))
    assert code == 0, err
    assert out.startswith("Configs are OK!")
    assert "SparseLoCo (5 AdamW steps per round" in out and "top-k 32" in out
    assert err == ""


def test_every_fixture_validates(shared_fixtures: Path) -> None:
    for state in sorted((shared_fixtures / "configs").glob("*/state.toml")):
        args = ["--state", str(state)]
        data = state.parent / "data.toml"
        if data.exists():
            args += ["--data-config", str(data)]
        code, out, err = run(*args)
        assert code == 0, (state, err)
        assert "Configs are OK!" in out
        assert "Error" not in err


def test_solana_layout_needs_run_id(shared_fixtures: Path) -> None:
    path = shared_fixtures / "configs" / "solana-test" / "light-config.toml"
    code, out, err = run("--state", str(path))
    assert code == 1 and out == ""
    assert "run_id" in err and "--run-id" in err
    code, out, _ = run("--state", str(path), "--run-id", "light")
    assert code == 0 and "light" in out


def test_missing_data_dir_is_a_warning(repo_root: Path, tmp_path: Path) -> None:
    document = tomllib.loads((repo_root / "state.toml.example").read_text())
    document["model"]["LLM"]["data_location"] = {"Server": "127.0.0.1:20001"}
    state = tmp_path / "state.toml"
    state.write_text(tomli_w.dumps(document))
    data = tmp_path / "data.toml"
    data.write_text((repo_root / "data.toml.example").read_text())
    code, out, err = run("--state", str(state), "--data-config", str(data))
    assert code == 0
    assert "warning: data.toml dir" in err and "does not exist" in err
    assert str(tmp_path / "data" / "tokens") in out


def write_broken(repo_root: Path, tmp_path: Path, section: str, key: str, value: object) -> Path:
    document = tomllib.loads((repo_root / "state.toml.example").read_text())
    document[section][key] = value
    path = tmp_path / "state.toml"
    path.write_text(tomli_w.dumps(document))
    return path


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        (
            "config",
            "warmup_time",
            120,
            "config.warmup_time (120) must be less than config.epoch_time",
        ),
        ("config", "warmup_tme", 5, "config.warmup_tme: unknown key"),
        ("config", "min_clients", 70000, "config.min_clients: must be less than or equal to 65535"),
    ],
)
def test_errors_exit_1_and_name_the_field(
    repo_root: Path, tmp_path: Path, section: str, key: str, value: object, message: str
) -> None:
    path = write_broken(repo_root, tmp_path, section, key, value)
    code, out, err = run("--state", str(path))
    assert code == 1
    assert out == ""
    assert "Error found in config" in err and message in err


def test_seq_len_mismatch_is_an_error(repo_root: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.toml"
    document = tomllib.loads((repo_root / "data.toml.example").read_text())
    document["seq_len"] = 512
    data.write_text(tomli_w.dumps(document))
    code, _, err = run("--state", str(repo_root / "state.toml.example"), "--data-config", str(data))
    assert code == 1
    assert "data.toml seq_len (512) must equal model.LLM.max_seq_len (256)" in err


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "state.toml"
    path.write_text("[config\n")
    code, _, err = run("--state", str(path))
    assert code == 1 and "not valid TOML" in err
    code, _, err = run("--state", str(tmp_path / "absent.toml"))
    assert code == 2 and "does not exist" in err


def test_installed_entry_point(repo_root: Path) -> None:
    script = Path(sys.executable).parent / "psyche-server"
    if not script.exists():
        pytest.skip("psyche-server is not installed next to this Python")
    completed = subprocess.run(
        [str(script), "validate-config", "--state", str(repo_root / "state.toml.example")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    assert "Configs are OK!" in completed.stdout


def test_a_model_the_architecture_does_not_train_is_refused(
    repo_root: Path, tmp_path: Path
) -> None:
    """A Qwen2 directory (tied embeddings, as Qwen2.5-0.5B ships) under HfLlama is refused with
    the fix; under HfAuto it validates."""
    with short_directory() as directory:
        model = write_family(directory / "qwen2", "qwen2-tied")
        document = tomllib.loads((repo_root / "state.toml.example").read_text())
        document["model"]["LLM"]["checkpoint"] = {"Hub": {"repo_id": str(model)}}
        path = tmp_path / "state.toml"
        path.write_text(tomli_w.dumps(document))
        code, _, err = run("--state", str(path))
        assert code == 1
        assert "model.LLM.architecture \"HfLlama\" trains model_type 'llama'" in err
        assert 'set architecture = "HfAuto"' in err
        document["model"]["LLM"]["architecture"] = "HfAuto"
        path.write_text(tomli_w.dumps(document))
        code, out, err = run("--state", str(path))
        assert code == 0, err
        assert out.startswith("Configs are OK!")


def test_data_that_runs_out_is_a_warning_naming_both_numbers(
    repo_root: Path, tmp_path: Path
) -> None:
    """24 sequences for 199 steps x 8 samples: still OK (a warning), both numbers named."""
    tokens = tmp_path / "data" / "tokens"
    tokens.mkdir(parents=True)
    (tokens / "part.bin").write_bytes(bytes(2 * 256 * 24))  # 24 sequences of 256 u16 tokens
    document = tomllib.loads((repo_root / "state.toml.example").read_text())
    document["model"]["LLM"]["data_location"] = {"Server": "127.0.0.1:20001"}
    state = tmp_path / "state.toml"
    state.write_text(tomli_w.dumps(document))
    data = tmp_path / "data.toml"
    data.write_text((repo_root / "data.toml.example").read_text())
    code, out, err = run("--state", str(state), "--data-config", str(data))
    assert code == 0 and out.startswith("Configs are OK!")
    assert "warning: the run needs 1,592 samples" in err and "holds 24" in err, err
    document["config"]["total_steps"] = 4  # 3 trained steps x 8 = 24: enough
    state.write_text(tomli_w.dumps(document))
    code, _, err = run("--state", str(state), "--data-config", str(data))
    assert code == 0 and err == ""


def test_what_the_client_cannot_run_is_named(repo_root: Path, tmp_path: Path) -> None:
    document = tomllib.loads((repo_root / "state.toml.example").read_text())
    document["model"]["LLM"]["architecture"] = "Torchtitan"
    document["model"]["LLM"]["checkpoint"] = {"Hub": {"repo_id": "builtin:llama-9m"}}
    state = tmp_path / "state.toml"
    state.write_text(tomli_w.dumps(document))
    code, out, err = run("--state", str(state))
    assert code == 1 and out == ""
    assert 'warning: model.LLM.architecture "Torchtitan" is not used' in err
    assert "model.LLM.checkpoint.Hub.repo_id 'builtin:llama-9m' is not a model preset" in err


def test_the_shipped_dolma_layout_warns_that_run_finds_no_token_file(
    shared_fixtures: Path,
) -> None:
    """Its data.toml's dir holds the token file one folder down, which the data server (as
    the reference's) does not read: validate-config says so before `run` fails."""
    config = shared_fixtures / "configs" / "llama2-20m-dolma-noverify-no-checkpointer"
    code, out, err = run(
        "--state", str(config / "state.toml"), "--data-config", str(config / "data.toml")
    )
    assert code == 0 and out.startswith("Configs are OK!")
    assert "warning: No training data files in directory" in err
    assert "only the top-level files of data.toml's dir are read" in err

"""`psyche-client` command line: help texts, identity sources, checkpoint retention."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from psyche_client.cli import main
from psyche_client.weights.sharing import prune_checkpoints
from psyche_common.pacing import MEGABIT
from psyche_common.protocol import Identity

TRAIN_FLAGS = [
    "--server-addr",
    "--run-id",
    "--identity-secret-key-path",
    "--bind-p2p-port",
    "--bind-p2p-interface",
    "--device",
    "--micro-batch-size",
    "--checkpoint-dir",
    "--hub-repo",
    "--logs",
    "--write-log",
    "--write-gradients-dir",
    "--max-concurrent-parameter-requests",
    "--max-concurrent-downloads",
    "--data-fetch-attempts",
    "--data-fetch-retry-delay",
    "--server-reconnect-timeout",
    "--dummy-training-delay-secs",
    "--max-upload-mbps",
    "--dummy-seconds-per-sample",
    "--dummy-result-size",
    "--dummy-model-size",
    "--eval-tasks",
    "--eval-tasks-dir",
    "--eval-fewshot",
    "--eval-seed",
    "--eval-task-max-docs",
    "--eval-heldout-every",
    "--wandb-project",
    "--wandb-run",
    "--wandb-group",
    "--wandb-entity",
    "--optim-stats-steps",
]


def test_train_help_explains_every_flag() -> None:
    result = CliRunner().invoke(main, ["train", "--help"], terminal_width=200)
    assert result.exit_code == 0
    helps = {opt: param.help for param in main.commands["train"].params for opt in param.opts}
    for flag in TRAIN_FLAGS:
        assert flag in result.output, flag
        assert helps.get(flag) and len(helps[flag]) > 20, f"{flag} has no explanation"


def test_server_reconnect_timeout_reaches_the_client_options(monkeypatch) -> None:
    import psyche_client.cli as cli

    seen = []
    monkeypatch.setattr(cli, "_run", lambda options, *_: seen.append(options) or 0)
    base = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    runner = CliRunner()
    assert runner.invoke(main, base).exit_code == 0
    assert runner.invoke(main, [*base, "--server-reconnect-timeout", "0"]).exit_code == 0
    env = {"SERVER_RECONNECT_TIMEOUT": "45.5"}
    assert runner.invoke(main, base, env=env).exit_code == 0
    assert [o.server.reconnect_timeout for o in seen] == [600.0, 0.0, 45.5]
    refused = runner.invoke(main, [*base, "--server-reconnect-timeout", "-1"])
    assert refused.exit_code == 2 and "--server-reconnect-timeout" in refused.output


def test_wandb_and_optim_stats_flags_reach_the_client_options(monkeypatch) -> None:
    import psyche_client.cli as cli

    seen = []
    monkeypatch.setattr(cli, "_run", lambda options, *_: seen.append(options) or 0)
    base = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    runner = CliRunner()
    assert runner.invoke(main, base).exit_code == 0
    wandb = ["--wandb-project", "p", "--wandb-run", "r", "--wandb-group", "g"]
    assert runner.invoke(main, [*base, *wandb, "--optim-stats-steps", "5"]).exit_code == 0
    env = {"WANDB_PROJECT": "q", "WANDB_ENTITY": "team", "OPTIM_STATS_STEPS": "2"}
    assert runner.invoke(main, base, env=env).exit_code == 0
    metrics = [
        (
            o.metrics.wandb_project,
            o.metrics.wandb_run,
            o.metrics.wandb_group,
            o.metrics.wandb_entity,
        )
        for o in seen
    ]
    assert metrics == [(None, None, None, None), ("p", "r", "g", None), ("q", None, None, "team")]
    assert [o.backend.optim_stats_steps for o in seen] == [0, 5, 2]
    assert seen[0].metrics.run_name("x", "ab12") == "x-ab12"
    refused = runner.invoke(main, [*base, "--wandb-group", "g", "--wandb-run", "r"])
    assert refused.exit_code == 2
    assert "--wandb-run, --wandb-group needs --wandb-project" in refused.output
    refused = runner.invoke(main, [*base, "--optim-stats-steps", "-1"])
    assert refused.exit_code == 2 and "--optim-stats-steps" in refused.output


def test_advertise_addr_reaches_the_p2p_address(monkeypatch) -> None:
    import psyche_client.cli as cli

    seen = []
    monkeypatch.setattr(cli, "_run", lambda options, *_: seen.append(options) or 0)
    base = ["train", "--server-addr", "10.9.9.9:1", "--run-id", "x"]
    runner = CliRunner()
    assert runner.invoke(main, [*base, "--advertise-addr", "203.0.113.7:4000"]).exit_code == 0
    env = {"ADVERTISE_ADDR": "[2001:db8::1]:4001"}
    assert runner.invoke(main, base, env=env).exit_code == 0
    assert [(o.p2p.advertise_host, o.p2p.advertise_port) for o in seen] == [
        ("203.0.113.7", 4000),
        ("2001:db8::1", 4001),
    ]
    refused = runner.invoke(main, [*base, "--advertise-addr", "no-port"])
    assert refused.exit_code == 2 and "--advertise-addr" in refused.output


def test_data_fetch_retry_flags_reach_the_client_options(monkeypatch) -> None:
    import psyche_client.cli as cli

    seen = []
    monkeypatch.setattr(cli, "_run", lambda options, *_: seen.append(options) or 0)
    base = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    runner = CliRunner()
    assert runner.invoke(main, base).exit_code == 0
    flags = ["--data-fetch-attempts", "3", "--data-fetch-retry-delay", "0.5"]
    assert runner.invoke(main, [*base, *flags]).exit_code == 0
    env = {"DATA_FETCH_ATTEMPTS": "2", "DATA_FETCH_RETRY_DELAY": "0"}
    assert runner.invoke(main, base, env=env).exit_code == 0
    assert [(o.data.attempts, o.data.delay_step) for o in seen] == [
        (7, 2.0),
        (3, 0.5),
        (2, 0.0),
    ]
    refused = runner.invoke(main, [*base, "--data-fetch-attempts", "0"])
    assert refused.exit_code != 0 and "--data-fetch-attempts" in refused.output
    negative = runner.invoke(main, [*base, "--data-fetch-retry-delay", "-1"])
    assert negative.exit_code != 0 and "--data-fetch-retry-delay" in negative.output


def test_max_upload_mbps_caps_the_nodes_model_share_uploads(monkeypatch) -> None:
    import psyche_client.cli as cli
    from psyche_client.app import ClientApp

    seen = []
    monkeypatch.setattr(cli, "_run", lambda options, *_: seen.append(options) or 0)
    base = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    runner = CliRunner()
    assert runner.invoke(main, base).exit_code == 0
    assert runner.invoke(main, [*base, "--max-upload-mbps", "8"]).exit_code == 0
    assert runner.invoke(main, base, env={"MAX_UPLOAD_MBPS": "2.5"}).exit_code == 0
    assert [o.p2p.max_upload_rate for o in seen] == [None, 8.0 * MEGABIT, 2.5 * MEGABIT]
    rates = [ClientApp(o).node.shaper.rate for o in seen]
    assert rates == [None, 1_000_000.0, 312_500.0]  # bytes/s
    refused = runner.invoke(main, [*base, "--max-upload-mbps", "0.5"])
    assert refused.exit_code == 2 and "--max-upload-mbps" in refused.output


@pytest.mark.parametrize(
    ("content", "why"),
    [(None, "No such file"), (b"", "got 0 bytes"), (b"\xb0" * 5, "64 hex characters")],
    ids=["missing", "empty", "garbage"],
)
@pytest.mark.parametrize("command", ["show-identity", "train"])
def test_a_bad_key_file_is_a_usage_error_naming_the_flag(
    tmp_path: Path, content: bytes | None, why: str, command: str
) -> None:
    """Not a traceback: exit status 2 with the flag and the reason."""
    key = tmp_path / "client.key"
    if content is not None:
        key.write_bytes(content)
    args = [command, "-i", str(key)]
    if command == "train":
        args += [
            "--server-addr",
            "127.0.0.1:1",
            "--run-id",
            "r",
            "--dummy-training-delay-secs",
            "0",
        ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "--identity-secret-key-path" in result.output and why in result.output
    assert "Traceback" not in result.output


def test_show_identity_from_file_and_env(tmp_path: Path) -> None:
    identity = Identity.generate()
    key = tmp_path / "key"
    identity.save(key)
    runner = CliRunner()
    out = runner.invoke(main, ["show-identity", "-i", str(key)])
    assert out.exit_code == 0 and identity.public_key.hex() in out.output
    env = {"RAW_IDENTITY_SECRET_KEY": identity.secret_bytes().hex()}
    out = runner.invoke(main, ["show-identity"], env=env)
    assert identity.public_key.hex() in out.output
    bad = runner.invoke(main, ["show-identity"], env={"RAW_IDENTITY_SECRET_KEY": "zz"})
    assert bad.exit_code != 0 and "RAW_IDENTITY_SECRET_KEY" in bad.output


def test_hub_repo_needs_checkpoint_dir() -> None:
    result = CliRunner().invoke(
        main, ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x", "--hub-repo", "a/b"]
    )
    assert result.exit_code != 0 and "--checkpoint-dir" in result.output


def test_check_estimates_the_example_state(repo_root: Path) -> None:
    result = CliRunner().invoke(
        main, ["check", "--state", str(repo_root / "state.toml.example"), "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    assert "fits" in result.output
    assert "(float32)" in result.output  # the CPU default
    bf16 = CliRunner().invoke(
        main,
        [
            "check",
            "--state",
            str(repo_root / "state.toml.example"),
            "--device",
            "cpu",
            "--dtype",
            "bf16",
            "--grad-accum-in-fp32",
        ],
    )
    assert bf16.exit_code == 0, bf16.output
    assert "(bfloat16)" in bf16.output and "fp32 gradient sums" in bf16.output


def test_prune_keeps_the_newest_steps(tmp_path: Path) -> None:
    for step in (3, 10, 7, 12):
        (tmp_path / f"run-step{step}").mkdir()
    (tmp_path / "other-step1").mkdir()
    prune_checkpoints(tmp_path, "run", 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-step1", "run-step10", "run-step12"]


def test_bind_interface_by_address_name_or_prefix() -> None:
    import click
    import pytest
    from psyche_client.cli import _interface_address

    assert _interface_address("10.1.2.3") == "10.1.2.3"
    assert _interface_address("lo") == "127.0.0.1"
    assert _interface_address("l*") == "127.0.0.1"
    with pytest.raises(click.BadParameter, match="no IPv4 interface"):
        _interface_address("no-such-if0")


def test_every_option_of_every_command_has_help() -> None:
    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, f"{name} {param.opts[0]} has no help text"


def test_write_log_gets_the_json_lines(tmp_path: Path) -> None:
    import logging

    log_file = tmp_path / "client.jsonl"
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        result = CliRunner().invoke(
            main,
            [
                "train",
                "--server-addr",
                "127.0.0.1:1",
                "--run-id",
                "x",
                "--logs",
                "json",
                "--write-log",
                str(log_file),
                "--dummy-training-delay-secs",
                "0.1",
            ],
        )
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
            handler.close()
    assert result.exit_code == 1, result.output
    assert "cannot connect to server 127.0.0.1:1" in log_file.read_text()


def test_check_reports_memory_per_device_for_a_sharded_client(repo_root: Path) -> None:
    state = str(repo_root / "state.toml.example")
    args = ["check", "--state", state, "--device", "cpu", "--data-parallelism", "2", "--fsdp"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "2 ranks on cpu, model sharded (--fsdp)" in result.output
    assert "memory per device: parameter shards" in result.output
    refused = CliRunner().invoke(main, ["check", "--state", state, "--fsdp"])
    assert refused.exit_code != 0 and "data_parallelism >= 2" in refused.output


def test_train_refuses_fsdp_without_several_ranks() -> None:
    result = CliRunner().invoke(
        main, ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x", "--fsdp"]
    )
    assert result.exit_code != 0 and "data_parallelism >= 2" in result.output


def test_train_refuses_dummy_training_on_several_ranks() -> None:
    args = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    args += ["--data-parallelism", "2", "--dummy-training-delay-secs", "0.1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "trains no model on several ranks" in result.output


def test_train_refuses_seconds_per_sample_without_the_dummy_backend() -> None:
    args = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    result = CliRunner().invoke(main, [*args, "--dummy-seconds-per-sample", "0.1"])
    assert result.exit_code != 0
    assert "--dummy-seconds-per-sample needs --dummy-training-delay-secs" in result.output


def test_train_refuses_a_rank_count_other_than_torchruns(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    args = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x", "--data-parallelism", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "differs from torchrun's WORLD_SIZE 4" in result.output


def test_log_level_reaches_the_logging_setup(monkeypatch) -> None:
    import psyche_client.cli as cli

    levels = []
    monkeypatch.setattr(
        cli, "_run", lambda _options, _logs, _write_log, level, _parts: levels.append(level) or 0
    )
    base = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    runner = CliRunner()
    assert runner.invoke(main, base).exit_code == 0
    assert runner.invoke(main, [*base, "--log-level", "DEBUG"]).exit_code == 0
    assert runner.invoke(main, base, env={"LOG_LEVEL": "warning"}).exit_code == 0
    assert levels == ["info", "debug", "warning"]
    refused = runner.invoke(main, [*base, "--log-level", "loud"])
    assert refused.exit_code == 2 and "--log-level" in refused.output


def test_check_refuses_a_model_the_architecture_does_not_train(
    repo_root: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state.toml"
    example = (repo_root / "state.toml.example").read_text()
    state.write_text(example.replace('architecture = "HfLlama"', 'architecture = "HfDeepseek"'))
    result = CliRunner().invoke(main, ["check", "--state", str(state), "--device", "cpu"])
    assert result.exit_code != 0
    assert 'model.LLM.architecture "HfDeepseek" trains' in result.output
    assert 'set architecture = "HfLlama"' in result.output


def test_tensor_parallelism_other_than_1_is_refused_pointing_to_fsdp(monkeypatch) -> None:
    import psyche_client.cli as cli

    seen = []
    monkeypatch.setattr(cli, "_run", lambda options, *_: seen.append(options) or 0)
    base = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    runner = CliRunner()
    assert runner.invoke(main, [*base, "--tensor-parallelism", "1"]).exit_code == 0
    assert len(seen) == 1  # the reference's default: accepted, changes nothing
    refused = runner.invoke(main, [*base, "--tensor-parallelism", "4"])
    assert refused.exit_code == 2 and len(seen) == 1  # nothing started
    assert "tensor parallelism is not supported" in refused.output
    assert "--data-parallelism 4 --fsdp" in refused.output
    from_env = runner.invoke(main, base, env={"TENSOR_PARALLELISM": "2"})
    assert from_env.exit_code == 2 and "--data-parallelism 2 --fsdp" in from_env.output


def test_eval_flags_reach_the_client_options(monkeypatch, tmp_path: Path) -> None:
    import psyche_client.cli as cli

    seen = []
    monkeypatch.setattr(cli, "_run", lambda options, *_: seen.append(options) or 0)
    base = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    runner = CliRunner()
    assert runner.invoke(main, base).exit_code == 0
    flags = [
        *("--eval-tasks", "arc_easy, piqa", "--eval-fewshot", "5", "--eval-seed", "7"),
        *("--eval-task-max-docs", "100", "--eval-tasks-dir", str(tmp_path)),
        *("--eval-heldout-every", "10"),
    ]
    assert runner.invoke(main, [*base, *flags]).exit_code == 0
    off, on = (o.evals for o in seen)
    assert not off.enabled and off.seed == 42 and off.max_docs is None
    assert (on.tasks, on.fewshot, on.seed, on.max_docs) == (("arc_easy", "piqa"), 5, 7, 100)
    assert (on.tasks_dir, on.heldout_every) == (tmp_path, 10)
    dummy = runner.invoke(main, [*base, *flags, "--dummy-training-delay-secs", "0.1"])
    assert dummy.exit_code != 0 and "--eval-*" in dummy.output
    missing = runner.invoke(main, [*base, "--eval-tasks-dir", str(tmp_path / "nope")])
    assert missing.exit_code != 0 and "--eval-tasks-dir" in missing.output


def test_server_key_reaches_the_server_options(monkeypatch) -> None:
    import psyche_client.cli as cli

    seen = []
    monkeypatch.setattr(cli, "_run", lambda options, *_: seen.append(options) or 0)
    base = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    key = bytes(range(32))
    runner = CliRunner()
    assert runner.invoke(main, base).exit_code == 0
    assert runner.invoke(main, [*base, "--server-key", key.hex()]).exit_code == 0
    assert runner.invoke(main, base, env={"SERVER_KEY": "0x" + key.hex()}).exit_code == 0
    assert [o.server.server_key for o in seen] == [None, key, key]
    refused = runner.invoke(main, [*base, "--server-key", "abcd"])
    assert refused.exit_code == 2 and "Invalid value for '--server-key'" in refused.output
    assert "64 hex characters" in refused.output

"""Pure parts of the local testnet: summary of client logs, kill schedules (clients and the
server), identities, command lines, the saved state a server restart resumes from and the
embedded default config."""

from __future__ import annotations

import json
import random
import shlex
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from psyche_common.config import parse_state, validate_state
from psyche_common.protocol.identity import Identity
from psyche_local_testnet import testnet as testnet_module
from psyche_local_testnet.commands import TestnetCommands as Commands
from psyche_local_testnet.commands import latest_state_name
from psyche_local_testnet.default_config import render_default_state
from psyche_local_testnet.identities import client_secret_hex, client_secret_key
from psyche_local_testnet.kills import (
    KillScheduler,
    ServerKillSchedule,
    check_kill_options,
    check_server_kill,
    planned_server_kill,
)
from psyche_local_testnet.server_eras import server_eras
from psyche_local_testnet.server_restart import ServerRestartError, read_resume_step
from psyche_local_testnet.summary import (
    ClientLogRecord,
    ServerRestart,
    line_reports_finished,
    log_file_name,
    parse_log_lines,
    read_client_logs,
    server_log_reports_finished,
    summarize,
)


def line(step: int, loss: float | None, digest: str | None, **extra: object) -> str:
    fields = {
        "client_id": "aa",
        "epoch": 0,
        "step": step,
        "state": "RoundTrain",
        "loss": loss,
        "weights_hash": digest,
        "msg": "step applied",
        **extra,
    }
    return json.dumps(fields)


def records(client: int, incarnation: int, lines: list[str]) -> list[ClientLogRecord]:
    return parse_log_lines(lines, client, incarnation)


def test_summary_of_agreeing_clients() -> None:
    logs = records(1, 0, [line(s, 5.0 - s, f"h{s}") for s in range(1, 6)])
    logs += records(2, 0, [line(s, 5.2 - s, f"h{s}") for s in range(2, 6)])
    summary = summarize(logs, kills=0)
    assert (summary.first_step, summary.last_step) == (1, 5)
    assert summary.loss_start == pytest.approx(4.0)
    assert summary.loss_end == pytest.approx((0.0 + 0.2) / 2)
    assert summary.hash_points_compared == 4  # steps 2..5 have two reporters
    assert summary.hashes_agree and summary.advanced and summary.ok
    assert summary.final_line().startswith("summary: {")
    assert json.loads(summary.final_line().removeprefix("summary: "))["ok"] is True


def test_summary_detects_disagreement() -> None:
    logs = records(1, 0, [line(s, 1.0, f"h{s}") for s in range(1, 4)])
    logs += records(2, 0, [line(s, 1.0, "x" if s == 2 else f"h{s}") for s in range(1, 4)])
    summary = summarize(logs)
    assert summary.hash_mismatches == ["step 2 epoch 0 (step applied)"]
    assert not summary.hashes_agree and not summary.ok
    assert any("DISAGREE" in text for text in summary.render_lines())


def test_hashes_compared_per_log_statement() -> None:
    """Different statements at one step may log different hashes (before/after apply)."""
    logs = records(1, 0, [line(3, None, "before", msg="start"), line(3, 1.0, "after")])
    logs += records(2, 0, [line(3, None, "before", msg="start"), line(3, 1.0, "after")])
    summary = summarize(logs)
    assert summary.hash_points_compared == 2 and summary.hashes_agree


def test_summary_without_enough_data_is_not_ok() -> None:
    one = summarize(records(1, 0, [line(1, 3.0, "h"), line(2, 2.0, "h2")]))
    assert one.advanced and not one.hashes_agree and not one.ok  # nothing to compare
    empty = summarize([])
    assert empty.first_step is None and not empty.advanced and not empty.ok
    stuck = summarize(records(1, 0, [line(4, 3.0, "h")]) + records(2, 0, [line(4, 3.0, "h")]))
    assert stuck.hashes_agree and not stuck.advanced and not stuck.ok


def test_rejoins_count_restarted_incarnations_that_trained() -> None:
    logs = records(2, 0, [line(1, 2.0, "a")])
    logs += records(2, 1, [line(5, 1.0, "b")])  # came back and trained
    logs += records(3, 1, [json.dumps({"msg": "loading model", "step": 5})])  # came back, no loss
    assert summarize(logs, kills=2).rejoins == 1
    assert summarize(logs, kills=2).kills == 2


def test_parsing_skips_garbage_and_wrong_types() -> None:
    lines = [
        "not json",
        "[1, 2]",
        "{broken",
        line(1, 2.0, "h"),
        json.dumps({"step": "7", "loss": "high", "weights_hash": 5, "state": "Finished"}),
    ]
    parsed = records(1, 0, lines)
    assert len(parsed) == 2
    assert parsed[1].step is None and parsed[1].loss is None and parsed[1].weights_hash is None
    assert summarize(parsed).finished


def test_read_client_logs_uses_file_names(tmp_path: Path) -> None:
    (tmp_path / log_file_name(3, 2)).write_text(line(9, 1.0, "h") + "\n")
    (tmp_path / "server.log").write_text(line(1, 1.0, "h") + "\n")
    (tmp_path / "client-x.jsonl").write_text(line(1, 1.0, "h") + "\n")
    [record] = read_client_logs(tmp_path)
    assert (record.client_number, record.incarnation, record.step) == (3, 2, 9)


def test_kill_scheduler_timing_and_victims() -> None:
    scheduler = KillScheduler(5, 2, 10.0, allowed=[2, 4, 5], rng=random.Random(1), start=100.0)
    assert not scheduler.due(105.0) and scheduler.take_victims(105.0) == []
    victims = scheduler.take_victims(110.0)
    assert len(victims) == 2 and set(victims) <= {2, 4, 5}
    assert scheduler.take_victims(115.0) == []
    assert len(scheduler.take_victims(120.0)) == 2
    everyone = KillScheduler(3, 3, 1.0, rng=random.Random(0))
    assert everyone.take_victims(1.0) == [1, 2, 3]


def test_kill_options_are_validated() -> None:
    with pytest.raises(ValueError, match="--random-kill-num 3"):
        check_kill_options(2, 3, [])
    with pytest.raises(ValueError, match=r"--random-kill-num 2 .* 1 client"):
        check_kill_options(4, 2, [3])
    with pytest.raises(ValueError, match=r"outside 1\.\.3"):
        check_kill_options(3, 1, [0, 4])
    check_kill_options(3, None, [])
    with pytest.raises(ValueError, match="interval"):
        KillScheduler(3, 1, 0.0)


def test_identities_are_deterministic_per_session() -> None:
    assert client_secret_key("s", 1) == client_secret_key("s", 1)
    assert client_secret_key("s", 1) != client_secret_key("s", 2)
    assert client_secret_key("s", 1) != client_secret_key("t", 1)
    assert len(client_secret_hex("s", 1)) == 64
    identity = Identity.from_secret_bytes(client_secret_key("s", 1))
    assert len(identity.public_key) == 32
    with pytest.raises(ValueError):
        client_secret_key("s", 0)


def make_commands(**overrides: object) -> Commands:
    values: dict = dict(
        server_program=["psyche-server"],
        client_program=["py", "client.py"],
        state_path=Path("/r/state.toml"),
        data_config_path=None,
        server_port=20000,
        run_id="demo",
        session="sess",
        log_dir=Path("/r/logs"),
    )
    values.update(overrides)
    return Commands(**values)


def test_command_lines_follow_the_contract() -> None:
    commands = make_commands(first_client_checkpoint="org/ckpt", checkpoint_dir=Path("/r/ck"))
    assert commands.validate() == ["psyche-server", "validate-config", "--state", "/r/state.toml"]
    server = commands.server().argv
    assert server[:6] == [
        "psyche-server",
        "run",
        "--state",
        "/r/state.toml",
        "--server-port",
        "20000",
    ]
    assert "--no-tui" in server and server[server.index("--log-format") + 1] == "json"
    first = commands.client(1, Path("/r/logs/client-1.0.jsonl"))
    assert first.argv[:3] == ["py", "client.py", "train"]
    assert first.argv[first.argv.index("--server-addr") + 1] == "127.0.0.1:20000"
    assert first.argv[first.argv.index("--hub-repo") + 1] == "org/ckpt"
    assert first.env["RAW_IDENTITY_SECRET_KEY"] == client_secret_hex("sess", 1)
    second = commands.client(2, None)
    assert "--hub-repo" not in second.argv and "--write-log" not in second.argv
    # the server accepts the Checkpoint reports of client 1, and only its
    checkpointer = server[server.index("--checkpointer") + 1]
    secret = bytes.fromhex(first.env["RAW_IDENTITY_SECRET_KEY"])
    assert checkpointer == Identity.from_secret_bytes(secret).public_key.hex()
    assert server.count("--checkpointer") == 1
    assert "--checkpointer" not in make_commands().server().argv
    shell = shlex.split(second.shell_command())
    assert shell[:2] == ["exec", "env"] and shell[2].startswith("RAW_IDENTITY_SECRET_KEY=")


def test_clients_get_the_metrics_flags() -> None:
    from psyche_client.app.flags import FLAGS
    from psyche_local_testnet.commands import ClientMetrics

    metrics = ClientMetrics("proj", "demo", "grp", "team", 5)
    commands = make_commands(metrics=metrics)
    second = commands.client(2, None).argv
    forwarded = second[second.index("--wandb-project") :]
    pairs = dict(zip(forwarded[::2], forwarded[1::2], strict=True))
    assert pairs == {
        "--wandb-project": "proj",
        "--wandb-run": "demo-2",
        "--wandb-group": "grp",
        "--wandb-entity": "team",
        "--optim-stats-steps": "5",
    }
    # every forwarded flag is one psyche-client train takes (the reference's testnet forwarded
    # an --optim-stats its client does not know)
    assert set(pairs) <= {flag.name for flag in FLAGS}
    assert "--wandb-project" not in make_commands().client(1, None).argv
    assert ClientMetrics(optim_stats_steps=2).argv(1) == ["--optim-stats-steps", "2"]
    with pytest.raises(ValueError, match="--wandb-group needs --wandb-project"):
        ClientMetrics(wandb_group="g")


def test_start_forwards_the_metrics_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner
    from psyche_local_testnet.cli import main

    seen: list[testnet_module.TestnetOptions] = []

    def run(self: testnet_module.Testnet) -> int:
        seen.append(self.options)
        return 0

    monkeypatch.setattr(testnet_module.Testnet, "run", run)
    args = ["start", "--num-clients", "2", "--wandb-project", "p", "--optim-stats-steps", "3"]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert seen[0].metrics.argv(1) == ["--wandb-project", "p", "--optim-stats-steps", "3"]
    refused = CliRunner().invoke(main, ["start", "--num-clients", "2", "--wandb-entity", "e"])
    assert refused.exit_code == 2 and "--wandb-entity needs --wandb-project" in refused.output


def test_clients_get_the_eval_flags(tmp_path: Path) -> None:
    from psyche_client.app.flags import FLAGS
    from psyche_local_testnet.commands import ClientMetrics

    metrics = ClientMetrics(
        eval_tasks="arc_easy,tiny",
        eval_tasks_dir=tmp_path,
        eval_fewshot=2,
        eval_task_max_docs=50,
        eval_heldout_every=4,
    )
    argv = make_commands(metrics=metrics).client(1, None).argv
    forwarded = argv[argv.index("--eval-tasks") :]
    pairs = dict(zip(forwarded[::2], forwarded[1::2], strict=True))
    assert pairs == {
        "--eval-tasks": "arc_easy,tiny",
        "--eval-tasks-dir": str(tmp_path),
        "--eval-fewshot": "2",
        "--eval-task-max-docs": "50",
        "--eval-heldout-every": "4",
    }
    assert set(pairs) <= {flag.name for flag in FLAGS}
    assert ClientMetrics(eval_heldout_every=3).argv(1) == ["--eval-heldout-every", "3"]
    with pytest.raises(ValueError, match="--eval-fewshot needs --eval-tasks"):
        ClientMetrics(eval_fewshot=1)


def test_start_forwards_the_eval_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from click.testing import CliRunner
    from psyche_local_testnet.cli import main

    seen: list[testnet_module.TestnetOptions] = []

    def run(self: testnet_module.Testnet) -> int:
        seen.append(self.options)
        return 0

    monkeypatch.setattr(testnet_module.Testnet, "run", run)
    args = ["start", "--num-clients", "2", "--eval-tasks", "t", "--eval-tasks-dir", str(tmp_path)]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert seen[0].metrics.argv(1) == ["--eval-tasks", "t", "--eval-tasks-dir", str(tmp_path)]
    refused = CliRunner().invoke(main, ["start", "--num-clients", "2", "--eval-task-max-docs", "3"])
    assert refused.exit_code == 2 and "--eval-task-max-docs needs --eval-tasks" in refused.output


def test_tui_and_data_config_flags() -> None:
    commands = make_commands(tui=True, data_config_path=Path("/r/data.toml"), log_dir=None)
    server = commands.server().argv
    assert "--tui" in server and "--log-format" not in server and "--log-file" not in server
    assert server[server.index("--data-config") + 1] == "/r/data.toml"
    assert commands.validate()[-2:] == ["--data-config", "/r/data.toml"]
    client = commands.client(1, None).argv
    assert client[client.index("--logs") + 1] == "tui"


@pytest.mark.parametrize(("clients", "kills"), [(1, None), (2, None), (3, 1), (8, 3)])
def test_default_config_is_valid(clients: int, kills: int | None) -> None:
    text = render_default_state(clients, kills)
    state = parse_state(tomllib.loads(text))
    report = validate_state(state, None)
    assert report.ok, report.errors
    document = tomllib.loads(text)
    assert document["model"]["LLM"]["checkpoint"]["Hub"]["repo_id"] == "builtin:llama-2m"
    assert document["model"]["LLM"]["data_location"] == {"Builtin": "python-stdlib"}
    assert document["config"]["init_min_clients"] == clients
    assert document["config"]["min_clients"] == max(1, clients - (kills or 0))


def test_finished_is_read_from_client_and_server_lines(tmp_path: Path) -> None:
    server_log = tmp_path / "server.log"
    server_log.write_text(
        json.dumps({"msg": "run state RoundWitness -> Cooldown", "new_state": "Cooldown"}) + "\n"
    )
    assert not server_log_reports_finished(server_log)
    with server_log.open("a") as log:
        log.write(json.dumps({"msg": "run state Cooldown -> Finished", "new_state": "Finished"}))
    assert server_log_reports_finished(server_log)
    assert not server_log_reports_finished(tmp_path / "missing.log")
    assert line_reports_finished('{"state": "Finished", "step": 9}')
    assert not line_reports_finished('{"msg": "Finished soon", "state": "RoundTrain"}')
    assert summarize([], server_finished=True).finished


def test_every_start_option_has_help_text() -> None:
    import click
    from psyche_local_testnet.cli import main

    for param in main.commands["start"].params:
        if isinstance(param, click.Option):
            assert param.help, f"start {param.opts[0]} has no help text"


@pytest.mark.parametrize(("headless", "write_log"), [(False, False), (False, True), (True, False)])
def test_clients_always_log_for_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, headless: bool, write_log: bool
) -> None:
    """Regression: an attached demo (no --write-log) ended with an empty summary because the
    clients wrote no log files; the server's own log file stays opt-in when attached."""
    monkeypatch.chdir(tmp_path)
    options = testnet_module.TestnetOptions(
        num_clients=2, run_dir=tmp_path / "run", headless=headless, write_log=write_log
    )
    commands = testnet_module.Testnet(options)._commands()
    client_argv = commands.client(1, tmp_path / "run" / "logs" / "client-1.0.jsonl").argv
    assert "--write-log" in client_argv
    assert commands.log_dir == tmp_path / "run" / "logs"
    assert ("--log-file" in commands.server().argv) == (headless or write_log)
    server_argv = commands.server().argv  # always restartable from its saved state
    assert server_argv[server_argv.index("--save-state-dir") + 1] == str(
        tmp_path / "run" / "saved-states"
    )


def test_server_kill_is_planned_before_a_round_of_client_kills() -> None:
    assert planned_server_kill(7.5, None) == 7.5
    assert planned_server_kill(80, 20) == 80  # a round is due then: the server goes first
    assert planned_server_kill(75, 20) == 80
    assert planned_server_kill(5, 20) == 20
    assert planned_server_kill(0.3, 0.1) == pytest.approx(0.3)


def test_server_kill_schedule_fires_once_and_waits_for_a_client_round() -> None:
    schedule = ServerKillSchedule(30.0, start=100.0)
    assert not schedule.take(129.9)
    assert not schedule.take(131.0, client_round_due=False)  # a client may be starting up
    assert schedule.take(140.0, client_round_due=True)
    assert not schedule.take(141.0) and not schedule.take(500.0)
    alone = ServerKillSchedule(5.0)  # without random kills: exactly at its time
    assert alone.take(5.0) and alone.done
    with pytest.raises(ValueError, match="--kill-server-at"):
        ServerKillSchedule(0.0)


def test_server_kill_options_are_validated() -> None:
    check_server_kill(None, 10, None)
    check_server_kill(40, None, 20)  # no --duration: any time
    check_server_kill(40, 150, 20)
    for bad in (0.0, -5.0, float("nan")):
        with pytest.raises(ValueError, match="--kill-server-at must be a positive"):
            check_server_kill(bad, None, None)
    with pytest.raises(ValueError, match=r"--kill-server-at 30 .* --duration 30"):
        check_server_kill(30, 30, None)
    with pytest.raises(ValueError, match=r"--kill-server-at 45 .*round of client kills.* 60 s"):
        check_server_kill(45, 59, 20)
    check_server_kill(45, 61, 20)


def test_testnet_checks_the_server_kill_against_the_headless_duration(tmp_path: Path) -> None:
    def options(**extra: Any) -> testnet_module.TestnetOptions:
        return testnet_module.TestnetOptions(num_clients=2, run_dir=tmp_path, **extra)

    with pytest.raises(ValueError, match="--kill-server-at 40 must come before"):
        testnet_module.Testnet(options(headless=True, duration=30, kill_server_at=40))
    testnet_module.Testnet(options(headless=True, duration=60, kill_server_at=40))
    testnet_module.Testnet(options(duration=30, kill_server_at=40))  # attached: no duration
    with pytest.raises(ValueError, match=r"first round of client kills at or after it: 60 s"):
        testnet_module.Testnet(
            options(
                headless=True,
                duration=50,
                kill_server_at=40,
                random_kill_num=1,
                random_kill_interval=30,
            )
        )


def test_server_restarts_from_its_latest_saved_state() -> None:
    commands = make_commands(save_state_dir=Path("/r/saved"))
    latest = commands.latest_state_path()
    assert latest == Path("/r/saved/demo-latest.toml")
    first = commands.server().argv
    assert first[first.index("--save-state-dir") + 1] == "/r/saved"
    assert first[first.index("--state") + 1] == "/r/state.toml"
    again = commands.server(latest).argv
    assert again[again.index("--state") + 1] == "/r/saved/demo-latest.toml"
    assert [a for a in again if a != str(latest)] == [a for a in first if a != "/r/state.toml"]
    assert make_commands().latest_state_path() is None
    assert "--save-state-dir" not in make_commands().server().argv


@pytest.mark.parametrize("run_id", ["demo", "my run/1", "ünïcode-ok_1.2", "a:b"])
def test_latest_state_name_is_the_servers(run_id: str) -> None:
    from psyche_server.persistence import latest_state_name as servers_name

    assert latest_state_name(run_id) == servers_name(run_id)


def test_resume_step_of_a_saved_state(tmp_path: Path) -> None:
    saved = tmp_path / "demo-latest.toml"
    saved.write_text('run_id = "demo"\n[progress]\nepoch = 2\nstep = 37\n')
    assert read_resume_step(saved) == 37
    saved.write_text('run_id = "demo"\n')
    assert read_resume_step(saved) == 1  # the server's default
    for text in ("[progress]\nstep = 0\n", '[progress]\nstep = "7"\n', "not toml ["):
        saved.write_text(text)
        with pytest.raises(ServerRestartError, match=str(saved)):
            read_resume_step(saved)
    with pytest.raises(ServerRestartError, match="cannot read"):
        read_resume_step(tmp_path / "missing.toml")


def test_summary_records_server_restarts() -> None:
    logs = records(1, 0, [line(s, 5.0 - s, f"h{s}") for s in range(1, 6)])
    logs += records(2, 0, [line(s, 5.0 - s, f"h{s}") for s in range(1, 6)])
    plain = summarize(logs)
    assert plain.server_restarts == 0 and plain.to_dict()["server_restarts"] == 0
    restarted = summarize(logs, server_restarts=[ServerRestart(killed_at=1e9, resumed_step=3)])
    fields = json.loads(restarted.final_line().removeprefix("summary: "))
    assert fields["server_restarts"] == 1 and fields["server_resume_steps"] == [3]
    assert fields["server_restart_error"] is None and fields["ok"] is True
    assert "server restarts: 1 (resumed at step 3)" in restarted.render_lines()
    failed = summarize(logs, server_restart_error="the restarted server did not start")
    assert failed.server_restarts == 0 and not failed.ok
    assert any("FAILED: the restarted server" in text for text in failed.render_lines())


def at(seconds: float) -> str:
    """An ISO `ts` `seconds` after a fixed moment (1_800_000_000 s after the epoch)."""
    return datetime.fromtimestamp(1_800_000_000 + seconds, tz=UTC).isoformat()


KILLED_AT = 1_800_000_000 + 100.0


def test_log_lines_keep_their_time() -> None:
    [record] = records(1, 0, [line(1, 2.0, "h", ts=at(5))])
    assert record.ts == pytest.approx(1_800_000_005)
    [no_time] = records(1, 0, [line(1, 2.0, "h", ts="yesterday")])
    assert no_time.ts is None


def test_server_eras_follow_reconnects_and_restarts() -> None:
    running = records(
        1,
        0,
        [
            line(36, 1.0, "a", ts=at(99)),
            line(36, 1.0, "a", ts=at(101)),  # still the old server's round, logged late
            json.dumps({"msg": "reconnected to the server", "ts": at(103)}),
            line(36, 1.0, "b", ts=at(106)),
        ],
    )
    lost = records(2, 0, [line(36, 1.0, "a", ts=at(99))])  # killed before reconnecting
    joined = records(2, 1, [line(36, 1.0, "b", ts=at(110))])  # started with the new server
    everyone = running + lost + joined
    assert server_eras(everyone, [KILLED_AT]) == [0, 0, 1, 1, 0, 1]
    assert server_eras(everyone, []) == [0] * 6
    blip = records(3, 0, [json.dumps({"msg": "reconnected to the server", "ts": at(50)})])
    assert server_eras(blip + records(3, 0, [line(9, 1.0, "h", ts=at(60))]), [KILLED_AT]) == [0, 0]


def test_steps_trained_again_after_a_server_restart_are_not_a_disagreement() -> None:
    """Regression: the chaos run with a server restart reported `DISAGREE at step 36` because
    the clients logged step 36 before the kill and again, from other weights, after it."""
    restart = ServerRestart(killed_at=KILLED_AT, resumed_step=35)

    def client(number: int, after: str) -> list[ClientLogRecord]:
        return records(
            number,
            0,
            [
                line(35, 1.0, "w35", ts=at(95)),
                line(36, 1.0, "early", ts=at(99)),
                json.dumps({"msg": "reconnected to the server", "ts": at(103)}),
                line(35, 1.0, "w35", ts=at(105)),
                line(36, 1.0, after, ts=at(107)),
            ],
        )

    logs = client(1, "again") + client(2, "again")
    assert not summarize(logs).hashes_agree  # compared across the restart: a false alarm
    summary = summarize(logs, server_restarts=[restart])
    assert summary.hashes_agree and summary.hash_points_compared == 4
    assert summary.server_resume_steps == [35]
    diverged = summarize(client(1, "again") + client(2, "other"), server_restarts=[restart])
    assert diverged.hash_mismatches == ["step 36 epoch 0 (step applied) after server restart 1"]


def test_with_a_server_key_file_the_clients_check_the_servers_key(tmp_path: Path) -> None:
    commands = make_commands(server_key_path=tmp_path / "server.key", session="sess")
    commands.write_server_key()
    server = commands.server().argv
    assert server[server.index("--identity-secret-key-path") + 1] == str(tmp_path / "server.key")
    expected = Identity.load(tmp_path / "server.key").public_key
    assert commands.server_public_key() == expected
    client = commands.client(1, None).argv
    assert client[client.index("--server-key") + 1] == expected.hex()
    other = make_commands(server_key_path=tmp_path / "other.key", session="other")
    assert other.server_public_key() != expected  # another session, another server key
    assert "--server-key" not in make_commands().client(1, None).argv

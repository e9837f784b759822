"""`psyche-client`: join a run and train (`train`), print the identity (`show-identity`),
estimate whether a run fits this machine (`check`), sign a delegation for a permissioned run
(`authorize`, in `authorize_cli`), print every command's help as markdown (`print-all-help`).

Every option of `train` can also be given as an environment variable with the upper-snake
name (e.g. `SERVER_ADDR`, `RUN_ID`, `MICRO_BATCH_SIZE`), like the reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click
from psyche_common.bool_flag import bool_flag
from psyche_common.cli_help import print_all_help_command
from psyche_common.protocol import Identity

from psyche_client.app.flags import (
    IDENTITY_ENV,
    IDENTITY_FLAG,
    precision_options,
    train_options,
)
from psyche_client.authorize_cli import authorize, load_authorization

if TYPE_CHECKING:
    from psyche_common.logs import LogFormat

    from psyche_client.app.options import ClientOptions
    from psyche_client.app.parts import Parts


def load_identity(path: Path | None) -> Identity:
    """The identity from a 32-byte key file, else ``$RAW_IDENTITY_SECRET_KEY`` (hex), else a
    fresh random one."""
    if path is not None:
        try:
            return Identity.load(path)
        except (OSError, ValueError) as exc:  # missing, unreadable, or not a key
            hint = "'-i' / '--identity-secret-key-path'"
            raise click.BadParameter(str(exc), param_hint=hint) from exc
    raw = os.environ.get(IDENTITY_ENV)
    if raw:
        try:
            return Identity.from_hex(raw.strip())
        except ValueError as exc:
            raise click.BadParameter(f"${IDENTITY_ENV}: {exc}") from exc
    return Identity.generate()


def _interface_address(name: str) -> str:
    """IPv4 address to bind for ``--bind-p2p-interface``: an address as is, or the address of
    a network interface by name (a trailing ``*`` matches by prefix)."""
    import ipaddress
    import socket

    with contextlib.suppress(ValueError):  # not an address: look it up as an interface name
        ipaddress.ip_address(name)
        return name
    import fcntl
    import struct

    prefix = name[:-1] if name.endswith("*") else None
    for _, ifname in socket.if_nameindex():
        if (prefix is not None and ifname.startswith(prefix)) or ifname == name:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                try:
                    packed = fcntl.ioctl(
                        sock.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode())
                    )
                except OSError:
                    continue
                return socket.inet_ntoa(packed[20:24])
    raise click.BadParameter(
        f"no IPv4 interface matches {name!r}", param_hint="--bind-p2p-interface"
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": None})
def main() -> None:
    """Psyche client: trains a model together with other clients of a run."""


identity_option = IDENTITY_FLAG.option()


main.add_command(authorize)


@main.command("show-identity")
@identity_option
def show_identity(identity_secret_key_path: Path | None) -> None:
    """Print this client's public key (its client id) and secret key, in hex."""
    identity = load_identity(identity_secret_key_path)
    click.echo(f"public key: {identity.public_key.hex()}")
    click.echo(f"short id:   {identity.short_id}")
    click.echo(f"secret key: {identity.secret_bytes().hex()}")


@main.command()
@train_options
def train(**flags: object) -> None:
    """Join run RUN_ID at the coordinator SERVER_ADDR and train until the run finishes."""
    from psyche_client.app.options import ClientOptions
    from psyche_client.app.parts import Parts

    values = dict(flags)
    server_addr = str(values["server_addr"])
    _check_server_addr(server_addr)
    _make_dirs(values, ("--checkpoint-dir", "--write-gradients-dir"))
    if values["hub_repo"] and values["checkpoint_dir"] is None:
        raise click.UsageError("--hub-repo needs --checkpoint-dir")
    if values["wandb_project"] is None:
        given = [
            f"--wandb-{name}" for name in ("run", "group", "entity") if values[f"wandb_{name}"]
        ]
        if given:
            raise click.UsageError(f"{', '.join(given)} needs --wandb-project")
    dummy = values["dummy_training_delay_secs"] is not None
    if values["dummy_seconds_per_sample"] and not dummy:
        raise click.UsageError("--dummy-seconds-per-sample needs --dummy-training-delay-secs")
    if not dummy:  # the dummy backend trains no model: it uses no device
        _check_device(str(values["device"]))
    _check_fsdp_precision(values)
    values["data_parallelism"] = _parallel_rank_setup(
        cast("int | None", values["data_parallelism"]),
        bool(values["fsdp"]),
        str(values["device"]),
        cast(float, values["parallel_timeout"]),
        dummy,
    )
    values["run_id"] = str(values["run_id"]).strip().strip("\"'")
    identity = load_identity(cast("Path | None", values["identity_secret_key_path"]))
    interface = values["bind_p2p_interface"]
    values["bind_p2p_interface"] = _interface_address(str(interface)) if interface else "0.0.0.0"
    options = ClientOptions.from_flags(values, identity)
    _check_evals(options, dummy)
    authorization_path = cast("Path | None", values["authorization"])
    if authorization_path is not None:
        statement = load_authorization(authorization_path, identity, str(values["run_id"]))
        options = replace(options, server=replace(options.server, authorization=statement))
    advertise_host = "127.0.0.1" if _is_loopback_server(server_addr) else None
    advertise_port = None
    if values["advertise_addr"] is not None:
        from psyche_client.p2p.connection import parse_address

        try:
            advertise_host, advertise_port = parse_address(str(values["advertise_addr"]))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--advertise-addr") from exc
    p2p = replace(options.p2p, advertise_host=advertise_host, advertise_port=advertise_port)
    options = replace(options, p2p=p2p)
    log_file = cast("Path | None", values["write_log"])
    if values["logs"] == "tui-and-console" and sys.stdout.isatty():
        raise click.UsageError(
            "--logs tui-and-console prints the log lines on stdout while the dashboard draws "
            "on the terminal: redirect stdout (e.g. > client.log), or use --logs tui"
        )
    parts = click.get_current_context().find_object(Parts)  # an attack client's, in tests
    logs = _log_format(cast("str | None", values["logs"]))
    sys.exit(_run(options, logs, log_file, str(values["log_level"]), parts))


def _check_server_addr(server_addr: str) -> None:
    from psyche_client.session.server_link import parse_server_addr

    try:
        parse_server_addr(server_addr)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--server-addr") from exc


def _make_dirs(values: dict[str, object], flags: tuple[str, ...]) -> None:
    """Create the directories the flags name, now: one that cannot be created is refused
    at start rather than when the client first writes into it."""
    for flag in flags:
        path = values[flag.removeprefix("--").replace("-", "_")]
        if path is None:
            continue
        try:
            Path(str(path)).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise click.BadParameter(
                f"cannot create the directory {path}: {exc.strerror or exc}", param_hint=flag
            ) from exc


def _check_device(device: str) -> None:
    """`--device` names a device this machine has (UsageError if not), before the client
    joins a run rather than when it loads the model."""
    from psyche_client.training.model.device import DeviceError, resolve_device

    try:
        resolve_device(device)
    except DeviceError as exc:
        raise click.UsageError(str(exc)) from exc


def _check_fsdp_precision(values: dict[str, object]) -> None:
    """`--fsdp` with a precision flag it cannot train with is refused at start."""
    from psyche_client.training.parallel.plan import fsdp_precision_problem

    if not values["fsdp"]:
        return
    problem = fsdp_precision_problem(
        bool(values["grad_accum_in_fp32"]), str(values["attn_implementation"])
    )
    if problem is not None:
        raise click.UsageError(problem)


def _check_evals(options: ClientOptions, dummy: bool) -> None:
    """The `--eval-*` flags make sense together and with the backend (UsageError if not)."""
    evals = options.evals
    try:
        evals.check()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if not evals.enabled:
        return
    if dummy:
        raise click.UsageError("--eval-* needs a model: not with --dummy-training-delay-secs")
    if options.backend.parallel.data_parallelism > 1:
        raise click.UsageError("--eval-* runs on a single-device client (--data-parallelism 1)")


def _parallel_rank_setup(
    data_parallelism: int | None, fsdp: bool, device: str, timeout: float, dummy: bool
) -> int:
    """The client's rank count. Under torchrun (`RANK`/`WORLD_SIZE` set) it is `WORLD_SIZE`,
    and a rank other than 0 becomes a worker here: it serves rank 0's commands and exits."""
    from psyche_client.training.parallel.plan import LaunchEnv, ParallelLaunchError, ParallelSpec

    try:
        env = LaunchEnv.from_env(os.environ)
    except ParallelLaunchError as exc:
        raise click.UsageError(str(exc)) from exc
    ranks = data_parallelism or 1
    if env is not None and env.world_size > 1:
        if data_parallelism not in (None, env.world_size):
            raise click.UsageError(
                f"--data-parallelism {data_parallelism} differs from torchrun's WORLD_SIZE "
                f"{env.world_size}"
            )
        ranks = env.world_size
    try:
        ParallelSpec(ranks, fsdp)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if dummy and ranks > 1:
        raise click.UsageError("--dummy-training-delay-secs trains no model on several ranks")
    if env is not None and env.world_size > 1:
        if env.rank != 0:
            from psyche_client.training.parallel.worker import exit_now, serve

            exit_now(serve(env, device, timeout))
        import atexit

        from psyche_client.training.parallel.launch import release_workers

        atexit.register(release_workers, env)  # workers waiting for a model load that never came
    return ranks


def _is_loopback_server(server_addr: str) -> bool:
    host = server_addr.rpartition(":")[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def _run(
    options: ClientOptions,
    logs: str,
    write_log: Path | None,
    log_level: str = "info",
    parts: Parts | None = None,
) -> int:
    import logging

    from psyche_common.logs import setup_logging

    from psyche_client.app.app import ClientApp
    from psyche_client.app.progress_bars import silence_progress_bars
    from psyche_client.app.signals import run_until_signalled

    silence_progress_bars(logs)
    if write_log is not None:
        _add_file_log(write_log)
    if logs in ("tui", "tui-and-console"):
        from psyche_client.tui.app import run_dashboard

        if logs == "tui-and-console":  # the readable lines on stdout, the dashboard on stderr
            setup_logging("console", log_level.upper(), stream=sys.stdout)
        logging.getLogger().setLevel(log_level.upper())
        return run_dashboard(options, parts)
    if logs == "none":  # nothing on the console (not even Python's last-resort handler)
        logging.getLogger().addHandler(logging.NullHandler())
        logging.getLogger().setLevel(log_level.upper())
    else:
        setup_logging(cast("LogFormat", logs), log_level.upper())
    try:
        import uvloop

        run_loop: Callable[[Coroutine[Any, Any, int]], int] = uvloop.run
    except ImportError:
        run_loop = asyncio.run
    try:
        return run_loop(run_until_signalled(ClientApp(options, parts).run()))
    except KeyboardInterrupt:  # a SIGINT before the loop took its handlers
        return 130


def _log_format(logs: str | None) -> str:
    """`--logs`, or when not given the dashboard on a terminal and log lines otherwise (a
    file, a pipe, a service manager), as the server chooses."""
    if logs is not None:
        return logs
    return "tui" if sys.stdout.isatty() else "console"


def _add_file_log(path: Path) -> None:
    """Also append every log record to `path`, one JSON object per line."""
    import logging

    from psyche_common.logs import JsonLineFormatter

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise click.BadParameter(
            f"cannot write the log file {path}: {reason}", param_hint="--write-log"
        ) from exc
    handler.setFormatter(JsonLineFormatter())
    logging.getLogger().addHandler(handler)


@main.command()
@click.option(
    "--state",
    "state_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The run's state.toml.",
)
@click.option(
    "--micro-batch-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Micro-batch size you plan to train with.",
)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option(
    "--data-parallelism",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Local ranks (devices) the client will train on.",
)
@bool_flag("--fsdp", default=False, help="The model will be sharded (--fsdp).")
@precision_options
def check(
    state_path: Path,
    micro_batch_size: int,
    device: str,
    data_parallelism: int,
    fsdp: bool,
    dtype: str,
    grad_accum_in_fp32: bool,
    activation_checkpointing: bool,
    attn_implementation: str,
) -> None:
    """Estimate memory per device and DisTrO traffic of a run for this machine (no download
    of weights when the model is a builtin preset or a local directory)."""
    from psyche_common.config import ConfigError, load_state, validate_state
    from psyche_common.config.architecture_rules import model_config_problem

    from psyche_client.training.parallel.plan import ParallelSpec, fsdp_precision_problem

    try:  # the file and the flags first: they need neither torch nor the model
        state = load_state(state_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    errors = validate_state(state).errors
    if errors:
        raise click.ClickException(str(ConfigError(errors, state_path)))
    checkpoint = state.model.checkpoint
    repo = checkpoint.hub_repo()
    if repo is None:
        raise click.ClickException(
            f"{state_path}: model.LLM.checkpoint is {checkpoint}, which names no model "
            "(check needs a Hub, Dummy or P2P checkpoint with a repo_id)"
        )
    try:
        spec = ParallelSpec(data_parallelism, fsdp)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    problem = fsdp_precision_problem(grad_accum_in_fp32, attn_implementation) if fsdp else None
    if problem is not None:
        raise click.UsageError(problem)
    _check_device(device)

    from psyche_client.tools.estimate import estimate_run
    from psyche_client.training.model.loading import ModelLoadError, load_model_config
    from psyche_client.training.model.precision import Precision

    try:
        model_config = load_model_config(repo.repo_id, repo.revision)
    except ModelLoadError as exc:
        raise click.ClickException(f"{state_path}: model.LLM.checkpoint: {exc}") from exc
    model_problem = model_config_problem(state.model.architecture, model_config, repo.repo_id)
    if model_problem is not None:
        raise click.ClickException(f"{state_path}: {model_problem.message}")
    precision = Precision(
        dtype,  # type: ignore[arg-type]  # click.Choice of DTYPE_NAMES
        grad_accum_in_fp32,
        activation_checkpointing,
        attn_implementation,  # type: ignore[arg-type]
    )
    estimate = estimate_run(
        state.model, model_config, micro_batch_size, device, precision=precision, parallel=spec
    )
    click.echo(estimate.render())
    if estimate.fits is False:
        sys.exit(1)


main.add_command(print_all_help_command(main, "psyche-client"))


if __name__ == "__main__":
    main()

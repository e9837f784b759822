"""`psyche-client`: join a run and train (`train`), print the identity (`show-identity`),
estimate whether a run fits this machine (`check`).

Every option of `train` can also be given as an environment variable with the upper-snake
name (e.g. `SERVER_ADDR`, `RUN_ID`, `MICRO_BATCH_SIZE`), like the reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click
from psyche_common.logs import LOG_LEVELS
from psyche_common.protocol import Identity

if TYPE_CHECKING:
    from psyche_common.logs import LogFormat

    from psyche_client.app import ClientOptions

IDENTITY_ENV = "RAW_IDENTITY_SECRET_KEY"


def load_identity(path: Path | None) -> Identity:
    """The identity from a 32-byte key file, else ``$RAW_IDENTITY_SECRET_KEY`` (hex), else a
    fresh random one."""
    if path is not None:
        return Identity.load(path)
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


identity_option = click.option(
    "-i",
    "--identity-secret-key-path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="IDENTITY_SECRET_KEY_PATH",
    help="File with the 32 raw bytes of this client's ed25519 secret key. Without it the key "
    f"comes from ${IDENTITY_ENV} (64 hex chars), or a random one is made for this run.",
)


@main.command("show-identity")
@identity_option
def show_identity(identity_secret_key_path: Path | None) -> None:
    """Print this client's public key (its client id) and secret key, in hex."""
    identity = load_identity(identity_secret_key_path)
    click.echo(f"public key: {identity.public_key.hex()}")
    click.echo(f"short id:   {identity.short_id}")
    click.echo(f"secret key: {identity.secret_bytes().hex()}")


@main.command()
@click.option(
    "--server-addr",
    required=True,
    envvar="SERVER_ADDR",
    help="Coordinator server address, HOST:PORT.",
)
@click.option(
    "--run-id",
    required=True,
    envvar="RUN_ID",
    help="Run to join (must equal the server's run_id); surrounding quotes are trimmed.",
)
@identity_option
@click.option(
    "--bind-p2p-port",
    type=click.IntRange(0, 65535),
    default=0,
    envvar="BIND_P2P_PORT",
    show_default=True,
    help="TCP port of the peer-to-peer listener (0: any free port).",
)
@click.option(
    "--bind-p2p-interface",
    default=None,
    envvar="BIND_P2P_INTERFACE",
    help="Bind the P2P listener to this IPv4 address or network interface (a trailing "
    "'*' matches interface names by prefix). Default: all interfaces.",
)
@click.option(
    "--advertise-addr",
    default=None,
    envvar="ADVERTISE_ADDR",
    help="HOST:PORT peers should dial to reach this client's P2P listener, when it differs "
    "from the listener's own address (a port forward, a VPN). The server checks it at join.",
)
@click.option(
    "--device",
    default="auto",
    envvar="DEVICE",
    show_default=True,
    help="Training device: auto, cpu, cuda or cuda:N.",
)
@click.option(
    "--micro-batch-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    envvar="MICRO_BATCH_SIZE",
    help="Samples per forward/backward pass; a batch is split into ceil(B/mbs) chunks "
    "whose gradients are accumulated.",
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="CHECKPOINT_DIR",
    help="Save the model (safetensors) to DIR/{run_id}-step{N} at the end of every epoch.",
)
@click.option(
    "--hub-repo",
    envvar="HUB_REPO",
    help="Also upload each epoch's checkpoint to this Hugging Face repo (needs HF_TOKEN "
    "and --checkpoint-dir) and report it to the coordinator.",
)
@click.option(
    "--logs",
    type=click.Choice(["tui", "console", "json"]),
    default="tui",
    show_default=True,
    envvar="LOGS",
    help="tui: interactive dashboard; console: readable log lines; json: one JSON "
    "object per line (fields client_id, epoch, step, state, loss, weights_hash).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    envvar="LOG_LEVEL",
    help="lowest level logged (debug adds every P2P push and fetch failure)",
)
@click.option(
    "--write-log",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="WRITE_LOG",
    help="Also append the logs (JSON lines) to this file.",
)
@click.option(
    "--write-gradients-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="WRITE_GRADIENTS_DIR",
    help="Write every result this client transmits to this directory "
    "(result-{id}-step{S}-batch{start}-{end}.bin).",
)
@click.option(
    "--max-concurrent-parameter-requests",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    envvar="MAX_CONCURRENT_PARAMETER_REQUESTS",
    help="Parameters downloaded at once when fetching the model from peers.",
)
@click.option(
    "--max-concurrent-downloads",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    envvar="MAX_CONCURRENT_DOWNLOADS",
    help="Peers' training results downloaded at once.",
)
@click.option(
    "--gossip-fanout",
    type=click.IntRange(min=0),
    default=8,
    show_default=True,
    envvar="GOSSIP_FANOUT",
    help="Peers each new result or Finished announcement is forwarded to, so that one pushed "
    "to a single member still reaches all (0: never forward).",
)
@click.option(
    "--p2p-max-inbound-connections",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    envvar="P2P_MAX_INBOUND_CONNECTIONS",
    help="Incoming P2P connections open at once; more are closed before their handshake.",
)
@click.option(
    "--p2p-max-inbound-per-ip",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    envvar="P2P_MAX_INBOUND_PER_IP",
    help="Incoming P2P connections open at once from one IP address (peers behind one NAT "
    "share it); more are closed before their handshake.",
)
@click.option(
    "--p2p-max-concurrent-serving",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    envvar="P2P_MAX_CONCURRENT_SERVING",
    help="Blob, manifest and parameter requests of peers served at once (others wait).",
)
@click.option(
    "--p2p-max-result-size",
    type=click.IntRange(min=1),
    default=256 * 1024 * 1024,
    show_default=True,
    envvar="P2P_MAX_RESULT_SIZE",
    help="Bytes beyond which a peer's result announcement is refused before any download.",
)
@click.option(
    "--max-upload-mbps",
    type=click.FloatRange(min=1.0),
    default=None,
    envvar="MAX_UPLOAD_MBPS",
    help="Cap, in Mbit/s, on the rate at which this client uploads the model to late "
    "joiners (manifest and parameter answers, all peers together), so that sharing the "
    "model cannot fill a slow uplink. The round's results are never capped, and always go "
    "before model shares. At least 1 (slower, a joiner's parameter requests time out). "
    "Default: no cap.",
)
@click.option(
    "--data-fetch-attempts",
    type=click.IntRange(min=1),
    default=7,
    show_default=True,
    envvar="DATA_FETCH_ATTEMPTS",
    help="Tries to fetch a batch's training data before giving that batch up. Only "
    "transient failures are retried (network errors, timeouts, a data server that does not "
    "list this client yet); a missing sample or an unusable data location fails at once.",
)
@click.option(
    "--data-fetch-retry-delay",
    type=click.FloatRange(min=0),
    default=2.0,
    show_default=True,
    envvar="DATA_FETCH_RETRY_DELAY",
    help="Backoff step in seconds between data-fetch attempts: attempt k waits (k-1) times "
    "this (0, 2, 4, ... 12 s with the defaults).",
)
@click.option(
    "--server-reconnect-timeout",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    envvar="SERVER_RECONNECT_TIMEOUT",
    help="Seconds to keep reconnecting after the server connection is lost (a crashed or "
    "restarted server, a network cut), with the same identity; meanwhile the client keeps "
    "its model and keeps serving its peers. Attempts wait 0.5 s, doubling up to 10 s, each "
    "+-20% at random. 0: exit at once (exit code 1). The first connection is not retried.",
)
@click.option(
    "--data-parallelism",
    type=click.IntRange(min=1),
    default=None,
    envvar="DATA_PARALLELISM",
    help="Local ranks (devices) this client trains on; each trains a share of every batch. "
    "The client starts the other ranks itself; under torchrun the default is WORLD_SIZE. "
    "With CUDA, rank r uses GPU r.  [default: 1]",
)
@click.option(
    "--fsdp",
    is_flag=True,
    default=False,
    envvar="FSDP",
    help="Shard the model over the --data-parallelism ranks (FSDP2 fully_shard) instead of "
    "holding a full copy on each: trains a model that does not fit one device.",
)
@click.option(
    "--parallel-timeout",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    envvar="PARALLEL_TIMEOUT",
    help="Seconds a rank may keep the others waiting (a collective, or no sign of life) "
    "before the client gives up on it and exits.",
)
@click.option(
    "--dummy-training-delay-secs",
    type=click.FloatRange(min=0),
    default=None,
    envvar="DUMMY_TRAINING_DELAY_SECS",
    help="Testing: no model and no torch; every batch sleeps this long and produces a "
    "tiny fake result, so protocol-level runs are fast.",
)
@click.option(
    "--dummy-result-size",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    envvar="DUMMY_RESULT_SIZE",
    help="Testing, with --dummy-training-delay-secs: bytes of every fake result (e.g. the "
    "size a real model's DisTrO results have, to test a run over slow links). Every client "
    "of a run must use the same size.",
)
@click.option(
    "--dummy-model-size",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    envvar="DUMMY_MODEL_SIZE",
    help="Testing, with --dummy-training-delay-secs: bytes of extra fake parameters in the "
    "model shared with late joiners, so a model share moves as much as a real model's would.",
)
def train(
    server_addr: str,
    run_id: str,
    identity_secret_key_path: Path | None,
    bind_p2p_port: int,
    bind_p2p_interface: str | None,
    advertise_addr: str | None,
    device: str,
    micro_batch_size: int,
    checkpoint_dir: Path | None,
    hub_repo: str | None,
    logs: str,
    log_level: str,
    write_log: Path | None,
    write_gradients_dir: Path | None,
    max_concurrent_parameter_requests: int,
    max_concurrent_downloads: int,
    gossip_fanout: int,
    p2p_max_inbound_connections: int,
    p2p_max_inbound_per_ip: int,
    p2p_max_concurrent_serving: int,
    p2p_max_result_size: int,
    max_upload_mbps: float | None,
    data_fetch_attempts: int,
    data_fetch_retry_delay: float,
    server_reconnect_timeout: float,
    data_parallelism: int | None,
    fsdp: bool,
    parallel_timeout: float,
    dummy_training_delay_secs: float | None,
    dummy_result_size: int,
    dummy_model_size: int,
) -> None:
    """Join run RUN_ID at the coordinator SERVER_ADDR and train until the run finishes."""
    from psyche_client.app import ClientOptions

    if hub_repo and checkpoint_dir is None:
        raise click.UsageError("--hub-repo needs --checkpoint-dir")
    data_parallelism = _parallel_rank_setup(
        data_parallelism, fsdp, device, parallel_timeout, dummy_training_delay_secs is not None
    )
    identity = load_identity(identity_secret_key_path)
    bind = _interface_address(bind_p2p_interface) if bind_p2p_interface else "0.0.0.0"
    advertise_host = "127.0.0.1" if _is_loopback_server(server_addr) else None
    advertise_port = None
    if advertise_addr is not None:
        from psyche_client.p2p.connection import parse_address

        try:
            advertise_host, advertise_port = parse_address(advertise_addr)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--advertise-addr") from exc
    options = ClientOptions(
        server_addr=server_addr,
        run_id=run_id.strip().strip("\"'"),
        identity=identity,
        bind_p2p_port=bind_p2p_port,
        bind_p2p_interface=bind,
        advertise_host=advertise_host,
        advertise_port=advertise_port,
        device=device,
        micro_batch_size=micro_batch_size,
        checkpoint_dir=checkpoint_dir,
        hub_repo=hub_repo,
        write_gradients_dir=write_gradients_dir,
        max_concurrent_parameter_requests=max_concurrent_parameter_requests,
        max_concurrent_downloads=max_concurrent_downloads,
        gossip_fanout=gossip_fanout,
        p2p_max_inbound_connections=p2p_max_inbound_connections,
        p2p_max_inbound_per_ip=p2p_max_inbound_per_ip,
        p2p_max_concurrent_serving=p2p_max_concurrent_serving,
        p2p_max_result_size=p2p_max_result_size,
        max_upload_mbps=max_upload_mbps,
        data_fetch_attempts=data_fetch_attempts,
        data_fetch_retry_delay=data_fetch_retry_delay,
        server_reconnect_timeout=server_reconnect_timeout,
        dummy_training_delay_secs=dummy_training_delay_secs,
        dummy_result_size=dummy_result_size,
        dummy_model_size=dummy_model_size,
        data_parallelism=data_parallelism,
        fsdp=fsdp,
        parallel_timeout=parallel_timeout,
    )
    sys.exit(_run(options, logs, write_log, log_level))


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


def _run(options: ClientOptions, logs: str, write_log: Path | None, log_level: str = "info") -> int:
    import logging

    from psyche_common.logs import setup_logging

    from psyche_client.app import ClientApp

    if write_log is not None:
        _add_file_log(write_log)
    if logs == "tui":
        from psyche_client.tui.app import run_dashboard

        logging.getLogger().setLevel(log_level.upper())
        return run_dashboard(options)
    setup_logging(cast("LogFormat", logs), log_level.upper())
    try:
        import uvloop

        run_loop: Callable[[Coroutine[Any, Any, int]], int] = uvloop.run
    except ImportError:
        run_loop = asyncio.run
    try:
        return run_loop(ClientApp(options).run())
    except KeyboardInterrupt:
        return 130


def _add_file_log(path: Path) -> None:
    """Also append every log record to `path`, one JSON object per line."""
    import logging

    from psyche_common.logs import JsonLineFormatter

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
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
@click.option("--fsdp", is_flag=True, default=False, help="The model will be sharded (--fsdp).")
def check(
    state_path: Path, micro_batch_size: int, device: str, data_parallelism: int, fsdp: bool
) -> None:
    """Estimate memory per device and DisTrO traffic of a run for this machine (no download
    of weights when the model is a builtin preset or a local directory)."""
    from psyche_common.config import load_state

    from psyche_client.model.estimate import estimate_run
    from psyche_client.model.loading import ModelLoadError, load_model_config
    from psyche_client.training.parallel.plan import ParallelSpec

    state = load_state(state_path)
    checkpoint = state.model.checkpoint
    repo = checkpoint.hub_repo()
    if repo is None:
        raise click.ClickException(
            f"{state_path}: model.LLM.checkpoint is {checkpoint}, which names no model "
            "(check needs a Hub, Dummy or P2P checkpoint with a repo_id)"
        )
    try:
        model_config = load_model_config(repo.repo_id, repo.revision)
    except ModelLoadError as exc:
        raise click.ClickException(f"{state_path}: model.LLM.checkpoint: {exc}") from exc
    try:
        spec = ParallelSpec(data_parallelism, fsdp)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    estimate = estimate_run(state.model, model_config, micro_batch_size, device, parallel=spec)
    click.echo(estimate.render())
    if estimate.fits is False:
        sys.exit(1)


if __name__ == "__main__":
    main()

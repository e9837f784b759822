"""Every option of `psyche-client train`, written once (a `psyche_common.flag_table`): its flag,
environment variable, click type, default and help, and the field of `ClientOptions` it sets
(`target`, a dotted path such as "p2p.gossip_fanout"; None for the few the CLI handles itself:
logging, the identity file, the authorization file, the advertised address).

`cli.py` builds its click options from `FLAGS`, and `ClientOptions.from_flags` fills the
options from the parsed values, so a flag and the field it sets cannot drift apart
(tests/unit/test_client_options.py checks every target names a field with the flag's default).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click
from psyche_common.flag_table import Flag, PublicKeyType, options
from psyche_common.logs import LOG_LEVELS
from psyche_common.pacing import MEGABIT

from psyche_client.evals.options import DEFAULT_EVAL_SEED, parse_task_list
from psyche_client.training.model.precision import ATTN_IMPLEMENTATIONS, DTYPE_NAMES

F = TypeVar("F", bound=Callable[..., object])

IDENTITY_ENV = "RAW_IDENTITY_SECRET_KEY"

LOG_OUTPUTS = ("tui", "console", "json", "tui-and-console", "none")
"""The values of `--logs` (the reference's five)."""


def mbps_to_bytes(value: object) -> object:
    """Mbit/s (the flag) to bytes/s (`P2PConfig.max_upload_rate`)."""
    return None if value is None else float(str(value)) * MEGABIT


def _int(low: int | None = None, high: int | None = None) -> click.IntRange:
    return click.IntRange(low, high)


class TensorParallelismType(click.ParamType):
    """`--tensor-parallelism`: the reference's flag, where only 1 (no tensor parallelism) is
    accepted; anything else is refused with what to use instead."""

    name = "N"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        try:
            number = int(str(value))
        except ValueError:
            self.fail(f"{value!r} is not an integer", param, ctx)
        if number != 1:
            self.fail(
                f"{number}: tensor parallelism is not supported by this client. To train a "
                "model that does not fit one device, shard it over several with "
                f"--data-parallelism {max(number, 2)} --fsdp (FSDP2; docs/client.md, "
                '"Several devices")',
                param,
                ctx,
            )
        return number


IDENTITY_FLAG = Flag(
    "--identity-secret-key-path",
    "File with this client's ed25519 secret key: 32 raw bytes or 64 hex characters. Without "
    "it the key "
    f"comes from ${IDENTITY_ENV} (64 hex chars), or a random one is made for this run.",
    short="-i",
    type=click.Path(dir_okay=False, path_type=Path),
)

FLAGS: tuple[Flag, ...] = (
    Flag("--server-addr", "Coordinator server address, HOST:PORT.", "server.addr", required=True),
    Flag(
        "--run-id",
        "Run to join (must equal the server's run_id); surrounding quotes are trimmed.",
        "server.run_id",
        required=True,
    ),
    IDENTITY_FLAG,
    Flag(
        "--server-key",
        "The coordinator server's public key (64 hex characters; the server prints it at "
        "start). The client then talks only to a server that proves this key, on the "
        "coordinator, data-server and relay ports, and exits with an error otherwise.",
        "server.server_key",
        type=PublicKeyType(
            "a public key", "as `psyche-server run` prints it (`psyche-server key ...`)"
        ),
    ),
    Flag(
        "--authorization",
        "A signed authorization file (`psyche-client authorize`) that lets this client's key "
        "join a permissioned run on behalf of an authorized key; sent with the Join.",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
    ),
    Flag(
        "--bind-p2p-port",
        "TCP port of the peer-to-peer listener (0: any free port).",
        "p2p.port",
        0,
        _int(0, 65535),
        show_default=True,
    ),
    Flag(
        "--bind-p2p-interface",
        "Bind the P2P listener to this IPv4 address or network interface (a trailing "
        "'*' matches interface names by prefix). Default: all interfaces.",
        "p2p.bind_host",
    ),
    Flag(
        "--advertise-addr",
        "HOST:PORT peers should dial to reach this client's P2P listener, when it differs "
        "from the listener's own address (a port forward, a VPN). The server checks it at "
        "join.",
    ),
    Flag(
        "--device",
        "Training device: auto, cpu, cuda or cuda:N.",
        "backend.device",
        "auto",
        show_default=True,
    ),
    Flag(
        "--micro-batch-size",
        "Samples per forward/backward pass; a batch is split into ceil(B/mbs) chunks "
        "whose gradients are accumulated.",
        "backend.micro_batch_size",
        1,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--dtype",
        "Parameter and gradient dtype. auto: bf16 on CUDA, fp32 elsewhere. DisTrO's momentum "
        "and the aggregate of applied results stay fp32 either way; every client of a run "
        "must train in the same dtype (the weights hash covers the stored bytes).",
        "backend.dtype",
        "auto",
        click.Choice(DTYPE_NAMES),
        show_default=True,
    ),
    Flag(
        "--grad-accum-in-fp32",
        "Sum the micro-batches' gradients in fp32 and round once to the parameter dtype "
        "(bf16 runs with several micro-batches per batch; costs 4 bytes per parameter).",
        "backend.grad_accum_in_fp32",
        False,
        is_flag=True,
    ),
    Flag(
        "--activation-checkpointing",
        "Recompute each decoder layer's activations in the backward pass instead of keeping "
        "them: less memory for longer sequences or larger micro-batches, ~30% more compute.",
        "backend.activation_checkpointing",
        False,
        is_flag=True,
    ),
    Flag(
        "--attn-implementation",
        "Attention kernel: eager, sdpa (torch's scaled_dot_product_attention) or "
        "flash_attention_2 (CUDA and the flash-attn package).",
        "backend.attn_implementation",
        "sdpa",
        click.Choice(ATTN_IMPLEMENTATIONS),
        show_default=True,
    ),
    Flag(
        "--checkpoint-dir",
        "Save the model (safetensors) to DIR/{run_id}-step{N} at the end of every epoch.",
        "checkpointing.dir",
        type=click.Path(file_okay=False, path_type=Path),
    ),
    Flag(
        "--hub-repo",
        "Also upload each epoch's checkpoint to this Hugging Face repo (needs HF_TOKEN "
        "and --checkpoint-dir) and report it to the coordinator.",
        "checkpointing.hub_repo",
    ),
    Flag(
        "--keep-steps",
        "With --delete-old-steps: how many of the run's checkpoints --checkpoint-dir keeps "
        "(the newest; deleted only once the new one is saved and uploaded).",
        "checkpointing.keep",
        3,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--delete-old-steps",
        "Delete the run's older checkpoints in --checkpoint-dir beyond --keep-steps after each "
        "epoch's checkpoint is saved (and uploaded); --no-delete-old-steps keeps them all.",
        "checkpointing.delete_old_steps",
        True,
        is_flag=True,
        show_default=True,
    ),
    Flag(
        "--hub-max-concurrent-downloads",
        "Files of a Hugging Face Hub model downloaded at once when the run's checkpoint is a "
        "Hub repo.",
        "backend.hub_max_concurrent_downloads",
        3,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--logs",
        "tui: interactive dashboard; console: readable log lines; json: one JSON object per "
        "line (fields client_id, epoch, step, state, loss, weights_hash); tui-and-console: the "
        "dashboard, and the readable lines on stdout, which must then not be the terminal "
        "(e.g. `> client.log`); none: no log output (--write-log, --events-dir and "
        "--metrics-local-port still work). Default: tui when stdout is a terminal, else "
        "console.",
        type=click.Choice(LOG_OUTPUTS),
    ),
    Flag(
        "--log-level",
        "lowest level logged (debug adds every P2P push and fetch failure)",
        default="info",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        show_default=True,
    ),
    Flag(
        "--write-log",
        "Also append the logs (JSON lines) to this file.",
        type=click.Path(dir_okay=False, path_type=Path),
    ),
    Flag(
        "--metrics-local-port",
        "Serve this client's metrics in the Prometheus text format on "
        "http://127.0.0.1:PORT/metrics: loss, tokens/s, P2P traffic, round and training "
        "times, run state, epoch and step (0: a free port, logged at start).",
        "metrics.local_port",
        type=_int(0, 65535),
    ),
    Flag(
        "--events-dir",
        "Record this client's events (run-state changes, each finished step's figures, "
        "checkpoints, warnings and errors) in DIR/<client id>/events-epoch-*.jsonl, one file "
        "per epoch; `psyche-server observe --events-dir DIR` prints them.",
        "metrics.events_dir",
        type=click.Path(file_okay=False, path_type=Path),
    ),
    Flag(
        "--keep-event-files",
        "Event files (one per epoch) kept in --events-dir; older ones are deleted.",
        "metrics.keep_event_files",
        5,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--wandb-project",
        "Log this client's metrics to this Weights & Biases project: per step the loss, "
        "learning rate, tokens/s, P2P bytes up/down and results applied, plus optimizer "
        "statistics and eval scores when there are any. Online (the default) needs "
        "WANDB_API_KEY or `wandb login`; WANDB_MODE=offline keeps the run on disk "
        "(docs/operations.md).",
        "metrics.wandb_project",
    ),
    Flag(
        "--wandb-run",
        "Name of the wandb run (with --wandb-project). Default: RUN_ID-<client short id>.",
        "metrics.wandb_run",
    ),
    Flag(
        "--wandb-group",
        "Group of the wandb run (with --wandb-project), e.g. one per training run.",
        "metrics.wandb_group",
    ),
    Flag(
        "--wandb-entity",
        "wandb entity (user or team) owning the project (with --wandb-project). Default: "
        "the credentials' own.",
        "metrics.wandb_entity",
    ),
    Flag(
        "--optim-stats-steps",
        "Every N steps measure the DisTrO optimizer per parameter: gradient and momentum L1 "
        "energy, the share of each tile's energy the top-k keeps, and how much the indices "
        "chosen by the results applied agree; logged and sent to wandb. 0: never (no cost).",
        "backend.optim_stats_steps",
        0,
        _int(0),
        show_default=True,
    ),
    Flag(
        "--write-gradients-dir",
        "Write every result this client transmits to this directory "
        "(result-{id}-step{S}-batch{start}-{end}.bin).",
        "round.write_gradients_dir",
        type=click.Path(file_okay=False, path_type=Path),
    ),
    Flag(
        "--max-concurrent-parameter-requests",
        "Parameters downloaded at once when fetching the model from peers.",
        "p2p.max_concurrent_parameter_requests",
        8,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--max-concurrent-downloads",
        "Peers' training results downloaded at once.",
        "p2p.max_concurrent_downloads",
        4,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--gossip-fanout",
        "Peers each new result or Finished announcement is forwarded to, so that one pushed "
        "to a single member still reaches all (0: never forward).",
        "p2p.gossip_fanout",
        8,
        _int(0),
        show_default=True,
    ),
    Flag(
        "--p2p-max-inbound-connections",
        "Incoming P2P connections open at once; more are closed before their handshake.",
        "p2p.max_inbound_connections",
        256,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--p2p-max-inbound-per-ip",
        "Incoming P2P connections open at once from one IP address (peers behind one NAT "
        "share it; an IPv6 /64 counts as one address); more are closed before their handshake.",
        "p2p.max_inbound_per_ip",
        16,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--p2p-max-concurrent-serving",
        "Blob, manifest and parameter requests of peers served at once (others wait).",
        "p2p.max_concurrent_serving",
        32,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--p2p-max-serving-per-peer",
        "Of those, blob requests of one peer served at once, and as many of its model "
        "(manifest, parameter) requests (its others wait): a peer reading slowly cannot hold "
        "every slot, and a joiner's result fetch never waits behind its own model download.",
        "p2p.max_serving_per_peer",
        4,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--p2p-announcement-rate",
        "New (not duplicate) announcements per second accepted from one pushing peer, after "
        "a burst of 512; more are answered 'deferred' before any signature check.",
        "p2p.announcement_rate",
        64.0,
        click.FloatRange(min=0.1),
        show_default=True,
    ),
    Flag(
        "--p2p-max-result-size",
        "Bytes beyond which a peer's result announcement is refused before any download.",
        "p2p.max_result_size",
        256 * 1024 * 1024,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--max-upload-mbps",
        "Cap, in Mbit/s, on the rate at which this client uploads the model to late "
        "joiners (manifest and parameter answers, all peers together), so that sharing the "
        "model cannot fill a slow uplink. The round's results are never capped, and always go "
        "before model shares. At least 1 (slower, a joiner's parameter requests time out). "
        "Default: no cap.",
        "p2p.max_upload_rate",
        type=click.FloatRange(min=1.0),
        convert=mbps_to_bytes,
    ),
    Flag(
        "--data-fetch-attempts",
        "Tries to fetch a batch's training data before giving that batch up. Only "
        "transient failures are retried (network errors, timeouts, a data server that does "
        "not list this client yet); a missing sample or an unusable data location fails at "
        "once.",
        "data.attempts",
        7,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--data-fetch-retry-delay",
        "Backoff step in seconds between data-fetch attempts: attempt k waits (k-1) times "
        "this (0, 2, 4, ... 12 s with the defaults).",
        "data.delay_step",
        2.0,
        click.FloatRange(min=0),
        show_default=True,
    ),
    Flag(
        "--server-reconnect-timeout",
        "Seconds to keep reconnecting after the server connection is lost (a crashed or "
        "restarted server, a network cut), with the same identity; meanwhile the client keeps "
        "its model and keeps serving its peers. Attempts wait 0.5 s, doubling up to 10 s, each "
        "+-20% at random. 0: exit at once (exit code 1). The first connection is not retried.",
        "server.reconnect_timeout",
        600.0,
        click.FloatRange(min=0),
        show_default=True,
    ),
    Flag(
        "--data-parallelism",
        "Local ranks (devices) this client trains on; each trains a share of every batch. "
        "The client starts the other ranks itself; under torchrun the default is WORLD_SIZE. "
        "With CUDA, rank r uses GPU r.  [default: 1]",
        "backend.parallel.data_parallelism",
        type=_int(1),
    ),
    Flag(
        "--fsdp",
        "Shard the model over the --data-parallelism ranks (FSDP2 fully_shard) instead of "
        "holding a full copy on each: trains a model that does not fit one device.",
        "backend.parallel.fsdp",
        False,
        is_flag=True,
    ),
    Flag(
        "--tensor-parallelism",
        "The reference's tensor parallelism: only 1 (none) is accepted; use --fsdp to shard "
        "a model over several devices.",
        None,
        1,
        TensorParallelismType(),
        show_default=True,
    ),
    Flag(
        "--parallel-timeout",
        "Seconds a rank may keep the others waiting (a collective, or no sign of life) "
        "before the client gives up on it and exits.",
        "backend.parallel_timeout",
        300.0,
        click.FloatRange(min=1),
        show_default=True,
    ),
    Flag(
        "--dummy-training-delay-secs",
        "Testing: no model and no torch; every batch sleeps this long and produces a "
        "tiny fake result, so protocol-level runs are fast.",
        "backend.dummy_delay_secs",
        type=click.FloatRange(min=0),
    ),
    Flag(
        "--dummy-seconds-per-sample",
        "Testing, with --dummy-training-delay-secs: seconds each sample of a batch adds to "
        "its sleep (a batch of n samples sleeps the delay plus n times this), so clients of "
        "different speeds can be simulated.",
        "backend.dummy_seconds_per_sample",
        0.0,
        click.FloatRange(min=0),
        show_default=True,
    ),
    Flag(
        "--dummy-result-size",
        "Testing, with --dummy-training-delay-secs: bytes of every fake result (e.g. the "
        "size a real model's DisTrO results have, to test a run over slow links). Every "
        "client of a run must use the same size.",
        "backend.dummy_result_size",
        64,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--dummy-model-size",
        "Testing, with --dummy-training-delay-secs: bytes of extra fake parameters in the "
        "model shared with late joiners, so a model share moves as much as a real model's "
        "would.",
        "backend.dummy_model_size",
        0,
        _int(0),
        show_default=True,
    ),
    Flag(
        "--eval-tasks",
        "Comma-separated lm-evaluation-harness tasks (e.g. arc_easy,hellaswag, or the names in "
        "--eval-tasks-dir) evaluated on the live model while the client would otherwise wait "
        "(Cooldown, spare time after training in a round); multiple-choice tasks only. Their "
        'datasets are read locally (docs/client.md, "Evals").',
        "evals.tasks",
        convert=parse_task_list,
    ),
    Flag(
        "--eval-tasks-dir",
        "A folder of lm-eval task YAML files (e.g. tasks reading downloaded data with "
        "dataset_path: json), read before lm-eval's own tasks.",
        "evals.tasks_dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
    ),
    Flag(
        "--eval-fewshot",
        "Few-shot examples per eval prompt.",
        "evals.fewshot",
        0,
        _int(0),
        show_default=True,
    ),
    Flag(
        "--eval-seed",
        "Seed of the choice of few-shot examples.",
        "evals.seed",
        DEFAULT_EVAL_SEED,
        _int(0),
        show_default=True,
    ),
    Flag(
        "--eval-task-max-docs",
        "Documents of each eval task evaluated (default: all).",
        "evals.max_docs",
        type=_int(1),
    ),
    Flag(
        "--eval-heldout-every",
        "Measure the loss on the run data's held-out split every this many steps (0: never; "
        "the built-in corpus has one), while the client would otherwise wait.",
        "evals.heldout_every",
        0,
        _int(0),
        show_default=True,
    ),
    Flag(
        "--eval-heldout-sequences",
        "Held-out sequences the held-out loss averages over.",
        "evals.heldout_sequences",
        16,
        _int(1),
        show_default=True,
    ),
    Flag(
        "--eval-batch-size",
        "Sequences per eval forward pass: the most an eval holds the model before training "
        "can take it back.",
        "evals.batch_size",
        4,
        _int(1),
        show_default=True,
    ),
)


PRECISION_FLAGS = (
    "--dtype",
    "--grad-accum-in-fp32",
    "--activation-checkpointing",
    "--attn-implementation",
)
"""The `train` flags `check` takes too, to estimate the same setup."""


def precision_options(command: F) -> F:
    """Decorate `command` (`check`) with `train`'s precision flags."""
    for flag in reversed(FLAGS):
        if flag.name in PRECISION_FLAGS:
            command = flag.option()(command)
    return command


def train_options(command: F) -> F:
    """Decorate `command` with every flag of `FLAGS`, in order."""
    return options(FLAGS)(command)

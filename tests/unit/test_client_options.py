"""`psyche-client train`'s flags and `ClientOptions` come from one table (`app.flags.FLAGS`):
every flag that sets a field names one that exists, with the flag's default, and the click
command declares exactly the table's flags."""

from __future__ import annotations

import dataclasses

from psyche_client.app.flags import FLAGS
from psyche_client.app.options import ClientOptions, ServerOptions
from psyche_client.cli import train
from psyche_common.protocol import Identity

NOT_FLAGS = {"server.exit_when_finished", "checkpointing.keep", "server.authorization"}
"""Fields of the client's own sections that no flag sets directly (tests and embedders set
them; `server.authorization` holds the checked contents of `--authorization FILE`)."""
OWN_SECTIONS = ("server", "backend", "checkpointing")


def field_of(options: object, target: str) -> tuple[object, dataclasses.Field[object]]:
    """The dataclass holding `target` (a dotted path) and that field."""
    *path, name = target.split(".")
    holder = options
    for part in path:
        holder = getattr(holder, part)
    fields = {f.name: f for f in dataclasses.fields(holder)}  # type: ignore[arg-type]
    assert name in fields, f"{target}: no field {name} in {type(holder).__name__}"
    return holder, fields[name]


def defaults() -> ClientOptions:
    return ClientOptions(ServerOptions("h:1", "r"), Identity.generate())


def test_every_flag_target_is_a_field_with_the_flags_default() -> None:
    options = defaults()
    for flag in FLAGS:
        if flag.target is None:
            continue
        holder, field = field_of(options, flag.target)
        if flag.default is None or flag.required:
            continue
        expected = flag.convert(flag.default) if flag.convert else flag.default
        assert getattr(holder, field.name) == expected, flag.name


def test_every_field_of_the_clients_own_sections_has_a_flag() -> None:
    targets = {flag.target for flag in FLAGS if flag.target is not None}
    options = defaults()
    for section in OWN_SECTIONS:
        for field in dataclasses.fields(getattr(options, section)):
            name = f"{section}.{field.name}"
            if field.name == "parallel":  # a ParallelSpec: its fields are checked above
                continue
            assert name in targets or name in NOT_FLAGS, f"{name} has no flag"


def test_the_train_command_declares_exactly_the_tables_flags() -> None:
    declared = [param.name for param in train.params]
    assert declared == [flag.param for flag in FLAGS]
    for param, flag in zip(train.params, FLAGS, strict=True):
        assert flag.name in param.opts and param.envvar == flag.envvar  # type: ignore[attr-defined]


def test_from_flags_fills_each_section() -> None:
    values: dict[str, object] = {
        "server_addr": "h:1",
        "run_id": "r",
        "gossip_fanout": 3,
        "data_parallelism": 2,
        "fsdp": True,
        "checkpoint_dir": None,
        "max_upload_mbps": 8.0,
    }
    options = ClientOptions.from_flags(values, Identity.generate())
    assert options.p2p.gossip_fanout == 3 and options.p2p.max_concurrent_downloads == 4
    assert options.p2p.max_upload_rate == 1_000_000.0
    assert options.backend.parallel.data_parallelism == 2 and options.backend.parallel.fsdp
    assert options.backend.kind == "parallel"
    assert options.checkpointing.dir is None and options.checkpointing.keep == 3

"""`psyche-client train`'s flags and `ClientOptions` come from one table (`app.flags.FLAGS`):
every flag that sets a field names one that exists, with the flag's default, and the click
command declares exactly the table's flags."""

from __future__ import annotations

from psyche_client.app.flags import FLAGS
from psyche_client.app.options import ClientOptions, ServerOptions
from psyche_client.cli import train
from psyche_common.protocol import Identity

from tests.support.flag_tables import declaration_mismatches, fields_without_flag, target_mismatches

NOT_FLAGS = {"server.exit_when_finished", "checkpointing.keep", "server.authorization"}
"""Fields of the client's own sections that no flag sets directly (tests and embedders set
them; `server.authorization` holds the checked contents of `--authorization FILE`)."""
OWN_SECTIONS = ("server", "backend", "checkpointing")


def defaults() -> ClientOptions:
    return ClientOptions(ServerOptions("h:1", "r"), Identity.generate())


def test_every_flag_target_is_a_field_with_the_flags_default() -> None:
    assert target_mismatches(FLAGS, defaults()) == []


def test_every_field_of_the_clients_own_sections_has_a_flag() -> None:
    # backend.parallel, a ParallelSpec, is a section of its own: its fields are checked above
    assert fields_without_flag(FLAGS, defaults(), OWN_SECTIONS, NOT_FLAGS) == []


def test_the_train_command_declares_exactly_the_tables_flags() -> None:
    assert declaration_mismatches(train, FLAGS, from_environment=True) == []


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

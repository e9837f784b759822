"""The embedded default run (`default_state.toml`), sized for the number of clients started.

`init_min_clients` = every client, so the first epoch starts with all of them; `min_clients`
leaves room for the clients that random kills take down at once; witnesses fit `min_clients`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from string import Template

DEFAULT_TOTAL_STEPS = 2000


def render_default_state(
    num_clients: int, random_kill_num: int | None = None, total_steps: int = DEFAULT_TOTAL_STEPS
) -> str:
    """The default state.toml text for `num_clients` clients."""
    if num_clients < 1:
        raise ValueError(f"--num-clients must be at least 1, got {num_clients}")
    min_clients = max(1, num_clients - (random_kill_num or 0))
    template = resources.files("psyche_local_testnet").joinpath("default_state.toml")
    return Template(template.read_text(encoding="utf-8")).substitute(
        total_steps=total_steps,
        init_min_clients=num_clients,
        min_clients=min_clients,
        witness_nodes=min(2, min_clients),
        global_batch_size=max(4, 2 * num_clients),
    )


def write_default_state(
    directory: Path, num_clients: int, random_kill_num: int | None = None
) -> Path:
    """Write the default state.toml into `directory` and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "state.toml"
    path.write_text(render_default_state(num_clients, random_kill_num), encoding="utf-8")
    return path

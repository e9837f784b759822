"""A test-only client that trains against the run: it negates its gradients.

It is `psyche-client` with one change: before DisTrO folds the gradients into its momentum,
they are negated, so every result it sends points the other way from an honest one (its
momentum holds only negated gradients, so the values it sends are the negation of what it
would send honestly). Everything else — signatures, announcements, blobs, witnessing — is
honest. Run it with `psyche-client`'s arguments:
`python tests/e2e/signflip_client.py train --server-addr ...`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.distro.optimizer import Generated
from psyche_client.training.trainer import NamedParameters
from psyche_client.weights.backends import with_generate_hook


def negate_gradients(generate: Callable[[], Generated], parameters: NamedParameters) -> Generated:
    """A `GenerateHook`: DisTrO's generate step on the negated gradients."""
    for _, parameter in parameters:
        if parameter.grad is not None:
            parameter.grad.neg_()
    return generate()


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(backends=with_generate_hook(negate_gradients)))


if __name__ == "__main__":
    main()

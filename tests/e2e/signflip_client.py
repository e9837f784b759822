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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.distro.optimizer import DistroOptimizer, Generated


def main() -> None:
    honest_generate = DistroOptimizer.generate

    def negated_generate(self: DistroOptimizer, *args: Any, **kwargs: Any) -> Generated:
        for _, parameter in self._params:
            if parameter.grad is not None:
                parameter.grad.neg_()
        return honest_generate(self, *args, **kwargs)

    DistroOptimizer.generate = negated_generate  # type: ignore[method-assign]
    from psyche_client.cli import main as client_main

    client_main()


if __name__ == "__main__":
    main()

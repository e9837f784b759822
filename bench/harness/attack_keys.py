"""The key files of an attack run (`attack_run`): `KeyFiles` writes identities; `RunKeys`
gives the attackers (and, where an attack needs them, the honest clients) keys the harness
knows; `PermissionedKeys` lists the keys of a permissioned run and makes the intruders' and
the sybils' flags.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from psyche_common.protocol import Identity
from psyche_common.protocol.authorization import encode_authorization, sign_authorization

RUN_ID = "e2e-run"


class KeyFiles:
    """Identities written as secret-key files under `tmp` (what `psyche-client -i` loads)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def write(self, name: str) -> tuple[Path, Identity]:
        identity = Identity.generate()
        path = self.tmp / name
        path.write_bytes(identity.secret_bytes())
        return path, identity


class RunKeys:
    """Keys of an unpermissioned attack run: one per attacker, and one per honest client when
    `honest` is true (the equivocation replayer is handed them: it replays what they signed).
    An attacker program learns its own key file (`PSYCHE_ATTACK_IDENTITY`), the keys of every
    attacker of the run (`PSYCHE_ATTACK_COLLUDERS`, hex) and the honest key files
    (`PSYCHE_ATTACK_HONEST_KEYS`) from its environment (`attacker_env`)."""

    def __init__(self, tmp: Path, honest: int, attackers: int, *, honest_keys: bool) -> None:
        files = KeyFiles(tmp)
        self.attackers = [files.write(f"attacker{i}.key") for i in range(attackers)]
        self.honest = [files.write(f"honest{i}.key") for i in range(honest)] if honest_keys else []

    def honest_flags(self, index: int) -> list[str]:
        return ["-i", str(self.honest[index][0])] if self.honest else []

    def attacker_flags(self, index: int) -> list[str]:
        return ["-i", str(self.attackers[index][0])]

    def attacker_env(self, index: int) -> dict[str, str]:
        return {
            "PSYCHE_ATTACK_IDENTITY": str(self.attackers[index][0]),
            "PSYCHE_ATTACK_COLLUDERS": ",".join(i.public_key.hex() for _, i in self.attackers),
            "PSYCHE_ATTACK_HONEST_KEYS": ",".join(str(path) for path, _ in self.honest),
        }


class PermissionedKeys:
    """The key files of a permissioned run: the honest clients' keys, an authorizer's and
    the `sybil_authorizers` keys of the sybils' owners are listed in `authorized`; intruders
    hold keys of their own (see `intruder`), sybils delegations (see `sybil`)."""

    def __init__(self, tmp: Path, honest: int, sybil_authorizers: int = 0) -> None:
        self.files = KeyFiles(tmp)
        self.tmp = tmp
        self.honest = [self.files.write(f"honest{i}.key")[0] for i in range(honest)]
        _, self.authorizer = self.files.write("authorizer.key")
        self.sybil_authorizers = [
            self.files.write(f"sybil-authorizer{i}.key")[1] for i in range(sybil_authorizers)
        ]
        listed = [
            *(Identity.load(path).public_key for path in self.honest),
            self.authorizer.public_key,
            *(a.public_key for a in self.sybil_authorizers),
        ]
        self.authorized = tmp / "authorized_keys"
        self.authorized.write_text("".join(f"{key.hex()}\n" for key in listed))

    def intruder(self, index: int, kind: str | None) -> list[str]:
        """`psyche-client train` flags of intruder `index`: an `unlisted` key, or (for
        `bad_delegation`) an expired delegation at even indices and a forged one at odd ones
        (a genuine statement with the intruder's key added, so its signature fails)."""
        path, identity = self.files.write(f"intruder{index}.key")
        if kind == "unlisted":
            return ["-i", str(path)]
        now = int(time.time())
        if index % 2 == 0:
            statement = sign_authorization(self.authorizer, RUN_ID, [identity.public_key], now - 60)
        else:
            genuine = sign_authorization(
                self.authorizer, RUN_ID, [Identity.generate().public_key], now + 3600
            )
            statement = dataclasses.replace(
                genuine, delegates=(*genuine.delegates, identity.public_key)
            )
        auth = self.tmp / f"intruder{index}.auth"
        auth.write_bytes(encode_authorization(statement))
        return ["-i", str(path), "--authorization", str(auth)]

    def sybils(self, owner: int, count: int) -> list[list[str]]:
        """Flags of `count` sybils of listed key `owner`: one statement of that key delegates
        all of them, each client presenting it with its own key."""
        keys = [self.files.write(f"sybil{owner}-{j}.key") for j in range(count)]
        statement = sign_authorization(
            self.sybil_authorizers[owner],
            RUN_ID,
            [identity.public_key for _, identity in keys],
            int(time.time()) + 3600,
        )
        auth = self.tmp / f"sybils{owner}.auth"
        auth.write_bytes(encode_authorization(statement))
        return [["-i", str(path), "--authorization", str(auth)] for path, _ in keys]

"""Running the lab's system commands (`ip`, `iptables`, `tc`) and checking that network
namespaces can be made here at all (root, the tools, a namespace that really comes up)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from .plan import PREFIX, owner_pid

TOOLS = ("ip", "iptables", "tc")
COMMAND_TIMEOUT = 20.0


class LabError(RuntimeError):
    """A lab command failed; the message names the command and what it printed."""


def run(args: Sequence[str], *, check: bool = True, timeout: float = COMMAND_TIMEOUT) -> str:
    """Run one command; its stdout, or `LabError` (when `check`) naming the command."""
    try:
        done = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"`{' '.join(args)}` failed: {exc}") from exc
    if check and done.returncode != 0:
        raise LabError(f"`{' '.join(args)}` exited with {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def in_ns(namespace: str, *args: str) -> list[str]:
    """The command line that runs `args` inside `namespace`."""
    return ["ip", "netns", "exec", namespace, *args]


def namespaces() -> list[str]:
    """Names of the machine's network namespaces."""
    out = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale() -> list[str]:
    """Delete the namespaces left by labs whose process is gone (a crashed or killed test
    session); returns their names. Labs of live processes (another session) are left alone.
    Deleting a namespace removes its veth ends too, so nothing else is left behind."""
    stale = [
        name for name in namespaces() if (pid := owner_pid(name)) is not None and not _alive(pid)
    ]
    for name in stale:
        run(["ip", "netns", "delete", name], check=False)
    return stale


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def unavailable_reason() -> str | None:
    """Why no lab can be built on this machine, or None when one can."""
    if os.geteuid() != 0:
        return "network namespaces need root (the lab runs `ip netns`)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (`make test` installs them with apt-get)"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        run(["ip", "netns", "add", probe])
        run(in_ns(probe, "ip", "link", "set", "lo", "up"))
        run(in_ns(probe, "iptables", "-L", "-n"))
    except LabError as exc:
        return f"cannot create a network namespace here: {exc}"
    finally:
        run(["ip", "netns", "delete", probe], check=False)
    return None

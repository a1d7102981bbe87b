"""One name, one machine: a worker refuses a `DISPATCHQ_HOST` another machine's worker holds.

Host-bound work (a checkout's code and session jobs) goes to the queues of the host that holds
the checkout, by name. Two machines under one `DISPATCHQ_HOST` (a cloned config, a copied unit
file) would each take the other's host-bound jobs and run them without the checkout; their
host breakers and session lines would mix too. So every worker publishes its machine's id with
its facts, and a worker starting under a name that a *live* worker of another machine holds
refuses to start, in one line. A machine restarting within its old workers' heartbeat is the
same machine (`/etc/machine-id` survives a reboot), so it is never refused.
"""

from __future__ import annotations

import functools
import hashlib
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dispatchq.errors import SettingsError

__all__ = ["MACHINE_ID_FILES", "check_host_unique", "holder_elsewhere", "machine_id"]

MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


@functools.lru_cache(maxsize=4)  # read once per process: every heartbeat publishes it
def machine_id(files: Sequence[str] = MACHINE_ID_FILES, boot_id_file: str = BOOT_ID_FILE) -> str:
    """This machine's id: `/etc/machine-id`, or where it is missing, the boot id and hostname.

    The fallback changes at every boot, so such a machine restarting within its old workers'
    heartbeat waits for them to lapse (at most the heartbeat grace) rather than being taken
    for itself; a cloned `/etc/machine-id` cannot be told from the original (see many-hosts.md).
    """
    for name in files:
        try:
            text = Path(name).read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if text:
            return text
    try:
        boot = Path(boot_id_file).read_text(encoding="utf-8").strip()
    except OSError:
        boot = ""
    return "boot-" + hashlib.sha256(f"{boot}\0{socket.gethostname()}".encode()).hexdigest()[:32]


def holder_elsewhere(live: Iterable[Mapping[str, Any]], host: str, mine: str) -> Mapping[str, Any] | None:
    """A live worker's facts that claim `host` from another machine, else None."""
    for facts in live:
        theirs = facts.get("machine_id")
        if facts.get("host") == host and isinstance(theirs, str) and theirs and theirs != mine:
            return facts
    return None


def check_host_unique(live: Iterable[Mapping[str, Any]], host: str, mine: str) -> None:
    """`SettingsError` (the CLI exits 2 with the line) when another machine holds `host`."""
    other = holder_elsewhere(live, host, mine)
    if other is None:
        return
    raise SettingsError(
        f"DISPATCHQ_HOST={host!r} is held by a live worker on another machine "
        f"(worker {other.get('name')}, pid {other.get('pid')}, machine id {str(other['machine_id'])[:12]}…): "
        "give every machine its own DISPATCHQ_HOST"
    )

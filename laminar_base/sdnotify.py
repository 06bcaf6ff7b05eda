"""systemd notification protocol (sd_notify): READY=1, WATCHDOG=1, STOPPING=1, STATUS=...

A no-op when ``NOTIFY_SOCKET`` is unset (not under systemd). The socket path is
read once at start-up and passed in, as nothing reads the environment later.
"""

from __future__ import annotations

import logging
import socket

log = logging.getLogger("laminar.sdnotify")


class Notifier:
    def __init__(self, notify_socket: str | None, watchdog_usec: str | None = None) -> None:
        self._address = notify_socket or None
        if self._address and self._address.startswith("@"):
            self._address = "\0" + self._address[1:]
        self.watchdog_interval_seconds: float | None = None
        if watchdog_usec and watchdog_usec.isdigit() and int(watchdog_usec) > 0:
            # Ping at half the watchdog timeout, as systemd recommends.
            self.watchdog_interval_seconds = int(watchdog_usec) / 1e6 / 2

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *states: str) -> None:
        if not self._address:
            return
        payload = "\n".join(states).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self._address)
                sock.sendall(payload)
        except OSError as exc:
            log.warning("sd_notify %s failed: %s", states, exc)

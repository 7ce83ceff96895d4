"""One listening socket per user beside the shared one, so that one user's connection
flood never stands in front of anyone else's connection.

The shared socket has one kernel listen queue: a user looping connect/close keeps it full
of dead connections, and every other client waits behind them (a CPU race the daemon
loses on a small node however cheaply it refuses each one). After a uid's first
connection through the shared socket the daemon binds `<socket>.d/<uid>`
(launcher.protocol.user_socket_path), owned by that uid and mode 0600, in a directory it
made and owns; the client uses it from then on. While a uid is over its connect rate the
daemon stops listening on that uid's own socket (launcher.connections), so the flood
waits in that user's queue only, costs the daemon nothing, and other users' queues stay
empty.

Bounds: at most `limits.max_user_sockets` sockets (one descriptor each); past it users
share the common socket as before. Only the daemon writes in the directory: it is
emptied at start (a dead daemon's sockets) and at stop. A daemon that cannot chown
(neither root nor CAP_CHOWN) serves its own uid's socket only.

This module must never follow a link, never be opened by a name a user can write, and
never fail the daemon: a directory it cannot trust leaves everyone on the shared socket,
said once in the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from pathlib import Path

from launcher.protocol import user_socket_dir
from launcher.safefs import UnsafePath, open_dir, remove_entry

log = logging.getLogger(__name__)

_BACKLOG = 128  # one user's own queue: deep enough for a pipeline of CLI calls


class UserSockets:
    """The per-uid listening sockets of one daemon (see the module docstring)."""

    def __init__(self, socket_path: Path, *, cap: int) -> None:
        self.directory = user_socket_dir(socket_path)
        self._cap = cap
        self._dirfd: int | None = None
        self._socks: dict[int, socket.socket] = {}
        self._inos: dict[int, int] = {}
        self._full_said = False
        self._may_give = True  # until chown fails: a daemon without CAP_CHOWN

    def __len__(self) -> int:
        return len(self._socks)

    def open(self) -> None:
        """Take the directory (made 0755 and owned by the daemon) and empty it; on any
        doubt leave per-user sockets off, logged."""
        if self._cap <= 0:
            return
        try:
            fd = open_dir(self.directory, mode=0o755)
        except (OSError, UnsafePath) as exc:
            log.warning("per-user sockets off (every user shares the common socket): %s",
                        exc)
            return
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
            os.close(fd)
            log.warning("per-user sockets off: %s is not the daemon's own directory "
                        "(owner %d, mode %04o)", self.directory, st.st_uid,
                        stat.S_IMODE(st.st_mode))
            return
        for name in os.listdir(fd):
            try:  # a dead daemon's sockets, or anything else: removed, never followed
                remove_entry(fd, name)
            except (OSError, UnsafePath) as exc:
                log.warning("cannot remove %s/%s: %s", self.directory, name, exc)
        self._dirfd = fd

    def ensure(self, uid: int) -> socket.socket | None:
        """A new listening socket for `uid`, or None (it has one, the cap is reached,
        the daemon may not give one to that uid, or binding failed: logged)."""
        fd = self._dirfd
        if fd is None or uid in self._socks:
            return None
        if uid != os.geteuid() and not self._may_give:
            return None
        if len(self._socks) >= self._cap:
            if not self._full_said:
                self._full_said = True
                log.warning("limits.max_user_sockets (%d) reached: uid %d and later "
                            "users share the common socket", self._cap, uid)
            return None
        name = str(uid)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # through the directory's descriptor; the file is the daemon's (umask: no
            # one else may connect) until it is given to the uid and made 0600
            s.bind(f"/proc/self/fd/{fd}/{name}")
            if uid != os.geteuid():
                try:
                    os.chown(name, uid, -1, dir_fd=fd, follow_symlinks=False)
                except PermissionError:
                    self._may_give = False
                    raise
            os.chmod(name, 0o600, dir_fd=fd)  # the directory is ours: no link in it
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISSOCK(st.st_mode):
                raise UnsafePath(f"{self.directory}/{name} is not the socket just bound")
            s.listen(_BACKLOG)
            s.setblocking(False)
        except (OSError, UnsafePath) as exc:
            s.close()
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
            log.warning("no own socket for uid %d (it shares the common socket): %s",
                        uid, exc)
            return None
        self._socks[uid] = s
        self._inos[uid] = st.st_ino
        return s

    def close(self) -> None:
        """Close every socket and remove its file (the daemon stops)."""
        fd = self._dirfd
        for uid, s in self._socks.items():
            s.close()
            if fd is not None:
                with contextlib.suppress(OSError):
                    st = os.stat(str(uid), dir_fd=fd, follow_symlinks=False)
                    if st.st_ino == self._inos.get(uid):
                        os.unlink(str(uid), dir_fd=fd)
        self._socks.clear()
        self._inos.clear()
        if fd is not None:
            os.close(fd)
            self._dirfd = None

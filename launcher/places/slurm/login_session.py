"""The SSH session to the login node, opened in a thread of its own as soon as `up` knows it goes to Slurm: the
handshake (sshd's start there, key exchange, authentication) proceeds while the rest of the submission's code is
imported, instead of after it. The session is the same one, opened the same way; only its start moves earlier."""

from __future__ import annotations

import threading

from launcher.transport.hostsession import ConnectOptions, HostSession


class LoginSession:
    """HostSession.open(options, sftp=False) begun now; `session()` waits for it and gives it, or raises what
    opening it raised (the same one line)."""

    def __init__(self, options: ConnectOptions) -> None:
        self._options = options
        self._session: HostSession | None = None
        self._error: BaseException | None = None
        self._abandoned = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._open, name="ddpctl-login-connect", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        try:
            session = HostSession.open(self._options, sftp=False)
        except BaseException as e:  # given to the caller as opening inline would have raised it
            self._error = e
            return
        with self._lock:
            if self._abandoned:  # the caller stopped waiting (Ctrl-C): nobody else will close it
                session.close()
            else:
                self._session = session

    def session(self) -> HostSession:
        """The open session (waiting for the handshake), handed over once: the caller closes it."""
        try:
            self._thread.join()
        except BaseException:
            self.abandon()
            raise
        if self._error is not None:
            raise self._error
        with self._lock:
            session, self._session = self._session, None
        if session is None:
            raise RuntimeError("the login session was handed over already")
        return session

    def abandon(self) -> None:
        """Not used after all (an error before it was asked for, an interruption): closed now or once it opens;
        nothing once handed over."""
        with self._lock:
            self._abandoned = True
            session, self._session = self._session, None
        if session is not None:
            session.close()

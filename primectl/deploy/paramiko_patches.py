"""paramiko's internals, patched for less CPU per connection with the same behaviour (`tune_paramiko`).

Every change primectl makes to paramiko's own classes and functions is here, applied once per process before the
first connection (transport.SSHTransport does), so that what runs on top of paramiko is paramiko plus this module.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import socket
import time
from collections.abc import Callable
from typing import Any


@functools.cache
def tune_paramiko() -> None:
    """paramiko's per-connection costs, made cheap with the same behaviour:
    - each received packet's MAC is compared a byte at a time in Python (a seventh of the controller's CPU at
      72 hosts); hmac.compare_digest is the same constant-time check in C;
    - each handshake starts a threading.Timer thread only to flag its timeout; a deadline read where paramiko
      asks (its reader checks between reads) flags the same timeout with no thread;
    - each packet took two reads (`buffered_read_all`), and the socket blocks once logged in (SSHTransport), so
      paramiko's own close shuts the socket down before it closes it: closing a descriptor does not wake a
      thread blocked in a read or a write on it, and paramiko closes from its reader thread (a disconnect, a bad
      MAC) while a call may be sending;
    - AES-GCM (an AEAD cipher: one native call per packet) is offered before AES-CTR with a MAC (an HMAC built
      in Python per packet): a round trip on an agent connection costs ~10% less CPU, on both ends. A server
      without GCM (OpenSSH has it since 6.2) agrees on CTR, as before;
    - the debug messages sshd sends after a login (the key's options) were escaped a byte at a time in Python
      (`safe_string`) for a log line nobody enables; printable text now passes through as it is."""
    import hmac

    import paramiko.packet
    import paramiko.transport
    import paramiko.util

    paramiko.util.constant_time_bytes_eq = hmac.compare_digest
    paramiko.util.safe_string = printable_as_is(paramiko.util.safe_string)
    client = paramiko.transport.Transport
    aead = tuple(c for c in client._preferred_ciphers if c.endswith("-gcm@openssh.com"))
    client._preferred_ciphers = aead + tuple(c for c in client._preferred_ciphers if c not in aead)
    packetizer = paramiko.packet.Packetizer

    def start_handshake(self: Any, timeout: float) -> None:
        if getattr(self, "_handshake_deadline", None) is None:
            self._handshake_deadline = time.monotonic() + float(timeout)

    def handshake_timed_out(self: Any) -> bool:
        deadline = getattr(self, "_handshake_deadline", None)
        return deadline is not None and not getattr(self, "_handshake_done", False) and time.monotonic() > deadline

    def complete_handshake(self: Any) -> None:
        self._handshake_done = True

    packetizer.start_handshake = start_handshake
    packetizer.handshake_timed_out = handshake_timed_out
    packetizer.complete_handshake = complete_handshake
    packetizer.read_all = buffered_read_all(packetizer.read_all)
    packetizer.close = shut_down_first(packetizer.close)


_PRINTABLE = bytes(range(32, 128))  # what paramiko's safe_string keeps as it is


def printable_as_is(safe_string: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    """paramiko's safe_string (bytes outside 32-127 become %XX), with text that has none returned at once."""

    def fast(s: bytes) -> bytes:
        if isinstance(s, bytes) and not s.translate(None, _PRINTABLE):
            return s
        return safe_string(s)

    return fast


def shut_down_first(close: Callable[[Any], None]) -> Callable[[Any], None]:
    """paramiko's Packetizer.close, after a shutdown of its socket (which wakes whatever blocks on it)."""

    def shut_then_close(self: Any) -> None:
        sock = getattr(self, "_Packetizer__socket", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        close(self)

    return shut_then_close


READ_CHUNK = 32768  # what one read from an SSH socket may take beyond the bytes asked for


def buffered_read_all(exact: Callable[..., bytes]) -> Callable[..., bytes]:
    """paramiko's Packetizer.read_all, reading what the socket holds rather than exactly what it needs: paramiko
    reads each packet in two reads (its first block, then the rest), and a socket with a timeout makes each read
    two system calls (poll, then recv), so most of its reader thread's time went to the kernel, and several
    packets that arrive together (a channel's EOF, exit status and close) took six. The surplus waits in the
    buffer paramiko keeps for what it over-reads after the version line. `exact` (paramiko's own) serves a
    Packetizer that does not have the attributes this one reads, or whose socket is not a socket."""
    from paramiko.packet import NeedRekeyException

    def read_all(self: Any, n: int, check_rekey: bool = False) -> bytes:
        try:
            buf: bytes = self._Packetizer__remainder
            sock = self._Packetizer__socket
        except AttributeError:
            return exact(self, n, check_rekey)
        if not isinstance(sock, socket.socket):  # a ProxyCommand's recv waits for all it is asked for
            return exact(self, n, check_rekey)
        if len(buf) >= n:
            self._Packetizer__remainder = buf[n:]
            return buf[:n]
        parts, have = [buf], len(buf)
        while have < n:
            if self.handshake_timed_out():
                raise EOFError()
            try:
                got = sock.recv(max(n - have, READ_CHUNK))
            except (TimeoutError, BlockingIOError) as exc:
                if exc.errno == errno.ETIMEDOUT:  # the kernel gave up on the peer (detect_dead_peer), not a poll
                    raise
                if self._Packetizer__closed:
                    raise EOFError() from None
                if check_rekey and not have and self._Packetizer__need_rekey:
                    raise NeedRekeyException() from None
                self._check_keepalive()
                continue
            except OSError:
                if self._Packetizer__closed:
                    raise EOFError() from None
                raise
            if not got:
                raise EOFError()
            parts.append(got)
            have += len(got)
        data = b"".join(parts)
        self._Packetizer__remainder = data[n:]
        return data[:n]

    return read_all


def use_host_keys(client: Any, keys: Any, filename: str) -> None:
    """Give an SSHClient `keys` as if its load_host_keys had read them from `filename`, without parsing the
    whole file."""
    client._host_keys = keys
    client._host_keys_filename = filename

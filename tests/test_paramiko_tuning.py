"""primectl's changes to paramiko's per-connection costs keep paramiko's behaviour: a handshake that stalls is
still ended at its deadline (now with no timer thread), and a MAC check still tells a good MAC from a bad one.
Real paramiko Packetizers on a socket pair; no SSH server is needed for either."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from primectl.deploy.paramiko_patches import tune_paramiko


def _reader() -> tuple[object, socket.socket]:
    import paramiko.packet

    tune_paramiko()
    ours, theirs = socket.socketpair()
    ours.settimeout(0.05)  # paramiko's reader wakes at its socket's timeout to check its deadlines
    return paramiko.packet.Packetizer(ours), theirs


def test_a_handshake_that_stalls_is_ended_at_its_deadline_without_a_timer_thread() -> None:
    packetizer, theirs = _reader()
    threads = threading.active_count()
    packetizer.start_handshake(0.3)  # type: ignore[attr-defined]
    assert threading.active_count() == threads, "a thread was started to time the handshake"
    t0 = time.monotonic()
    with pytest.raises(EOFError):
        packetizer.read_all(4)  # type: ignore[attr-defined]  # the peer never sends a byte
    waited = time.monotonic() - t0
    assert 0.25 <= waited < 3, f"ended after {waited:.2f}s, its deadline was 0.3s"
    theirs.close()


def test_a_completed_handshake_has_no_deadline_and_data_still_arrives() -> None:
    packetizer, theirs = _reader()
    packetizer.start_handshake(0.1)  # type: ignore[attr-defined]
    packetizer.complete_handshake()  # type: ignore[attr-defined]
    time.sleep(0.2)
    assert not packetizer.handshake_timed_out()  # type: ignore[attr-defined]
    theirs.sendall(b"abcd")
    assert packetizer.read_all(4) == b"abcd"  # type: ignore[attr-defined]
    theirs.close()


def test_the_mac_check_still_refuses_a_wrong_mac() -> None:
    import paramiko.util

    tune_paramiko()
    assert paramiko.util.constant_time_bytes_eq(b"\x01" * 32, b"\x01" * 32)
    assert not paramiko.util.constant_time_bytes_eq(b"\x01" * 32, b"\x01" * 31 + b"\x02")


class CountingSocket(socket.socket):
    """A socket that counts its reads (the reader's cost is mostly its system calls)."""

    reads = 0

    def recv(self, n: int, flags: int = 0) -> bytes:
        self.reads += 1
        return super().recv(n, flags)


def test_packets_that_arrive_together_are_read_in_one_read_and_come_out_whole() -> None:
    import paramiko.packet

    tune_paramiko()
    ours, theirs = socket.socketpair()
    counted = CountingSocket(fileno=ours.detach())
    counted.settimeout(0.05)
    packetizer = paramiko.packet.Packetizer(counted)
    theirs.sendall(b"first-block|rest of the first packet|second packet|third")
    assert packetizer.read_all(12) == b"first-block|"
    assert packetizer.read_all(25) == b"rest of the first packet|"
    assert packetizer.read_all(14) == b"second packet|"
    assert counted.reads == 1, f"{counted.reads} reads for what came in one"
    threading.Timer(0.2, theirs.sendall, args=(b"-and more",)).start()  # the rest comes later, after timeouts
    assert packetizer.read_all(14) == b"third-and more"
    theirs.close()
    with pytest.raises(EOFError):  # the peer closed: no partial packet comes out
        packetizer.read_all(1)


def test_a_closed_reader_stops_at_its_next_wake() -> None:
    packetizer, theirs = _reader()
    threading.Timer(0.1, packetizer.close).start()  # type: ignore[attr-defined]
    with pytest.raises(EOFError):
        packetizer.read_all(4)  # type: ignore[attr-defined]
    theirs.close()


def test_paramikos_own_close_wakes_a_reader_blocked_on_a_socket_without_timeout() -> None:
    """Once logged in, primectl's sockets block; paramiko closes from its reader thread on a disconnect or a bad
    MAC, and closing a descriptor alone wakes no thread blocked on it (a call sending would hang for good)."""
    import paramiko.packet

    tune_paramiko()
    ours, theirs = socket.socketpair()  # blocking, as after the handshake
    packetizer = paramiko.packet.Packetizer(ours)
    ended: list[BaseException] = []

    def read() -> None:
        try:
            packetizer.read_all(4)
        except BaseException as exc:  # what ended the read is the result
            ended.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.2)  # blocked in recv
    packetizer.close()
    reader.join(2)
    assert not reader.is_alive(), "the read still blocks 2 s after paramiko closed its packetizer"
    assert ended and isinstance(ended[0], EOFError), ended
    theirs.close()


def test_a_rekey_paramiko_asked_for_is_signalled_to_its_reader_while_nothing_arrives() -> None:
    import paramiko.packet

    packetizer, theirs = _reader()
    packetizer._trigger_rekey()  # type: ignore[attr-defined]  # what paramiko does after sending its rekey limit
    with pytest.raises(paramiko.packet.NeedRekeyException):
        packetizer.read_all(4, check_rekey=True)  # type: ignore[attr-defined]
    theirs.sendall(b"abcd")
    assert packetizer.read_all(4, check_rekey=True) == b"abcd"  # type: ignore[attr-defined]
    theirs.close()


def test_debug_text_from_a_server_is_escaped_as_paramiko_escapes_it() -> None:
    import paramiko.util

    tune_paramiko()
    assert paramiko.util.safe_string(b"/root/.ssh/authorized_keys:1: key options: agent-forwarding") == (
        b"/root/.ssh/authorized_keys:1: key options: agent-forwarding")
    assert paramiko.util.safe_string(b"tab\there \xff\x00 del\x7f") == b"tab%09here %FF%00 del\x7f"
    assert paramiko.util.safe_string(b"") == b""

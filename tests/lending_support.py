"""The node stager's lent warm sockets, for the tests of lending (tests/test_stager_lending.py,
tests/test_stager_lending_signals.py): a counting TCP store, the stager's warm sockets ready
to it, and a job's copy as a forked process."""

from __future__ import annotations

import os
import socket

import pytest

from pegasus_cloudio.stager import warm as stager_warm

from test_stager import wait_for

# The stager lends each job's copy a descriptor of its warm sockets and keeps its own; when the
# copy is reaped, a socket comes back to the pool only if the kernel says it carried nothing.


class Store:
    """A TCP server that accepts and counts connections (the store's side of each)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.accepted = []

    @property
    def address(self):
        return self.listener.getsockname()

    def accept_all(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return len(self.accepted)
            self.accepted.append(conn)

    def peer_of(self, sock):
        """The store's side of the client socket ``sock``."""
        self.accept_all()
        return next(conn for conn in self.accepted if conn.getpeername() == sock.getsockname())

    def close(self):
        for conn in self.accepted + [self.listener]:
            conn.close()


@pytest.fixture
def warmed():
    """(store, the stager's warm sockets): PER_ENDPOINT connected to the store, ready."""
    store, sockets = Store(), stager_warm.WarmSockets()
    try:
        stager_warm.report(sockets.reports_w, [store.address], look_up=True)
        sockets.drain_reports()
        for sock in sockets.idle():
            wait_for(lambda: _state(sock) == 1, "the stager's connect")  # TCP_ESTABLISHED
        yield store, sockets
    finally:
        sockets.close()
        store.close()


def _state(sock):
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def _job(handed, act=lambda sockets: None):
    """A job's copy: a forked process holding the handed sockets, doing ``act`` with them,
    then closing its descriptors (as ``transfer.http.warm.discard`` does); its pid."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            act([sock for found in handed.values() for sock in found])
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid


def _reaped(pid):
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _at_each_bytecode(code, k, interrupt, callees=()):
    """A tracer that calls ``interrupt()`` once, before the ``k``-th bytecode run by the first
    frame of ``code`` or by the frames it calls whose code is in a file of ``callees``, as a
    signal handler would run there; the tracer's own state (fired)."""
    state = {"frame": None, "seen": 0, "fired": False}

    def local(frame, event, arg):
        if event == "opcode" and not state["fired"]:
            if state["seen"] == k:
                state["fired"] = True
                interrupt()
            state["seen"] += 1
        return local

    def calls(frame, event, arg):
        if state["fired"]:
            return None
        if state["frame"] is None and frame.f_code is code:
            state["frame"] = frame
        elif state["frame"] is None or frame.f_code.co_filename not in callees:
            return None
        frame.f_trace_opcodes = True
        return local

    return calls, state

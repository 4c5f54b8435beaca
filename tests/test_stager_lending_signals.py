"""Lent warm connections against SIGCHLD: the stager's reaper runs as a signal handler between
any two bytecodes, so these tests run it before every bytecode of the reaper and of a real
dispatch, with real copies and sockets (tests/lending_support.py)."""

from __future__ import annotations

import os
import signal
import socket
import sys

from pegasus_cloudio.stager import warm as stager_warm

from test_stager import wait_for
from lending_support import warmed, _state, _job, _reaped, _at_each_bytecode  # noqa: F401 - warmed is a fixture


def test_a_copy_that_ends_while_the_reaper_runs_is_reaped_before_it_returns_whatever_the_bytecode(warmed, monkeypatch):
    """SIGCHLD's handler runs between any two bytecodes, the reaper's own too (it then only
    notes that a child ended). A copy that ends at any point of the reaper must be reaped, and
    its sockets given back, before the reaper returns: no later SIGCHLD comes for it, so a
    missed one would leave it a zombie holding its loans (and its job unlogged) until some
    other job comes."""
    from pegasus_cloudio.stager import server

    store, sockets = warmed
    monkeypatch.setattr(stager_warm, "MAX_AGE_S", 3600.0)  # as in the dispatch's test below
    monkeypatch.setattr(stager_warm, "FORGET_S", 3600.0)
    code = server.Stager._reap.__code__
    k = 0
    while True:
        stager = server.Stager("/nonexistent/s.sock")
        stager._warm = sockets
        first = _job({})
        os.waitid(os.P_PID, first, os.WEXITED | os.WNOWAIT)
        handed = sockets.hand_out()
        reader, writer = os.pipe()
        second = _job(handed, lambda _: os.read(reader, 1))
        sockets.lend(second)

        def sigchld():
            os.write(writer, b"x")
            os.waitid(os.P_PID, second, os.WEXITED | os.WNOWAIT)  # it ended
            stager._reap(signal.SIGCHLD, None)  # the handler, run here

        tracer, state = _at_each_bytecode(code, k, sigchld)
        sys.settrace(tracer)
        try:
            stager._reap(signal.SIGCHLD, None)
        finally:
            sys.settrace(None)
        if not state["fired"]:  # k is past the reaper's last bytecode
            os.write(writer, b"x")
            assert _reaped(second) == 0
            sockets.give_back(second)
            break
        assert stager.served == 2, f"a copy that ended before bytecode {k} of the reaper was left unreaped"
        assert all(sock in sockets.idle() for sock in handed[store.address])
        for fd in (reader, writer):
            os.close(fd)
        k += 1
    assert k > 20


def test_a_copy_that_ends_at_any_bytecode_of_a_dispatch_never_mixes_its_loans_with_the_new_copys(warmed, monkeypatch):
    """SIGCHLD's handler run before each bytecode of a real dispatch, the stager's and the
    pool's functions it calls included (an opcode tracer; a real client connection, a real
    forked copy kept waiting for its request): the copy that
    ended is reaped by the dispatch's end, its sockets back in the pool; the new copy's
    sockets are lent under the new copy's pid and none is in the pool while it runs."""
    from pegasus_cloudio.stager import server, wire

    store, sockets = warmed
    # The loop takes longer than a connection's age limit (10 s) on a loaded machine, and the
    # same returned sockets are handed out first in every round: ages are not what this tests.
    # Nor is forgetting an endpoint unused for FORGET_S (300 s): no copy here reports using it.
    monkeypatch.setattr(stager_warm, "MAX_AGE_S", 3600.0)
    monkeypatch.setattr(stager_warm, "FORGET_S", 3600.0)
    code = server.Stager._dispatch.__code__
    me = os.getpid()
    k = 0
    while True:
        stager = server.Stager("/nonexistent/s.sock")
        stager._warm = sockets
        stager._listener = socket.socket(socket.AF_UNIX)
        handed = sockets.hand_out()
        reader, writer = os.pipe()
        ending = _job(handed, lambda _: os.read(reader, 1))
        sockets.lend(ending)
        sockets.refill()
        wait_for(lambda: store.accept_all() and all(_state(s) == 1 for s in sockets.idle()), "the refill's connects")
        client, conn = socket.socketpair()

        def sigchld():
            if os.getpid() != me:
                return
            os.write(writer, b"x")
            os.waitid(os.P_PID, ending, os.WEXITED | os.WNOWAIT)
            stager._reap(signal.SIGCHLD, None)

        tracer, state = _at_each_bytecode(code, k, sigchld, (server.__file__, stager_warm.__file__))
        sys.settrace(tracer)
        try:
            stager._dispatch(conn)
        finally:
            sys.settrace(None)
        if not state["fired"]:
            os.write(writer, b"x")
        copy = next(pid for pid in sockets._lent if pid != ending)
        mine = [loan[3] for loan in sockets._lent[copy]]
        assert mine and not set(mine) & set(sockets.idle()), f"bytecode {k}"
        if state["fired"]:
            assert ending not in sockets._lent and stager.served == 1, f"bytecode {k}"
            back = set(sockets.idle()) | set(mine)  # back in the pool, or lent again to the new copy
            assert set(handed[store.address]) <= back, f"bytecode {k}"
        client.sendall(b"\0" * wire.LENGTH_BYTES)  # a request without the job's streams: the copy ends
        client.close()
        os.waitid(os.P_PID, copy, os.WEXITED | os.WNOWAIT)
        if not state["fired"]:  # let go only after the dispatch: it ends in its own time, maybe after
            os.waitid(os.P_PID, ending, os.WEXITED | os.WNOWAIT)  # the new copy (a stager reaps it at its SIGCHLD)
        stager._reap(signal.SIGCHLD, None)
        assert not sockets._lent and stager.served == 2
        for fd in (reader, writer):
            os.close(fd)
        stager._listener.close()
        if not state["fired"]:
            break
        k += 1
    assert k > 20

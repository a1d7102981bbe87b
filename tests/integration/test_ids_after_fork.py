"""Judgement and job ids are drawn from a buffer: a forked process must not draw its parent's."""

from __future__ import annotations

import os

from dispatchq.queue.dispatch import _new_id


def test_a_forked_child_draws_none_of_the_ids_its_parent_will() -> None:
    _new_id()  # the buffer is filled in the parent before the fork, as in an RQ worker
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a work horse making ids of its own
        try:
            os.write(write, " ".join(_new_id() for _ in range(20)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    parent = {_new_id() for _ in range(20)}
    assert len(child) == 20 and len(parent) == 20
    assert not child & parent


def test_ids_are_128_bits_of_hex_and_do_not_repeat_across_refills() -> None:
    drawn = [_new_id() for _ in range(2_000)]
    assert len(set(drawn)) == len(drawn)
    assert all(len(jid) == 32 and int(jid, 16) >= 0 for jid in drawn)

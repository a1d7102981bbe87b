"""RQ's INFO chatter is left out of dispatchq's log unless asked for; its warnings never are."""

from __future__ import annotations

import io
import logging

from dispatchq.process import logs


def _log_lines(rq_info: bool) -> str:
    stream = io.StringIO()
    logs.configure("session", "text", stream=stream, rq_info=rq_info)
    logging.getLogger("rq.worker").info("default: job picked up")
    logging.getLogger("rq_scheduler.scheduler").info("Registering birth")
    logging.getLogger("rq.worker").warning("job exceeded its timeout")
    logging.getLogger("dispatchq.session").info("answered j-1")
    return stream.getvalue()


def test_rq_info_lines_are_left_out_by_default(restore_root: None) -> None:
    out = _log_lines(rq_info=False)
    assert "job picked up" not in out and "Registering birth" not in out
    assert "job exceeded its timeout" in out and "answered j-1" in out


def test_dispatchq_log_rq_shows_them(restore_root: None) -> None:
    out = _log_lines(rq_info=True)
    assert "job picked up" in out and "Registering birth" in out

"""The Python API for producers: `from dispatchq import Client`.

    client = Client()                      # settings from the environment
    jid = client.enqueue("comment-actionable", "acme/app#12", state={...})
    record = client.result(jid, wait=30)   # a dispatchq.core.judgement.Record

The CLI's `enqueue` and `run` go through the same methods, so a producer in Python
and one piping JSON Lines get exactly the same validation and idempotency.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from dispatchq.core.judgement import FINISHED, JudgementIn, Record
from dispatchq.errors import EnqueueInterrupted, TooManyRefused, UserError
from dispatchq.queue.parts import QUEUE_PARTS
from dispatchq.queue.writer import ChunkWriter
from dispatchq.runtime import Dispatching, Runtime
from dispatchq.settings import Settings, load_settings
from dispatchq.storage.connection import connect
from dispatchq.storage.outage import is_outage, out_of_memory_message

if TYPE_CHECKING:
    from dispatchq.queue.dispatch import Prepared

__all__ = [
    "Client",
    "Enqueued",
    "describe_validation",
]


@dataclass(frozen=True)
class Enqueued:
    """One input's outcome: its id (new or the live duplicate's), or why it was refused."""

    index: int  # 1-based position (the line number for JSON Lines)
    id: str | None
    created: bool = False
    error: str | None = None
    #: True when Redis failed before this input was written (the batch was cut off).
    unwritten: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


def describe_validation(error: ValidationError) -> str:
    """pydantic's report as one line naming the field: `kind: Field required`."""
    parts = []
    for item in error.errors(include_url=False)[:3]:
        where = ".".join(str(x) for x in item["loc"]) or "judgement"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


class Client:
    """Enqueue judgements and read their records."""

    def __init__(self, settings: Settings | None = None, *, runtime: Runtime | None = None) -> None:
        # A producer's client needs the queues and the config's kinds, not the decision
        # gate's built-in ones (only the gate enqueues those, with its own runtime).
        if runtime is None:
            settings = settings or load_settings()
            runtime = Runtime(settings=settings, redis=connect(settings), queue_parts=QUEUE_PARTS)
        self.runtime = runtime
        #: Why the last batch enqueue was cut off part way (a Redis outage or OOM), if it was.
        self.interrupted: BaseException | None = None

    def enqueue(
        self,
        kind: str,
        target: str,
        *,
        item: str | None = None,
        context: dict[str, Any] | None = None,
        state: Any = None,
        key: str | None = None,
        priority: str | None = None,
        force: bool = False,
    ) -> str:
        """Enqueue one judgement; return its id (the live duplicate's id if already queued).

        `priority`: `urgent`, `normal` or `background` (None: the kind's default, else
        normal); the session line serves a higher class first.
        """
        try:
            judgement = JudgementIn.model_validate(
                {
                    "kind": kind,
                    "target": target,
                    "item": item,
                    "context": context or {},
                    "state": state,
                    "key": key,
                    "priority": priority,
                }
            )
        except ValidationError as error:
            raise UserError(describe_validation(error)) from None
        result = self.enqueue_many([judgement], force=force)[0]
        if result.error:
            raise UserError(result.error)
        assert result.id is not None
        return result.id

    def enqueue_many(
        self, judgements: Iterable[JudgementIn | dict[str, Any]], *, force: bool = False
    ) -> list[Enqueued]:
        """Enqueue many at once: one bad judgement is reported and does not stop the rest."""
        parsed: list[tuple[int, JudgementIn | None, str | None]] = []
        for index, raw in enumerate(judgements, start=1):
            if isinstance(raw, JudgementIn):
                parsed.append((index, raw, None))
                continue
            try:
                parsed.append((index, JudgementIn.model_validate(raw), None))
            except ValidationError as error:
                parsed.append((index, None, describe_validation(error)))
        return self._submit(parsed, force)

    def enqueue_lines(
        self,
        lines: Iterable[str | bytes | JudgementIn],
        *,
        force: bool = False,
        max_errors: int | None = None,
    ) -> list[Enqueued]:
        """Enqueue JSON Lines (how other tools enqueue); blank lines are skipped.

        Lines may be bytes (a file or stdin read raw): a line that is not UTF-8 is refused
        by number, with the offset of its first bad byte, and the other lines go in. A line
        may also be a `JudgementIn` its caller has validated (`POST /judgements`). With
        `max_errors`, more refused lines than that (unreadable, invalid, an unknown kind,
        anything `prepare` refuses) raise TooManyRefused before anything is written.
        Without it, lines are read as they come and written a chunk at a time
        (`WRITE_CHUNK`), each chunk while the next is read and prepared.
        """
        return self._submit(_parse_lines(lines), force, max_errors)

    def enqueue_file(self, path: Path, *, force: bool = False) -> list[Enqueued]:
        try:
            with path.open("rb") as handle:
                return self.enqueue_lines(handle, force=force)
        except OSError as error:
            raise UserError(f"{path}: cannot read: {error.strerror}") from None

    def _submit(
        self,
        parsed: Iterable[tuple[int, JudgementIn | None, str | None]],
        force: bool,
        max_errors: int | None = None,
    ) -> list[Enqueued]:
        """Prepare and write; one bad input is reported and does not stop the rest.

        With `max_errors`, everything is prepared before anything is written (the whole
        batch may yet be refused). Without it, each full chunk is handed to a `ChunkWriter`
        as soon as it is prepared, and the next is prepared while it is written.
        """
        from dispatchq.queue.dispatch import WRITE_CHUNK  # noqa: PLC0415 (lazy: RQ, on the first write)

        dispatcher = self.runtime.dispatcher
        self.interrupted = None
        results: dict[int, Enqueued] = {}
        order: list[int] = []
        good: list[tuple[int, Prepared]] = []
        fingerprints: dict[Path, str] = {}
        writer = ChunkWriter(dispatcher.build_chunk, dispatcher.run_chunk) if max_errors is None else None
        handed = 0
        try:
            for index, judgement, error in parsed:
                order.append(index)
                if judgement is None:
                    results[index] = Enqueued(index, None, error=error)
                else:
                    try:
                        good.append(
                            (index, dispatcher.prepare(judgement, force=force, fingerprints=fingerprints))
                        )
                    except UserError as refused:
                        results[index] = Enqueued(index, None, error=str(refused))
                    else:
                        if writer is not None and len(good) - handed >= WRITE_CHUNK:
                            writer.put([p for _, p in good[handed:]])
                            handed = len(good)
                        continue
                if max_errors is not None and len(results) > max_errors:
                    raise TooManyRefused(len(results), max_errors)
            if writer is not None:
                writer.finish([p for _, p in good[handed:]])
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            written, failure = self._write_all(dispatcher, [p for _, p in good])
        else:
            written, failure = writer.written, writer.error
        if failure is not None:
            cause = failure.cause if isinstance(failure, EnqueueInterrupted) else failure
            if not is_outage(cause) and out_of_memory_message(cause) is None:
                if written:
                    raise EnqueueInterrupted(written, cause) from cause
                raise failure
            self.interrupted = cause
            for index, _ in good[len(written) :]:
                results[index] = Enqueued(index, None, error="not written: Redis failed", unwritten=True)
        for (index, _), (jid, created) in zip(good, written, strict=False):
            results[index] = Enqueued(index, jid, created)
        return [results[index] for index in order]

    @staticmethod
    def _write_all(
        dispatcher: Dispatching, prepared: list[Prepared]
    ) -> tuple[list[tuple[str, bool]], BaseException | None]:
        """`Dispatcher.submit`'s outcome as (written, why the rest was not, or None)."""
        if not prepared:
            return [], None
        try:
            return dispatcher.submit(prepared), None
        except EnqueueInterrupted as error:
            return error.written, error
        except Exception as error:
            return [], error

    def result(self, jid: str, *, wait: float | None = None, poll: float = 0.1) -> Record:
        """The judgement's record; with `wait`, block up to that many seconds for it to finish."""
        deadline = time.monotonic() + (wait or 0)
        while True:
            record = self.runtime.storage.records.get(jid)
            if record is None:
                raise UserError(f"no judgement {jid} (unknown id, or its record expired)")
            if record.status in FINISHED or wait is None or time.monotonic() >= deadline:
                return record
            time.sleep(poll)


def _parse_lines(
    lines: Iterable[str | bytes | JudgementIn],
) -> Iterator[tuple[int, JudgementIn | None, str | None]]:
    """(line number, judgement or None, why not) per non-blank line, read as they come."""
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, JudgementIn):
            yield number, raw, None
            continue
        if isinstance(raw, bytes):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as bad:
                yield number, None, f"not UTF-8 text (bad byte at offset {bad.start})"
                continue
        else:
            line = raw
        text = line.strip()
        if not text:
            continue
        try:
            yield number, JudgementIn.model_validate_json(text), None
        except ValidationError as error:
            yield number, None, _line_error(text, error)


def _line_error(text: str, error: ValidationError) -> str:
    """Why a line is not a judgement, in `enqueue -`'s words."""
    kinds = {e["type"] for e in error.errors()}
    if "json_invalid" in kinds:
        try:
            json.loads(text)
        except json.JSONDecodeError as bad:
            return f"not valid JSON ({bad.msg} at column {bad.colno})"
        except (ValueError, RecursionError):  # Python's own bounds: digits, depth
            return f"not readable JSON ({describe_validation(error)})"
    if "model_type" in kinds:
        return "each line must be a JSON object"
    return describe_validation(error)

"""Executors carry resolved actions out; the ledger remembers what they carried out.

Every executor re-reads the target before it writes and does nothing when the target
is already in the wanted state, so a retried or redelivered action is harmless even
when the ledger write after it was lost. Two more guarantees live here rather than in
the engine, so that no caller can bypass them:

- a label is removed only if dispatchq itself added it (the ledger's label set);
- a comment carries a hidden marker, and a retry edits the marked comment instead of
  posting a second one.

The recording executor writes only to dispatchq's own Redis; it is what tests and
dry runs use. The GitHub executor talks to the REST API with a token that is never
shown: not in a repr, an error message or a log line, and never sent over plain http
to another machine.

Which repositories an executor may act on is `triage.repositories`: a signed delivery
names its repository, and a webhook secret shared with (or leaked from) another
repository must not let its deliveries write here. `build_executor` wraps the executor
in that allowlist, so every caller gets it; outside it an action is `refused` (recorded
in the triage run, never performed).
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import parse_qsl, quote, urlsplit

from githubkit import GitHub, Response, TokenAuthStrategy
from githubkit.exception import GitHubException, RateLimitExceeded, RequestError, RequestFailed
from githubkit.retry import RetryOption
from pydantic import SecretStr

from dispatchq.core.judgement import canonical_json, sha256_hex
from dispatchq.errors import ExecutorError, UserError
from dispatchq.settings import require_https
from dispatchq.storage.triage import TriageStorage
from dispatchq.triage.rules import KNOWN_OPS, ActionSpec
from dispatchq.triage.table import SupportsOps

__all__ = [
    "DEFAULT_GITHUB_API_URL",
    "ActionResult",
    "Command",
    "Executor",
    "GitHubExecutor",
    "IssueRef",
    "Ledger",
    "RecordingExecutor",
    "RepositoryGate",
    "Status",
    "build_executor",
    "capabilities",
    "comment_body",
    "comment_marker",
]

DEFAULT_GITHUB_API_URL = "https://api.github.com"

Status = Literal["performed", "unchanged", "refused"]


@dataclass(frozen=True)
class Command:
    """One action ready to perform: the op with its text already rendered."""

    op: str
    label: str | None = None
    body: str | None = None
    marker: str | None = None
    assignees: tuple[str, ...] = ()
    reason: str | None = None

    @classmethod
    def from_action(
        cls, action: ActionSpec, *, body: str | None = None, marker: str | None = None
    ) -> Command:
        return cls(action.op, action.label, body, marker, action.assignees, action.reason)


@dataclass(frozen=True)
class ActionResult:
    """What the executor did: wrote (`performed`), found it done (`unchanged`), or would not."""

    status: Status
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        return {"status": self.status, "detail": self.detail}


@runtime_checkable
class Executor(Protocol):
    """What the engine needs from an executor.

    `perform` must re-read the target before writing, return `unchanged` when the
    target is already in that state, and raise ExecutorError (never another exception
    type for an expected failure) when it cannot act.
    """

    name: str

    def supports(self, op: str) -> bool: ...

    def perform(self, action: Command, target: str) -> ActionResult: ...

    def remove_label(self, target: str, name: str) -> ActionResult:
        """Remove a label dispatchq itself added (e.g. its `needs-triage`); refuse any other."""
        ...

    def close(self) -> None:
        """Release what the executor holds (a connection pool); the caller calls it once, at the end."""
        ...


def comment_marker(rule: str, template: str) -> str:
    """The hidden marker a rule's comment carries: one comment per rule and template."""
    digest = sha256_hex(f"{rule}\0{template}")[:16]
    return f"<!-- dispatchq:comment:{digest} -->"


def comment_body(body: str, marker: str) -> str:
    return f"{body.rstrip()}\n\n{marker}"


# ------------------------------------------------------------------------------------ ledger


class Ledger:
    """Performed actions, written only after an executor succeeded.

    An action's fingerprint covers the decision, the rule, the target and the action,
    so a redelivered event finds its actions done and the executor is not called again.
    """

    def __init__(self, storage: TriageStorage) -> None:
        self._storage = storage

    @staticmethod
    def fingerprint(decision_id: str, rule: str, action: ActionSpec, target: str) -> str:
        return sha256_hex(canonical_json([decision_id, rule, target, action.to_json()]))

    def get(self, fingerprint: str) -> dict[str, Any] | None:
        entry: dict[str, Any] | None = self._storage.ledger_entry(fingerprint)  # JSON object or None
        return entry

    def record(self, fingerprint: str, entry: dict[str, Any]) -> None:
        self._storage.put_ledger_entry(fingerprint, {**entry, "time": time.time()})

    def entries(self) -> list[dict[str, Any]]:
        return self._storage.ledger_entries()

    def added_label(self, target: str, label: str) -> bool:
        return self._storage.label_added(target, label)

    def note_label_added(self, target: str, label: str) -> None:
        self._storage.note_label_added(target, label)

    def note_label_removed(self, target: str, label: str) -> None:
        self._storage.note_label_removed(target, label)


def _refuse_foreign_label(ledger: Ledger, target: str, label: str) -> ActionResult | None:
    if ledger.added_label(target, label):
        return None
    return ActionResult("refused", f"label {label!r} was not added by dispatchq; it is never removed")


# ------------------------------------------------------------------------- recording executor


class RecordingExecutor:
    """Performs actions on a model of the target kept in dispatchq's own store.

    Writes go to `TRIAGE_RECORDED_STATE` (the model it re-reads) and `TRIAGE_RECORDED`
    (one line per write), nothing else: this is the executor that can never touch the
    outside world.
    """

    name = "recording"

    def __init__(self, storage: TriageStorage, *, ops: Iterable[str] | None = None) -> None:
        self._storage = storage
        self._ops = frozenset(KNOWN_OPS if ops is None else ops)
        self.ledger = Ledger(storage)

    def __repr__(self) -> str:
        return f"RecordingExecutor(ops={sorted(self._ops)})"

    def close(self) -> None:
        """Nothing to release: the storage's Redis client belongs to the caller."""

    def supports(self, op: str) -> bool:
        return op in self._ops

    def state(self, target: str) -> dict[str, Any]:
        stored = self._storage.recorded_state(target)
        base: dict[str, Any] = {
            "state": "open",
            "labels": [],
            "assignees": [],
            "comments": {},
            "locked": False,
        }
        return {**base, **stored} if stored is not None else base

    def seed(self, target: str, **state: Any) -> None:
        """Put a target in a known state (tests, and replaying a real target's state)."""
        self._storage.put_recorded_state(target, {**self.state(target), **state})

    def recorded(self) -> list[dict[str, Any]]:
        return self._storage.recorded_writes()

    def remove_label(self, target: str, name: str) -> ActionResult:
        """Remove a label dispatchq added (its own `needs-triage`); any other is refused, not removed."""
        return self.perform(Command("label.remove", label=name), target)

    def perform(self, action: Command, target: str) -> ActionResult:
        if not self.supports(action.op):
            raise ExecutorError(f"the recording executor does not perform {action.op}")
        current = self.state(target)
        if action.op == "label.remove":
            refused = _refuse_foreign_label(self.ledger, target, action.label or "")
            if refused is not None:
                return refused
        wanted, detail = _recorded_change(current, action)
        if wanted == current:
            return ActionResult("unchanged", detail)
        line = {"target": target, "op": action.op, "detail": detail, "time": time.time()}
        self._storage.record_write(target, wanted, line)
        if action.op == "label.add":
            self.ledger.note_label_added(target, action.label or "")
        elif action.op == "label.remove":
            self.ledger.note_label_removed(target, action.label or "")
        return ActionResult("performed", detail)


def _recorded_change(current: dict[str, Any], action: Command) -> tuple[dict[str, Any], str]:
    state = copy.deepcopy(current)
    op = action.op
    if op == "label.add":
        if action.label not in state["labels"]:
            state["labels"] = sorted([*state["labels"], action.label])
        return state, f"label {action.label}"
    if op == "label.remove":
        state["labels"] = [lbl for lbl in state["labels"] if lbl != action.label]
        return state, f"label {action.label}"
    if op == "comment":
        marker = action.marker or ""
        state["comments"] = {**state["comments"], marker: comment_body(action.body or "", marker)}
        return state, f"comment {marker}"
    if op in ("close", "reopen"):
        state["state"] = "closed" if op == "close" else "open"
        return state, state["state"]
    if op == "assign":
        state["assignees"] = sorted(set(state["assignees"]) | set(action.assignees))
        return state, f"assignees {', '.join(action.assignees)}"
    if op == "lock":
        state["locked"] = True
        return state, "locked"
    if op == "delete-branch":
        state["branch_deleted"] = True
        return state, "branch deleted"
    raise ExecutorError(f"the recording executor does not perform {op}")


# ---------------------------------------------------------------------------- GitHub executor


class _Token:
    """A secret that prints as *** wherever it ends up (repr, f-string, traceback locals)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__


_TARGET = re.compile(
    r"^(?P<owner>[A-Za-z0-9](?:[A-Za-z0-9-]{0,38}))/(?P<repo>[A-Za-z0-9._-]{1,100})#(?P<number>[1-9][0-9]{0,9})$"
)


@dataclass(frozen=True)
class IssueRef:
    owner: str
    repo: str
    number: int

    @classmethod
    def parse(cls, target: str) -> IssueRef:
        match = _TARGET.match(target)
        if not match or match["repo"] in (".", ".."):
            raise UserError(f"target {target[:200]!r} is not owner/repo#number")
        return cls(match["owner"], match["repo"], int(match["number"]))

    @property
    def path(self) -> str:
        return f"/repos/{self.owner}/{self.repo}/issues/{self.number}"


class _HiddenTokenAuth(TokenAuthStrategy):
    """githubkit's token auth, whose dataclass repr would print the token: here it prints ***."""

    def __repr__(self) -> str:
        return "TokenAuthStrategy(token='***')"

    __str__ = __repr__


class _RetryPolicy:
    """githubkit's `auto_retry` decision: what is worth another try, and after how long.

    - a primary or secondary rate limit: once its `Retry-After` (or `x-ratelimit-reset`)
      is within `max_wait`; a longer one fails now, saying when to try again;
    - a 5xx: with exponential back-off, except a comment's POST, which might have landed
      (its retry is the next delivery's marker search, never a blind second POST);
    - a transport error or timeout: for a read only.
    """

    def __init__(self, retries: int, backoff: float, max_wait: float) -> None:
        self.retries = retries
        self.backoff = backoff
        self.max_wait = max_wait

    def __call__(self, exc: GitHubException, count: int) -> RetryOption:
        if count >= self.retries:
            return RetryOption(False)
        if isinstance(exc, RateLimitExceeded):
            wait = exc.retry_after.total_seconds()
            if wait > self.max_wait:
                return RetryOption(False)
            # githubkit sleeps 60 s for a falsy (zero) delay: never hand it one.
            return RetryOption(True, timedelta(seconds=max(wait, 0.001)))
        if isinstance(exc, RequestFailed):
            request = exc.request
            comment_post = request.method == "POST" and request.url.path.endswith("/comments")
            if exc.response.status_code >= 500 and not comment_post:
                return RetryOption(True, timedelta(seconds=self.backoff * 2**count))
            return RetryOption(False)
        if isinstance(exc, RequestError):
            method = _request_method(exc)
            if method == "GET":
                return RetryOption(True, timedelta(seconds=self.backoff * 2**count))
        return RetryOption(False)


def _request_method(exc: RequestError[Any]) -> str | None:
    try:
        return str(exc.exc.request.method)
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError when no request is attached
        return None


class GitHubExecutor:
    """Labels, comments, close/reopen and assignment through GitHub's REST API (githubkit).

    githubkit carries the requests: its retry hook (`_RetryPolicy`) waits out rate limits
    (primary and secondary, honouring `Retry-After`) and retries server errors; lists are
    read page by page through the `Link: rel="next"` header (a label past the 100th is
    seen). A write that still fails raises ExecutorError, which the engine reports as
    failed, never as applied.

    The token (`DISPATCHQ_GITHUB_TOKEN`) and the API base URL
    (`DISPATCHQ_GITHUB_API_URL`) are passed in; settings read them, never this class. The token only
    ever travels in the Authorization header, and every message built from a
    response passes through `_redact` before it can be raised or printed.
    """

    name = "github"
    OPS = frozenset({"label.add", "label.remove", "comment", "close", "reopen", "assign"})
    MAX_PAGES = 50
    PER_PAGE = 100

    def __init__(
        self,
        token: SecretStr | str | None,
        api_url: str = DEFAULT_GITHUB_API_URL,
        *,
        ledger: Ledger,
        timeout: float = 10.0,
        retries: int = 3,
        retry_backoff: float = 1.0,
        max_retry_wait: float = 60.0,
    ) -> None:
        secret = token.get_secret_value() if isinstance(token, SecretStr) else token
        self._token = _Token(secret) if secret else None
        try:
            require_https(api_url)
            parts = urlsplit(api_url)
        except ValueError as error:
            raise UserError(f"DISPATCHQ_GITHUB_API_URL: {error}") from None
        if parts.username or parts.password:
            raise UserError("DISPATCHQ_GITHUB_API_URL: expected an https URL without credentials")
        self.api_url = api_url.rstrip("/")
        self.ledger = ledger
        self._timeout = timeout
        self._retry = _RetryPolicy(retries, retry_backoff, max_retry_wait)
        self._github: GitHub[Any] | None = None

    def __repr__(self) -> str:
        return f"GitHubExecutor(api_url={self.api_url!r}, token={'***' if self._token else None})"

    def close(self) -> None:
        self._github = None  # githubkit opens (and closes) an HTTP client per request

    def supports(self, op: str) -> bool:
        return op in self.OPS

    # -- HTTP ------------------------------------------------------------------------------
    def _redact(self, text: str) -> str:
        if self._token is not None and self._token.reveal():
            text = text.replace(self._token.reveal(), "***")
        return text

    def _client(self) -> GitHub[Any]:
        if self._token is None:
            raise ExecutorError("DISPATCHQ_GITHUB_TOKEN is not set: the github executor cannot act")
        if self._github is None:
            self._github = GitHub(
                _HiddenTokenAuth(self._token.reveal()),
                base_url=self.api_url + "/",
                user_agent="dispatchq",
                timeout=self._timeout,
                follow_redirects=False,
                http_cache=False,
                auto_retry=self._retry,
            )
        return self._github

    def _send(
        self, method: str, path: str, *, body: Any = None, params: dict[str, Any] | None = None
    ) -> Response[Any]:
        github = self._client()
        try:
            return github.request(
                method,
                path.lstrip("/"),
                json=body,
                params=params,
                headers={"X-GitHub-Api-Version": "2022-11-28"},
            )
        except RateLimitExceeded as error:
            wait = int(error.retry_after.total_seconds())
            raise ExecutorError(
                f"{method} {path}: rate limited by GitHub (HTTP {error.response.status_code}); "
                f"try again in {wait} s"
            ) from None
        except RequestFailed as error:
            response = error.response
            try:
                message = str(response.json().get("message", ""))
            except (ValueError, AttributeError):
                message = response.text
            message = " ".join(message.split())[:200]
            raise ExecutorError(
                self._redact(f"{method} {path}: HTTP {response.status_code}: {message}")
            ) from None
        except RequestError as error:
            cause = error.exc
            raise ExecutorError(self._redact(f"{method} {path}: {type(cause).__name__}: {cause}")) from None
        except GitHubException as error:
            raise ExecutorError(self._redact(f"{method} {path}: {type(error).__name__}")) from None

    def _call(self, method: str, path: str, *, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        response = self._send(method, path, body=body, params=params)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise ExecutorError(f"{method} {path}: the response is not JSON") from None

    def _pages(self, path: str) -> Iterator[list[Any]]:
        """Each page of a list endpoint, following `Link: rel="next"` (at most MAX_PAGES)."""
        params: dict[str, Any] | None = {"per_page": self.PER_PAGE}
        for _ in range(self.MAX_PAGES):
            response = self._send("GET", path, params=params)
            try:
                items = response.json() if response.content else []
            except ValueError:
                raise ExecutorError(f"GET {path}: the response is not JSON") from None
            if not isinstance(items, list):
                raise ExecutorError(f"GET {path}: expected a JSON list")
            yield items
            following = response.raw_response.links.get("next", {}).get("url")
            if not following:
                return
            parsed = urlsplit(following)
            base = urlsplit(self.api_url)
            if (parsed.scheme, parsed.netloc) != (base.scheme, base.netloc):
                raise ExecutorError(f"GET {path}: the next page is on another host; not followed")
            path = parsed.path.removeprefix(base.path.rstrip("/"))
            params = dict(parse_qsl(parsed.query))

    # -- actions ---------------------------------------------------------------------------
    def perform(self, action: Command, target: str) -> ActionResult:
        if not self.supports(action.op):
            raise ExecutorError(f"the github executor does not perform {action.op}")
        try:
            issue = IssueRef.parse(target)
        except UserError as error:
            raise ExecutorError(str(error)) from None
        handler = {
            "label.add": self._label_add,
            "label.remove": self._label_remove,
            "comment": self._comment,
            "close": self._set_state,
            "reopen": self._set_state,
            "assign": self._assign,
        }[action.op]
        return handler(action, issue, target)

    def remove_label(self, target: str, name: str) -> ActionResult:
        """Remove a label dispatchq added (its own `needs-triage`); any other is refused, not removed."""
        return self.perform(Command("label.remove", label=name), target)

    def _labels(self, issue: IssueRef) -> set[str]:
        return {str(item.get("name")) for page in self._pages(f"{issue.path}/labels") for item in page}

    def _label_add(self, action: Command, issue: IssueRef, target: str) -> ActionResult:
        label = action.label or ""
        if label in self._labels(issue):
            return ActionResult("unchanged", f"label {label} already present")
        self._call("POST", f"{issue.path}/labels", body={"labels": [label]})
        self.ledger.note_label_added(target, label)
        return ActionResult("performed", f"label {label} added")

    def _label_remove(self, action: Command, issue: IssueRef, target: str) -> ActionResult:
        label = action.label or ""
        refused = _refuse_foreign_label(self.ledger, target, label)
        if refused is not None:
            return refused
        if label not in self._labels(issue):
            self.ledger.note_label_removed(target, label)
            return ActionResult("unchanged", f"label {label} already absent")
        self._call("DELETE", f"{issue.path}/labels/{quote(label, safe='')}")
        self.ledger.note_label_removed(target, label)
        return ActionResult("performed", f"label {label} removed")

    def _comment(self, action: Command, issue: IssueRef, target: str) -> ActionResult:
        marker = action.marker
        if not marker:
            raise ExecutorError("a comment needs its dispatchq marker so a retry cannot post twice")
        body = comment_body(action.body or "", marker)
        existing = self._find_marked_comment(issue, marker)
        if existing is None:
            created = self._call("POST", f"{issue.path}/comments", body={"body": body})
            return ActionResult("performed", f"comment {created.get('id') if created else ''} posted")
        if existing.get("body") == body:
            return ActionResult("unchanged", f"comment {existing.get('id')} already says this")
        comment_id = int(existing["id"])
        self._call(
            "PATCH", f"/repos/{issue.owner}/{issue.repo}/issues/comments/{comment_id}", body={"body": body}
        )
        return ActionResult("performed", f"comment {comment_id} edited")

    def _find_marked_comment(self, issue: IssueRef, marker: str) -> dict[str, Any] | None:
        for page in self._pages(f"{issue.path}/comments"):
            for comment in page:
                if isinstance(comment, dict) and marker in str(comment.get("body") or ""):
                    found: dict[str, Any] = comment  # the API's JSON object for one comment
                    return found
        return None

    def _set_state(self, action: Command, issue: IssueRef, target: str) -> ActionResult:
        wanted = "closed" if action.op == "close" else "open"
        current = self._call("GET", issue.path) or {}
        if current.get("state") == wanted:
            return ActionResult("unchanged", f"already {wanted}")
        body: dict[str, Any] = {"state": wanted}
        if action.op == "close" and action.reason:
            body["state_reason"] = action.reason
        self._call("PATCH", issue.path, body=body)
        return ActionResult("performed", wanted)

    def _assign(self, action: Command, issue: IssueRef, target: str) -> ActionResult:
        current = self._call("GET", issue.path) or {}
        present = {str(a.get("login")) for a in current.get("assignees") or []}
        missing = [login for login in action.assignees if login not in present]
        if not missing:
            return ActionResult("unchanged", "already assigned")
        self._call("POST", f"{issue.path}/assignees", body={"assignees": missing})
        return ActionResult("performed", f"assigned {', '.join(missing)}")


class RepositoryGate:
    """An executor that acts only on the repositories `triage.repositories` lists.

    Any other target (or one that names no repository) is answered `refused` before the
    inner executor is asked: the engine records that in the run and ledgers nothing, so
    the delivery is on record and nothing was written. Names compare case-insensitively,
    as GitHub's do.
    """

    def __init__(self, inner: Executor, repositories: Iterable[str]) -> None:
        self.inner = inner
        self.name = inner.name
        self.repositories = frozenset(r.lower() for r in repositories)

    def __repr__(self) -> str:
        return f"RepositoryGate({self.inner!r}, repositories={sorted(self.repositories)})"

    def _refusal(self, target: str) -> ActionResult | None:
        try:
            issue = IssueRef.parse(target)
        except UserError:
            return ActionResult("refused", f"{target[:200]!r} names no repository (triage.repositories)")
        repository = f"{issue.owner}/{issue.repo}"
        if repository.lower() in self.repositories:
            return None
        return ActionResult("refused", f"{repository} is not in triage.repositories")

    def supports(self, op: str) -> bool:
        return self.inner.supports(op)

    def perform(self, action: Command, target: str) -> ActionResult:
        return self._refusal(target) or self.inner.perform(action, target)

    def remove_label(self, target: str, name: str) -> ActionResult:
        return self._refusal(target) or self.inner.remove_label(target, name)

    def close(self) -> None:
        self.inner.close()


def build_executor(
    name: str,
    storage: TriageStorage,
    *,
    github_token: SecretStr | str | None = None,
    github_api_url: str = DEFAULT_GITHUB_API_URL,
    repositories: Iterable[str] | None = None,
) -> Executor:
    """The executor a config names (`triage.executor`), over dispatchq's Redis for the ledger.

    The token and URL come from settings (`DISPATCHQ_GITHUB_TOKEN`, `DISPATCHQ_GITHUB_API_URL`),
    read by the caller at the edge: nothing here looks at the environment. `repositories`
    (`triage.repositories`) limits where it acts; None: anywhere (the config load warns).
    """
    executor: Executor
    if name == "github":
        executor = GitHubExecutor(github_token, github_api_url, ledger=Ledger(storage))
    elif name == "recording":
        executor = RecordingExecutor(storage)
    else:
        raise UserError(f"triage.executor: unknown executor {name!r}")
    return executor if repositories is None else RepositoryGate(executor, repositories)


@dataclass(frozen=True)
class _Capabilities:
    ops: frozenset[str]

    def supports(self, op: str) -> bool:
        return op in self.ops


def capabilities(name: str) -> SupportsOps:
    """What the executor a config names can do, without Redis, a network or a token (for lint)."""
    if name == "github":
        return _Capabilities(GitHubExecutor.OPS)
    if name == "recording":
        return _Capabilities(frozenset(KNOWN_OPS))
    raise UserError(f"triage.executor: unknown executor {name!r}")

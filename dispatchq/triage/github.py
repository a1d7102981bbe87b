"""GitHub webhook deliveries as triage events: a pure mapping, no I/O.

A delivery is (`X-GitHub-Event`, the parsed JSON payload). It becomes the triage event
envelope `{"event", "target", "item", "context", "state"}`:

- `event`: `<event>.<action>` (`issues.opened`), or `<event>` for an event that has no
  action (`push`, `create`, `delete`, `status`); a rule may name either form.
- `target`: `owner/repo#number` wherever the payload has an issue or a pull request (a
  check run or check suite through its first pull request), `owner/repo@<after>` for a
  push, `owner/repo@<head sha>` for a check without a pull request, and `owner/repo`
  for repository-only events (`create`, `label`, `status`, `workflow_run`, ...).
- `item`: which part of the target (`comment:<id>`, `review:<id>`, `check_run:<id>`,
  `issue:<n>`), so a second comment on one issue is a second decision.
- `context`: repository, default branch, sender, installation (small and stable).
- `state`: the payload trimmed: keys ending in `_url`, `node_id`, `gravatar_id` and
  `_links` are dropped at every depth (a 12-24 KB payload is mostly those). A rule's
  `state:` list of dotted paths narrows it further (`narrow`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dispatchq.triage.rules import TriageConfig

__all__ = [
    "NO_ACTION_EVENTS",
    "event_name",
    "map_delivery",
    "narrow",
    "state_paths",
    "target_of",
    "trim",
]

#: Events GitHub sends without an `action` (their name alone is the triage event name).
NO_ACTION_EVENTS = frozenset({"push", "create", "delete", "status", "public", "fork", "gollum"})

_DROPPED_EXACT = frozenset({"node_id", "gravatar_id", "_links"})


def _dropped(key: str) -> bool:
    return key in _DROPPED_EXACT or key.endswith("_url")


def trim(value: Any) -> Any:
    """The payload without URLs, node ids, gravatar ids and `_links`, at every depth."""
    kind = type(value)
    if kind is dict and all(type(k) is str for k in value):
        # Parsed JSON, the case on every delivery: exact types, and no call per leaf.
        return {
            k: trim(v) if type(v) is dict or type(v) is list else v
            for k, v in value.items()
            if not (k in _DROPPED_EXACT or k.endswith("_url"))
        }
    if kind is list:
        return [trim(v) if type(v) is dict or type(v) is list else v for v in value]
    if isinstance(value, Mapping):
        return {str(k): trim(v) for k, v in value.items() if not _dropped(str(k))}
    if isinstance(value, list):
        return [trim(v) for v in value]
    return value


def _get(value: Any, path: Sequence[str]) -> tuple[bool, Any]:
    current = value
    for part in path:
        if not isinstance(current, Mapping) or part not in current:
            return False, None
        current = current[part]
    return True, current


def narrow(state: Any, paths: Iterable[str]) -> Any:
    """Only the dotted `paths` of `state` (`issue.title`, `issue.labels`), in their places.

    A path the payload does not have is left out, not invented. An empty list of paths
    keeps nothing: `{}`.
    """
    out: dict[str, Any] = {}
    for dotted in paths:
        parts = [p for p in dotted.split(".") if p]
        found, value = _get(state, parts)
        if not found or not parts:
            continue
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
    return out


def event_name(event: str, payload: Mapping[str, Any]) -> str:
    """`issues.opened`; `push` (no action)."""
    action = payload.get("action")
    if isinstance(action, str) and action and event not in NO_ACTION_EVENTS:
        return f"{event}.{action}"
    return event


def _repo_name(payload: Mapping[str, Any]) -> str | None:
    repo = payload.get("repository")
    if isinstance(repo, Mapping):
        full = repo.get("full_name")
        if isinstance(full, str) and "/" in full:
            return full
        owner = repo.get("owner")
        name = repo.get("name")
        if isinstance(owner, Mapping) and isinstance(owner.get("login"), str) and isinstance(name, str):
            return f"{owner['login']}/{name}"
    return None


def _number(value: Any) -> int | None:
    if isinstance(value, Mapping):
        number = value.get("number")
        if isinstance(number, int) and not isinstance(number, bool) and number > 0:
            return number
    return None


def _first_pull_request(check: Any) -> int | None:
    if not isinstance(check, Mapping):
        return None
    pulls = check.get("pull_requests")
    if isinstance(pulls, list) and pulls:
        return _number(pulls[0])
    suite = check.get("check_suite")
    return _first_pull_request(suite) if isinstance(suite, Mapping) else None


def target_of(event: str, payload: Mapping[str, Any]) -> str:
    """Where the event happened, as the executors name targets."""
    repo = _repo_name(payload)
    if repo is None:
        org = payload.get("organization")
        if isinstance(org, Mapping) and isinstance(org.get("login"), str):
            return str(org["login"])
        sender = payload.get("sender")
        if isinstance(sender, Mapping) and isinstance(sender.get("login"), str):
            return str(sender["login"])
        return event
    for key in ("issue", "pull_request"):
        number = _number(payload.get(key))
        if number is not None:
            return f"{repo}#{number}"
    if event == "push" and isinstance(payload.get("after"), str):
        return f"{repo}@{payload['after']}"
    if event in ("check_run", "check_suite"):
        check = payload.get(event)
        number = _first_pull_request(check)
        if number is not None:
            return f"{repo}#{number}"
        if isinstance(check, Mapping) and isinstance(check.get("head_sha"), str):
            return f"{repo}@{check['head_sha']}"
    return repo


def _item_of(event: str, payload: Mapping[str, Any]) -> str | None:
    for key, name in (
        ("comment", "comment"),
        ("review", "review"),
        ("thread", "thread"),
        ("check_run", "check_run"),
        ("check_suite", "check_suite"),
        ("workflow_run", "workflow_run"),
        ("label", "label"),
        ("discussion", "discussion"),
    ):
        value = payload.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("id"), int | str):
            return f"{name}:{value['id']}"
    if event in ("create", "delete") and isinstance(payload.get("ref"), str):
        return f"{payload.get('ref_type') or 'ref'}:{payload['ref']}"
    if event == "push" and isinstance(payload.get("ref"), str):
        return f"ref:{payload['ref']}"
    if event == "status" and isinstance(payload.get("id"), int | str):
        return f"status:{payload['id']}"
    for key in ("issue", "pull_request"):
        number = _number(payload.get(key))
        if number is not None:
            return f"{'pr' if key == 'pull_request' else 'issue'}:{number}"
    return None


def _login(value: Any) -> str | None:
    if isinstance(value, Mapping) and isinstance(value.get("login"), str):
        return str(value["login"])
    return None


def _context(payload: Mapping[str, Any]) -> dict[str, Any]:
    repo = payload.get("repository")
    repo_map: Mapping[str, Any] = repo if isinstance(repo, Mapping) else {}
    installation = payload.get("installation")
    return {
        "repository": _repo_name(payload),
        "default_branch": repo_map.get("default_branch"),
        "sender": _login(payload.get("sender")),
        "installation": installation.get("id") if isinstance(installation, Mapping) else None,
    }


def map_delivery(
    event: str, payload: Mapping[str, Any], *, state_paths: Iterable[str] | None = None
) -> dict[str, Any]:
    """The triage event envelope for one delivery (validate it with `Event.from_json`).

    `state_paths`: the union of the `state:` lists of the rules this event triggers, or
    None when any of them asks for the whole (trimmed) payload.
    """
    # Narrowed first, then trimmed (the same state, but for a path naming a dropped key), so a rule
    # that asks for two fields does not pay for walking the whole 12-24 KB payload.
    state = trim(payload if state_paths is None else narrow(payload, state_paths))
    return {
        "event": event_name(event, payload),
        "target": target_of(event, payload),
        "item": _item_of(event, payload),
        "context": _context(payload),
        "state": state,
    }


def state_paths(config: TriageConfig | None, name: str) -> tuple[str, ...] | None:
    """The union of the `state:` lists of the rules `name` triggers; None: keep the whole state.

    None as soon as one triggered rule has no `state:` list (it may read anything), and
    when no rule is triggered (the stored event stays replayable under new rules).
    """
    if config is None:
        return None
    rules = config.triggered(name)
    if not rules or any(rule.state is None for rule in rules):
        return None
    paths: dict[str, None] = {}
    for rule in rules:
        paths.update(dict.fromkeys(rule.state or ()))
    return tuple(paths)

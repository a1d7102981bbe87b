"""The typed `Status`: its document, its schema in the docs, and the page reading only its fields.

The page's script is read as text: every access on the status document (`data.x`, an alias of
a part, an element of a list handed to a callback or to a helper function) becomes a path
such as `markers[].lifts_at_epoch`, checked against the model's JSON Schema. A field renamed
in the model, or read by the page under a name the model does not have, fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dispatchq.core.status import (
    OPTIONAL_FIELDS,
    SCHEMA_VERSION,
    ServerFacts,
    Status,
    WindowPart,
    status_json_schema,
)

ROOT = Path(__file__).resolve().parents[2]
PAGE_JS = ROOT / "dispatchq" / "serve" / "static" / "page.js"
SCHEMA_DOC = ROOT / "docs" / "status.schema.json"
STATUS_DOC = ROOT / "docs" / "status.md"
REGENERATE = (
    ".venv/bin/python -c 'import json; from dispatchq.core.status import status_json_schema as s; "
    "print(json.dumps(s(), indent=2))' > docs/status.schema.json"
)

# --- reading the page's script ------------------------------------------------------------------
_IDENT = r"[A-Za-z_$][\w$]*"
_SEGMENTS = rf"(?:\??\.{_IDENT}|\[{_IDENT}\])+"
_CHAIN = rf"{_IDENT}{_SEGMENTS}|{_IDENT}"
_EVENTS = re.compile(
    rf"(?P<func>\bfunction\s+(?P<fname>{_IDENT})\s*\((?P<params>[^)]*)\))"
    rf"|(?P<decl>\b(?:const|let|var)\s+(?P<dname>{_IDENT})\s*=\s*(?=(?P<rhs>[^;]*)))"
    rf"|(?P<arrow>\(\s*(?P<aparam>{_IDENT})\s*\)\s*=>)"
    rf"|(?P<paren>\(\s*(?P<pchain>{_CHAIN})\s*\|\|\s*(?:\{{\}}|\[\])\s*\)(?P<prest>{_SEGMENTS})?)"
    rf"|(?P<call>(?<![\w$.])(?P<callee>{_IDENT})\(\s*(?P<arg>{_IDENT})\s*\))"
    rf"|(?P<chain>(?<![\w$.])(?P<base>{_IDENT})(?P<segs>{_SEGMENTS}))"
)
_ALIAS = [
    re.compile(rf"^\(?\s*(?P<chain>{_CHAIN})\s*\)?\s*(?:\|\|\s*(?:\{{\}}|\[\]))?\s*$"),
    re.compile(rf"^Array\.isArray\((?P<chain>{_CHAIN})\)\s*\?\s*(?P=chain)\s*:\s*\[\]\s*$"),
]
_ITERATORS = (".map(", ".filter(", ".forEach(", ".some(", ".every(", ".find(")
Path_ = tuple[str, ...]


def _prepare(source: str) -> str:
    """Comments dropped; `x["key"]` read as `x.key` (a dash kept as `_DASH_`); strings blanked."""
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.DOTALL)
    source = re.sub(r"(?m)^\s*//.*$|\s//.*$", "", source)
    source = re.sub(
        r'(?<=[\w$)\]])\[\s*"([\w-]+)"\s*\]', lambda m: "." + m.group(1).replace("-", "_DASH_"), source
    )
    return re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', source)


def _segments(text: str) -> list[str]:
    return [
        "*" if s.startswith("[") else s.lstrip("?.").replace("_DASH_", "-")
        for s in re.findall(rf"\??\.{_IDENT}|\[{_IDENT}\]", text)
    ]


class _Reader:
    """One pass over the script: which names stand for which paths of the document."""

    def __init__(self, source: str, params: dict[str, set[Path_]]) -> None:
        self.source = source
        self.params = params  # function name -> the paths its first parameter was called with
        self.found_params: dict[str, set[Path_]] = {}
        self.names: dict[str, set[Path_]] = {}
        self.reads: set[Path_] = set()
        self.functions = set(re.findall(rf"\bfunction\s+({_IDENT})", source))

    def resolve(self, chain: str) -> set[Path_]:
        base = re.match(_IDENT, chain)
        assert base is not None
        segs = _segments(chain[base.end() :])
        return {path + tuple(segs) for path in self.names.get(base.group(0), set())}

    def alias(self, rhs: str) -> set[Path_]:
        for pattern in _ALIAS:
            if m := pattern.match(rhs.strip()):
                return self.resolve(m.group("chain"))
        return set()

    def receiver(self, before: str) -> set[Path_]:
        """The paths of the list whose iterator's callback starts right after `before`."""
        call = next((it for it in _ITERATORS if before.endswith(it)), None)
        if call is None:
            return set()
        head = before[: -len(call)].rstrip()
        if head.endswith(")"):
            depth, i = 0, len(head) - 1
            while i >= 0:
                depth += {")": 1, "(": -1}.get(head[i], 0)
                if depth == 0:
                    break
                i -= 1
            inner, outer = head[i + 1 : -1], head[:i]
            if outer.endswith(".filter"):
                return self.receiver(outer[: -len(".filter")] + ".filter(")
            if re.search(r"[\w$]$", outer):
                return set()  # what a function returns: not a part of the document
            return self.alias(inner)
        m = re.search(rf"(?:{_CHAIN})$", head)
        return self.resolve(m.group(0)) if m else set()

    def read(self) -> None:
        for m in _EVENTS.finditer(self.source):
            if m.group("func"):
                params = [p.strip() for p in m.group("params").split(",") if p.strip()]
                self.names = {}
                if params:
                    bound = set(self.params.get(m.group("fname"), set()))
                    if params[0] == "data":
                        bound.add(())
                    self.names[params[0]] = bound
            elif m.group("decl"):
                self.names[m.group("dname")] = self.alias(m.group("rhs"))
            elif m.group("arrow"):
                self.names[m.group("aparam")] = {(*p, "[]") for p in self.receiver(self.source[: m.start()])}
            elif m.group("paren"):
                rest = _segments(m.group("prest") or "")
                if re.search(r"[\w$]$", self.source[: m.start()]):
                    rest = []  # `f(x || {}).y`: `y` is read on what `f` returns
                elif rest and self.source[m.end() : m.end() + 1] == "(":
                    rest.pop()  # `(x || []).map(`: a method, not a field
                self.reads |= {p + tuple(rest) for p in self.resolve(m.group("pchain"))}
            elif m.group("call"):
                if m.group("callee") in self.functions and self.names.get(m.group("arg")):
                    self.found_params.setdefault(m.group("callee"), set()).update(self.names[m.group("arg")])
            elif m.group("chain"):
                segs = m.group("segs")
                after = self.source[m.end() : m.end() + 1]
                if after == "(":  # `x.y.method(`: the last name is a method, not a field
                    segs = segs[: segs.rfind(".")]
                self.reads |= self.resolve(m.group("base") + segs)


def status_reads(source: str) -> set[str]:
    """Every path of the status document the script reads, e.g. `markers[].lifts_at_epoch`."""
    text = _prepare(source)
    params: dict[str, set[Path_]] = {}
    for _ in range(3):  # a helper's parameter is known from its call sites, found on the pass before
        reader = _Reader(text, params)
        reader.read()
        params = reader.found_params
    return {".".join(p).replace(".[]", "[]") for p in reader.reads if p}


def unknown_reads(reads: set[str], schema: dict[str, Any]) -> list[str]:
    """The paths that name no field of the schema (a map's keys and `length` are any)."""
    defs = schema.get("$defs", {})

    def options(node: dict[str, Any]) -> list[dict[str, Any]]:
        if "$ref" in node:
            return options(defs[node["$ref"].rsplit("/", 1)[-1]])
        if "anyOf" in node:
            return [o for sub in node["anyOf"] for o in options(sub)]
        return [] if node.get("type") == "null" else [node]

    def step(node: dict[str, Any], seg: str) -> list[dict[str, Any]]:
        out = []
        for option in options(node):
            if not option or option == {"additionalProperties": True, "type": "object"}:
                out.append({})  # any value: what is under it is not the model's
            elif option.get("type") == "array" and seg in ("[]", "*"):
                out.append(option.get("items", {}))
            elif option.get("type") in ("array", "string") and seg == "length":
                out.append({"type": "integer"})
            elif seg in option.get("properties", {}):
                out.append(option["properties"][seg])
            elif isinstance(option.get("additionalProperties"), dict) and not option.get("properties"):
                out.append(option["additionalProperties"])  # a map: any key
        return out

    unknown = []
    for read in sorted(reads):
        nodes = [schema]
        for seg in re.findall(r"\[\]|[^.\[\]]+", read):
            nodes = [n for node in nodes for n in step(node, seg)]
        if not nodes:
            unknown.append(read)
    return unknown


# --- the tests ----------------------------------------------------------------------------------
def test_the_page_reads_only_fields_the_status_has() -> None:
    reads = status_reads(PAGE_JS.read_text(encoding="utf-8"))
    assert unknown_reads(reads, status_json_schema()) == []


def test_the_reader_sees_through_aliases_callbacks_and_helpers() -> None:
    reads = status_reads(PAGE_JS.read_text(encoding="utf-8"))
    for path in (
        "now",  # data.x
        "judgements.needs-triage",  # an alias, a bracketed key
        "warnings[].hint",  # an element of an `Array.isArray(...) ? ... : []` alias
        "markers[].lifts_at_epoch",  # a callback's parameter
        "markers[].source",  # a helper called with that parameter (scopeState)
        "latest[].id",  # the same helper for two lists (judgementActions)
        "waiting_sample[].status",
        "credentials[].warning",  # through .filter(...).map(...)
        "judgements_by_tier.*.running",  # `(x[t] || {}).y`
        "triage.suppressed[].margin",
        "sessions.running",
        "window_audit[].who",
        "pool.credentials[].spend.cap_day",  # a part's list through `(x || []).map(...)`
        "pool.credentials[].windows[].age_seconds",  # a list inside a list's element
        "backlog.drain_text",
    ):
        assert path in reads, (path, sorted(reads))


@pytest.mark.parametrize(
    ("added", "unknown"),
    [
        ("  const gone = data.no_such_field;\n", "no_such_field"),
        ("  const sched = data.scheduler || {};\n  el('td', sched.alive_since);\n", "scheduler.alive_since"),
        ("  (data.markers || []).map((m) => m.lifts_at_epch);\n", "markers[].lifts_at_epch"),
        ("  fill('x', (data.latest || []).map((r) => [r.tier, r.answer]));\n", "latest[].answer"),
    ],
)
def test_a_read_of_a_field_the_status_lacks_fails(added: str, unknown: str) -> None:
    source = PAGE_JS.read_text(encoding="utf-8")
    anchor = "function render(data) {\n"
    assert anchor in source
    changed = source.replace(anchor, anchor + added)
    assert unknown_reads(status_reads(changed), status_json_schema()) == [unknown]


def test_the_documented_schema_is_the_models() -> None:
    documented = json.loads(SCHEMA_DOC.read_text(encoding="utf-8"))
    assert documented == status_json_schema(), f"regenerate it: {REGENERATE}"


def test_every_field_is_named_in_the_status_page() -> None:
    schema = status_json_schema()
    text = STATUS_DOC.read_text(encoding="utf-8")
    names = set(schema["properties"])
    for part in schema["$defs"].values():
        names |= set(part.get("properties", {}))
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert missing == [], "docs/status.md names every field of the document"
    assert f"`schema`: {SCHEMA_VERSION}" in text


def test_the_document_holds_what_was_set_and_its_version() -> None:
    status = Status(now=1.5, redis="redis://x")
    assert status.as_json() == {"schema": SCHEMA_VERSION, "now": 1.5, "redis": "redis://x"}
    assert set(OPTIONAL_FIELDS) <= set(Status.model_fields)
    assert not set(OPTIONAL_FIELDS) & set(status_json_schema()["required"])
    status.waiting_counts_rebuilt = 3
    assert status.as_json()["waiting_counts_rebuilt"] == 3
    # a worker's own facts keep exactly their keys, an unknown one included
    parsed = Status.model_validate({"worker_details": [{"tier": "code", "future_fact": 1}]})
    assert parsed.as_json()["worker_details"] == [{"tier": "code", "future_fact": 1}]
    assert parsed.worker_details[0].tier == "code" and parsed.worker_details[0].host is None


def test_a_part_dispatchq_builds_refuses_an_unknown_field() -> None:
    with pytest.raises(ValueError, match="scheduled"):
        Status.model_validate({"scheduler": {"alive": True, "scheduled": 1}})
    with pytest.raises(ValueError, match="no_such"):
        Status.model_validate({"no_such": 1})


@pytest.mark.parametrize("part", [WindowPart, ServerFacts])
def test_a_part_kept_flat_in_the_document_is_fields_of_status_by_name_and_type(part: type[Any]) -> None:
    """`collect_status` copies these parts' fields to the document's top level, one by one."""
    for name, field in part.model_fields.items():
        assert name in Status.model_fields, name
        assert field.annotation == Status.model_fields[name].annotation, name

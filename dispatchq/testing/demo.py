"""`dispatchq demo`: the whole ladder on the embedded default, with stand-ins for both paid services.

A newcomer's first run must show what dispatchq is for, and spend nothing: no key, no
usage window, no server to install. So both paid services are stand-ins shipped in this
package: the TypeSafe API is `dispatchq.testing.typesafe.FakeTypeSafeAPI` (so some rows are
answered *typed*, with their confidence, and one is too unsure and climbs to a session),
and a session is `dispatchq.testing.stand_in_session` (its first run hits a usage limit
that lifts a few seconds later: the marker, zero spawns while it is up, the probe, the
drain). The kinds and judgements are the shipped examples (package data), so this works
after `pipx install dispatchq` as well as from a clone.

Each step is a real `dispatchq` process on a fresh embedded Redis in a temporary data dir;
after each run one narration line per judgement says which tier answered it and why.
The command lives in `dispatchq.testing` because it wires test doubles; the CLI lists it
by name (`dispatchq.cli.COMMANDS`) without importing it until it runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from dispatchq.settings import parent_environment
from dispatchq.testing.typesafe import FakeTypeSafeAPI, Rule, choice, noul, score

__all__ = ["DEMO_KEY", "demo", "examples_dir", "narrate", "script_typed_answers"]

#: The stand-in TypeSafe API's key (it checks one, as the real service does; not a secret).
DEMO_KEY = "demo-key-for-the-loopback-stand-in"


def examples_dir() -> Path:
    """The shipped examples (package data beside this package)."""
    return Path(__file__).resolve().parent.parent / "examples"


def script_typed_answers(api: FakeTypeSafeAPI) -> None:
    """What the stand-in Jev answers for the example judgements.

    One review comment plainly asks for a change (sure: answered typed); one is praise the
    model is unsure about (0.55, below the local band of 0.6: it climbs to a session); the
    issue's area is docs, sure enough for an external effect (0.91 against 0.85).
    """
    api.add_rule(Rule(noul(0.93), question="actionable", state_contains="fetch_all"))
    api.add_rule(Rule(score(1.0, 0.88), question="severity", state_contains="fetch_all"))
    api.add_rule(Rule(noul(0.3), question="actionable", state_contains="Nice work"))
    api.add_rule(Rule(score(0.0, 0.62), question="severity", state_contains="Nice work"))
    api.add_rule(Rule(choice("docs", 0.91), question="area", state_contains="install page"))


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v)}" for k, v in value.items())
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def narrate(record: Mapping[str, Any]) -> str:
    """One line for one judgement: where it ended, and the climb that got it there."""
    item = f" {record['item']}" if record.get("item") else ""
    head = f"{record['target']}{item} ({record['kind']}): "
    climb = [
        f"{e['tier']} {e['outcome']}" + (f" ({e['why']})" if e.get("why") else "")
        for e in record.get("trail", [])
        if e.get("outcome") != "answered"
    ]
    path = f" after {'; '.join(climb)}" if climb else ""
    status = record["status"]
    if status == "answered":
        conf = record.get("confidence")
        typed = record.get("tier") == "typed" and isinstance(conf, int | float)
        sure = f" at {conf:.2f} confidence" if typed else ""
        free = " (no model asked)" if record.get("tier") == "code" else ""
        return f"{head}the {record['tier']} tier answered {_value(record.get('value'))}{sure}{free}{path}"
    if status == "waiting":
        return f"{head}waits for a session: {record.get('reason')}{path}"
    return f"{head}{status}" + (f": {record['reason']}" if record.get("reason") else "") + path


def _say(message: str) -> None:
    click.echo(f"==> {message}", err=True)


def _dispatchq(
    args: Sequence[str], env: Mapping[str, str], **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatchq.cli", *args], env=dict(env), text=True, check=False, **kwargs
    )


def _narrate_all(env: Mapping[str, str], judgements: Path) -> None:
    listed = _dispatchq(["list", "--json"], env, capture_output=True)
    if listed.returncode != 0:
        click.echo(listed.stderr, err=True, nl=False)
        return
    # In the file's order (one batch has one creation time, so `list` cannot give it).
    order = {
        (line["kind"], line["target"], line.get("item")): n
        for n, line in enumerate(json.loads(text) for text in judgements.read_text().splitlines() if text)
    }
    records = json.loads(listed.stdout)
    records.sort(key=lambda r: order.get((r["kind"], r["target"], r.get("item")), len(order)))
    for record in records:
        click.echo(f"  - {narrate(record)}")


def demo_environment(data: Path, api: FakeTypeSafeAPI, lift_after: float) -> dict[str, str]:
    """A child environment with nothing of the caller's dispatchq or TypeSafe settings."""
    env = {k: v for k, v in parent_environment().items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
    examples = examples_dir()
    env.update(
        DISPATCHQ_DATA_DIR=str(data),
        DISPATCHQ_CONFIG=str(examples / "dispatchq.yaml"),
        DISPATCHQ_CHECKOUT_ROOTS=str(data),
        TYPESAFE_API_KEY=DEMO_KEY,
        TYPESAFE_BASE_URL=api.url,
        DISPATCHQ_SESSION_COMMAND=(
            f"{sys.executable} -m dispatchq.testing.stand_in_session --state {data / 'stand-in.json'} "
            f"--lift-after {lift_after} -p --output-format stream-json --verbose"
        ),
        # The stand-in is dispatchq's own trusted code and keeps its state in the data dir,
        # so it runs unconfined (the demo needs nothing but python3, not bubblewrap); it
        # checks no credential, but a session worker refuses to start without one.
        DISPATCHQ_SESSION_SANDBOX="off",
        DISPATCHQ_SESSION_CREDENTIAL_VAR="CLAUDE_CODE_OAUTH_TOKEN",
        CLAUDE_CODE_OAUTH_TOKEN="stand-in-needs-no-credential",  # noqa: S106 (not a secret)
    )
    return env


@click.command()
@click.option(
    "--lift-after",
    type=float,
    default=6.0,
    show_default=True,
    help="Seconds until the stand-in's limit lifts.",
)
def demo(lift_after: float) -> None:
    """Run the shipped example judgements through every tier, with stand-ins (nothing spent).

    The TypeSafe API and the session are loopback stand-ins shipped with dispatchq: no key,
    no usage window, no server to install. Shows typed answers with their confidence, one
    escalation to a session, a usage limit pausing the session line and the probe at the
    lift. Exit status: that of the last `dispatchq run`.
    """
    data = Path(tempfile.mkdtemp(prefix="dispatchq-demo-"))
    judgements = examples_dir() / "judgements.jsonl"
    code = 1
    with FakeTypeSafeAPI(api_key=DEMO_KEY) as api:
        script_typed_answers(api)
        env = demo_environment(data, api, lift_after)
        _say("the TypeSafe API is a loopback STAND-IN (dispatchq.testing.typesafe): no key, nothing spent")
        _say("sessions run the STAND-IN dispatchq.testing.stand_in_session: no model, no usage window spent")
        _say(
            "the stand-in session is our own trusted code: it runs unconfined (DISPATCHQ_SESSION_SANDBOX=off)"
        )
        _say("dispatchq run examples/judgements.jsonl  (embedded Redis in a temporary data dir)")
        try:
            _dispatchq(["run", str(judgements), "--no-progress"], env)
            _narrate_all(env, judgements)
            _say("the stand-in's first session hit a usage limit: the marker is up, nothing more spawns")
            _dispatchq(["status"], env)
            _say(f"waiting {lift_after + 1:.0f} s for the limit to lift (a worker wakes at the lift instant)")
            time.sleep(lift_after + 1)
            _say("dispatchq run again: one probe session first, then the rest drain")
            code = _dispatchq(["run", str(judgements), "--no-progress"], env).returncode
            _narrate_all(env, judgements)
            _say(f"typed requests the stand-in TypeSafe API answered: {api.request_count}")
        finally:
            _dispatchq(["redis", "stop"], env, stdout=subprocess.DEVNULL)
            shutil.rmtree(data, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    demo()

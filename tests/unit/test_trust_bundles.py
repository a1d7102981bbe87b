"""A confined session keeps its CA bundle readable: `SSL_CERT_FILE` names public certificates, not a
secret, although it ends in `_FILE` like the secret files the sandbox masks.

The real Codex CLI reads `SSL_CERT_FILE` for every connection it sets up; masked as `/dev/null`
it failed every one of them inside the sandbox (tests/integration/test_codex_cli.py runs it).
"""

from __future__ import annotations

from pathlib import Path

from dispatchq.settings import load_settings
from dispatchq.tiers.confine import secret_paths, trust_bundles


def test_a_ca_bundle_named_by_ssl_cert_file_stays_visible_and_a_key_file_is_hidden(tmp_path: Path) -> None:
    bundle = tmp_path / "ca-certificates.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    key = tmp_path / "typesafe-key"
    key.write_text("secret\n")
    environ = {
        "SSL_CERT_FILE": str(bundle),
        "NIX_SSL_CERT_FILE": str(bundle),  # the same bundle under a name the session is not given
        "TYPESAFE_API_KEY_FILE": str(key),
    }
    settings = load_settings({"DISPATCHQ_DATA_DIR": str(tmp_path / "data")})
    hidden = secret_paths(settings, environ)
    assert str(bundle) not in hidden
    assert str(key) in hidden
    assert trust_bundles(environ) == frozenset({str(bundle)})


def test_a_pool_credentials_file_stays_hidden_even_where_a_bundle_variable_names_it(tmp_path: Path) -> None:
    login = tmp_path / "codex-plus.json"
    login.write_text("{}")
    settings = load_settings({"DISPATCHQ_DATA_DIR": str(tmp_path / "data")})
    hidden = secret_paths(settings, {"SSL_CERT_FILE": str(login)}, credential_files=[str(login)])
    assert str(login) in hidden

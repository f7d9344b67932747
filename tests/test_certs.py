"""``topoplace certs`` and the mTLS it is for, end to end.

The generated files are checked as files (modes, no overwrite), as certificates (key type,
SANs, key usages, CA constraints; read with ``cryptography`` from the test extra), as an
``ssl.SSLContext`` loads them, and finally against a real ``topoplace serve`` (uvicorn, real
HTTPS on loopback) started with them and with ``--health-port``: a client with the client
certificate is served, clients without one, with a certificate of another CA, or with the
server's certificate (serverAuth only) are refused in the handshake, and the plain health
port serves only the health paths.
"""

from __future__ import annotations

import datetime
import http.client
import os
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.cli import certs
from scheduler.cli.main import main

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def make(out: Path, *extra: str) -> int:
    try:
        return main(["certs", "--out", str(out), *extra])
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pki") / "tls"
    assert make(out, "--dns", "topoplace.topoplace-system.svc", "10.1.2.3", "--days", "30") == 0
    return out


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("other") / "tls"
    assert make(out) == 0
    return out


# ---- files ----------------------------------------------------------------------------------


def test_writes_a_ca_and_two_key_pairs_with_private_modes(pki: Path) -> None:
    assert sorted(p.name for p in pki.iterdir()) == sorted(certs.FILES)
    for name in certs.FILES:
        mode = stat.S_IMODE((pki / name).stat().st_mode)
        assert mode == (0o600 if name.endswith(".key") else 0o644), (name, oct(mode))
    assert stat.S_IMODE(pki.stat().st_mode) == 0o700  # created by the command
    assert set(certs.SECRET_FILES) == set(certs.FILES) - {certs.CA_KEY}


def test_refuses_to_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tls"
    assert make(out) == 0
    before = {n: (out / n).read_bytes() for n in certs.FILES}
    capsys.readouterr()
    assert make(out) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"topoplace: error: {out} already holds {', '.join(certs.FILES)}; "
        "use --force to replace them"
    ]
    assert {n: (out / n).read_bytes() for n in certs.FILES} == before
    # One existing file is enough to refuse, and nothing else is written then.
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "server.key").write_text("keep me")
    assert make(lone) == 2
    assert [p.name for p in lone.iterdir()] == ["server.key"]
    assert (lone / "server.key").read_text() == "keep me"

    assert make(out, "--force") == 0
    after = {n: (out / n).read_bytes() for n in certs.FILES}
    assert all(after[n] != before[n] for n in certs.FILES)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp folder left


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--days", "0"], "argument --days: 0 is out of range 1..3650"),
        (["--days", "many"], "argument --days: 'many' is not a whole number of days"),
        (["--dns", "bad name"], "argument --dns: 'bad name' is not a DNS name or an IP address"),
        (["--dns", "a\nDNS.9 = evil"], "is not a DNS name"),
        (["--dns", "under_score.example"], "is not a DNS name"),
        (["--dns=-x.example"], "is not a DNS name"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert make(tmp_path / "tls", *argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("topoplace certs: error: ") and needle in line
    assert not (tmp_path / "tls").exists()


def test_without_openssl_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(certs.shutil, "which", lambda _name: None)
    assert make(tmp_path / "tls") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("topoplace: error: the openssl command is not installed")


def test_out_must_be_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert make(f) == 2
    assert "is not a folder" in capsys.readouterr().err


# ---- certificates ---------------------------------------------------------------------------


def test_certificate_contents(pki: Path) -> None:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    def load(name: str) -> x509.Certificate:
        return x509.load_pem_x509_certificate((pki / name).read_bytes())

    ca, server, client = load("ca.crt"), load("server.crt"), load("client.crt")
    for cert in (ca, server, client):
        key = cert.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
        life = cert.not_valid_after_utc - cert.not_valid_before_utc
        assert abs(life - datetime.timedelta(days=30)) < datetime.timedelta(minutes=1)
        assert cert.serial_number > 0
    assert len({ca.serial_number, server.serial_number, client.serial_number}) == 3

    basic = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    assert ca.subject == ca.issuer

    for cert, eku in (
        (server, ExtendedKeyUsageOID.SERVER_AUTH),
        (client, ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        assert cert.issuer == ca.subject
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [eku]
        cert.verify_directly_issued_by(ca)

    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "10.1.2.3"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "topoplace.topoplace-system.svc"]
    assert client.subject.rfc4514_string() == "CN=kube-scheduler"


def test_generated_files_load_in_ssl_contexts(pki: Path) -> None:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki / "server.crt", pki / "server.key")
    server.load_verify_locations(cafile=pki / "ca.crt")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_cert_chain(pki / "client.crt", pki / "client.key")
    client.load_verify_locations(cafile=pki / "ca.crt")
    assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
    # and as `topoplace serve` checks them at start-up
    from scheduler.kube.tls import uvicorn_ssl_kwargs

    kw = uvicorn_ssl_kwargs(str(pki / "server.crt"), str(pki / "server.key"), str(pki / "ca.crt"))
    assert kw["ssl_cert_reqs"] == ssl.CERT_REQUIRED


# ---- a real `topoplace serve` with them -----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str, context: ssl.SSLContext | None = None, host: str = "127.0.0.1"):
    conn = (
        http.client.HTTPSConnection(host, port, context=context, timeout=10)
        if context is not None
        else http.client.HTTPConnection(host, port, timeout=10)
    )
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _post(port: int, path: str, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"content-type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def _client(pki: Path, cert: str | None = "client", ca: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=ca or pki / "ca.crt")
    if cert is not None:
        ctx.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    return ctx


@pytest.fixture(scope="module")
def served(pki: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """``topoplace serve`` (demo cluster) with mTLS on 127.0.0.1 and a plain health port."""
    port, health = _free_port(), _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli.main", "serve", "--host", "127.0.0.1",
             "--port", str(port), "--tls-cert", str(pki / "server.crt"),
             "--tls-key", str(pki / "server.key"), "--tls-client-ca", str(pki / "ca.crt"),
             "--health-port", str(health)],
            cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(health, "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield port, health
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_serve_accepts_a_client_with_the_client_certificate(
    served: tuple[int, int], pki: Path
) -> None:
    port, _ = served
    ctx = _client(pki)
    assert _get(port, "/healthz", ctx) == (200, b'{"status":"ok"}')
    status, body = _get(port, "/v1/inspect/nodes", ctx)
    assert status == 200 and b'"nodes"' in body
    # The server certificate is valid for both names the docs use (SANs).
    assert _get(port, "/readyz", ctx, host="localhost")[0] == 200


@pytest.mark.parametrize("who", ["no certificate", "another CA", "the server certificate"])
def test_serve_refuses_other_clients_in_the_handshake(
    who: str, served: tuple[int, int], pki: Path, other_pki: Path
) -> None:
    port, _ = served
    ctx = {
        "no certificate": lambda: _client(pki, cert=None),
        "another CA": lambda: _client(other_pki, ca=pki / "ca.crt"),
        "the server certificate": lambda: _client(pki, cert="server"),  # serverAuth only
    }[who]()
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _get(port, "/healthz", ctx)


def test_clients_check_the_server_certificate(
    served: tuple[int, int], pki: Path, other_pki: Path
) -> None:
    port, _ = served
    with pytest.raises(ssl.SSLCertVerificationError):  # a CA that did not sign it
        _get(port, "/healthz", _client(pki, ca=other_pki / "ca.crt"))
    ctx = _client(pki)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
        pytest.raises(ssl.SSLCertVerificationError, match="elsewhere.example"),
    ):  # a name not in the SANs
        ctx.wrap_socket(sock, server_hostname="elsewhere.example")


def test_plain_health_port_serves_only_the_health_paths(served: tuple[int, int]) -> None:
    _, health = served
    assert _get(health, "/healthz") == (200, b'{"status":"ok"}')
    assert _get(health, "/readyz")[0] == 200
    status, body = _get(health, "/metrics")
    assert status == 200 and b"topoplace_" in body
    assert _get(health, "/version")[0] == 200
    assert _get(health, "/v1/inspect/nodes")[0] == 404
    assert _get(health, "/v1/inspect/placements")[0] == 404
    assert _post(health, "/scheduler/filter", b"{}") == 404
    assert _post(health, "/scheduler/bind", b"{}") == 404
    assert _post(health, "/readyz", b"") == 405

"""The test cluster's credentials and kubeconfig, checked with a real TLS handshake."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from benchmarks.cluster.pki import ADMIN_GROUP, make_pki, token_line, write_kubeconfig


def test_token_line_is_the_static_token_file_format() -> None:
    assert token_line("abc") == 'abc,topoplace-admin,topoplace-admin,"system:masters"\n'
    for bad in ("", "a,b", 'a"b'):
        with pytest.raises(ValueError):
            token_line(bad)


def test_pki_files_sans_and_reuse(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    cert = x509.load_pem_x509_certificate(pki.cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert {"localhost", "kubernetes.default.svc"} <= set(san.get_values_for_type(x509.DNSName))
    for key in (pki.key, pki.sa_key):
        assert key.stat().st_mode & 0o077 == 0
    assert b"PUBLIC KEY" in pki.sa_pub.read_bytes()
    assert pki.tokens.read_text() == token_line(pki.token, group=ADMIN_GROUP)
    assert len(pki.token) == 48
    again = make_pki(tmp_path / "pki")  # a restart keeps the credentials
    assert again.token == pki.token and again.cert.read_bytes() == pki.cert.read_bytes()


def test_kubeconfig_reaches_a_server_with_the_serving_pair(tmp_path: Path) -> None:
    """The kubeconfig's CA verifies the serving certificate for 127.0.0.1 in a real TLS
    handshake, and both clients the project uses read it (token, server, CA)."""
    from kubernetes import client, config

    from benchmarks.live.kubeapi import Api

    pki = make_pki(tmp_path / "pki")
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(pki.cert, pki.key)
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = lsock.accept()
        with srv.wrap_socket(conn, server_side=True) as tls:
            req = tls.recv(4096)
            got.append(req)
            body = b'{"major":"1","minor":"36","gitVersion":"v1.36.2"}'
            tls.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    kc = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}", pki)
    assert kc.stat().st_mode & 0o077 == 0
    api = Api(kc)
    try:
        assert api.version() == "v1.36.2"
    finally:
        api.close()
        t.join(5)
        lsock.close()
    assert f"Authorization: Bearer {pki.token}".encode().lower() in got[0].lower()
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kc), client_configuration=cfg)
    assert cfg.host == f"https://127.0.0.1:{port}"
    assert cfg.get_api_key_with_prefix("BearerToken") == f"Bearer {pki.token}"
    assert yaml.safe_load(kc.read_text())["contexts"][0]["context"]["namespace"] == "default"

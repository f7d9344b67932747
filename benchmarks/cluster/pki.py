"""Credentials of a loopback control plane: a CA and kube-apiserver's serving pair (made
by ``topoplace certs``' own functions, OpenSSL underneath: ``cryptography`` is not a runtime
dependency), the service-account signing key, one admin bearer token (group
``system:masters``, a static token file) and the kubeconfig that uses them."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scheduler.cli.certs import CertPlan, CertsError, write_certs

APISERVER_SANS = (
    "IP:127.0.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
)
ADMIN_USER = "topoplace-admin"
ADMIN_GROUP = "system:masters"
CONTEXT = "topoplace-cluster"


@dataclass(frozen=True, slots=True)
class Pki:
    """Paths of a plane's credentials (all under one folder, mode 0700).

    Attributes:
        ca: the CA certificate (clients trust it; kube-apiserver's client CA too).
        cert / key: kube-apiserver's serving pair (SANs 127.0.0.1, localhost, kubernetes.*).
        sa_key / sa_pub: the service-account signing key and its public half (kube-apiserver
            signs tokens with the one and verifies them with the other).
        tokens: the static token file (``token,user,uid,"groups"``).
        token: the admin bearer token.
    """

    ca: Path
    cert: Path
    key: Path
    sa_key: Path
    sa_pub: Path
    tokens: Path
    token: str


def token_line(token: str, user: str = ADMIN_USER, group: str = ADMIN_GROUP) -> str:
    """One line of kube-apiserver's ``--token-auth-file``: ``token,user,uid,"group"``."""
    if not token or any(c in token for c in ',"\n'):
        raise ValueError("a token is a non-empty string without commas, quotes or newlines")
    return f'{token},{user},{user},"{group}"\n'


def make_pki(folder: Path) -> Pki:
    """Write (or reuse, when all files are there) the credentials in ``folder``.

    Raises:
        CertsError: openssl missing or failing, or ``folder`` not writable.
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca, cert, key = folder / "ca.crt", folder / "server.crt", folder / "server.key"
    sa_key, sa_pub, tokens = folder / "sa.key", folder / "sa.pub", folder / "tokens.csv"
    if not all(p.is_file() for p in (ca, cert, key, sa_key, sa_pub, tokens)):
        write_certs(CertPlan(folder, days=3650, sans=APISERVER_SANS, force=True))
        exe = shutil.which("openssl")
        if exe is None:  # write_certs found it a moment ago
            raise CertsError("the openssl command is not installed")
        for argv in (
            [
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                str(sa_key),
            ],
            ["pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub)],
        ):
            out = subprocess.run(
                [exe, *argv], capture_output=True, text=True, timeout=60, check=False
            )
            if out.returncode != 0:
                raise CertsError(f"openssl {argv[0]} failed: {out.stderr.strip()[-300:]}")
            os.chmod(sa_key, 0o600)
        tokens.write_text(token_line(secrets.token_hex(24)))
        os.chmod(tokens, 0o600)
    token = tokens.read_text().split(",", 1)[0]
    return Pki(ca, cert, key, sa_key, sa_pub, tokens, token)


def kubeconfig(server: str, ca_pem: bytes, token: str) -> dict[str, Any]:
    """A kubeconfig for ``server`` trusting ``ca_pem`` with the admin ``token`` (context
    :data:`CONTEXT`, namespace ``default``)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": ADMIN_USER, "namespace": "default"},
            }
        ],
        "current-context": CONTEXT,
    }


def write_kubeconfig(path: Path, server: str, pki: Pki) -> Path:
    """Write :func:`kubeconfig` for ``pki`` to ``path`` (mode 0600); returns ``path``."""
    text = yaml.safe_dump(kubeconfig(server, pki.ca.read_bytes(), pki.token), sort_keys=False)
    path.write_text(text)
    os.chmod(path, 0o600)
    return path

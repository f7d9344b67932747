"""TLS and mutual TLS for the extender's HTTP server (uvicorn keyword arguments).

kube-scheduler reaches the extender with ``enableHTTPS`` and a ``tlsConfig``
(``certFile``/``keyFile`` for its client certificate, ``caFile`` to verify ours; see
extender-protocol.md §2). With a client CA, every connection must present a certificate
signed by it, so only kube-scheduler (or whoever holds such a key) can call the verbs.

The files are checked here, at start-up, so that a wrong path, a file that is not PEM, an
encrypted key or a key that does not belong to the certificate is one clear
:class:`TLSConfigError` instead of a failure at the first handshake. uvicorn reads the
files once: a changed certificate takes effect when the process restarts.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, NoReturn


class TLSConfigError(ValueError):
    """A TLS file is missing, unreadable, not PEM, encrypted, or does not fit its pair."""


class TLSFileNotFound(TLSConfigError, FileNotFoundError):
    """A TLS file does not exist (also a ``FileNotFoundError``)."""


def _read(path: str, what: str) -> str:
    p = Path(path)
    if not p.exists():
        raise TLSFileNotFound(f"{what} {path}: no such file")
    if not p.is_file():
        raise TLSConfigError(f"{what} {path}: not a file")
    try:
        return p.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise TLSConfigError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None


def _reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc)


def _check_certificates(path: str, what: str) -> None:
    """``path`` holds at least one PEM certificate that OpenSSL can parse."""
    text = _read(path, what)
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise TLSConfigError(f"{what} {path}: not a PEM certificate (no BEGIN CERTIFICATE)")
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        probe.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TLSConfigError(
            f"{what} {path}: not a valid PEM certificate ({_reason(exc)})"
        ) from None


def _no_password() -> NoReturn:
    raise TLSConfigError("encrypted")


def check_key_pair(cert: str, key: str) -> None:
    """``cert`` and ``key`` are PEM, the key is not encrypted, and they belong together.

    Raises:
        TLSConfigError: with which file is wrong and why.
    """
    _check_certificates(cert, "TLS certificate")
    text = _read(key, "TLS key")
    if "PRIVATE KEY-----" not in text:
        raise TLSConfigError(f"TLS key {key}: not a PEM private key (no BEGIN ... PRIVATE KEY)")
    if "ENCRYPTED" in text:
        raise TLSConfigError(f"TLS key {key}: encrypted keys are not supported")
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # A callable password: OpenSSL would otherwise prompt on the terminal.
        probe.load_cert_chain(cert, key, password=_no_password)
    except TLSConfigError:
        raise TLSConfigError(f"TLS key {key}: encrypted keys are not supported") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise TLSConfigError(f"TLS key {key} does not match the certificate {cert}") from None
        raise TLSConfigError(
            f"cannot load TLS certificate {cert} with key {key}: {_reason(exc)}"
        ) from None


def check_ca_bundle(path: str, what: str = "TLS client CA") -> None:
    """``path`` is a PEM bundle of one or more CA certificates.

    Raises:
        TLSConfigError: missing, unreadable or not PEM certificates.
    """
    _check_certificates(path, what)


def uvicorn_ssl_kwargs(cert: str, key: str, client_ca: str | None = None) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` serving HTTPS.

    Args:
        cert: server certificate chain (PEM).
        key: its private key (PEM, not encrypted).
        client_ca: CA bundle (PEM) that must have signed client certificates; with it,
            a client without a valid certificate is refused during the TLS handshake.

    Raises:
        TLSConfigError: a file is missing (:class:`TLSFileNotFound`) or unreadable, is not
            PEM, the key is encrypted, the key does not match the certificate, or the CA
            bundle holds no certificate. (A ``ValueError``.)
    """
    check_key_pair(cert, key)
    if client_ca:
        check_ca_bundle(client_ca)
    out: dict[str, Any] = {"ssl_certfile": cert, "ssl_keyfile": key}
    if client_ca:
        out["ssl_ca_certs"] = client_ca
        out["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return out

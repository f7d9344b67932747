"""TLS and mutual TLS for the extender's HTTP server (uvicorn keyword arguments).

kube-scheduler reaches the extender with ``enableHTTPS`` and a ``tlsConfig``
(``certFile``/``keyFile`` for its client certificate, ``caFile`` to verify ours; see
extender-protocol.md §2). With a client CA, every connection must present a certificate
signed by it, so only kube-scheduler (or whoever holds such a key) can call the verbs.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any


def uvicorn_ssl_kwargs(cert: str, key: str, client_ca: str | None = None) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` serving HTTPS.

    Args:
        cert: server certificate chain (PEM).
        key: its private key (PEM).
        client_ca: CA bundle (PEM) that must have signed client certificates; with it,
            a client without a valid certificate is refused during the TLS handshake.

    Raises:
        FileNotFoundError: a file does not exist.
        ssl.SSLError: the certificate and key do not load or do not match.
    """
    files = [cert, key] + ([client_ca] if client_ca else [])
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"TLS file not found: {f}")
    # Fail at start-up, not at the first handshake, when the pair or the CA is unusable.
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    probe.load_cert_chain(cert, key)
    if client_ca:
        probe.load_verify_locations(cafile=client_ca)
    out: dict[str, Any] = {"ssl_certfile": cert, "ssl_keyfile": key}
    if client_ca:
        out["ssl_ca_certs"] = client_ca
        out["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return out

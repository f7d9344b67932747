"""``topoplace certs``: a private CA and the two key pairs of kube-scheduler <-> topoplace mTLS.

``topoplace certs --out DIR [--days N] [--dns NAME ...] [--force]`` writes::

    ca.crt       the CA certificate: both sides trust it (Secret key ca.crt)
    ca.key       the CA's private key: only to sign more certificates; NOT for the Secret
    server.crt   topoplace's serving certificate, SANs IP 127.0.0.1, DNS localhost and --dns
    server.key
    client.crt   kube-scheduler's client certificate (CN kube-scheduler, clientAuth only)
    client.key

Keys are ECDSA P-256 (supported by Go's crypto/tls on the kube-scheduler side and by
OpenSSL on ours); key files are mode 0600. The server certificate is valid for serverAuth
only and the client certificate for clientAuth only, so neither can stand in for the other.
Existing files are never overwritten without ``--force``; the files are written to a
temporary folder inside DIR and moved into place only once all of them exist and load.

The certificates are made by the ``openssl`` command line tool (OpenSSL 1.1.1 or 3.x): the
``cryptography`` package is not a dependency of topoplace.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SERVER_CERT = "server.crt"
SERVER_KEY = "server.key"
CLIENT_CERT = "client.crt"
CLIENT_KEY = "client.key"
FILES = (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY, CLIENT_CERT, CLIENT_KEY)
SECRET_FILES = (CA_CERT, SERVER_CERT, SERVER_KEY, CLIENT_CERT, CLIENT_KEY)
"""What the deploy Secret carries (config/deploy/mtls/kustomization.yaml): all but ca.key."""

DEFAULT_DAYS = 365
MAX_DAYS = 3650
DEFAULT_SANS = ("IP:127.0.0.1", "DNS:localhost")
CA_SUBJECT = "/CN=topoplace extender CA"
SERVER_SUBJECT = "/CN=topoplace"
CLIENT_SUBJECT = "/CN=kube-scheduler"

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")


class CertsError(Exception):
    """The certificates cannot be made (reported as ``topoplace: error: ...``, exit 2)."""


def san_entry(name: str) -> str:
    """``IP:...`` or ``DNS:...`` for a --dns value (an IP address becomes an IP SAN).

    Raises:
        argparse.ArgumentTypeError: neither an IP address nor a valid DNS name.
    """
    try:
        return f"IP:{ipaddress.ip_address(name)}"
    except ValueError:
        pass
    if len(name) > 253 or not _DNS_RE.match(name):
        raise argparse.ArgumentTypeError(f"{name!r} is not a DNS name or an IP address")
    return f"DNS:{name.rstrip('.').lower()}"


def days_type(text: str) -> int:
    """A validity in days, 1..MAX_DAYS."""
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of days") from None
    if not 1 <= days <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"{days} is out of range 1..{MAX_DAYS}")
    return days


@dataclass(frozen=True)
class CertPlan:
    """What to write: the folder, the validity and the server certificate's SANs."""

    out: Path
    days: int = DEFAULT_DAYS
    sans: tuple[str, ...] = DEFAULT_SANS
    force: bool = False


def _openssl_config(sans: Sequence[str]) -> str:
    alt = "\n".join(
        f"{kind}.{i} = {value}"
        for i, (kind, value) in enumerate((s.split(":", 1) for s in sans), start=1)
    )
    return f"""\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder

[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[v3_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = @server_alt

[v3_client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always

[server_alt]
{alt}
"""


def _openssl() -> str:
    exe = shutil.which("openssl")
    if exe is None:
        raise CertsError(
            "the openssl command is not installed (topoplace certs runs it to make the "
            "certificates); install OpenSSL or make them another way (docs/deploy.md)"
        )
    return exe


def _run(exe: str, args: Sequence[str], cwd: Path) -> None:
    try:
        proc = subprocess.run(
            [exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CertsError(f"openssl {args[0]} failed: {exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        detail = lines[-1] if lines else f"exit status {proc.returncode}"
        raise CertsError(f"openssl {args[0]} failed: {detail}")


def _serial() -> str:
    return f"0x{secrets.randbits(127) or 1:x}"  # positive, at most 16 bytes


def _make_all(exe: str, work: Path, plan: CertPlan) -> None:
    (work / "openssl.cnf").write_text(_openssl_config(plan.sans), encoding="ascii")
    days = str(plan.days)
    for key in (CA_KEY, SERVER_KEY, CLIENT_KEY):
        _run(
            exe,
            ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key],
            work,
        )
        os.chmod(work / key, 0o600)
    _run(
        exe,
        ["req", "-x509", "-new", "-sha256", "-key", CA_KEY, "-days", days, "-subj", CA_SUBJECT,
         "-set_serial", _serial(), "-config", "openssl.cnf", "-extensions", "v3_ca",
         "-out", CA_CERT],
        work,
    )  # fmt: skip
    for key, cert, subject, ext in (
        (SERVER_KEY, SERVER_CERT, SERVER_SUBJECT, "v3_server"),
        (CLIENT_KEY, CLIENT_CERT, CLIENT_SUBJECT, "v3_client"),
    ):
        csr = cert + ".csr"
        _run(
            exe,
            ["req", "-new", "-sha256", "-key", key, "-subj", subject, "-config", "openssl.cnf",
             "-out", csr],
            work,
        )  # fmt: skip
        _run(
            exe,
            ["x509", "-req", "-sha256", "-in", csr, "-CA", CA_CERT, "-CAkey", CA_KEY,
             "-set_serial", _serial(), "-days", days, "-extfile", "openssl.cnf",
             "-extensions", ext, "-out", cert],
            work,
        )  # fmt: skip
    for cert in (CA_CERT, SERVER_CERT, CLIENT_CERT):
        os.chmod(work / cert, 0o644)


def _self_check(work: Path) -> None:
    """The pairs load the way ``topoplace serve`` and a TLS client load them."""
    try:
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(work / SERVER_CERT, work / SERVER_KEY)
        server.load_verify_locations(cafile=work / CA_CERT)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.load_cert_chain(work / CLIENT_CERT, work / CLIENT_KEY)
        client.load_verify_locations(cafile=work / CA_CERT)
    except (ssl.SSLError, OSError) as exc:
        raise CertsError(f"the generated files do not load: {exc}") from None


def write_certs(plan: CertPlan) -> list[Path]:
    """Make the CA and both key pairs in ``plan.out``; returns the files written.

    Raises:
        CertsError: openssl missing or failing, a file exists without ``force``, or the
            folder cannot be written.
    """
    exe = _openssl()
    out = plan.out
    if out.exists() and not out.is_dir():
        raise CertsError(f"{out} exists and is not a folder")
    existing = [name for name in FILES if (out / name).exists()]
    if existing and not plan.force:
        raise CertsError(f"{out} already holds {', '.join(existing)}; use --force to replace them")
    try:
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".topoplace-certs-", dir=out))  # mode 0700
    except OSError as exc:
        raise CertsError(f"cannot write to {out}: {exc.strerror or exc}") from None
    try:
        _make_all(exe, work, plan)
        _self_check(work)
        written = []
        for name in FILES:
            os.replace(work / name, out / name)
            written.append(out / name)
        return written
    except OSError as exc:
        raise CertsError(f"cannot write to {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cmd_certs(args: argparse.Namespace) -> int:
    """``topoplace certs``: write the files and say what to do with them."""
    sans = tuple(dict.fromkeys([*DEFAULT_SANS, *(args.dns or ())]))
    plan = CertPlan(Path(args.out), days=args.days, sans=sans, force=args.force)
    written = write_certs(plan)
    for path in written:
        print(path)
    print(
        f"topoplace certs: CA and key pairs valid for {plan.days} days; server SANs "
        f"{', '.join(sans)}. {CA_KEY} only signs more certificates: keep it out of the "
        "Secret (config/deploy/mtls/kustomization.yaml leaves it out).",
        file=sys.stderr,
    )
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``topoplace certs`` on the top-level sub-parsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "certs",
        help="write a CA and the server/client key pairs for kube-scheduler <-> topoplace mTLS",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the files")
    p.add_argument(
        "--days",
        type=days_type,
        default=DEFAULT_DAYS,
        help=f"validity of the CA and both certificates (default {DEFAULT_DAYS})",
    )
    p.add_argument(
        "--dns",
        type=san_entry,
        action="extend",
        nargs="+",
        metavar="NAME",
        help="extra SAN of the server certificate (a DNS name or an IP address; repeatable); "
        "127.0.0.1 and localhost are always in",
    )
    p.add_argument("--force", action="store_true", help="replace existing files")
    p.set_defaults(func=cmd_certs)
    return p

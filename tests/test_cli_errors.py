"""The CLI turns every input mistake into one line on stderr and a non-zero exit.

Each case runs the real command line: ``scheduler.cli.main.main(argv)`` in this process (as
the console script does: ``sys.exit(main())``; argparse errors arrive as ``SystemExit``), or
``python -m scheduler.cli.main`` in a subprocess where the process boundary matters (a closed
stdout pipe, the interpreter's last flush). Every case checks the exit status, that stderr
is exactly one line naming the problem, and that no traceback was printed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.cli.main import main

REPO = Path(__file__).resolve().parents[1]
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``topoplace ARGV`` run in this process."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str, prefix: str = "topoplace") -> None:
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith(f"{prefix}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture(autouse=True)
def _no_ambient_kube(monkeypatch: pytest.MonkeyPatch) -> None:
    """No $KUBECONFIG / in-cluster variables from the environment running the tests."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA with server and client pairs (``topoplace certs``), plus broken variants."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    d = tmp_path_factory.mktemp("pki")
    assert main(["certs", "--out", str(d)]) == 0
    files = {name: d / name for name in ("ca.crt", "server.crt", "server.key", "client.key")}
    files["not-pem"] = d / "not-pem.txt"
    files["not-pem"].write_text("this is not PEM\n")
    files["encrypted.key"] = d / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(d / "server.key"), "-aes256", "-passout", "pass:secret"]
        + ["-out", str(files["encrypted.key"])],
        check=True,
        capture_output=True,
    )
    return files


# ---- argument values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["serve", "--port", "99999"], ["argument --port", "99999", "1..65535"]),
        (["serve", "--port", "0"], ["argument --port", "0 is not a port number"]),
        (["serve", "--port", "eighty"], ["argument --port", "'eighty' is not a port number"]),
        (["serve", "--health-port", "70000"], ["argument --health-port", "70000"]),
        (["serve", "--max-body-bytes", "-5"], ["argument --max-body-bytes", "-5 must be at least 1"]),
        (["serve", "--max-body-bytes", "0"], ["argument --max-body-bytes", "0 must be at least 1"]),
        (["serve", "--max-body-bytes", "64M"], ["argument --max-body-bytes", "'64M'"]),
    ],
    ids=["port-99999", "port-0", "port-word", "health-port", "body-negative", "body-zero", "body-unit"],
)  # fmt: skip
def test_serve_argument_values_are_checked(
    argv: list[str], needles: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, *needles, prefix="topoplace serve")


def test_log_level_bogus_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--log-level", "bogus", "topo", "show", "dgx1-v100"], capsys)
    assert_one_line_error(code, err, "argument --log-level", "'bogus' is not a log level", "DEBUG")
    assert out == ""


@pytest.mark.parametrize("level", ["warning", "DEBUG", "Error"])
def test_log_level_names_any_case_are_accepted(
    level: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["--log-level", level, "topo", "show", "dgx1-v100", "--json"], capsys)
    assert code == 0, err
    assert '"name": "dgx1-v100"' in out


def test_serve_health_port_must_differ(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["serve", "--port", "18888", "--health-port", "18888"], capsys)
    assert_one_line_error(code, err, "--health-port must differ from --port")


def test_serve_health_host_needs_health_port(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["serve", "--health-host", "0.0.0.0"], capsys)
    assert_one_line_error(code, err, "--health-host needs --health-port")


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_serve_on_a_busy_port(busy_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["serve", "--port", str(busy_port)], capsys)
    assert_one_line_error(code, err, f"cannot listen on 127.0.0.1:{busy_port}", "in use")


def test_serve_on_an_unknown_host(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["serve", "--host", "no-such-host.invalid", "--port", "18889"], capsys)
    assert_one_line_error(code, err, "cannot resolve 'no-such-host.invalid'")


# ---- kubeconfig -----------------------------------------------------------------------------


GOOD_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (None, ["no such file"]),
        ("clusters: [\n", ["not valid YAML", "line 2"]),
        ("", ["not a kubeconfig"]),
        ("- a\n- b\n", ["not a kubeconfig"]),
        ("apiVersion: v1\nkind: Config\n", ["Invalid kube-config", "current-context"]),
        (GOOD_KUBECONFIG.replace("current-context: x", "current-context: y"), ["name y"]),
        (GOOD_KUBECONFIG.replace("cluster: c,", "cluster: nope,"), ["name nope"]),
        ("contexts: 5\ncurrent-context: x\n", ["kubeconfig"]),
    ],
    ids=["missing", "not-yaml", "empty", "a-list", "no-context", "unknown-context",
         "unknown-cluster", "malformed"],
)  # fmt: skip
def test_serve_with_a_bad_kubeconfig(
    text: str | None, needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kubeconfig"
    if text is not None:
        path.write_text(text)
    code, _, err = run(["serve", "--kubeconfig", str(path), "--port", "18890"], capsys)
    assert_one_line_error(code, err, f"kubeconfig {path}", *needles)


def test_bad_kubeconfig_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    code, _, err = run(["serve", "--port", "18891"], capsys)
    assert_one_line_error(code, err, "(from $KUBECONFIG)", "no such file")


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("TOPOPLACE_SLICE_REBUILD_DELAY_S", "soon", "0..600"),
        ("TOPOPLACE_HEALTH_CLOCK", "fast", "EPOCH@WALL*RATE"),
    ],
)
def test_serve_with_a_bad_setting_in_the_environment(
    variable: str,
    value: str,
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(GOOD_KUBECONFIG)
    monkeypatch.setenv(variable, value)
    code, _, err = run(["serve", "--kubeconfig", str(path), "--port", "18892"], capsys)
    assert_one_line_error(code, err, "environment", variable, says)


def test_snapshot_with_a_bad_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("users: {\n")
    code, out, err = run(["snapshot", "--kubeconfig", str(path)], capsys)
    assert_one_line_error(code, err, "not valid YAML")
    assert out == ""


# ---- TLS files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        ({"--tls-cert": "missing.crt", "--tls-key": "server.key"},
         ["TLS certificate", "missing.crt: no such file"]),
        ({"--tls-cert": "server.crt", "--tls-key": "missing.key"},
         ["TLS key", "missing.key: no such file"]),
        ({"--tls-cert": "server.crt", "--tls-key": "server.key", "--tls-client-ca": "missing.crt"},
         ["TLS client CA", "missing.crt: no such file"]),
        ({"--tls-cert": "not-pem", "--tls-key": "server.key"},
         ["TLS certificate", "not a PEM certificate"]),
        ({"--tls-cert": "server.crt", "--tls-key": "not-pem"}, ["TLS key", "not a PEM private key"]),
        ({"--tls-cert": "server.crt", "--tls-key": "client.key"},
         ["client.key does not match the certificate", "server.crt"]),
        ({"--tls-cert": "server.crt", "--tls-key": "encrypted.key"},
         ["encrypted.key: encrypted keys are not supported"]),
        ({"--tls-cert": "server.crt", "--tls-key": "server.key", "--tls-client-ca": "not-pem"},
         ["TLS client CA", "not a PEM certificate"]),
        ({"--tls-client-ca": "ca.crt"}, ["--tls-client-ca needs --tls-cert and --tls-key"]),
        ({"--tls-cert": "server.crt"}, ["HTTPS needs both --tls-cert and --tls-key"]),
    ],
    ids=["cert-missing", "key-missing", "ca-missing", "cert-not-pem", "key-not-pem",
         "key-mismatch", "key-encrypted", "ca-not-pem", "ca-alone", "cert-alone"],
)  # fmt: skip
def test_serve_with_bad_tls_files(
    flags: dict[str, str],
    needles: list[str],
    pki: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["serve", "--port", "18892"]
    for flag, name in flags.items():
        argv += [flag, str(pki.get(name, tmp_path / name))]
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, *needles)


# ---- other commands -------------------------------------------------------------------------


def test_serve_with_a_missing_cluster_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:  # a free port: the default 8888 may be taken on this host
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    code, _, err = run(["serve", "--port", port, "--cluster", str(tmp_path / "nope.json")], capsys)
    assert_one_line_error(code, err, "cannot read cluster file", "nope.json")


def test_serve_with_a_missing_policy_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["serve", "--config", str(tmp_path / "nope.yaml")], capsys)
    assert_one_line_error(code, err, "cannot read policy file", "nope.yaml")


def test_topo_show_of_an_unknown_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["topo", "show", "no-such-shape"], capsys)
    assert_one_line_error(
        code, err, "'no-such-shape' is neither a catalog shape", prefix="topoplace topo"
    )
    assert out == ""


def test_plan_with_a_missing_cluster_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--cluster", str(tmp_path / "nope.json"), "--gang", "a:1x1"]
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, "cannot read cluster file", prefix="topoplace plan")


# ---- the real process -----------------------------------------------------------------------


def _cli(*argv: str, **kwargs: object) -> subprocess.Popen[bytes]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    return subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli.main", *argv],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    "argv",
    [["topo", "show", "dgx-h100"], ["topo", "show", "dgx2-v100", "--json"], ["demo", "--json"]],
    ids=["topo-show", "topo-show-json", "demo-json"],
)
def test_output_into_a_closed_pipe_ends_quietly(argv: list[str]) -> None:
    """``topoplace topo show ... | head``: no BrokenPipeError traceback, status 1 (EPIPE)."""
    proc = _cli("--log-level", "WARNING", *argv, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert err == "", err
    assert code == 1


def test_standalone_topo_into_a_closed_pipe_ends_quietly() -> None:
    """``python -m scheduler.cli.topo show ... | head`` too."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli.topo", "show", "dgx-h100"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    assert proc.stderr.read().decode() == ""
    assert proc.wait(timeout=60) == 1


def test_help_into_a_closed_pipe_is_quiet() -> None:
    """argparse itself swallows EPIPE while printing help (exit status 0); nothing on stderr."""
    proc = _cli("--help", stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    assert proc.stderr.read().decode() == ""
    assert proc.wait(timeout=60) in (0, 1)


def test_the_console_script_prints_one_line_and_exits_2() -> None:
    proc = _cli("serve", "--port", "99999", stdout=subprocess.DEVNULL)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 2
    assert err.splitlines() == [
        "topoplace serve: error: argument --port: 99999 is not a port number (1..65535) "
        "(see topoplace serve --help)"
    ]


@needs_openssl
def test_the_console_script_reports_a_key_mismatch(pki: dict[str, Path]) -> None:
    proc = _cli(
        "serve",
        "--tls-cert",
        str(pki["server.crt"]),
        "--tls-key",
        str(pki["client.key"]),
        stdout=subprocess.DEVNULL,
    )
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 2
    assert err.splitlines() == [
        f"topoplace: error: TLS key {pki['client.key']} does not match the certificate "
        f"{pki['server.crt']}"
    ]

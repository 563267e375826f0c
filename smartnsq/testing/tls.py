"""Self-signed TLS material for tests of TLS connections (uses the ``openssl`` command)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

from smartnsq.testing.errors import ClusterError

__all__ = ["self_signed_contexts"]


def self_signed_contexts(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting it) for 127.0.0.1, valid one day."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ClusterError("the openssl command is needed to make a test certificate")
    cert = directory / "cert.pem"
    key = directory / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client

"""Keys and certificates for a local control plane, made with the ``openssl`` command."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

DAYS = "3650"


@dataclasses.dataclass(frozen=True)
class Certificates:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    service_account_key: Path
    service_account_public: Path
    kubelet_client_cert: Path  # the API server's, to the kubelets (logs, exec, port-forward)
    kubelet_client_key: Path


KUBELET_CLIENT = "kube-apiserver-kubelet-client"  # its user; in system:masters, as kubeadm's


def make(directory: Path, addresses: Sequence[str] = ()) -> Certificates:
    """A CA, an API-server serving certificate for 127.0.0.1 (and ``addresses``: where
    real nodes and pods dial it), a service-account key pair, and the API server's client
    certificate for the kubelets' APIs."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command is not on PATH (Debian package openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    certs = Certificates(*(directory / name for name in (
        "ca.crt", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub",
        "apiserver-kubelet-client.crt", "apiserver-kubelet-client.key")))
    ca_key = directory / "ca.key"
    _openssl("genrsa", "-out", str(ca_key), "2048")
    _openssl("req", "-x509", "-new", "-key", str(ca_key), "-days", DAYS,
             "-subj", "/CN=asrpool-local-ca", "-out", str(certs.ca_cert))
    _openssl("genrsa", "-out", str(certs.serving_key), "2048")
    request = directory / "apiserver.csr"
    _openssl("req", "-new", "-key", str(certs.serving_key), "-subj", "/CN=kube-apiserver",
             "-out", str(request))
    extensions = directory / "apiserver.ext"
    ips = "".join(f"IP:{ip}," for ip in addresses if ip != "127.0.0.1")
    extensions.write_text(
        f"subjectAltName=IP:127.0.0.1,{ips}"
        "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", str(request), "-CA", str(certs.ca_cert),
             "-CAkey", str(ca_key), "-CAcreateserial", "-days", DAYS,
             "-extfile", str(extensions), "-out", str(certs.serving_cert))
    _openssl("genrsa", "-out", str(certs.service_account_key), "2048")
    _openssl("rsa", "-in", str(certs.service_account_key), "-pubout",
             "-out", str(certs.service_account_public))
    _client_certificate(directory, ca_key, certs.ca_cert, certs.kubelet_client_key,
                        certs.kubelet_client_cert, f"/O=system:masters/CN={KUBELET_CLIENT}")
    return certs


def _client_certificate(directory: Path, ca_key: Path, ca_cert: Path, key: Path, cert: Path,
                        subject: str) -> None:
    """A key and a certificate for client authentication only, signed by the CA."""
    _openssl("genrsa", "-out", str(key), "2048")
    request = directory / f"{cert.stem}.csr"
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(request))
    extensions = directory / f"{cert.stem}.ext"
    extensions.write_text("extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca_cert), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", DAYS, "-extfile", str(extensions), "-out", str(cert))


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")

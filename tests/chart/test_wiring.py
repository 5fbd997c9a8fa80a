"""The chart's selectors match what the operator really builds: the NetworkPolicies
pick its server pods and let the router's pods in; the ServiceMonitor picks its
Services; the dashboard queries metrics the server and router really export."""

from __future__ import annotations

import base64
import json
import re
import textwrap
from typing import Any

import jsonschema
import pytest
import yaml

from asrpool.operator import children, naming, pools
from asrpool.operator import settings as operator_settings
from asrpool.router import metrics as router_metrics
from asrpool.server import metrics as server_metrics
from tests.chart import rendering
from tests.chart.scenarios import SCENARIOS


def built_children(namespace: str = "speech") -> dict[str, dict[str, Any]]:
    pool = pools.from_body({"metadata": {"name": "stt-en", "namespace": namespace},
                            "spec": {"model": {"name": "kyutai/stt-2.6b-en"}, "slots": 16}})
    config = operator_settings.OperatorSettings(all_namespaces=True)
    return {child["kind"]: child for child in children.build_all(pool, config)}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are checked here"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def pod_labels(manifests: list[rendering.Manifest], component: str) -> dict[str, str]:
    labels: dict[str, str] = rendering.deployment(manifests, component)["spec"]["template"][
        "metadata"]["labels"]
    return labels


def operator_config(manifests: list[rendering.Manifest]) -> operator_settings.OperatorSettings:
    """The operator's settings from its rendered environment (JSON values decoded as
    pydantic-settings decodes them)."""
    env = {e["name"]: e.get("value", "") for e in
           rendering.container(rendering.deployment(manifests, "operator"))["env"]}
    given: dict[str, Any] = {"all_namespaces": True}
    if "ASRPOOL_NETWORK_POLICY_FROM" in env:
        given["network_policy_from"] = json.loads(env["ASRPOOL_NETWORK_POLICY_FROM"])
    if env.get("ASRPOOL_NETWORK_POLICY") == "false":
        given["network_policy"] = False
    return operator_settings.OperatorSettings(**given)


@pytest.mark.parametrize("scenario", ["defaults", "namespaced-operator", "names-and-images",
                                      "monitoring"])
def test_only_routers_and_prometheus_reach_server_pods_of_every_pool(scenario: str) -> None:
    """The operator makes one NetworkPolicy per pool, with the peers the chart gives it:
    this release's routers (not its operator) and Prometheus, on the server port."""
    manifests = rendering.render(SCENARIOS[scenario])
    values = rendering.chart().merge_values(SCENARIOS[scenario])
    assert [p for p in rendering.find(manifests, "NetworkPolicy")
            if p["metadata"]["labels"]["app.kubernetes.io/component"] == "server"] == []
    built = {child["kind"]: child for child in children.build_all(pools.from_body({
        "metadata": {"name": "stt-en", "namespace": "speech"},
        "spec": {"model": {"name": "kyutai/stt-2.6b-en"}, "slots": 16}}),
        operator_config(manifests))}
    policy = built["NetworkPolicy"]
    assert selects(policy["spec"]["podSelector"],
                   built["Deployment"]["spec"]["template"]["metadata"]["labels"])
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [operator_settings.SERVER_PORT]
    router_peer, prometheus_peer = rule["from"]
    assert selects(router_peer["podSelector"], pod_labels(manifests, "router"))
    assert not selects(router_peer["podSelector"], pod_labels(manifests, "operator"))
    assert router_peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": rendering.NAMESPACE}}
    assert prometheus_peer["namespaceSelector"] == values["networkPolicy"]["prometheus"][
        "namespaceSelector"]


def test_without_network_policies_the_operator_makes_none() -> None:
    manifests = rendering.render(SCENARIOS["no-extras"])
    assert not operator_config(manifests).network_policy


def test_redis_admits_the_router_the_operator_and_server_pods() -> None:
    manifests = rendering.render()
    policy = rendering.one(manifests, "NetworkPolicy", "demo-asrpool-redis")
    redis = rendering.one(manifests, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["spec"]["podSelector"], redis)
    peers = policy["spec"]["ingress"][0]["from"]
    server = built_children()["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for labels in (pod_labels(manifests, "router"), pod_labels(manifests, "operator"), server):
        assert any(selects(peer["podSelector"], labels) for peer in peers)


@pytest.mark.parametrize(("values", "namespaces"), [
    ({}, [rendering.NAMESPACE]),
    ({"pools": {"namespaces": ["speech", "other"]}}, [rendering.NAMESPACE, "speech", "other"]),
])
def test_redis_admits_server_pods_of_the_pool_namespaces_by_name(
        values: dict[str, Any], namespaces: list[str]) -> None:
    """By the name the API server sets, not by labels a pod in any namespace may copy;
    watching every namespace, of any."""
    policy = rendering.one(rendering.render(values), "NetworkPolicy", "demo-asrpool-redis")
    (server_peer,) = [peer for peer in policy["spec"]["ingress"][0]["from"]
                      if "namespaceSelector" in peer]
    assert server_peer["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}
    everywhere = rendering.render({"operator": {"allNamespaces": True}})
    policy = rendering.one(everywhere, "NetworkPolicy", "demo-asrpool-redis")
    assert {"namespaceSelector": {}} in [
        {k: v for k, v in peer.items() if k == "namespaceSelector"}
        for peer in policy["spec"]["ingress"][0]["from"]]


def test_the_server_service_monitor_picks_the_operators_services_and_labels_the_pool() -> None:
    manifests = rendering.render(SCENARIOS["monitoring"])
    monitor = rendering.one(manifests, "ServiceMonitor", "demo-asrpool-server")
    service = built_children()["Service"]
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    label = "__meta_kubernetes_service_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", naming.POOL_LABEL)
    assert {"sourceLabels": [label], "targetLabel": "pool"} in endpoint["relabelings"]
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


def test_the_router_service_monitor_picks_the_routers_admin_port_alone() -> None:
    """The metrics are on the routers' admin port, which only an in-cluster Service
    reaches: the public Service (and the Ingress on it) serve the client port alone."""
    manifests = rendering.render(SCENARIOS["monitoring"])
    monitor = rendering.one(manifests, "ServiceMonitor", "demo-asrpool-router")
    admin = rendering.one(manifests, "Service", "demo-asrpool-router-admin")
    public = rendering.one(manifests, "Service", "demo-asrpool-router")
    assert selects(monitor["spec"]["selector"], admin["metadata"]["labels"])
    assert not selects(monitor["spec"]["selector"], public["metadata"]["labels"])
    assert monitor["spec"]["endpoints"][0]["port"] == admin["spec"]["ports"][0]["name"]
    assert admin["spec"]["type"] == "ClusterIP"
    assert [p["targetPort"] for p in public["spec"]["ports"]] == ["http"]
    router = rendering.container(rendering.deployment(manifests, "router"))
    env = {e["name"]: e.get("value") for e in router["env"]}
    ports = {p["name"]: p["containerPort"] for p in router["ports"]}
    assert int(env["ASRPOOL_ADMIN_PORT"]) == ports["admin"] != int(env["ASRPOOL_PORT"])


def exported_metrics() -> set[str]:
    """Names the server and router really export (each histogram and counter series)."""
    texts = [server_metrics.ServerMetrics().exposition(), router_metrics.Metrics().exposition()]
    names: set[str] = set()
    for text in texts:
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text.decode(), re.MULTILINE):
            if kind == "counter":
                names.add(name.removesuffix("_total") + "_total")
            elif kind == "histogram":
                names |= {name + suffix for suffix in ("_bucket", "_sum", "_count")}
            else:
                names.add(name)
    return names


def test_the_dashboard_shows_the_pools_from_metrics_that_exist() -> None:
    manifests = rendering.render()
    config_map = rendering.one(manifests, "ConfigMap", "demo-asrpool-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["asrpool.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(asr\w+)\b", e)}
    assert used and used <= exported_metrics()
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Slots", "Free slots", "Active streams", "Step time", "Step lag"} <= titles
    assert all("by (pool" in e for e in exprs if "router_rejections" not in e)


def test_the_pod_token_seed_stays_in_the_release_namespace_with_the_router_and_operator(
) -> None:
    """No pool namespace gets a copy: the operator writes each pool its own token."""
    values = {**SCENARIOS["namespaced-operator"], "examplePool": {"enabled": True}}
    manifests = rendering.render(values)
    (seed,) = rendering.find(manifests, "Secret", "demo-asrpool-pod-token")
    assert seed["metadata"]["namespace"] == rendering.NAMESPACE
    assert len(base64.b64decode(seed["data"]["token"])) == 48
    for part in ("router", "operator"):
        env = rendering.container(rendering.deployment(manifests, part))["env"]
        ref = next(e for e in env if e["name"] == "ASRPOOL_POD_TOKEN_SEED")["valueFrom"]
        assert ref == {"secretKeyRef": {"name": "demo-asrpool-pod-token", "key": "token"}}
        assert not any(e["name"] == "ASRPOOL_POD_TOKEN" for e in env)
    pool = pools.from_body(rendering.one(manifests, "StreamingASRPool"))
    assert pool.pod_token is None  # the operator's own, not one the pool names


def test_existing_secrets_are_used_and_none_is_made() -> None:
    manifests = rendering.render(SCENARIOS["existing-secrets"])
    assert [s["metadata"]["name"] for s in rendering.find(manifests, "Secret")] == []
    router = rendering.container(rendering.deployment(manifests, "router"))
    ref = next(e for e in router["env"] if e["name"] == "ASRPOOL_POD_TOKEN_SEED")["valueFrom"]
    assert ref == {"secretKeyRef": {"name": "asr-pod-token", "key": "value"}}
    volumes = rendering.deployment(manifests, "router")["spec"]["template"]["spec"]["volumes"]
    (keys,) = [volume for volume in volumes if "secret" in volume]
    assert keys["secret"]["secretName"] == "asr-keys"
    ref = next(e for e in router["env"] if e["name"] == "ASRPOOL_REDIS_PASSWORD")["valueFrom"]
    assert ref == {"secretKeyRef": {"name": "asr-redis", "key": "router-password"}}


def test_a_redis_without_password_is_a_choice_not_a_default() -> None:
    manifests = rendering.render(SCENARIOS["redis-without-password"])
    assert "demo-asrpool-redis" not in [s["metadata"]["name"]
                                        for s in rendering.find(manifests, "Secret")]
    for part in ("router", "operator"):
        env = rendering.container(rendering.deployment(manifests, part))["env"]
        assert not any("REDIS_PASSWORD" in e["name"] for e in env)
    redis = rendering.container(rendering.one(manifests, "StatefulSet", "demo-asrpool-redis"))
    assert redis["command"] == ["redis-server"]


def test_the_router_hpa_owns_the_replica_count_when_on() -> None:
    scaled = rendering.render()
    assert "replicas" not in rendering.deployment(scaled, "router")["spec"]
    hpa = rendering.one(scaled, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == rendering.deployment(scaled, "router")[
        "metadata"]["name"]
    fixed = rendering.render(SCENARIOS["fixed-routers"])
    assert rendering.deployment(fixed, "router")["spec"]["replicas"] == 3
    assert rendering.find(fixed, "HorizontalPodAutoscaler") == []


@pytest.mark.parametrize("scenario", ["defaults", "ingress", "load-balancer"])
def test_the_notes_give_a_url_the_router_serves(scenario: str) -> None:
    from asrpool.router import app, settings

    notes = rendering.render_files(SCENARIOS[scenario])["asrpool/templates/NOTES.txt"]
    urls = re.findall(r"URL: wss?://\S+?(/\S+)", notes)
    assert urls, notes
    routes = {getattr(r, "path", "") for r in app.create_app(settings.RouterSettings()).routes}
    for path in urls:
        assert any(re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", route), path)
                   for route in routes), f"the router serves no {path}"


@pytest.mark.parametrize("scenario", ["defaults", "no-pod-token"])
def test_the_pool_the_notes_suggest_is_valid_and_names_no_pod_token(
    scenario: str,
) -> None:
    notes = rendering.render_files(SCENARIOS[scenario])["asrpool/templates/NOTES.txt"]
    block = notes.split("-f -\n", 1)[1].split("\n  YAML", 1)[0]
    body = yaml.safe_load(textwrap.dedent(block))
    jsonschema.Draft7Validator(pool_crd_schema()).validate(body)
    pool = pools.from_body(body)
    assert pool.pod_token is None  # with the chart's seed, the operator writes the pool's own
    assert f"/pools/{pool.name}/api/asr-streaming" in notes


def test_the_notes_point_at_the_example_pool_when_there_is_one() -> None:
    notes = rendering.render_files(SCENARIOS["example-pool"])["asrpool/templates/NOTES.txt"]
    assert "kubectl apply" not in notes
    assert "ws://127.0.0.1:8080/pools/stt-first/api/asr-streaming" in notes


def pool_crd_schema() -> dict[str, Any]:
    crd = rendering.load_yaml(rendering.ROOT / "crds" / "streamingasrpools.asrpool.io.yaml")[0]
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize(("values", "url"), [
    ({}, f"ws://{rendering.RELEASE}-asrpool-router.{rendering.NAMESPACE}.svc:80"),
    ({"router": {"ingress": {"enabled": True, "host": "asr.example.com"}}},
     "ws://asr.example.com"),
    ({"router": {"ingress": {"enabled": True, "host": "asr.example.com",
                             "tlsSecretName": "asr-tls"}}}, "wss://asr.example.com"),
    ({"router": {"url": "wss://speech.example.com:8443"}}, "wss://speech.example.com:8443"),
])
def test_the_operator_is_told_where_clients_reach_the_routers(values: dict[str, Any],
                                                              url: str) -> None:
    """Each pool's status.url is its streaming URL at the routers' address, which the
    operator takes as its settings take it (a bad one would stop it at start)."""
    operator = rendering.deployment(rendering.render(values), "operator")
    env = {e["name"]: e.get("value") for e in rendering.container(operator)["env"]}
    assert env["ASRPOOL_ROUTER_URL"] == url
    operator_settings.OperatorSettings(all_namespaces=True, router_url=url)


def test_the_router_service_keeps_client_addresses_when_asked() -> None:
    values = {"router": {"service": {"type": "LoadBalancer", "externalTrafficPolicy": "Local"}}}
    name = f"{rendering.RELEASE}-asrpool-router"
    service = rendering.one(rendering.render(values), "Service", name)
    assert service["spec"]["externalTrafficPolicy"] == "Local"
    default = rendering.one(rendering.render({}), "Service", name)
    assert "externalTrafficPolicy" not in default["spec"]


def test_the_http_route_sends_every_path_to_the_routers_client_port() -> None:
    manifests = rendering.render(SCENARIOS["gateway"])
    route = rendering.one(manifests, "HTTPRoute", "demo-asrpool-router")
    service = rendering.one(manifests, "Service", "demo-asrpool-router")
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["name"], backend["port"]) == (service["metadata"]["name"],
                                                  service["spec"]["ports"][0]["port"])
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "gateways"}]
    with pytest.raises(Exception, match="parentRefs"):  # a route attached to nothing
        rendering.render({"router": {"httpRoute": {"enabled": True}}})

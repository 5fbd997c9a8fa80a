"""Each pod's termination grace period and its drain bound come from one value.

Server pods: the pool's ``spec.drainGracePeriodSeconds`` is both the server's drain bound
(``ASRPOOL_DRAIN_GRACE_SECONDS``) and, plus the chart's ``operator.terminationMarginSeconds``,
the pod's termination grace. Routers: the chart's grace must cover the preStop sleep, the
drain grace and the router's own shutdown bound, which lives in the router's code.
"""

from __future__ import annotations

import json

import helm_python
import pytest

from asrpool.operator import children, pools
from asrpool.operator import settings as operator_settings
from asrpool.router import serving
from asrpool.router import settings as router_settings
from asrpool.server import settings as server_settings
from tests.chart import rendering


def margin_from_chart(margin: int) -> int:
    operator = rendering.deployment(
        rendering.render({"operator": {"terminationMarginSeconds": margin}}), "operator")
    env = {e["name"]: e.get("value") for e in rendering.container(operator)["env"]}
    return int(env["ASRPOOL_TERMINATION_MARGIN_SECONDS"])


@pytest.mark.parametrize(("drain", "margin"), [(60, 15), (300, 20), (0, 5)])
def test_a_server_pods_grace_is_its_drain_plus_the_charts_margin(drain: int, margin: int) -> None:
    config = operator_settings.OperatorSettings(
        all_namespaces=True, termination_margin_seconds=margin_from_chart(margin))
    pool = pools.from_body({"metadata": {"name": "stt", "namespace": "speech"}, "spec": {
        "model": {"name": "kyutai/stt-1b-en_fr"}, "slots": 8, "drainGracePeriodSeconds": drain}})
    built = {child["kind"]: child for child in children.build_all(pool, config)}
    pod = built["Deployment"]["spec"]["template"]["spec"]
    assert float(built["ConfigMap"]["data"]["ASRPOOL_DRAIN_GRACE_SECONDS"]) == drain
    assert pod["terminationGracePeriodSeconds"] == drain + margin


def router_shutdown_bound() -> int:
    config = router_settings.RouterSettings()
    bound = serving.uvicorn_config(config).timeout_graceful_shutdown
    assert bound is not None, "the router must bound its shutdown"
    return int(bound)


def test_the_routers_grace_covers_its_prestop_sleep_drain_and_shutdown_bound() -> None:
    router = rendering.deployment(rendering.render(), "router")
    pod = router["spec"]["template"]["spec"]
    container = rendering.container(router)
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    env = {e["name"]: e.get("value") for e in container["env"]}
    drain = float(env["ASRPOOL_DRAIN_GRACE_SECONDS"])
    assert drain >= 3600  # streams last as long as calls: the chart's drain is long
    assert pod["terminationGracePeriodSeconds"] >= sleep + drain + router_shutdown_bound()


@pytest.mark.parametrize(("sleep", "drain"), [(0, 0), (5, 30), (20, 3600)])
def test_the_chart_refuses_a_router_grace_shorter_than_the_routers_bound(
    sleep: int, drain: int
) -> None:
    """The chart's check uses the router's real bound: one second less is refused."""
    enough = sleep + drain + router_shutdown_bound()
    router = {"preStopSleepSeconds": sleep, "drainGraceSeconds": drain,
              "terminationGracePeriodSeconds": enough}
    rendering.render({"router": router})
    with pytest.raises(helm_python.HelmError, match="terminationGracePeriodSeconds"):
        rendering.render({"router": {**router, "terminationGracePeriodSeconds": enough - 1}})


def test_the_routers_resume_grace_is_never_below_the_server_pods() -> None:
    """docs/internals/router.md: the router's resume_grace_seconds must be at least the pods'."""
    pods = server_settings.ServerSettings.model_fields["resume_grace_seconds"].default
    pool = pools.from_body({"metadata": {"name": "stt", "namespace": "speech"},
                            "spec": {"model": {"name": "tiny"}, "slots": 8}})
    built = children.build_all(pool, operator_settings.OperatorSettings(all_namespaces=True))
    config_map = next(c for c in built if c["kind"] == "ConfigMap")
    pods = float(config_map["data"].get("ASRPOOL_RESUME_GRACE_SECONDS", pods))
    schema = json.loads((rendering.CHART / "values.schema.json").read_text())
    least = schema["properties"]["router"]["properties"]["resumeGraceSeconds"]["minimum"]
    assert least >= pods
    rendering.render({"router": {"resumeGraceSeconds": least}})
    with pytest.raises(helm_python.HelmError, match="resumeGraceSeconds"):
        rendering.render({"router": {"resumeGraceSeconds": least - 1}})

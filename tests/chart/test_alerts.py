"""The chart's alert rules (``metrics.prometheusRule.enabled``): promtool finds them
valid, every metric they name is one the routers or server pods export, and promtool's
own rule tests show each alert firing on the series that should fire it, and not
before its ``for``.

promtool is Prometheus's (Debian's package, unpacked by ``make promtool``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import rendering
from tests.chart.test_wiring import exported_metrics

VALUES = {"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "prom"},
                                         "refusingFor": "10m", "drainingFor": "30m",
                                         "errorsPerSecond": 0.1}}}
CACHED = Path.home() / ".cache" / "asrpool" / "promtool" / "usr" / "bin" / "promtool"


def promtool() -> str:
    found = os.environ.get("PROMTOOL") or shutil.which("promtool") or (
        str(CACHED) if CACHED.is_file() else None)
    assert found, "no promtool: make test unpacks it (make promtool)"
    return found


def rules() -> dict[str, Any]:
    rule = rendering.one(rendering.render(VALUES), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    spec: dict[str, Any] = rule["spec"]
    return spec


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in rules()["groups"] for r in group["rules"]}


def test_no_rules_unless_asked() -> None:
    assert rendering.find(rendering.render({}), "PrometheusRule") == []


def test_promtool_finds_the_rules_valid(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules()))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_every_metric_a_rule_names_is_exported() -> None:
    exported = exported_metrics()
    for name, rule in alerts().items():
        named = set(re.findall(r"\b(asr_[a-z_]+|asrpool_[a-z_]+)\b", rule["expr"]))
        assert named, name
        assert named <= exported, f"{name} names {named - exported}"


def test_the_issue_s_alerts_are_all_there() -> None:
    assert {"AsrpoolStreamsRefused", "AsrpoolStreamsQueueing", "AsrpoolPodOverloaded",
            "AsrpoolPodBehindRealTime", "AsrpoolRedisUnreachable", "AsrpoolDrainNotFinishing",
            "AsrpoolErrorRateHigh", "AsrpoolKeysRefused"} <= set(alerts())


# promtool's unit tests: each alert on the series that fire it.
TESTS = [
    {"interval": "1m",
     "input_series": [
         {"series": 'asrpool_router_rejections_total{reason="busy"}', "values": "0+60x30"},
         {"series": 'asrpool_router_redis_errors_total{op="admit"}', "values": "0+5x30"},
         {"series": 'asr_overloaded{pool="speech/stt",pod="stt-0"}', "values": "1x30"},
         {"series": 'asr_draining{pool="speech/stt",pod="stt-1"}', "values": "1x40"},
         {"series": 'asrpool_router_rejections_total{reason="unauthorized"}',
          "values": "0+30x30"},
         {"series": 'asr_errors_total{pool="speech/stt",code="bad_audio"}',
          "values": "0+30x30"}],
     "alert_rule_test": [
         {"eval_time": "5m", "alertname": "AsrpoolStreamsRefused", "exp_alerts": []},
         {"eval_time": "20m", "alertname": "AsrpoolStreamsRefused",
          "exp_alerts": [{"exp_labels": {"severity": "warning", "reason": "busy"}}]},
         {"eval_time": "10m", "alertname": "AsrpoolRedisUnreachable",
          "exp_alerts": [{"exp_labels": {"severity": "critical", "op": "admit"}}]},
         {"eval_time": "10m", "alertname": "AsrpoolPodOverloaded",
          "exp_alerts": [{"exp_labels": {"severity": "warning", "pool": "speech/stt",
                                         "pod": "stt-0"}}]},
         {"eval_time": "20m", "alertname": "AsrpoolDrainNotFinishing", "exp_alerts": []},
         {"eval_time": "35m", "alertname": "AsrpoolDrainNotFinishing",
          "exp_alerts": [{"exp_labels": {"severity": "warning", "pool": "speech/stt",
                                         "pod": "stt-1"}}]},
         {"eval_time": "20m", "alertname": "AsrpoolKeysRefused",
          "exp_alerts": [{"exp_labels": {"severity": "warning"}}]},
         {"eval_time": "20m", "alertname": "AsrpoolErrorRateHigh",
          "exp_alerts": [{"exp_labels": {"severity": "warning", "pool": "speech/stt",
                                         "code": "bad_audio"}}]},
     ]},
    {"interval": "1m",  # quiet series: nothing fires
     "input_series": [
         {"series": 'asrpool_router_rejections_total{reason="busy"}', "values": "0x30"},
         {"series": 'asr_overloaded{pool="speech/stt",pod="stt-0"}', "values": "0x30"},
         {"series": 'asr_draining{pool="speech/stt",pod="stt-1"}', "values": "0x40"}],
     "alert_rule_test": [
         {"eval_time": "30m", "alertname": name, "exp_alerts": []}
         for name in ("AsrpoolStreamsRefused", "AsrpoolPodOverloaded",
                      "AsrpoolDrainNotFinishing")]},
]


def test_each_alert_fires_on_what_should_fire_it(tmp_path: Path) -> None:
    """(Without their annotations, which promtool would compare word for word: the
    check above renders them.)"""
    bare = rules()
    for group in bare["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(bare))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": TESTS}))
    done = subprocess.run([promtool(), "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_bad_threshold_is_refused_naming_it() -> None:
    with pytest.raises(Exception, match="drainingFor"):
        rendering.render({"metrics": {"prometheusRule": {"enabled": True,
                                                         "drainingFor": "half an hour"}}})

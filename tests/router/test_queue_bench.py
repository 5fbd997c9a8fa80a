"""``asrpool bench queue`` end to end, short: waiters polling past a ticket's lease keep
their order (the bench exits 1 otherwise) and the JSON has the figures."""

from __future__ import annotations

import json
from pathlib import Path

from asrpool_harness.bench import queue as bench_queue


def test_bench_queue_keeps_the_order_and_writes_json(tmp_path: Path) -> None:
    assert bench_queue.main(["--waiters", "6", "--wait", "3.5", "--memory-waiters", "50",
                             "--keys", "5", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "queue-waiters.json").read_text())
    assert result["order"]["admitted"] == 6 and result["order"]["polls"] > 6 * 20
    assert result["memory"]["bytes_per_waiter"] > 0

"""Token buckets (asrpool.common.rates): the one rate policy of pods and routers."""

from __future__ import annotations

import pytest

from asrpool.common import rates


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_gives_its_burst_then_its_rate_and_a_refusal_takes_nothing() -> None:
    clock = Clock()
    bucket = rates.TokenBucket(2.0, 3.0, clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    assert bucket.seconds_until() == pytest.approx(0.5)
    for _ in range(10):
        assert not bucket.take()  # refused: nothing spent, the wait does not grow
    clock.now += 0.5
    assert bucket.take() and not bucket.take()
    clock.now += 60
    assert bucket.full() and sum(bucket.take() for _ in range(9)) == 3


def test_a_bucket_needs_a_positive_rate_and_burst() -> None:
    with pytest.raises(ValueError, match="positive rate"):
        rates.TokenBucket(0.0, 1.0)


def test_keyed_buckets_are_separate_and_forgotten_once_full() -> None:
    clock = Clock()
    buckets = rates.KeyedBuckets(1.0, 2.0, clock)
    assert buckets.take("a") and buckets.take("a") and not buckets.take("a")
    assert buckets.take("b")  # another key has its own burst
    assert len(buckets) == 2
    clock.now += 2.0  # burst / rate: both full again, so both are forgotten
    assert buckets.take("c") and len(buckets) == 1


def test_keyed_buckets_stay_bounded_by_their_key_count() -> None:
    buckets = rates.KeyedBuckets(1.0, 5.0, Clock(), max_keys=3)
    for key in range(10):
        assert buckets.take(key)
    assert len(buckets) == 3


def test_a_throttled_answer_says_why_and_when_to_come_back() -> None:
    throttled = rates.too_many_streams(50.0, "from 10.0.0.7", 0.02)
    assert throttled.status == 429 and throttled.code == "too_many_streams"
    assert throttled.message.startswith("too_many_streams: over 50 new streams per second")
    assert throttled.headers == {"Retry-After": "1"}

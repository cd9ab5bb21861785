"""Source offsets: ranges, new partitions, replay generations (pure)."""

import pytest

from pipeline.source import offsets as off


def test_ranges_between_continue_each_partition():
    start = {"users": {"gen": 0, "base": {"-1": "earliest"}, "target": {}, "parts": {"-1": {"n": 10, "id": "0:9:-1:-1"}}}}
    end = {"users": {"gen": 0, "base": {"-1": "earliest"}, "target": {}, "parts": {"-1": {"n": 15, "id": "0:14:-1:-1"}}}}
    (rng,) = off.ranges_between(start, end)
    assert (rng.start_id, rng.start_n, rng.end_id, rng.end_n, rng.count) == ("0:9:-1:-1", 10, "0:14:-1:-1", 15, 5)
    assert off.ranges_between(end, end) == []


def test_new_generation_restarts_at_its_base():
    start = {"users": {"gen": 0, "base": {"-1": "earliest"}, "target": {}, "parts": {"-1": {"n": 99, "id": "0:98:-1:-1"}}}}
    end = {"users": {"gen": 3, "base": {"-1": "earliest"}, "target": {"-1": "0:98:-1:-1"}, "parts": {"-1": {"n": 40, "id": "0:39:-1:-1"}}}}
    (rng,) = off.ranges_between(start, end)
    assert (rng.gen, rng.start_id, rng.start_n, rng.end_n) == (3, "earliest", 0, 40)


def test_new_partitions_start_at_earliest():
    offset = off.initial_offset({"orders": ["0"]})
    grown = off.with_partitions(offset, {"orders": ["0", "1"]})
    assert grown["orders"]["parts"]["1"] == {"n": 0, "id": "earliest"}
    assert offset["orders"]["parts"] == {"0": {"n": 0, "id": "earliest"}}  # not mutated


def test_a_tick_is_a_new_end_that_reads_nothing():
    start = {"users": {"gen": 0, "base": {"-1": "earliest"}, "target": {}, "parts": {"-1": {"n": 15, "id": "0:14:-1:-1"}}},
             "orders": {"gen": 0, "base": {"-1": "earliest"}, "target": {}, "parts": {"-1": {"n": 7, "id": "0:6:-1:-1"}}}}
    ticked = off.with_tick(start)
    assert ticked != start and off.with_tick(ticked) != ticked  # Spark runs a batch for each
    assert ticked["orders"]["tick"] == 1 and off.with_tick(ticked)["orders"]["tick"] == 2 and "tick" not in start["orders"]
    assert off.ranges_between(start, ticked) == [] and off.ranges_between(ticked, off.with_tick(ticked)) == []


def planned_ticks(tick_for: float, tick_every: float, trigger: float = 0.5, until: float = 60.0) -> list[float]:
    """When a quiet source plans its batches of no row: planning each trigger after a read ended at 0."""
    ticks, last = [], 0.0
    for step in range(1, int(until / trigger) + 1):
        now = step * trigger
        if off.tick_due(now, 0.0, last, tick_for, tick_every):
            ticks.append(now)
            last = now
    return ticks


def test_ticks_come_every_trigger_through_the_window_or_once_at_its_end():
    from pipeline.runtime.spark import timer_ticks

    assert planned_ticks(0, 0) == []
    assert planned_ticks(3.0, 0) == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]  # the lookups' max_wait: each trigger
    assert planned_ticks(3.0, 3.0) == [3.0]  # a state TTL: one batch, once every timer is due
    assert planned_ticks(3.2, 3.2) == [3.5]  # the first trigger at or past the window
    assert planned_ticks(4.0, 2.0) == [2.0, 4.0]
    # max_wait 10 s at a 500 ms trigger: 12 s of ticks, one a trigger; a TTL of 1 h: one tick after 1 h 12 s
    assert timer_ticks(10_000, 500, once=False) == {"tickForMs": 12_000, "tickEveryMs": 0}
    ttl = timer_ticks(3_600_000, 500, once=True)
    assert ttl == {"tickForMs": 3_602_000, "tickEveryMs": 3_602_000}
    assert planned_ticks(ttl["tickForMs"] / 1000, ttl["tickEveryMs"] / 1000, trigger=1.0, until=10_000) == [3_602.0]


def test_replay_finishes_when_target_reached():
    topic = {"gen": 1, "target": {"-1": "0:50:-1:-1"}, "parts": {"-1": {"n": 10, "id": "0:9:-1:-1"}}}
    assert not off.replay_finished(topic)
    topic["parts"]["-1"]["id"] = "0:50:-1:-1"
    assert off.replay_finished(topic)
    assert off.replay_finished({"gen": 0, "target": {}, "parts": {}})


def test_position_parse_errors_name_the_value():
    with pytest.raises(ValueError, match="'x:y' is not of the form"):
        off.Position.parse("x:y")
    assert off.Position.parse("1:2:-1:3") < off.Position.parse("1:3:-1:-1")


def test_split_range_cuts_at_known_ids_and_covers_the_range():
    rng = off.Range("orders", "-1", 0, "0:0:-1:-1", 0, "0:25:-1:-1", 25)
    pieces = off.split_range(rng, lambda n: f"0:{n}:-1:-1", 10)
    assert [(p.start_n, p.end_n) for p in pieces] == [(0, 8), (8, 16), (16, 25)]
    assert [p.start_id for p in pieces[1:]] == [p.end_id for p in pieces[:-1]]
    assert (pieces[0].start_id, pieces[-1].end_id) == (rng.start_id, rng.end_id)
    assert sum(p.count for p in pieces) == rng.count


def test_split_range_keeps_the_range_whole_without_ids():
    rng = off.Range("orders", "-1", 0, "earliest", 0, "0:25:-1:-1", 25)
    assert off.split_range(rng, lambda n: None, 10) == [rng]
    assert off.split_range(rng, lambda n: "x", 100) == [rng]


def test_planning_walks_the_ledgers_reads_found_and_stops_at_one_not_known():
    newest = "3:9:-1:-1"
    # the first ledger not known (no probe yet): earlier ledgers ride with the newest one's entries
    assert off.plan_entries("earliest", newest) == [off.Segment(3, 0, 10)]
    known = {"ends": {"-1": -1, "0": 49_999, "2": 7}, "next": {"-1": 0, "0": 2, "2": 3}}
    assert off.plan_entries("earliest", newest, known) == [off.Segment(0, 0, 50_000), off.Segment(2, 0, 8),
                                                          off.Segment(3, 0, 10)]
    assert off.plan_entries("0:49999:-1:-1", newest, known) == [off.Segment(2, 0, 8), off.Segment(3, 0, 10)]
    assert off.plan_entries("2:3:-1:-1", newest, known) == [off.Segment(2, 4, 4), off.Segment(3, 0, 10)]
    assert off.plan_entries("2:3:-1:1", newest, known)[0] == off.Segment(2, 3, 5)  # the rest of entry 3
    # a ledger whose end no read has found yet is open, and nothing after it is planned
    assert off.plan_entries("0:10:-1:-1", newest, {"ends": {}, "next": {}}) == [off.Segment(0, 11, off.OPEN_LEDGER)]
    # a range planned before a broker's first ledger (Apache Pulsar's are not 0) found it: jump there
    assert off.plan_entries("0:99:-1:-1", newest, {"ends": {"-1": -1}, "next": {"-1": 3}}) == [off.Segment(3, 0, 10)]
    segments = off.plan_entries("earliest", newest, known)
    assert off.available_entries(segments) == 50_018
    assert off.end_after(segments, 50_000) == (0, 49_999) and off.end_after(segments, 50_001) == (2, 0)

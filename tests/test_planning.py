"""Batch planning (pure): caps in messages and bytes, changelogs first, a share for orders, progress."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.source import planning
from pipeline.source.planning import EntrySize, plan_batch, share_budget

UNBATCHED = EntrySize(1, 300)  # one order a message, as pulsar-client sends by default
BATCHED = EntrySize(650, 650 * 300)  # a producer's batch of 650 orders in one entry


@pytest.mark.parametrize("available,limit,expected", [
    ({"a": 100, "b": 100}, 50, {"a": 25, "b": 25}),
    ({"a": 5, "b": 100}, 50, {"a": 5, "b": 45}),
    ({"a": 0, "b": 7}, 50, {"a": 0, "b": 7}),
])
def test_share_budget_is_fair_and_gives_what_a_small_partition_leaves(available, limit, expected):
    assert share_budget(available, {key: 1 / limit for key in available}, 1.0) == expected


def test_caps_count_messages_whatever_the_batching():
    cost = {"unbatched": UNBATCHED.cost(10_000, None), "batched": BATCHED.cost(10_000, None)}
    plan = plan_batch({"unbatched": 50_000}, cost, set(), 0, 10)
    assert plan.grants == {"unbatched": 10_000}  # 10,000 messages, not 10,000 entries' worth
    plan = plan_batch({"batched": 500}, cost, set(), 0, 10)
    assert plan.grants == {"batched": 15}  # 15 × 650 = 9,750 messages
    both = plan_batch({"unbatched": 50_000, "batched": 500}, cost, set(), 0, 10).grants
    assert both["unbatched"] * 1 + both["batched"] * 650 <= 10_000 and both["unbatched"] >= 4_000


def test_the_byte_cap_binds_large_messages():
    big = EntrySize(1, 4 << 20)
    plan = plan_batch({"orders": 1000}, {"orders": big.cost(300_000, 64 << 20)}, set(), 0, 10)
    assert plan.grants == {"orders": 16}  # 16 × 4 MB = 64 MB


def test_orders_wait_until_every_changelog_is_admitted_up_to_its_newest_entry():
    cost = {key: UNBATCHED.cost(100, None) for key in ("users", "items", "orders")}
    held = plan_batch({"users": 150, "items": 10, "orders": 500}, cost, {"users", "items"}, 0, 10)
    assert held.grants == {"users": 90, "items": 10, "orders": 0} and (held.held_for, held.shared) == (1, False)
    done = plan_batch({"users": 60, "items": 0, "orders": 500}, cost, {"users", "items"}, held.held_for, 10)
    assert done.grants == {"users": 60, "items": 0, "orders": 40} and (done.held_for, done.shared) == (0, False)


def test_orders_get_a_share_once_the_changelogs_filled_the_cap_too_long():
    cost = {key: UNBATCHED.cost(100, None) for key in ("users", "orders")}
    held_for = 0
    for _ in range(3):
        plan = plan_batch({"users": 10_000, "orders": 500}, cost, {"users"}, held_for, 3)
        assert plan.grants["orders"] == 0
        held_for = plan.held_for
    plan = plan_batch({"users": 10_000, "orders": 500}, cost, {"users"}, held_for, 3)
    assert plan.shared and plan.held_for == 4 and plan.grants == {"users": 50, "orders": 50}
    after = plan_batch({"users": 10, "orders": 500}, cost, {"users"}, plan.held_for, 3)
    assert not after.shared and after.held_for == 0 and after.grants == {"users": 10, "orders": 90}


def test_no_orders_waiting_is_not_holding_them():
    cost = {"users": 0.01, "orders": 0.01}
    assert plan_batch({"users": 1000, "orders": 0}, cost, {"users"}, 5, 10).held_for == 0


def test_an_entry_over_the_whole_cap_still_moves_changelogs_first():
    cost = {"users": 3.0, "orders": 3.0}
    assert plan_batch({"users": 2, "orders": 2}, cost, {"users"}, 0, 10).grants == {"users": 1, "orders": 0}
    assert plan_batch({"users": 0, "orders": 2}, cost, {"users"}, 0, 10).grants == {"users": 0, "orders": 1}


def test_a_cold_partition_is_priced_small_never_large():
    cold = planning.cold_size(None)
    assert cold.cost(300_000, 128 << 20) >= 1 / 30  # at most 25 entries of the largest size in the first batch
    assert planning.cold_size(7).messages == 1000  # a short newest entry (Apache's id says 7) prices none smaller
    assert planning.cold_size(5000).messages == 5000  # a producer batching more than the default is believed


def test_samples_round_trip_and_damaged_ones_are_skipped(tmp_path):
    planning.record_read(str(tmp_path), "users", "-1", entries=10, messages=6500, nbytes=1_950_000)
    planning.record_read(str(tmp_path), "orders", "3", entries=0, messages=0, nbytes=0)  # nothing read: no sample
    (tmp_path / "items.-1.json").write_text("{not json")
    assert planning.read_sizes(str(tmp_path)) == {("users", "-1"): EntrySize(650, 195_000)}
    assert planning.read_sizes(None) == {} and planning.read_sizes(str(tmp_path / "none")) == {}


sizes = st.sampled_from([UNBATCHED, BATCHED, EntrySize(3.5, 2000), EntrySize(1, 5 << 20)])


@settings(max_examples=300, deadline=None)
@given(available=st.dictionaries(st.sampled_from(["users/0", "users/1", "items", "orders/0", "orders/1"]),
                                 st.integers(0, 5000), min_size=1),
       size_of=st.dictionaries(st.sampled_from(["users/0", "users/1", "items", "orders/0", "orders/1"]), sizes),
       max_messages=st.integers(1, 200_000), max_bytes=st.one_of(st.none(), st.integers(1 << 20, 1 << 30)),
       held_for=st.integers(0, 12), share_after=st.integers(0, 10))
def test_plans_stay_within_the_caps_and_keep_changelogs_first(available, size_of, max_messages, max_bytes,
                                                              held_for, share_after):
    cost = {key: size_of.get(key, UNBATCHED).cost(max_messages, max_bytes) for key in available}
    first = {key for key in available if not key.startswith("orders")}
    plan = plan_batch(available, cost, first, held_for, share_after)
    grants = plan.grants
    assert all(0 <= grants[key] <= available[key] for key in available)
    spent = sum(grants[key] * cost[key] for key in available)
    assert spent <= 1 + 1e-6 or sum(grants.values()) == 1  # within the caps, or one entry that alone is over
    if any(available.values()):
        assert any(grants.values())  # something always moves
    changelogs_done = all(grants[key] == available[key] for key in first)
    orders_admitted = any(grants[key] for key in available if key not in first)
    if orders_admitted and not changelogs_done:
        assert plan.shared and plan.held_for > share_after
    if changelogs_done:
        assert plan.held_for == 0 and not plan.shared


def test_an_estimate_from_few_batched_entries_admits_few_more_and_one_message_entries_are_not_limited():
    assert EntrySize(42, 4200, entries=1).most_entries() == planning.RAMP
    assert EntrySize(1, 300, entries=1).most_entries() is None  # unbatched: each entry one message
    assert planning.cold_size(None).most_entries() is None  # a guess already errs small
    # a sample is one read task's: the partition's last grant, when more, is what the batch grows from
    assert EntrySize(1000, 100_000, entries=10).most_entries(granted_before=40) == 4 * 40


def test_a_partition_read_by_several_tasks_reaches_the_cap_in_a_few_batches():
    """Each read task records its own sample (10 entries of 1,000 messages here, a quarter of a
    grant), so the batches would stay at 4 × 10 entries, 40,000 rows against a cap of 200,000."""
    key, grants = "users\x000", []
    for _ in range(5):
        granted = grants[-1] if grants else 0
        sample = EntrySize(1000, 100_000, entries=max(1, granted // 4) if granted else 10)
        cost = {key: sample.cost(200_000, None)}
        plan = plan_batch(planning.within_estimates({key: 10_000}, {key: sample}, set(), {key: granted} if granted else {}),
                          cost, set(), 0, 10)
        grants.append(plan.grants[key])
    assert grants == [40, 160, 200, 200, 200]


def test_a_batch_offers_only_what_each_estimate_vouches_for_except_the_changelogs():
    short_first = EntrySize(42, 4200, entries=1)  # a batching producer's first, short entry
    sizes = {"orders\x000": short_first, "orders\x001": UNBATCHED, "users\x000": short_first}
    offered = planning.within_estimates({"orders\x000": 100, "orders\x001": 100, "users\x000": 100}, sizes,
                                        {"users\x000"})
    assert offered == {"orders\x000": planning.RAMP, "orders\x001": 100, "users\x000": 100}
    cost = {"orders\x000": short_first.cost(500, None)}
    assert plan_batch({"orders\x000": 100}, cost, set(), 0, 10).grants == {"orders\x000": 11}  # 500 / 42
    # 4 entries, not 11: a batch planned on a 42-message estimate once read 3,958 orders
    assert plan_batch(planning.within_estimates({"orders\x000": 100}, sizes, set()), cost, set(), 0, 10).grants == {
        "orders\x000": planning.RAMP}

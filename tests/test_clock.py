"""The event-time clock the source carries (pipeline/source/clock.py), as pure functions: no
row moves the watermark past the clock the batch's own rows give, and where one partition moves
alone the single watermark node gets exactly where one node per partition would have."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.source import clock as clk

NAMES = ("users/0", "users/1", "items")
times = st.integers(0, 10_000)
facts_strategy = st.dictionaries(st.sampled_from(NAMES), st.tuples(st.none() | times, st.booleans()), min_size=1)


def after(facts: dict, rows: dict[str, list[int]]) -> dict:
    """The facts once a batch's rows (partition -> times) are read."""
    moved = dict(facts)
    for name, read in rows.items():
        if name in facts and read:
            newest, idle = facts[name]
            moved[name] = (max([newest, *read] if newest is not None else read), idle)
    return moved


def watermark_clock(facts: dict, rows: dict[str, list[int]]) -> int | None:
    """Where the batch puts the clock: the most any row stamps, and the clock row's time."""
    bounds = clk.row_bounds(facts)
    stamps = [min(t, bound) for name, read in rows.items() for t in read
              if (bound := bounds.get(name, bounds[""])) is not None]
    if (clock := clk.clock_ms(facts)) is not None:
        stamps.append(clock)
    return max(stamps, default=None)


@given(facts_strategy, st.dictionaries(st.sampled_from((*NAMES, "orders")), st.lists(times, max_size=4)))
def test_no_row_moves_the_watermark_past_the_clock_of_the_rows_read(facts, rows):
    reached = watermark_clock(facts, rows)
    truth = clk.clock_ms(after(facts, rows))
    if all(idle for _, idle in facts.values()):  # every changelog idle: any row's time counts
        truth = max([t for t in (truth, *(t for read in rows.values() for t in read)) if t is not None], default=None)
    if reached is not None:
        assert truth is not None and reached <= truth


@given(facts_strategy, st.sampled_from(NAMES), st.lists(times, min_size=1, max_size=4))
def test_one_partition_moving_alone_gets_the_watermark_as_far_as_its_own_node_would(facts, name, read):
    if name not in facts or facts[name][1]:
        return  # only an active partition's rows move the clock
    assert watermark_clock(facts, {name: read}) == clk.clock_ms(after(facts, {name: read}))


def test_the_clock_and_the_bounds():
    facts = {"users/0": (5_000, False), "users/1": (3_000, False), "items": (9_000, True)}
    assert clk.clock_ms(facts) == 3_000
    assert clk.row_bounds(facts) == {"": None, "users/0": 3_000, "users/1": 5_000, "items": None}
    # a partition with nothing read holds everything at 0, and bounds every other one to nothing
    assert clk.clock_ms({**facts, "users/1": (None, False)}) is None
    assert clk.row_bounds({**facts, "users/1": (None, False)})["users/0"] is None
    # every changelog partition idle: the newest of all, and every row counts its own time
    idle = {name: (newest, True) for name, (newest, _) in facts.items()}
    assert clk.clock_ms(idle) == 9_000 and set(clk.row_bounds(idle).values()) == {clk.UNBOUNDED}
    # one active partition alone counts its own time
    assert clk.row_bounds({"users": (1_000, False)}) == {"": None, "users": clk.UNBOUNDED}
    assert clk.clock_ms({}) is None and clk.row_bounds({}) == {"": None}


def test_facts_go_into_an_offset_and_come_back_out(tmp_path):
    offset = {"users": {"gen": 0, "parts": {"0": {"n": 1, "id": "a"}, "1": {"n": 0, "id": "b"}}},
              "orders": {"gen": 0, "parts": {"-1": {"n": 5, "id": "c"}}}}
    path = tmp_path / "clock.json"
    clk.write_clock_file(path, {"users/0": 7_000, "users/1": None}, {"users/1"}, offset)
    clock = clk.read_clock_file(path)
    assert clock.through == offset
    clk.with_facts(offset, clock, {"users"})
    assert clk.facts_of(offset, {"users"}) == {"users/0": (7_000, False), "users/1": (None, True)}
    assert "newest_ms" not in offset["orders"]["parts"]["-1"]  # only the changelogs carry facts
    assert clk.facts_of({"users": {"gen": 0, "parts": {"0": {"n": 1}}}}, {"users"}) == {}  # planned without a clock
    path.write_text("{not json")
    assert clk.read_clock_file(path) is None and clk.read_clock_file(None) is None


def test_facts_from_a_late_clock_never_go_below_the_batch_before():
    start = {"users": {"parts": {"0": {"n": 1, "newest_ms": 5_000}, "1": {"n": 1, "newest_ms": 7_000}}},
             "items": {"parts": {"-1": {"n": 1, "newest_ms": None}}}}
    end = {"users": {"parts": {"0": {"n": 2, "newest_ms": 4_000},  # a late clock file: older than start
                               "1": {"n": 2, "newest_ms": 9_000}}},
           "items": {"parts": {"-1": {"n": 2, "newest_ms": None}, "3": {"n": 1}}}}  # 3: not followed
    clk.raise_newest(end, start, {"users", "items"})
    assert clk.facts_of(end, {"users", "items"}) == {"users/0": (5_000, False), "users/1": (9_000, False),
                                                     "items": (None, False)}
    assert "newest_ms" not in end["items"]["parts"]["3"]


@given(st.dictionaries(st.sampled_from(["users", "users/0", "items"]), st.none() | st.integers(0, 10**6)),
       st.dictionaries(st.sampled_from(["users", "users/0", "items"]), st.none() | st.integers(0, 10**6)))
def test_raised_facts_are_the_most_of_the_clock_and_the_batch_before(clock, before):
    def offset(facts):
        out: dict = {}
        for name, newest in facts.items():
            kind, _, p = name.partition("/")
            out.setdefault(kind, {"parts": {}})["parts"][p or "-1"] = {"n": 0, "newest_ms": newest}
        return out
    end = clk.raise_newest(offset(clock), offset(before), {"users", "items"})
    for name, (newest, _) in clk.facts_of(end, {"users", "items"}).items():
        known = [t for t in (clock[name], before.get(name)) if t is not None]
        assert newest == (max(known) if known else None)

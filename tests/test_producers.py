"""The producers against the real shared broker: keyed JSON in file order, bad rows named, pacing kept."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pulsar
import pytest

from pipeline import cli
from pipeline.feed import datagen, producers
from pipeline.feed.csv_records import read_csv_records
from pipeline.errors import BrokerError, StatefulStreamsError
from pipeline.feed.producers import loop_orders, publish_records
from pipeline.wire import FIELDS
from waiting import wait_for

ORDER_HEADER = ",".join(field.name for field in FIELDS["orders"])


@pytest.fixture
def client(broker):
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    yield client
    client.close()


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """A small generated sample: 100 orders, 20 users (one late), 10 items."""
    out = tmp_path_factory.mktemp("sample")
    for stem, table in datagen.generate(n_users=20, n_items=10, n_orders=100, seed=1).items():
        datagen.write_csv(out / f"{stem}.csv", table)
    return out


def read_back(client, topic: str, expected: int) -> list[tuple[str, bytes]]:
    """Every message on ``topic`` from the earliest, as (key, payload); exactly ``expected`` of them."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    messages: list[tuple[str, bytes]] = []

    def drain() -> int:
        while reader.has_message_available():
            message = reader.read_next(5000)
            messages.append((message.partition_key(), message.data()))
        return len(messages)

    try:
        wait_for(lambda: drain() >= expected, timeout=30, what=f"{expected} messages on {topic}")
        assert drain() == expected  # and nothing more
    finally:
        reader.close()
    return messages


def produce(settings, *argv: str) -> None:
    args = cli.build_parser().parse_args(["produce", *argv])
    producers.main(args, settings)


def records_of(path: Path, kind: str) -> list[dict]:
    return [row.record for row in read_csv_records(path, kind)]


@pytest.mark.parametrize("kind, stem", [("orders", "orders"), ("users", "users"), ("items", "items")])
def test_a_csv_is_published_as_keyed_json_in_file_order(settings_factory, client, sample, capsys, kind, stem):
    settings = settings_factory()
    produce(settings, kind, "--file", str(sample / f"{stem}.csv"), "--quiet")
    expected = records_of(sample / f"{stem}.csv", kind)
    messages = read_back(client, settings.topics[kind], len(expected))
    key_field = "invoiceId" if kind == "orders" else "id"
    assert [key for key, _ in messages] == [str(record[key_field]) for record in expected]
    payloads = [json.loads(payload.decode("utf-8")) for _, payload in messages]
    assert all(list(p) == [field.name for field in FIELDS[kind]] for p in payloads)
    assert payloads == expected
    assert f"sent {len(expected)}, skipped 0, failed 0" in capsys.readouterr().out


def test_bad_rows_are_reported_by_line_and_the_good_ones_still_sent(settings_factory, client, tmp_path, capsys):
    path = tmp_path / "orders.csv"
    path.write_text("\n".join([
        ORDER_HEADER,
        "1,1,10,5,matte tool,tool,2.5,1000,-1",
        "2,1,abc,5,matte tool,tool,2.5,1000,-1",
        "3,1,10,5,matte tool,tool,2.5,1000",
        "4,1,10,5,matte tool,tool,,1000,-1",
        "5,1,10,5,matte tool,tool,2.5,1000,2000",
    ]) + "\n")
    settings = settings_factory()
    produce(settings, "orders", "--file", str(path))  # with the progress bar
    captured = capsys.readouterr()
    reports = [line for line in captured.err.splitlines() if " line " in line]
    assert reports == [
        "orders.csv line 3: field 'userId' must be an integer, got 'abc'",
        "orders.csv line 4: has 8 fields but the header has 9",
        "orders.csv line 5: field 'price' is empty; it is required",
    ]
    assert "5/5" in captured.err.splitlines()[-1]  # the bar's last line counts every row
    assert "sent 2, skipped 3, failed 0" in captured.out
    assert [key for key, _ in read_back(client, settings.topics["orders"], 2)] == ["1", "5"]


def test_a_missing_file_is_one_line_error_before_any_broker_is_needed(tmp_path, capsys):
    missing = tmp_path / "nope.csv"
    # an embedded setting with no broker running: the file must be checked first
    code = cli.main(["--data-dir", str(tmp_path / "var"), "produce", "orders", "--file", str(missing)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"error: orders file {str(missing)!r} does not exist; create it with 'python -m pipeline datagen' or pass --file\n"


def test_loop_is_for_orders_only(settings_factory, sample):
    with pytest.raises(StatefulStreamsError, match=re.escape("--loop works for orders only, not 'users'")):
        produce(settings_factory(), "users", "--file", str(sample / "users.csv"), "--loop")


def test_loop_starts_over_with_fresh_invoice_ids(settings_factory, client, sample):
    settings = settings_factory()
    produce(settings, "orders", "--file", str(sample / "orders.csv"), "--loop", "--limit", "250", "--quiet")
    orders = [json.loads(payload) for _, payload in read_back(client, settings.topics["orders"], 250)]
    firsts = records_of(sample / "orders.csv", "orders")
    assert orders[:100] == firsts
    assert len({(o["invoiceId"], o["lineItemId"]) for o in orders}) == 250
    assert min(o["invoiceId"] for o in orders[100:]) > max(o["invoiceId"] for o in firsts)
    # apart from the invoice id, a later round is the same orders again
    assert [{**o, "invoiceId": 0} for o in orders[100:200]] == [{**o, "invoiceId": 0} for o in firsts]


def test_loop_orders_shifts_each_round_past_all_earlier_ones():
    rounds = []

    def read_round(round_no):
        rounds.append(round_no)
        return [{"invoiceId": 5}, {"invoiceId": 3}, {"invoiceId": 9}]

    looped = loop_orders(read_round)
    ids = [next(looped)["invoiceId"] for _ in range(9)]
    assert ids == [5, 3, 9, 12, 10, 16, 19, 17, 23]  # span 9 - 3 + 1 = 7
    assert rounds == [0, 1, 2]
    assert list(loop_orders(lambda round_no: [])) == []


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_the_rate_limit_paces_every_send(settings_factory, client):
    topic = settings_factory().topics["orders"]
    records = records_of_n(40)
    clock = FakeClock()  # time passes only while the publisher waits on the rate limit
    stats = publish_records(client, topic, "orders", records, rate=100, clock=clock, sleep=clock.sleep)
    assert (stats.sent, stats.failed, stats.attempted) == (40, 0, 40)
    assert stats.throttled_s == pytest.approx(39 / 100)  # the first send is free, each later one 10 ms
    assert stats.elapsed_s == pytest.approx(39 / 100)
    assert len(read_back(client, topic, 40)) == 40


def test_a_real_clock_publish_never_beats_the_rate(settings_factory, client):
    topic = settings_factory().topics["orders"]
    stats = publish_records(client, topic, "orders", records_of_n(30), rate=300)
    assert stats.sent == 30
    assert stats.elapsed_s >= 29 / 300  # a lower bound the bucket guarantees, however slow the machine


def test_unlimited_publish_never_waits_and_limit_stops_early(settings_factory, client):
    topic = settings_factory().topics["orders"]
    progress = []
    clock = FakeClock()
    stats = publish_records(client, topic, "orders", records_of_n(20), limit=5, on_progress=progress.append,
                            clock=clock, sleep=clock.sleep)
    assert (stats.sent, stats.throttled_s, progress) == (5, 0.0, [1, 2, 3, 4, 5])
    assert [key for key, _ in read_back(client, topic, 5)] == ["1", "2", "3", "4", "5"]


def test_an_invalid_record_is_skipped_never_sent(settings_factory, client):
    topic = settings_factory().topics["users"]
    skips = []
    records = [{"id": 1, "firstName": "Ada"}, {"firstName": "nobody"}, {"id": "2"}, {"id": 3, "extra": True}]
    stats = publish_records(client, topic, "users", records, on_skip=skips.append)
    assert (stats.sent, stats.skipped) == (2, 2)
    assert skips == ["record 1: required field 'id' is missing",
                     "record 2: field 'id' must be an integer, got str '2'"]
    messages = read_back(client, topic, 2)
    assert [key for key, _ in messages] == ["1", "3"]
    assert json.loads(messages[1][1]) == {"id": 3, "firstName": None, "lastName": None, "emailAddress": None,
                                          "createdAt": -1, "deletedAt": -1, "mergedAt": -1, "parentUserId": -1}


class RefusingProducer:
    """Acknowledges nothing: every send comes back as a timeout, as from an overloaded broker."""

    def send_async(self, payload, callback, partition_key=None):
        callback(pulsar.Result.Timeout, None)

    def flush(self):
        pass

    def close(self):
        pass


class RefusingClient:
    def create_producer(self, topic, **options):
        assert options["block_if_queue_full"] and options["batching_enabled"]
        return RefusingProducer()

    def close(self):
        pass


def test_unacknowledged_sends_are_counted_and_fail_the_command(monkeypatch, settings_factory, sample, capsys):
    import pipeline.feed.topics

    monkeypatch.setattr(pipeline.feed.topics, "make_client", lambda url, **kwargs: RefusingClient())
    settings = settings_factory()
    with pytest.raises(BrokerError, match=re.escape(
            f"3 of 3 messages to {settings.topics['orders']!r} were not acknowledged (first error: Timeout)")):
        produce(settings, "orders", "--file", str(sample / "orders.csv"), "--limit", "3", "--quiet")
    assert "sent 0, skipped 0, failed 3" in capsys.readouterr().out


def records_of_n(count: int) -> list[dict]:
    return [{"invoiceId": i, "lineItemId": 1, "userId": 7, "itemId": 3, "price": 1.5, "createdAt": 1000}
            for i in range(1, count + 1)]

"""The embedded broker launcher: loopback only, metrics off, gone with its parent."""

import json
import subprocess
import sys
import textwrap

import pulsar

from pipeline.feed.broker import EmbeddedBroker, port_is_open, running_embedded_url
from waiting import wait_for


def test_shared_broker_listens_on_loopback_with_metrics_off(broker):
    assert broker.service_url.startswith("pulsar://127.0.0.1:")
    assert "enabled = false" in (broker.broker_dir / "pulsar-lite.toml").read_text()
    listening = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    own = [line for line in listening.splitlines() if f"pid={broker.process.pid}," in line]
    assert own and all("127.0.0.1:" in line for line in own), own
    assert running_embedded_url(broker.data_dir) == broker.service_url


def test_broker_round_trip_keyed(broker):
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        topic = "persistent://public/default/broker-roundtrip"
        producer = client.create_producer(topic)
        producer.send(b'{"x":1}', partition_key="k1")
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        message = reader.read_next(5000)
        assert (message.data(), message.partition_key()) == (b'{"x":1}', "k1")
    finally:
        client.close()


def test_broker_dies_with_its_parent(tmp_path):
    script = textwrap.dedent(f"""
        import json, os, sys
        from pipeline.feed.broker import EmbeddedBroker
        b = EmbeddedBroker({str(tmp_path)!r}).start()
        print(json.dumps({{"pid": b.process.pid, "port": b.port}}), flush=True)
        os._exit(0)  # no clean-up: the parent-death signal must stop the broker
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    info = json.loads(out.stdout.strip().splitlines()[-1])

    def gone() -> bool:
        try:
            with open(f"/proc/{info['pid']}/status") as status:
                return "zombie" in status.read()
        except FileNotFoundError:
            return True

    # A zombie leader can outlive its threads for a moment, so wait for the port too.
    wait_for(lambda: gone() and not port_is_open("127.0.0.1", info["port"]), timeout=20,
             what="the orphaned broker to exit")


def test_stop_removes_endpoint(tmp_path):
    with EmbeddedBroker(tmp_path) as running:
        assert running.endpoint_file.exists()
    assert not running.endpoint_file.exists()
    assert running_embedded_url(tmp_path) is None


def test_the_broker_log_is_moved_aside_past_its_cap_and_written_on_from_its_start(tmp_path):
    """The keeper caps broker.log (pulsar-lite's warnings run to tens of MB): the child keeps its
    descriptor, opened with O_APPEND as EmbeddedBroker opens it, and writes on at the new end."""
    from pipeline.feed.broker import cap_log

    path = tmp_path / "broker.log"
    child = textwrap.dedent("""
        import sys
        sys.stdout.write("x" * 3000 + "\\n"); sys.stdout.flush()
        sys.stdin.readline()
        sys.stdout.write("after the cap\\n"); sys.stdout.flush()
    """)
    with open(path, "ab") as log:
        process = subprocess.Popen([sys.executable, "-c", child], stdout=log, stdin=subprocess.PIPE)
    try:
        wait_for(lambda: path.stat().st_size > 3000, timeout=30, what="the child's first line")
        assert cap_log(path, max_bytes=10_000) is False  # under the cap: left alone
        assert cap_log(path, max_bytes=1000) is True
        assert (tmp_path / "broker.log.1").read_text().startswith("x" * 3000)
        process.stdin.write(b"go\n")
        process.stdin.flush()
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert path.read_bytes() == b"after the cap\n"  # at the start: no hole where the old lines were


def test_rust_log_keeps_the_users_filter_and_silences_the_dead_subscriptions():
    from pipeline.feed.broker import BROKER_RUST_LOG, broker_environment

    assert broker_environment({})["RUST_LOG"] == BROKER_RUST_LOG
    assert broker_environment({"RUST_LOG": "debug"})["RUST_LOG"] == f"debug,{BROKER_RUST_LOG}"


def test_closed_readers_add_nothing_to_the_log_per_message_published(tmp_path):
    """pulsar-lite keeps a closed reader's subscription and, after each entry published, logs a
    warning for every such one (issue 28: the log grew as entries x readers closed so far)."""
    with EmbeddedBroker(tmp_path) as running:
        client = pulsar.Client(running.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            topic = "persistent://public/default/broker-closed-readers"
            producer = client.create_producer(topic, batching_enabled=False)
            producer.send(b"first")
            for _ in range(10):
                reader = client.create_reader(topic, pulsar.MessageId.earliest)
                assert reader.read_next(5000).data() == b"first"
                reader.close()
            for i in range(50):
                producer.send(b"%d" % i)
            last = client.create_reader(topic, pulsar.MessageId.earliest)
            for _ in range(51):
                last.read_next(5000)  # every entry was published and dispatched
        finally:
            client.close()
        log = (running.broker_dir / "broker.log").read_text()
    assert log.count("No dispatcher found") == 0, log[-500:]


def test_the_keepers_sweep_removes_the_sources_closed_readers_subscriptions_and_no_others(tmp_path):
    """pulsar-lite keeps a closed reader's subscription and tries it after every entry published
    (issue 28: 3,000 of them slowed publishing 6.5x). With its warning for each such try left on,
    the log shows which subscriptions the broker still holds after the keeper's sweep."""
    from pipeline.feed.reader_sweep import ReaderSweep
    from pipeline.source.connection import READER_PREFIX, open_reader

    with EmbeddedBroker(tmp_path, rust_log="") as running:
        client = pulsar.Client(running.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            topic = "persistent://public/default/broker-sweep"
            producer = client.create_producer(topic, batching_enabled=False)
            producer.send(b"first")
            for _ in range(5):  # the source's readers, as a read task opens and closes them
                reader = open_reader(running.service_url, topic, "earliest", client=client)
                assert reader.read_next(5000).data() == b"first"
                reader.close()
            someone_elses = client.create_reader(topic, pulsar.MessageId.earliest)
            assert someone_elses.read_next(5000).data() == b"first"
            someone_elses.close()
            still_reading = open_reader(running.service_url, topic, "earliest", client=client)
            assert still_reading.read_next(5000).data() == b"first"
            sweep = ReaderSweep(running.broker_dir, stale_s=0.0)
            assert sweep.sweep(running.service_url) == 5  # not the open one, not someone else's
            assert sweep.sweep(running.service_url) == 0  # removed once, though the metadata still names them
            producer.send(b"marker")  # a round trip after the sweep, before the log is measured
            assert still_reading.read_next(5000).data() == b"marker"
            log = running.broker_dir / "broker.log"
            before = log.stat().st_size  # what follows is the 20 entries' dispatch
            for i in range(20):
                producer.send(b"%d" % i)
            assert [still_reading.read_next(5000).data() for _ in range(20)] == [b"%d" % i for i in range(20)]
        finally:
            client.close()
        with open(log, "rb") as lines:
            lines.seek(before)
            warned = [line for line in lines.read().decode().splitlines() if "No dispatcher found" in line]
    ours = [line for line in warned if f"{READER_PREFIX}-reader-" in line]
    # Kept, the 5 would warn for each of the 20 entries (100 lines). The broker dispatches on its
    # own tasks, so one pass begun before the sweep may still log a line for each of them.
    assert len(ours) <= 5, ours[-3:]
    assert len(warned) - len(ours) >= 20  # someone else's closed reader: kept, and the log shows it


def test_a_free_port_is_chosen_outside_the_kernels_ephemeral_range_where_no_bind_0_lands(tmp_path):
    """A port from the ephemeral range can be handed to any bind(0) (Spark's Python worker socket
    took an Apache Pulsar test broker's once) before the broker binds it."""
    import socket

    from pipeline.feed.ports import ephemeral_range, find_free_port

    low, high = ephemeral_range()
    for _ in range(20):
        port = find_free_port()
        assert not low <= port <= high and port >= 10_000
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # and it is free
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text("40000\t40100\n")
    assert ephemeral_range(narrow) == (40_000, 40_100)
    narrow.write_text("not numbers")
    assert ephemeral_range(narrow) == (32_768, 60_999)
    assert ephemeral_range(tmp_path / "missing") == (32_768, 60_999)

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

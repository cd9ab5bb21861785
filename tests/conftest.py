"""Shared fixtures: one real pulsar-lite broker and one local SparkSession per test session.

Fixtures are factories with defaults: ``settings_factory(**overrides)`` builds Settings on a
fresh data dir pointed at the shared broker; ``unique_topics()`` gives per-test topic names so
tests sharing the broker never see each other's messages.
"""

from __future__ import annotations

import itertools
import os
import uuid
from pathlib import Path
from typing import Callable

import pytest

from pipeline.feed.broker import EmbeddedBroker
from pipeline.config import Settings, load_settings

_counter = itertools.count()
# Fixtures that start a broker or Spark: a test using one is marked ``services`` (and left out of
# ``make test-fast``); a test that starts the job is marked ``e2e`` by its file.
SERVICE_FIXTURES = {"broker", "spark", "apache_pulsar", "settings_factory", "apache_settings_factory",
                    "partitioned_broker", "partitioned"}


def pytest_collection_modifyitems(items):
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)


@pytest.fixture(scope="session")
def broker(tmp_path_factory) -> EmbeddedBroker:
    """A real pulsar-lite broker on a free loopback port, stopped at the end of the session."""
    with EmbeddedBroker(tmp_path_factory.mktemp("broker")) as running:
        yield running


@pytest.fixture
def unique_topics() -> Callable[[], dict[str, str]]:
    def make() -> dict[str, str]:
        tag = f"t{next(_counter)}-{uuid.uuid4().hex[:8]}"
        return {name: f"persistent://public/default/{name}-{tag}" for name in ("users", "items", "orders")}

    return make


def _settings_maker(tmp_path, unique_topics, broker_values: dict) -> Callable[..., Settings]:
    """Settings on a fresh data dir and fresh topics of a broker; keyword overrides use '__' for '.'."""

    def make(**overrides) -> Settings:
        topics = unique_topics()
        values = {
            **broker_values,
            "paths.data_dir": str(tmp_path / f"data{next(_counter)}"),
            "spark.master": "local[2]",
            "job.trigger_interval": "500ms",
            "job.restart.delay": "1s",
            **{f"topics.{kind}": name for kind, name in topics.items()},
        }
        values.update({k.replace("__", "."): v for k, v in overrides.items()})
        return load_settings(env={}, cli=values)

    return make


@pytest.fixture
def settings_factory(tmp_path, broker, unique_topics) -> Callable[..., Settings]:
    """Settings on a fresh data dir, the shared broker and fresh topics; keyword overrides use '__' for '.'."""
    return _settings_maker(tmp_path, unique_topics, {"pulsar.service_url": broker.service_url})


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """The one local SparkSession of the test session."""
    from pipeline.runtime.spark import build_spark

    settings = load_settings(env={}, cli={"spark.master": "local[2]", "paths.data_dir": str(tmp_path_factory.mktemp("spark"))})
    session = build_spark(settings, app_name="stateful-streams-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def apache_pulsar(tmp_path_factory):
    """A real Apache Pulsar standalone (3.0 LTS, from Maven Central) on free loopback ports, one
    per test session, started on first use (about 15-30 s) and stopped at the end.
    ``make test`` fetches its jars first (``make apache-pulsar``); a bare pytest fetches them here."""
    from pipeline.feed.apache_broker import ApacheBroker, fetch_jars

    fetch_jars()
    with ApacheBroker(tmp_path_factory.mktemp("apache-pulsar")) as running:
        yield running


@pytest.fixture
def apache_settings_factory(tmp_path, apache_pulsar, unique_topics) -> Callable[..., Settings]:
    """Settings as ``settings_factory`` gives, on the Apache Pulsar broker and its admin API."""
    return _settings_maker(tmp_path, unique_topics, {"pulsar.service_url": apache_pulsar.service_url,
                                                      "pulsar.admin_url": apache_pulsar.admin_url})

"""Settings for every entry point: defaults < TOML file < environment < CLI flags.

One frozen :class:`Settings` object is loaded once per process with :func:`load_settings`
and passed down explicitly. Each key ``a.b.c`` has the environment variable ``SS_A_B_C``
(DESIGN.md §8); the table :data:`KEYS` is the single list of keys, defaults and checks.
A bad value fails at start-up with one line that names the key and the allowed values.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline import setting_values
from pipeline.setting_values import EMBEDDED
from pipeline.enrich.lookups import CHANGELOGS
from pipeline.errors import ConfigError

TOPIC_NAMES = (*CHANGELOGS, "orders")  # each lookup's changelog, then the orders


@dataclass(frozen=True)
class Key:
    """One setting: its dotted name, default and parser."""

    name: str
    default: Any
    parse: Callable[[Any], Any]
    help: str

    @property
    def env(self) -> str:
        return "SS_" + self.name.upper().replace(".", "_")


KEYS: tuple[Key, ...] = (
    Key("pulsar.service_url", EMBEDDED, setting_values.service_url, "Broker URL, or 'embedded' for pulsar-lite"),
    Key("pulsar.admin_url", None, setting_values.admin_url, "Pulsar admin REST URL (none for pulsar-lite)"),
    Key("pulsar.auth_token", None, setting_values.optional_text, "JWT for a Pulsar with token authentication (secret; never logged)"),
    *(Key(f"topics.{name}", f"persistent://public/default/{name}", setting_values.topic, f"{name.capitalize()} changelog topic")
      for name in CHANGELOGS),
    Key("topics.orders", "persistent://public/default/orders", setting_values.topic, "Orders event topic"),
    Key("paths.data_dir", "./var", setting_values.folder, "Broker data, checkpoints, sinks and metrics"),
    Key("spark.master", "local[*]", setting_values.spark_master, "Spark master URL"),
    Key("spark.shuffle_partitions", 0, setting_values.int_at_least(0, 100_000), "Shuffle partitions; 0 sizes them to the cores"),
    Key("spark.auth_secret", None, setting_values.optional_text, "Shared secret for Spark RPC authentication (spark.authenticate); secret"),
    # 1 GB holds a batch at job.max_rows_per_batch's default with room to spare, and the job's
    # memory is bounded (bench/bench_state.py): raise it with the batch bound.
    Key("spark.driver_memory", "1g", setting_values.heap_size,
        "Heap of the Spark driver JVM, which collects each micro-batch for the sinks ('1g', '1536m')"),
    Key("spark.extra_java_options", None, setting_values.optional_text, "More JVM options for the Spark driver (after ours)"),
    Key("job.trigger_interval", "1s", setting_values.positive_duration, "Micro-batch trigger interval"),
    # The driver collects a batch for the sinks, in spark.driver_memory: 300k of our orders fit
    # 1 GB and 600k did not (bench/README.md, stops 24 and 26). Both caps are estimated at planning
    # from what each partition's entries last held (pipeline/source/planning.py), and a producer's
    # batches can double in size from one range to the next, so the defaults leave 2x of room.
    Key("job.max_rows_per_batch", 150_000, setting_values.int_at_least(1),
        "Most messages in one micro-batch, whatever the producers' batching (estimated; README \"Batches\")"),
    Key("job.max_bytes_per_batch", "64MB", setting_values.byte_size,
        "Most bytes of messages in one micro-batch ('64MB'; estimated like the message cap)"),
    Key("job.orders_share_after", 10, setting_values.int_at_least(0, 1_000_000),
        "Batches in a row the changelogs may fill alone before orders get a share anyway (0: at once)"),
    Key("job.start_from", "earliest", setting_values.choice("earliest", "latest"), "Where a fresh checkpoint starts reading every topic"),
    Key("job.restart.attempts", 5, setting_values.int_at_least(0), "Restarts from the last checkpoint before giving up"),
    Key("job.restart.delay", "10s", setting_values.parse_duration, "Delay between restart attempts"),
    # The sinks are Delta tables (pipeline/sinks.py): one small file per batch until compacted.
    Key("sinks.compact_interval", "10m", setting_values.parse_duration,
        "How often the running job compacts each sink's small files, then vacuums replaced ones; 0 = not by time "
        "(both this and sinks.compact_after_batches 0: never)"),
    Key("sinks.compact_after_batches", 100, setting_values.int_at_least(0),
        "Compact (and vacuum) as soon as this many batches have committed since the last round; 0 = by time only"),
    Key("sinks.vacuum_retention", "1h", setting_values.parse_duration,
        "How long vacuum keeps files that compaction or a restore replaced (whole hours); a savepoint's "
        "files stay while it exists"),
    Key("metrics.retention", "168h", setting_values.parse_duration,
        "How long the running job keeps metrics day files (whole days; today's and yesterday's always stay)"),
    Key("enrichment.max_wait", "10s", setting_values.parse_duration, "How long an order waits for its user/item; 0 = no buffering"),
    Key("enrichment.time", "processing", setting_values.choice("processing", "event"),
        "Enrich with the state held when the order is processed, or with the versions current at its event time"),
    Key("enrichment.order_time", "created_at", setting_values.choice("created_at", "event_time"),
        "Event time: an order's time is its createdAt field or its message event time"),
    Key("enrichment.out_of_orderness", "5s", setting_values.parse_duration,
        "Event time: how far a changelog topic's event times may run out of order (its watermark lags its newest by this)"),
    Key("enrichment.allowed_lateness", "1h", setting_values.parse_duration,
        "Event time: an order older than the watermark minus this is late (missing_state, reason 'late')"),
    Key("enrichment.idle_timeout", "30s", setting_values.parse_duration,
        "Event time: a changelog with no new message for this long stops holding the watermark back; 0 = never"),
    Key("enrichment.future_horizon", "1h", setting_values.parse_duration,
        "Event time: an order further than this past the time the changelogs have reached is 'future' (missing_state), "
        "and a message time further than this past its publish time moves no watermark"),
    # Python's client pays a call per message (46k messages/s on this 2-core machine); the JVM's
    # sends a batch's messages handed over in one call (pipeline/sql/jvm_sender.py)
    Key("sql.topic_sender", "python", setting_values.choice("python", "jvm"),
        "What sends a SQL pipeline's result rows to its topic: Python's Pulsar client, or the JVM's (its jars come "
        "with make setup)"),
    Key("app.address", "127.0.0.1", setting_values.text, "Console bind address"),
    Key("app.port", 8501, setting_values.port, "Console port"),
    Key("app.admin_token", None, setting_values.optional_text, "Token that control actions require (needed off loopback)"),
    Key("exporter.address", "127.0.0.1", setting_values.text, "Prometheus exporter bind address"),
    Key("exporter.port", 9464, setting_values.port, "Prometheus exporter port"),
)
SECRET_KEYS = ("pulsar.auth_token", "spark.auth_secret", "app.admin_token")
KEYS_BY_NAME = {key.name: key for key in KEYS}
CONFIG_FILE_ENV = "SS_CONFIG"


@dataclass(frozen=True)
class Settings:
    """All settings, typed. Build it with :func:`load_settings`; never mutate it."""

    values: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    # Named accessors for the keys the code reads most; the names say what they are.
    @property
    def service_url(self) -> str:
        return self.values["pulsar.service_url"]

    @property
    def admin_url(self) -> str | None:
        return self.values["pulsar.admin_url"]

    @property
    def topics(self) -> dict[str, str]:
        """Logical name (users, items, orders) -> full topic name."""
        return {name: self.values[f"topics.{name}"] for name in TOPIC_NAMES}

    @property
    def data_dir(self) -> Path:
        return Path(self.values["paths.data_dir"]).absolute()

    @property
    def max_wait_ms(self) -> int:
        return int(round(self.values["enrichment.max_wait"] * 1000))

    @property
    def is_embedded(self) -> bool:
        return self.service_url == EMBEDDED

    def redacted(self) -> dict[str, Any]:
        """The settings with secrets masked, for logs and the metrics store."""
        return {k: ("***" if k in SECRET_KEYS and v else v) for k, v in self.values.items()}

    def with_overrides(self, **dotted: Any) -> "Settings":
        """A copy with some keys replaced (keys use '__' for '.'), each value checked."""
        overrides = {name.replace("__", "."): value for name, value in dotted.items()}
        merged = dict(self.values)
        for name, raw in overrides.items():
            merged[name] = _check(name, raw, "override")
        return Settings(merged)


def _check(name: str, raw: Any, origin: str) -> Any:
    key = KEYS_BY_NAME.get(name)
    if key is None:
        allowed = ", ".join(KEYS_BY_NAME)
        raise ConfigError(f"unknown setting {name!r} (from {origin}); known settings: {allowed}")
    try:
        return key.parse(raw)
    except ValueError as exc:
        raise ConfigError(
            f"setting {name!r} = {raw!r} (from {origin}) is not valid: expected {exc}; "
            f"fix it in the TOML file, {key.env} or --set {name}=…"
        ) from None


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in table.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """The dotted keys of a TOML settings file; a missing or malformed file is a ConfigError."""
    file = Path(path)
    try:
        with file.open("rb") as handle:
            return _flatten(tomllib.load(handle))
    except FileNotFoundError:
        raise ConfigError(f"config file {str(file)!r} does not exist; pass an existing TOML file") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {str(file)!r} is a folder; pass a TOML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(file)!r} is not UTF-8 text (byte {exc.start}); "
                          "save it as UTF-8 TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(file)!r} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {str(file)!r} cannot be read: {exc.strerror or exc}") from None


def load_settings(
    config_file: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge defaults < TOML < environment < CLI flags and check every value.

    ``config_file`` falls back to the ``SS_CONFIG`` environment variable. ``cli`` maps dotted
    keys to raw values (from ``--set key=value`` or a dedicated flag).
    """
    env = dict(os.environ if env is None else env)
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for key in KEYS:
        values[key.name], origins[key.name] = key.default, "default"

    config_file = config_file or env.get(CONFIG_FILE_ENV) or None
    if config_file:
        for name, raw in load_toml(config_file).items():
            values[name] = raw
            origins[name] = f"config file {str(config_file)!r}"
            _check(name, raw, origins[name])  # names the unknown key early

    for name, raw in env.items():
        if not name.startswith("SS_") or name == CONFIG_FILE_ENV:
            continue
        key = next((k for k in KEYS if k.env == name), None)
        if key is None:
            known = ", ".join(k.env for k in KEYS)
            raise ConfigError(f"unknown environment variable {name!r}; known: {CONFIG_FILE_ENV}, {known}")
        values[key.name], origins[key.name] = raw, f"environment {name}"

    for name, raw in (cli or {}).items():
        values[name], origins[name] = raw, "command line"

    checked = {name: (None if raw is None else _check(name, raw, origins.get(name, "?"))) for name, raw in values.items()}
    settings = Settings(checked)
    _check_consistency(settings)
    return settings


def _check_consistency(settings: Settings) -> None:
    """Rules that span several keys."""
    topics = settings.topics
    if len(set(topics.values())) != len(topics):
        raise ConfigError(f"{', '.join(f'topics.{name}' for name in TOPIC_NAMES[:-1])} and topics.{TOPIC_NAMES[-1]} "
                          f"must differ; got {topics!r}")
    address = settings["app.address"]
    if address not in ("127.0.0.1", "localhost", "::1") and not settings["app.admin_token"]:
        raise ConfigError(
            f"setting 'app.address' = {address!r} is not loopback and 'app.admin_token' is empty; "
            "set SS_APP_ADMIN_TOKEN to bind a non-loopback address"
        )


def parse_set_flags(pairs: list[str] | None) -> dict[str, str]:
    """``["a.b=1", …]`` from repeated ``--set`` flags, each one checked for shape."""
    result: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--set {pair!r} is not of the form key=value, e.g. --set enrichment.max_wait=5s")
        result[name.strip()] = value
    return result


def pulsar_authentication(token: str | None):
    """pulsar-client's ``authentication=`` argument for ``pulsar.auth_token``: None when no token is set.

    Pass the token itself (not the settings) so the executors can build it from a data source
    option: ``pulsar.Client(url, authentication=pulsar_authentication(token), …)``.
    """
    if not token:
        return None
    import pulsar

    return pulsar.AuthenticationToken(token)


def pulsar_admin_headers(settings: Settings) -> dict[str, str]:
    """HTTP headers for the Pulsar admin REST API: a bearer token when ``pulsar.auth_token`` is set."""
    token = settings["pulsar.auth_token"]
    return {"Authorization": f"Bearer {token}"} if token else {}

"""Settings precedence and one-line errors (DESIGN.md §8)."""

import re

import pytest

from pipeline.config import KEYS, load_settings, parse_set_flags
from pipeline.setting_values import parse_duration
from pipeline.errors import ConfigError


def test_defaults_match_the_contract():
    settings = load_settings(env={})
    assert settings["pulsar.service_url"] == "embedded"
    assert settings["pulsar.admin_url"] is None
    assert settings.topics == {n: f"persistent://public/default/{n}" for n in ("users", "items", "orders")}
    assert settings["paths.data_dir"] == "./var"
    assert settings["spark.master"] == "local[*]"
    assert settings["job.trigger_interval"] == 1.0
    assert settings.max_wait_ms == 10_000
    assert settings["app.admin_token"] is None


def test_env_names_follow_the_rule():
    envs = {key.name: key.env for key in KEYS}
    assert envs["pulsar.service_url"] == "SS_PULSAR_SERVICE_URL"
    assert envs["job.restart.attempts"] == "SS_JOB_RESTART_ATTEMPTS"
    assert envs["topics.users"] == "SS_TOPICS_USERS"


def test_precedence_defaults_toml_env_cli(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text('[enrichment]\nmax_wait = "3s"\n[job]\ntrigger_interval = "2s"\n[job.restart]\nattempts = 7\n')
    settings = load_settings(toml, env={"SS_JOB_TRIGGER_INTERVAL": "4s"}, cli={"job.restart.attempts": "9"})
    assert settings.max_wait_ms == 3000  # TOML beats default
    assert settings["job.trigger_interval"] == 4.0  # env beats TOML
    assert settings["job.restart.attempts"] == 9  # CLI beats TOML


def test_bad_value_names_key_and_allowed_values():
    with pytest.raises(ConfigError, match=re.escape("setting 'enrichment.max_wait' = 'soon' (from environment SS_ENRICHMENT_MAX_WAIT) is not valid: expected a duration")):
        load_settings(env={"SS_ENRICHMENT_MAX_WAIT": "soon"})


def test_unknown_keys_are_named(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text("[job]\ntriger_interval = 1\n")
    with pytest.raises(ConfigError, match=re.escape("unknown setting 'job.triger_interval'")):
        load_settings(toml, env={})
    with pytest.raises(ConfigError, match=re.escape("unknown environment variable 'SS_JOB_TRIGER'")):
        load_settings(env={"SS_JOB_TRIGER": "1"})


def test_missing_and_malformed_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[job\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_settings(bad, env={})


def test_non_loopback_app_needs_a_token():
    with pytest.raises(ConfigError, match="not loopback"):
        load_settings(env={"SS_APP_ADDRESS": "10.1.2.3"})
    assert load_settings(env={"SS_APP_ADDRESS": "10.1.2.3", "SS_APP_ADMIN_TOKEN": "s3cret"})["app.address"] == "10.1.2.3"


def test_secrets_are_redacted():
    settings = load_settings(env={"SS_APP_ADMIN_TOKEN": "s3cret"})
    assert "s3cret" not in repr(settings.redacted())


@pytest.mark.parametrize("raw,seconds", [("10s", 10), ("500ms", 0.5), ("2m", 120), (0, 0), ("1.5", 1.5)])
def test_durations(raw, seconds):
    assert parse_duration(raw) == seconds


def test_set_flags_shape():
    assert parse_set_flags(["a.b=1", "c.d=x=y"]) == {"a.b": "1", "c.d": "x=y"}
    with pytest.raises(ConfigError, match="is not of the form key=value"):
        parse_set_flags(["oops"])


@pytest.mark.parametrize("raw", [float("inf"), float("nan"), 1e308, -1, "1e308", "8d", "99999999999999999999s", 10**30])
def test_durations_out_of_range_are_refused(raw):
    with pytest.raises(ValueError, match=re.escape("a duration from 0 to 7 days")):
        parse_duration(raw)


@pytest.mark.parametrize("key,raw,allowed", [
    ("enrichment.max_wait", float("inf"), "a duration from 0 to 7 days"),
    ("job.trigger_interval", 1e308, "a duration from 0 to 7 days"),
    ("paths.data_dir", 5, "a folder path as text"),
    ("spark.shuffle_partitions", 99999999999999999999, "a whole number from 0 to 100000"),
    ("job.max_rows_per_batch", 2**40, "a whole number from 1 to 2147483647"),
])
def test_toml_values_outside_what_is_allowed(tmp_path, key, raw, allowed):
    section, name = key.rsplit(".", 1)
    toml = tmp_path / "s.toml"
    toml.write_text(f"[{section}]\n{name} = {raw!r}\n")  # repr is TOML here: inf, 1e+308, 5, big integers
    with pytest.raises(ConfigError, match=re.escape(f"setting {key!r} = ") + r".*" + re.escape(f"expected {allowed}")):
        load_settings(toml, env={})


def test_config_file_that_is_a_folder_or_not_utf8(tmp_path):
    with pytest.raises(ConfigError, match=re.escape(f"config file {str(tmp_path)!r} is a folder")):
        load_settings(tmp_path, env={})
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[app]\naddress = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=re.escape(f"config file {str(latin)!r} is not UTF-8 text")):
        load_settings(latin, env={})


@pytest.mark.parametrize("raw,expected", [("1g", "1g"), ("1536M", "1536m"), (" 2G ", "2g"), ("512m", "512m")])
def test_driver_memory_takes_spark_sizes(raw, expected):
    assert load_settings(env={"SS_SPARK_DRIVER_MEMORY": raw})["spark.driver_memory"] == expected


@pytest.mark.parametrize("raw", ["1", "1gb", "256m", "0g", "-1g", "lots"])
def test_driver_memory_too_small_or_not_a_size(raw):
    with pytest.raises(ConfigError, match=re.escape("setting 'spark.driver_memory' = ") + ".*"
                       + re.escape("a JVM heap size of at least 512 MB")):
        load_settings(env={"SS_SPARK_DRIVER_MEMORY": raw})

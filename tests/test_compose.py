"""docker-compose.yaml, checked without a Docker engine: settings, service names and commands are real.

Every SS_ variable must be a real setting whose value passes load_settings, every host a URL
points at must be a service of the file, the data dir must be one shared volume, and every
``python -m pipeline …`` command must parse with the real CLI parser.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from pipeline.cli import build_parser
from pipeline.config import KEYS, load_settings
from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yaml"
HOST_ENV = {"SS_APP_ADMIN_TOKEN": "dummy-token-for-tests"}  # what `export …` provides on the host
ENV_NAMES = {key.env for key in KEYS}
_HOST_VARIABLE = re.compile(r"(?<!\$)\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str, host_env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} substitution, and $$ for a literal $."""
    def substitute(match: re.Match) -> str:
        name, operator, argument = match.group(1), match.group(2), match.group(3)
        if host_env.get(name):
            return host_env[name]
        if operator and operator.endswith("?"):
            raise ValueError(f"compose would stop: {argument}")
        return argument if operator and operator.endswith("-") else ""

    return _HOST_VARIABLE.sub(substitute, value).replace("$$", "$")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict]:
    return compose["services"]


def environment(service: dict, host_env: dict[str, str] = HOST_ENV) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the "KEY=value" list form
        env = dict(item.partition("=")[::2] for item in env)
    return {name: interpolate(str(value), host_env) for name, value in env.items()}


def pipeline_commands(service: dict) -> list[list[str]]:
    """The argument lists of every ``python -m pipeline …`` the service runs."""
    command = service.get("command") or []
    text = command if isinstance(command, str) else " ".join(shlex.quote(part) for part in command)
    if isinstance(command, list) and command[:2] == ["sh", "-c"]:
        text = command[2]
    found = []
    for part in re.split(r"&&|\|\||;|&|\{|\}", text):
        words = shlex.split(part)
        for i in range(len(words) - 2):
            if words[i].endswith("python") and words[i + 1:i + 3] == ["-m", "pipeline"]:
                found.append(words[i + 3:])
    return found


def host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname, parsed.port


def container_ports(service: dict) -> set[int]:
    ports = {int(str(p).split(":")[-1].split("/")[0]) for p in service.get("ports", [])}
    return ports | {int(p) for p in service.get("expose", [])}


def test_the_expected_services_exist_and_none_is_built(services):
    assert {"pulsar", "spark-master", "spark-worker", "init", "job", "app", "producers"} <= services.keys()
    assert not [name for name, service in services.items() if "build" in service]


def test_every_ss_variable_is_a_real_setting(services):
    used = {name for service in services.values() for name in environment(service) if name.startswith("SS_")}
    assert used, "no service is configured through SS_ variables"
    assert used <= ENV_NAMES, f"not settings: {sorted(used - ENV_NAMES)}"
    assert {"SS_PULSAR_SERVICE_URL", "SS_PULSAR_ADMIN_URL", "SS_SPARK_MASTER", "SS_PATHS_DATA_DIR",
            "SS_APP_ADDRESS", "SS_APP_ADMIN_TOKEN"} <= used


@pytest.mark.parametrize("name", ["init", "job", "app", "producers"])
def test_each_service_settings_load(services, name):
    env = environment(services[name])
    settings = load_settings(env={k: v for k, v in env.items() if k.startswith("SS_")})
    assert not settings.is_embedded
    assert settings.admin_url == "http://pulsar:8080"


def test_the_app_binds_all_interfaces_only_with_a_token_from_the_host(services):
    app = services["app"]
    settings = load_settings(env={k: v for k, v in environment(app).items() if k.startswith("SS_")})
    assert (settings["app.address"], settings["app.port"]) == ("0.0.0.0", 8501)
    assert "8501:8501" in app["ports"]
    # the token is never written in the file: it comes from the host, and compose refuses to start without it
    assert re.fullmatch(r"\$\{SS_APP_ADMIN_TOKEN:\?[^}]+\}", app["environment"]["SS_APP_ADMIN_TOKEN"])
    with pytest.raises(ValueError, match="export SS_APP_ADMIN_TOKEN"):
        environment(app, host_env={})
    # and that guard matters: without a token the settings themselves refuse the address
    unguarded = {k: v for k, v in environment(app).items() if k.startswith("SS_") and k != "SS_APP_ADMIN_TOKEN"}
    with pytest.raises(ConfigError, match="SS_APP_ADMIN_TOKEN"):
        load_settings(env=unguarded)


def test_the_only_host_variable_is_the_admin_token():
    names = set(_HOST_VARIABLE.findall(COMPOSE.read_text()))
    assert {name for name, _, _ in names} == {"SS_APP_ADMIN_TOKEN"}


def test_job_and_app_are_configured_only_through_ss_variables(services):
    for name in ("job", "app"):
        env = environment(services[name])
        assert all(key.startswith("SS_") for key in env), (name, sorted(env))
        assert "SS_CONFIG" not in env
        for argv in pipeline_commands(services[name]):
            assert not {"--config", "--set", "--data-dir", "--service-url"} & set(argv), (name, argv)


def test_urls_point_at_services_and_ports_of_this_file(services):
    for name in ("init", "job", "app", "producers"):
        settings = load_settings(env={k: v for k, v in environment(services[name]).items() if k.startswith("SS_")})
        for url in (settings.service_url, settings.admin_url, settings["spark.master"]):
            host, port = host_port(url)
            assert host in services, f"{name}: {url!r} names no service"
            assert port in container_ports(services[host]), f"{name}: {url!r} but {host} has {container_ports(services[host])}"


def test_the_data_dir_is_one_volume_shared_by_job_app_and_executors(compose, services):
    data_dir = environment(services["job"])["SS_PATHS_DATA_DIR"]
    mounts = {}
    for name in ("job", "app", "spark-worker"):
        for volume in services[name]["volumes"]:
            source, target = volume.split(":")[:2]
            if target == data_dir:
                mounts[name] = source
    assert mounts.keys() == {"job", "app", "spark-worker"}, mounts
    assert len(set(mounts.values())) == 1 and next(iter(mounts.values())) in compose["volumes"]
    assert environment(services["app"])["SS_PATHS_DATA_DIR"] == data_dir


@pytest.mark.parametrize("name, command", [("init", "topics"), ("job", "run"), ("app", "app")])
def test_service_commands_are_real_cli_commands(services, name, command):
    [argv] = pipeline_commands(services[name])
    args = build_parser().parse_args(argv)
    assert args.command == command


def test_the_producers_publish_files_that_exist_with_late_users_last(services):
    commands = pipeline_commands(services["producers"])
    parsed = [build_parser().parse_args(argv) for argv in commands]
    assert [a.command for a in parsed] == ["produce"] * 4
    assert [(a.topic, a.file) for a in parsed] == [("items", None), ("users", None), ("orders", None),
                                                   ("users", "data/users_late.csv")]
    for args in parsed:
        assert (ROOT / (args.file or f"data/{args.topic}.csv")).exists()
    assert parsed[2].loop and parsed[2].rate > 0
    working_dir = services["producers"]["working_dir"]
    assert f".:{working_dir}:ro" in services["producers"]["volumes"]


def test_pulsar_allows_topic_level_retention(services):
    pulsar = services["pulsar"]
    assert pulsar["image"].startswith("apachepulsar/pulsar:")
    assert "bin/pulsar standalone" in " ".join(pulsar["command"])
    env = environment(pulsar)
    for option in ("systemTopicEnabled", "topicLevelPoliciesEnabled"):
        assert env.get(f"PULSAR_PREFIX_{option}", env.get(option)) == "true", option
    assert {6650, 8080} <= container_ports(pulsar)


def test_spark_versions_match_requirements(services):
    pinned = re.search(r"^pyspark==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    assert services["spark-master"]["image"] == f"apache/spark:{pinned}"
    worker = services["spark-worker"]
    assert worker["command"][:3] == ["/opt/venv/bin/spark-class", "org.apache.spark.deploy.worker.Worker",
                                     "spark://spark-master:7077"]
    # the executors run our Python: the same interpreter and code as the driver
    assert worker["image"] == services["job"]["image"]
    assert environment(worker)["PYSPARK_PYTHON"] == "/opt/venv/bin/python"
    assert environment(worker)["PYTHONPATH"] == services["job"]["working_dir"]


def test_dependencies_and_volumes_are_declared(compose, services):
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert set(depends) <= services.keys(), (name, depends)
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith(".") or source in compose["volumes"], (name, source)
    assert services["init"]["depends_on"]["pulsar"]["condition"] == "service_healthy"
    assert services["job"]["depends_on"]["init"]["condition"] == "service_completed_successfully"

"""docker-compose.yaml, checked without a Docker engine: settings, service names and commands are real.

Every SS_ variable must be a real setting whose value passes load_settings, every host a URL
points at must be a service of the file, the data dir must be one shared volume, and every
``python -m pipeline …`` command must parse with the real CLI parser. Safe by default: every
published port is bound to the host's loopback, secrets come only from the host's environment,
Spark RPC is authenticated and encrypted with one shared secret, Pulsar checks a token and
authorises one role per service, every service runs as a non-root user, every image is pinned by
digest and nothing is installed when a container starts (issue 27, item 4).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from pipeline.cli import build_parser
from pipeline.config import KEYS, SECRET_KEYS, load_settings
from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "docker" / "python.Dockerfile"
# the role of each Pulsar token, and what docker/make_secrets.py writes for the host
ROLE_TOKENS = {"PULSAR_ADMIN_TOKEN": "ss-admin", "PULSAR_JOB_TOKEN": "ss-job", "PULSAR_PRODUCERS_TOKEN": "ss-producers",
               "PULSAR_CONSOLE_TOKEN": "ss-console", "PULSAR_EXPORTER_TOKEN": "ss-exporter"}
HOST_ENV = {"SS_APP_ADMIN_TOKEN": "dummy-token-for-tests", "SS_SPARK_AUTH_SECRET": "dummy-spark-secret",
            "GRAFANA_ADMIN_PASSWORD": "dummy-grafana-password", "PULSAR_TOKEN_SECRET_KEY": "data:;base64,ZHVtbXk=",
            **{name: f"dummy.{role}.token" for name, role in ROLE_TOKENS.items()}}
REQUIRED_HOST_VARIABLES = set(HOST_ENV)
# each Pulsar client service: its role, and what the namespace grants let that role do
SERVICE_ROLES = {"init": "ss-admin", "job": "ss-job", "producers": "ss-producers", "app": "ss-console",
                 "exporter": "ss-exporter"}
GRANTS = {"ss-job": {"consume", "produce"}, "ss-producers": {"produce"}, "ss-console": {"produce"},
          "ss-exporter": {"consume"}}
OUR_IMAGE = "stateful-streams-python:local"
ENV_NAMES = {key.env for key in KEYS}
SECRET_ENV_NAMES = {key.env for key in KEYS if key.name in SECRET_KEYS}
TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
_HOST_VARIABLE = re.compile(r"(?<!\$)\$\{(\w+)(?:(:?[-?+])([^}]*))?\}")


def interpolate(value: str, host_env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?error} and ${VAR:+replacement} substitution, and $$ for a literal $."""
    def substitute(match: re.Match) -> str:
        name, operator, argument = match.group(1), match.group(2), match.group(3)
        if operator and operator.endswith("+"):
            return argument if host_env.get(name) else ""
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


def test_the_expected_services_exist_and_only_our_image_is_built(services):
    assert {"pulsar", "pulsar-grants", "spark-master", "spark-worker", "init", "job", "app", "producers",
            "exporter", "prometheus", "grafana"} <= services.keys()
    built = {name for name, service in services.items() if "build" in service}
    assert built == {"spark-worker", "init", "job", "app", "producers", "exporter"}
    for name in built:
        assert services[name]["image"] == OUR_IMAGE
        assert services[name]["build"] == {"context": ".", "dockerfile": "docker/python.Dockerfile"}
    assert DOCKERFILE.is_file()


def _from_lines() -> list[str]:
    return [line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("FROM ")]


def test_every_image_is_pinned_by_digest_with_how_to_update_it(services):
    digest = re.compile(r"^[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}$")
    pulled = {name: service["image"] for name, service in services.items() if "build" not in service}
    for name, image in pulled.items():
        assert digest.match(image), f"{name}: {image!r} is not pinned by digest"
    [base] = _from_lines()
    assert digest.match(base), base
    for text in (COMPOSE.read_text(), DOCKERFILE.read_text()):
        assert "docker buildx imagetools inspect" in text
    # a placeholder (zeros: no registry where this was written) is marked where it stands
    lines = COMPOSE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "@sha256:" + "0" * 64 in line:
            tag = line.split("image:")[1].strip().split("@")[0]
            assert f"UNVERIFIED placeholder digest: fill in with docker buildx imagetools inspect {tag}" in lines[i - 1]
    assert "@sha256:" + "0" * 64 not in base  # the image we build has a real base


def test_every_service_runs_as_a_non_root_user(services):
    for name, service in services.items():
        user = str(service.get("user", ""))
        assert user, f"{name} runs as its image's default user"
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{name} runs as {user!r}"
    users = [line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] == services["job"]["user"].split(":")[0] != "0"


def test_nothing_is_installed_when_a_container_starts(services):
    installing = re.compile(r"apt-get|apt |pip install|python -m venv|curl|wget", re.I)
    for name, service in services.items():
        assert "entrypoint" not in service, name
        command = service.get("command") or []
        text = command if isinstance(command, str) else " ".join(command)
        assert not installing.search(text), f"{name} installs at start: {text!r}"
    # the image does it once, when it is built
    dockerfile = DOCKERFILE.read_text()
    assert "apt-get install" in dockerfile and "pip install" in dockerfile and "-r /tmp/requirements.txt" in dockerfile
    assert not [v for s in services.values() for v in s.get("volumes", []) if "venv" in v.split(":")[0]]


def test_every_ss_variable_is_a_real_setting(services):
    used = {name for service in services.values() for name in environment(service) if name.startswith("SS_")}
    assert used, "no service is configured through SS_ variables"
    assert used <= ENV_NAMES, f"not settings: {sorted(used - ENV_NAMES)}"
    assert {"SS_PULSAR_SERVICE_URL", "SS_PULSAR_ADMIN_URL", "SS_SPARK_MASTER", "SS_PATHS_DATA_DIR",
            "SS_APP_ADDRESS", "SS_APP_ADMIN_TOKEN"} <= used


@pytest.mark.parametrize("name", ["init", "job", "app", "producers", "exporter"])
def test_each_service_settings_load(services, name):
    env = environment(services[name])
    settings = load_settings(env={k: v for k, v in env.items() if k.startswith("SS_")})
    assert not settings.is_embedded
    # only topic set-up administers; the console reads the retention before a restore
    assert settings.admin_url == ("http://pulsar:8080" if name in ("init", "app") else None)


def test_the_app_binds_all_interfaces_only_with_a_token_from_the_host(services):
    app = services["app"]
    settings = load_settings(env={k: v for k, v in environment(app).items() if k.startswith("SS_")})
    assert (settings["app.address"], settings["app.port"]) == ("0.0.0.0", 8501)
    assert "127.0.0.1:8501:8501" in app["ports"]
    # the token is never written in the file: it comes from the host, and compose refuses to start without it
    assert re.fullmatch(r"\$\{SS_APP_ADMIN_TOKEN:\?[^}]+\}", app["environment"]["SS_APP_ADMIN_TOKEN"])
    with pytest.raises(ValueError, match="export SS_APP_ADMIN_TOKEN"):
        environment(app, host_env={k: v for k, v in HOST_ENV.items() if k != "SS_APP_ADMIN_TOKEN"})
    # and that guard matters: without a token the settings themselves refuse the address
    unguarded = {k: v for k, v in environment(app).items() if k.startswith("SS_") and k != "SS_APP_ADMIN_TOKEN"}
    with pytest.raises(ConfigError, match="SS_APP_ADMIN_TOKEN"):
        load_settings(env=unguarded)


def test_host_variables_are_the_secrets_and_all_are_required():
    found = _HOST_VARIABLE.findall(COMPOSE.read_text())
    assert {name for name, _, _ in found} == REQUIRED_HOST_VARIABLES
    assert all(operator == ":?" for _, operator, _ in found)  # compose refuses to start without any


def _published(service: dict) -> list[tuple[str | None, str]]:
    """(host address or None for every interface, "host:container") of each published port."""
    published = []
    for port in service.get("ports", []):
        if isinstance(port, dict):  # the long syntax
            published.append((port.get("host_ip"), f"{port.get('published')}:{port.get('target')}"))
            continue
        parts = str(port).split(":")
        published.append((parts[0] if len(parts) == 3 else None, ":".join(parts[-2:])))
    return published


def test_every_published_port_is_bound_to_the_host_loopback(services):
    published = {name: _published(service) for name, service in services.items() if service.get("ports")}
    assert {"pulsar", "spark-master", "spark-worker", "app", "prometheus", "grafana"} <= published.keys()
    for name, ports in published.items():
        for address, mapping in ports:
            assert address == "127.0.0.1", f"{name} publishes {mapping} on {address or 'every interface'}"
    assert "exporter" not in published  # Prometheus reaches it on the compose network


def test_secrets_come_only_from_the_host(services):
    secretish = re.compile(r"secret|token|password|authparams|authenticationparameters", re.I)
    for name, service in services.items():
        for variable, value in (service.get("environment") or {}).items():
            if secretish.search(variable):
                assert "${" in str(value), f"{name}: {variable} is written in the file"
    assert services["pulsar"]["environment"]["PULSAR_PREFIX_tokenSecretKey"].startswith("${PULSAR_TOKEN_SECRET_KEY:?")


def test_spark_rpc_is_authenticated_with_one_secret_shared_by_job_master_and_worker(services):
    master, worker, job = services["spark-master"], services["spark-worker"], services["job"]
    master_opts, worker_opts = environment(master)["SPARK_MASTER_OPTS"].split(), environment(worker)["SPARK_WORKER_OPTS"].split()
    assert "-Dspark.authenticate=true" in master_opts
    # the REST submission server (on by default in Spark 4) would accept applications without the secret
    assert "-Dspark.master.rest.enabled=false" in master_opts
    assert "-Dspark.authenticate=true" in worker_opts
    # RPC and shuffles encrypted, and no kill buttons on the master's and worker's UIs
    for opts in (master_opts, worker_opts):
        assert {"-Dspark.network.crypto.enabled=true", "-Dspark.ui.killEnabled=false"} <= set(opts)
    # only the job submits, from the compose network: the master's RPC port is not on the host
    assert not [p for p in master.get("ports", []) if str(p).endswith(":7077")]
    # daemons read Spark's _SPARK_AUTH_SECRET (never on a command line); the job reads our setting
    secrets = {environment(master)["_SPARK_AUTH_SECRET"], environment(worker)["_SPARK_AUTH_SECRET"],
               environment(job)["SS_SPARK_AUTH_SECRET"]}
    assert secrets == {HOST_ENV["SS_SPARK_AUTH_SECRET"]}
    assert "secret" not in " ".join(master["command"] + worker["command"]).lower()
    settings = load_settings(env={k: v for k, v in environment(job).items() if k.startswith("SS_")})
    assert settings["spark.auth_secret"] == HOST_ENV["SS_SPARK_AUTH_SECRET"]
    assert settings.redacted()["spark.auth_secret"] == "***"
    without = {k: v for k, v in HOST_ENV.items() if k != "SS_SPARK_AUTH_SECRET"}
    for service in (master, worker, job):
        with pytest.raises(ValueError, match="export SS_SPARK_AUTH_SECRET"):
            environment(service, host_env=without)
    # only the job is a Spark driver: no other service holds the secret
    holders = {name for name, service in services.items()
               if {"SS_SPARK_AUTH_SECRET", "_SPARK_AUTH_SECRET"} & set(service.get("environment") or {})}
    assert holders == {"spark-master", "spark-worker", "job"}


def _pulsar_clients(services) -> list[str]:
    return [name for name, service in services.items() if "SS_PULSAR_SERVICE_URL" in environment(service)]


def test_the_driver_encrypts_rpc_and_its_ui_cannot_kill(services):
    """The job's side of the same (pipeline/runtime/spark.py): encryption with the secret, no kill buttons."""
    from pipeline.runtime import spark

    assert spark.SECURE_RPC_CONF == {"spark.network.crypto.enabled": "true"}
    source = Path(spark.__file__).read_text()
    assert '.config("spark.ui.killEnabled", "false")' in source
    assert "for key, value in SECURE_RPC_CONF.items():" in source


def test_pulsar_checks_tokens_and_authorises_one_role_per_service(services):
    pulsar = environment(services["pulsar"])
    assert pulsar["PULSAR_PREFIX_authenticationEnabled"] == "true"
    assert pulsar["PULSAR_PREFIX_authorizationEnabled"] == "true"
    assert pulsar["PULSAR_PREFIX_authenticationProviders"] == "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
    assert pulsar["PULSAR_PREFIX_tokenSecretKey"] == HOST_ENV["PULSAR_TOKEN_SECRET_KEY"]
    assert pulsar["PULSAR_PREFIX_superUserRoles"] == "ss-admin"
    admin = f"token:{HOST_ENV['PULSAR_ADMIN_TOKEN']}"
    # the broker's own client and the healthcheck's pulsar-admin (client.conf) are the admin role
    assert pulsar["PULSAR_PREFIX_brokerClientAuthenticationPlugin"] == pulsar["PULSAR_PREFIX_authPlugin"] == TOKEN_PLUGIN
    assert pulsar["PULSAR_PREFIX_brokerClientAuthenticationParameters"] == pulsar["PULSAR_PREFIX_authParams"] == admin
    assert "conf/client.conf" in services["pulsar"]["command"][2]
    # every service of ours that has a Pulsar URL presents its own role's token
    assert set(_pulsar_clients(services)) == set(SERVICE_ROLES)
    tokens = {}
    for name, role in SERVICE_ROLES.items():
        settings = load_settings(env={k: v for k, v in environment(services[name]).items() if k.startswith("SS_")})
        assert settings["pulsar.auth_token"] == f"dummy.{role}.token", name
        assert settings["pulsar.auth_token"] not in repr(settings.redacted())
        tokens[name] = settings["pulsar.auth_token"]
    assert len(set(tokens.values())) == len(tokens)  # no two services share a role
    # executors get the token from the job through the source's options, not from the worker's environment
    assert "SS_PULSAR_AUTH_TOKEN" not in environment(services["spark-worker"])


def _grants(services) -> dict[str, set[str]]:
    grants: dict[str, set[str]] = {}
    command = services["pulsar-grants"]["command"][2]
    for part in command.split("&&"):
        words = shlex.split(part)
        if words[:3] == ["bin/pulsar-admin", "namespaces", "grant-permission"]:
            role, actions = words[words.index("--role") + 1], words[words.index("--actions") + 1]
            assert words[3] == "public/default"
            grants.setdefault(role, set()).update(actions.split(","))
    return grants


def test_each_role_is_granted_only_what_its_service_needs(services):
    grants = _grants(services)
    assert grants == GRANTS
    assert grants["ss-exporter"] == {"consume"}  # the exporter reads only
    assert "ss-admin" not in grants  # a superuser, and the only one
    # every topic is in that namespace
    settings = load_settings(env={k: v for k, v in environment(services["job"]).items() if k.startswith("SS_")})
    assert all(topic.startswith("persistent://public/default/") for topic in settings.topics.values())
    grant_env = environment(services["pulsar-grants"])
    assert grant_env["PULSAR_PREFIX_authParams"] == f"token:{HOST_ENV['PULSAR_ADMIN_TOKEN']}"
    assert services["pulsar-grants"]["depends_on"]["pulsar"]["condition"] == "service_healthy"
    for name in ("job", "app", "producers", "exporter"):
        assert services[name]["depends_on"]["pulsar-grants"]["condition"] == "service_completed_successfully"


def test_make_secrets_writes_a_0600_file_with_tokens_for_each_role(tmp_path):
    target = tmp_path / "secrets.env"
    subprocess.run([sys.executable, str(ROOT / "docker" / "make_secrets.py"), str(target)], check=True,
                   capture_output=True, text=True)
    assert target.stat().st_mode & 0o777 == 0o600
    values = dict(line.split("=", 1) for line in target.read_text().splitlines())
    assert set(values) == REQUIRED_HOST_VARIABLES
    key = base64.b64decode(values["PULSAR_TOKEN_SECRET_KEY"].removeprefix("data:;base64,"))
    for name, role in ROLE_TOKENS.items():
        header, payload, signature = values[name].split(".")
        pad = lambda part: part + "=" * (-len(part) % 4)  # noqa: E731
        assert json.loads(base64.urlsafe_b64decode(pad(header))) == {"alg": "HS256"}
        assert json.loads(base64.urlsafe_b64decode(pad(payload))) == {"sub": role}
        expected = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
        assert base64.urlsafe_b64decode(pad(signature)) == expected
    again = subprocess.run([sys.executable, str(ROOT / "docker" / "make_secrets.py"), str(target)],
                           capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr  # never overwrites the keys in use


def test_job_and_app_are_configured_only_through_ss_variables(services):
    for name in ("job", "app"):
        env = environment(services[name])
        assert all(key.startswith("SS_") for key in env), (name, sorted(env))
        assert "SS_CONFIG" not in env
        for argv in pipeline_commands(services[name]):
            assert not {"--config", "--set", "--data-dir", "--service-url"} & set(argv), (name, argv)


def test_urls_point_at_services_and_ports_of_this_file(services):
    for name in ("init", "job", "app", "producers", "exporter"):
        settings = load_settings(env={k: v for k, v in environment(services[name]).items() if k.startswith("SS_")})
        for url in filter(None, (settings.service_url, settings.admin_url, settings["spark.master"])):
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
    # the exporter reads the same store, and only reads it
    assert f"{next(iter(mounts.values()))}:{data_dir}:ro" in services["exporter"]["volumes"]
    assert environment(services["exporter"])["SS_PATHS_DATA_DIR"] == data_dir


@pytest.mark.parametrize("name, command", [("init", "topics"), ("job", "run"), ("app", "app"), ("exporter", "exporter")])
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
    assert services["spark-master"]["image"].startswith(f"apache/spark:{pinned}@sha256:")
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


def test_prometheus_scrapes_the_exporter_on_the_compose_network(services):
    exporter = services["exporter"]
    settings = load_settings(env={k: v for k, v in environment(exporter).items() if k.startswith("SS_")})
    assert settings["exporter.address"] == "0.0.0.0"  # inside its container; nothing is published
    prometheus = services["prometheus"]
    [config_mount] = [v for v in prometheus["volumes"] if v.endswith(":/etc/prometheus/prometheus.yml:ro")]
    config = yaml.safe_load((ROOT / config_mount.split(":")[0]).read_text())
    [job] = config["scrape_configs"]
    [target] = job["static_configs"][0]["targets"]
    assert target == f"exporter:{settings['exporter.port']}"
    assert settings["exporter.port"] in container_ports(exporter)
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]


def test_grafana_is_provisioned_with_the_dashboard_and_prometheus(services):
    grafana = services["grafana"]
    mounts = {target: ROOT / source for source, target, *_ in (v.split(":") for v in grafana["volumes"]) if source.startswith(".")}
    for source in mounts.values():
        assert source.is_file(), source
    [datasources] = [yaml.safe_load(mounts[t].read_text()) for t in mounts if "/provisioning/datasources/" in t]
    [providers] = [yaml.safe_load(mounts[t].read_text()) for t in mounts if "/provisioning/dashboards/" in t]
    [datasource] = datasources["datasources"]
    host, port = host_port(datasource["url"])
    assert host == "prometheus" and port in container_ports(services["prometheus"])
    [provider] = providers["providers"]
    dashboards = [t for t in mounts if t.endswith(".json")]
    assert dashboards and all(t.startswith(provider["options"]["path"].rstrip("/") + "/") for t in dashboards)
    dashboard = json.loads(mounts[dashboards[0]].read_text())
    uids = {panel["datasource"]["uid"] for panel in dashboard["panels"] if "datasource" in panel}
    assert uids == {datasource["uid"]}
    assert environment(grafana)["GF_SECURITY_ADMIN_PASSWORD"] == HOST_ENV["GRAFANA_ADMIN_PASSWORD"]
    assert environment(grafana)["GF_AUTH_ANONYMOUS_ENABLED"] == "false"

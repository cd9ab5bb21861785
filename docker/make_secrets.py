"""Write every secret docker-compose.yaml needs into a 0600 env file (stdlib only; run on the host).

    python3 docker/make_secrets.py secrets.env
    docker compose --env-file secrets.env up -d

Pulsar tokens are HS256 JWTs whose subject is the role, signed with the broker's secret key:
what ``bin/pulsar tokens create --secret-key … --subject <role>`` makes. Compose reads the file
itself; no secret is put on a command line or into the compose file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import sys

# The role each token carries (docker-compose.yaml grants what each may do; README "Roles").
PULSAR_ROLES = {"PULSAR_ADMIN_TOKEN": "ss-admin", "PULSAR_JOB_TOKEN": "ss-job",
                "PULSAR_PRODUCERS_TOKEN": "ss-producers", "PULSAR_CONSOLE_TOKEN": "ss-console",
                "PULSAR_EXPORTER_TOKEN": "ss-exporter"}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make_token(key: bytes, role: str) -> str:
    """A Pulsar token for ``role`` signed with ``key`` (HS256, no expiry)."""
    signing_input = f"{_b64url(json.dumps({'alg': 'HS256'}).encode())}.{_b64url(json.dumps({'sub': role}).encode())}"
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64url(signature)}"


def make_secrets() -> dict[str, str]:
    key = secrets.token_bytes(32)
    values = {"PULSAR_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(key).decode(),
              "SS_SPARK_AUTH_SECRET": secrets.token_urlsafe(32),
              "SS_APP_ADMIN_TOKEN": secrets.token_urlsafe(24),
              "GRAFANA_ADMIN_PASSWORD": secrets.token_urlsafe(16)}
    values |= {name: make_token(key, role) for name, role in PULSAR_ROLES.items()}
    return values


def write_env_file(path: str, values: dict[str, str]) -> None:
    """Create ``path`` readable by its owner only; refuse to overwrite one (keys would change)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.writelines(f"{name}={value}\n" for name, value in values.items())


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "secrets.env"
    try:
        write_env_file(target, make_secrets())
    except FileExistsError:
        sys.exit(f"error: {target!r} exists; its tokens are signed with its key, keep it or delete it first")
    print(f"wrote {target} (0600); start with: docker compose --env-file {target} up -d")

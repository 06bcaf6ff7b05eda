# Laminar developer commands. Every target creates what it needs (.venv) itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTOS := $(wildcard proto/laminar_api/v1/*.proto)

.PHONY: help venv proto proto-check lint test test-fast demo bench install install-config install-units etc clean

help:
	@echo "make demo     run a local cluster on simulated GPUs doing real work"
	@echo "make test     proto check, lint (ruff, mypy --strict, import contracts), tests"
	@echo "make bench    benchmarks (numbers are reported, never asserted)"
	@echo "make proto    regenerate laminar_api/v1 from proto/"
	@echo "make install  a venv in PREFIX/lib/laminar, scripts linked in PREFIX/bin (PREFIX=/usr/local, DESTDIR=)"
	@echo "make install-config install-units   example configs and systemd units (DESTDIR=)"

# constraints.txt pins every package (reproducible CI); pyproject.toml keeps compatible
# ranges so an installed Laminar fits beside other stacks.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Regenerate the checked-in API code with the pinned grpcio-tools.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto \
	  --python_out=. --pyi_out=. --grpc_python_out=. --mypy_grpc_out=. \
	  --plugin=protoc-gen-mypy_grpc=$(VENV)/bin/protoc-gen-mypy_grpc \
	  $(PROTOS)

# Fails when the checked-in generated code differs from what proto/ produces.
proto-check: $(STAMP)
	@rm -rf .proto-check && mkdir -p .proto-check
	@$(PY) -m grpc_tools.protoc -Iproto \
	  --python_out=.proto-check --pyi_out=.proto-check --grpc_python_out=.proto-check \
	  --mypy_grpc_out=.proto-check \
	  --plugin=protoc-gen-mypy_grpc=$(VENV)/bin/protoc-gen-mypy_grpc \
	  $(PROTOS)
	@for f in $$(cd .proto-check && find . -name '*.py' -o -name '*.pyi'); do \
	  cmp -s .proto-check/$$f $$f || { echo "stale generated code: $$f (run 'make proto')"; rm -rf .proto-check; exit 1; }; \
	done
	@rm -rf .proto-check
	@echo "proto: generated code is up to date"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: proto-check lint
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -x -p no:cacheprovider -m "not slow" $(PYTEST_ARGS)

demo: $(STAMP)
	$(VENV)/bin/laminar demo

# Placement only and launch, each as a burst and at 100 jobs/s offered, at 4 and 256 agents.
bench: $(STAMP)
	mkdir -p bench-out
	$(PY) bench/agent_probe.py
	for n in 4 256; do \
	  $(VENV)/bin/laminar bench placement --agents $$n --jobs 300 -o json > bench-out/placement_n$$n.json && \
	  $(VENV)/bin/laminar bench placement --agents $$n --jobs 300 --rate 100 -o json > bench-out/placement_n$${n}_rate100.json && \
	  $(VENV)/bin/laminar bench placement --agents $$n --jobs 300 --launch -o json > bench-out/launch_n$$n.json && \
	  $(VENV)/bin/laminar bench placement --agents $$n --jobs 300 --launch --rate 100 -o json > bench-out/launch_n$${n}_rate100.json \
	  || exit 1; \
	done
	$(VENV)/bin/laminar bench heartbeats --agents 4096 --seconds 20 -o json > bench-out/heartbeats_n4096.json
	$(VENV)/bin/laminar bench submit --cli-runs 20 --instructions -o json > bench-out/submit.json
	$(PY) bench/fgd_live.py --pods 2000 -o bench-out/fgd_live_2000.json
	$(VENV)/bin/laminar bench airlock --trials 20 -o json > bench-out/airlock.json
	$(PY) bench/fgd_reproduce.py --workloads default --mig -o bench-out/fgd_default.json --plot bench-out/fgd_default.png
	$(PY) bench/clearing_round.py -o json > bench-out/clearing_round.json
	$(PY) bench/queue_pass.py -o json > bench-out/queue_pass.json
	$(PY) bench/fault_soak.py --jobs 300 --seed 1 -o json > bench-out/fault_soak.json

# Install into a venv of its own, $(PREFIX)/lib/laminar, with the versions constraints.txt
# pins, and link its laminar, laminar-agent and laminar-zone into $(PREFIX)/bin, where the
# units look (/usr/local/bin). Not pip into the system Python: Debian's and Ubuntu's refuse
# it (externally-managed-environment), and put `--prefix /usr/local` scripts in
# /usr/local/local/bin. Run again to upgrade in place. DESTDIR=/tmp/stage stages it for a
# package: paths inside the venv then name $(PREFIX), where it will run. Config and units
# are separate steps, so nothing lands in /etc unless asked: `make install-config
# install-units`.
PREFIX ?= /usr/local
DESTDIR ?=
LAMINAR_HOME = $(PREFIX)/lib/laminar
SCRIPTS := laminar laminar-agent laminar-zone
SYSCONFDIR ?= /etc
SYSTEMDDIR ?= /etc/systemd/system
SYSUSERSDIR ?= /etc/sysusers.d
DOCDIR ?= /usr/share/doc/laminar
install:
	$(PYTHON) -m venv $(DESTDIR)$(LAMINAR_HOME)
	# setuptools builds in ./build and never prunes it: a module deleted since the last
	# build would still be packaged.
	rm -rf build
	$(DESTDIR)$(LAMINAR_HOME)/bin/python -m pip install -q --upgrade -c constraints.txt .
	rm -rf build
	@if [ -n "$(DESTDIR)" ]; then \
	  grep -rlI -F '$(DESTDIR)$(LAMINAR_HOME)' $(DESTDIR)$(LAMINAR_HOME)/bin $(DESTDIR)$(LAMINAR_HOME)/pyvenv.cfg \
	  | xargs -r sed -i 's|$(DESTDIR)$(LAMINAR_HOME)|$(LAMINAR_HOME)|g'; \
	fi
	install -d $(DESTDIR)$(PREFIX)/bin
	for s in $(SCRIPTS); do ln -sfn $(LAMINAR_HOME)/bin/$$s $(DESTDIR)$(PREFIX)/bin/$$s; done
	@echo "installed $(SCRIPTS) in $(PREFIX)/bin (links into $(LAMINAR_HOME))"

# Example configs with every key at its default; an installed file is never overwritten.
install-config:
	for f in etc/laminar/agent.toml etc/laminar/zone.toml; do \
	  dest=$(DESTDIR)$(SYSCONFDIR)/laminar/$$(basename $$f); \
	  if [ -e "$$dest" ]; then echo "keeping $$dest"; \
	  else install -D -m 0644 $$f "$$dest" && echo "installed $$dest"; fi; \
	done

# The units run $(PREFIX)/bin/laminar-*; the router's user comes from sysusers.d, made at
# once unless staged (a package runs systemd-sysusers after installing).
install-units:
	for d in laminar-agent laminar-zone; do \
	  install -D -m 0644 systemd/$$d.service $(DESTDIR)$(SYSTEMDDIR)/$$d.service && \
	  sed -i 's|/usr/local/bin/|$(PREFIX)/bin/|' $(DESTDIR)$(SYSTEMDDIR)/$$d.service || exit 1; \
	done
	install -D -m 0644 systemd/laminar.sysusers $(DESTDIR)$(SYSUSERSDIR)/laminar.conf
	if [ -z "$(DESTDIR)" ] && command -v systemd-sysusers >/dev/null; then \
	  systemd-sysusers $(SYSUSERSDIR)/laminar.conf; fi
	# Documentation= in the units points here.
	for f in docs/*.md; do install -D -m 0644 $$f $(DESTDIR)$(DOCDIR)/$$(basename $$f); done

# Regenerate etc/laminar/*.toml from the config dataclasses (a test checks they match).
etc: $(STAMP)
	$(PY) -c 'from laminar_base.configlib import render_example as r; from laminar_agent.config import AgentConfig as A; print(r(A, "laminar-agent: /etc/laminar/agent.toml"), end="")' > etc/laminar/agent.toml
	$(PY) -c 'from laminar_base.configlib import render_example as r; from laminar_zone.config import ZoneConfig as Z; print(r(Z, "laminar-zone: /etc/laminar/zone.toml"), end="")' > etc/laminar/zone.toml

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info

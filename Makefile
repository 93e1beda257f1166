# Shiftlog: `make run` sets everything up and starts the embedded product; `make test` runs
# every test. Both create the virtualenv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# `make run PORT=8080 HOST=0.0.0.0`: where the server listens (its links use that address too,
# unless SHIFTLOG_BASE_URL names another).
PORT ?= 8000
HOST ?= 127.0.0.1

.PHONY: test-container test-container-if-built container-deps run test test-chain-services test-chain-sqlite test-chain-sqlite-second test-db-first test-db-second test-pure test-db test-services test-pages test-pages-first test-pages-second test-chaos test-pure-then-chaos chaos setup lint format bench clean system-deps sandbox browser claude-code openai-agents

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || { echo "Creating the virtualenv $(VENV)..."; $(PYTHON) -m venv $(VENV); }
	@echo "Installing Shiftlog and its dependencies into $(VENV) with pip (a minute or two the first time)..."
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --progress-bar off -e '.[dev]'
	@touch $@
	@echo "Installed."

setup: $(VENV)/.installed

# bubblewrap is the sandbox runs' commands get (their workspace and the toolchain, nothing of the
# supervisor, no network but through the run's proxy); without it runs do not start, unless the
# operator sets SHIFTLOG_ALLOW_UNISOLATED=1.
# `make run` needs only this; the tests need the browser too (system-deps).
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "Installing bubblewrap (the sandbox of runs' commands) with apt-get..." && \
	  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null 2>&1)) \
	  || echo "note: bubblewrap (bwrap) could not be installed: runs will not start, because their commands cannot be isolated (set SHIFTLOG_ALLOW_UNISOLATED=1 to let them run with the worker's own reach, at your risk)"; }
system-deps: sandbox
	@$(MAKE) --no-print-directory browser

# The browser tests drive Debian's chromium through the playwright package (never a Playwright
# browser download); without it they are skipped with a note.
browser:
	@test -x /usr/bin/chromium || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "Installing chromium (for the browser tests) with apt-get..." && \
	  (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null 2>&1)) \
	  || echo "note: chromium is not installed; the browser tests are skipped"; }

# The real Claude Code CLI, pinned, for shiftlog-claude's end-to-end test (tests/test_claude_code.py):
# installed with npm (node and npm from Debian's packages) under var/, outside the git tree; its
# native binary comes in the optional package @anthropic-ai/claude-code-linux-x64. Without npm or
# the registry the test is skipped with a note.
CLAUDE_CODE_VERSION := 2.1.328
CLAUDE_CODE_DIR := var/claude-code
claude-code:
	@test -x $(CLAUDE_CODE_DIR)/node_modules/@anthropic-ai/claude-code-linux-x64/claude && \
	  grep -q '"version": "$(CLAUDE_CODE_VERSION)"' $(CLAUDE_CODE_DIR)/node_modules/@anthropic-ai/claude-code/package.json || { \
	  command -v npm >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    (apt-get install -y -qq nodejs npm >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null 2>&1)); }; \
	  mkdir -p $(CLAUDE_CODE_DIR) && npm install --silent --no-audit --no-fund --prefix $(CLAUDE_CODE_DIR) \
	    @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) >/dev/null 2>&1 \
	  || echo "note: Claude Code $(CLAUDE_CODE_VERSION) could not be installed with npm; tests/test_claude_code.py is skipped"; }

# The OpenAI Agents SDK in a virtualenv of its own (its package is named `agents`, like
# Shiftlog's app): tests/test_framework_adapters.py runs examples/openai_agents with it.
OPENAI_AGENTS_VENV := var/openai-agents-venv
openai-agents:
	@test -x $(OPENAI_AGENTS_VENV)/bin/python && $(OPENAI_AGENTS_VENV)/bin/python -c 'import agents.run_state' 2>/dev/null || { \
	  $(PYTHON) -m venv $(OPENAI_AGENTS_VENV) && \
	  $(OPENAI_AGENTS_VENV)/bin/python -m pip install --quiet --progress-bar off './clients/python[openai-agents]' \
	  || echo "note: openai-agents could not be installed; its test in tests/test_framework_adapters.py is skipped"; }

# Sets up the data folder (var/), saying each step (migrations, static files, the admin's login
# link, the demo run), then serves. Links (the one-time login, webhooks) point at the address
# served, unless SHIFTLOG_BASE_URL says.
run: setup sandbox
	$(PY) manage.py serve --setup --port $(PORT) --host $(HOST)

# Every test on SQLite, then the ones whose behaviour can differ with the database, the queue or
# the channel layer again on the PostgreSQL and Redis of this machine (skipped, saying so, when
# they do not answer). Three at a time, each pytest with its own data folder and database: most
# tests wait on processes, browsers and sockets rather than on the CPU. Three chains side by side:
# a few browser tests, the PostgreSQL + Redis pass, then the chaos minute (which so never shares
# the database with that pass) and the container; the first half of the SQLite pass, then the
# other browser tests (so the two browser parts never run at once); the second half, then the
# pure tests. The two cores are busy throughout (a clean clone on a 2-core machine, 2026-12-06:
# 3 + 20 + 2.5, 15.5 + 13 and 22.3 + 6.5 minutes, 32 in all): only less work makes it shorter.
# A chain goes on after a failing part, so one run shows every failure; -O prints each chain's
# report whole.
test: setup system-deps claude-code openai-agents
	@$(MAKE) --no-print-directory -j3 -O test-chain-services test-chain-sqlite test-chain-sqlite-second
test-chain-services: setup system-deps
	@st=0; $(MAKE) --no-print-directory test-pages-second || st=1; \
	  $(MAKE) --no-print-directory test-services || st=1; \
	  $(MAKE) --no-print-directory test-chaos || st=1; \
	  $(MAKE) --no-print-directory test-container-if-built || st=1; exit $$st
test-chain-sqlite: setup system-deps
	@st=0; $(MAKE) --no-print-directory test-db-first || st=1; \
	  $(MAKE) --no-print-directory test-pages-first || st=1; exit $$st
test-chain-sqlite-second: setup system-deps
	@st=0; $(MAKE) --no-print-directory test-db-second || st=1; \
	  $(MAKE) --no-print-directory test-pure || st=1; exit $$st

# The halves: code that touches no database (sandbox, shell, snapshots, policy, ...); everything
# else on SQLite but the browser tests of what pages show; the second pass on PostgreSQL + Redis
# (tests.postgres_redis); and those browser tests (ui_only), which read the same on any database.
test-pure: setup
	$(PY) -m pytest -m "no_services and not ui_only"
test-db: setup
	$(PY) -m pytest -m "not no_services and not ui_only"
# test-db in two halves (make test runs them side by side): these files, then everything else.
DB_FIRST := $(wildcard tests/test_[a-f]*.py) tests/e2e/test_browser.py
test-db-first: setup
	$(PY) -m pytest -m "not no_services and not ui_only" $(DB_FIRST)
test-db-second: setup
	$(PY) -m pytest -m "not no_services and not ui_only" $(addprefix --ignore=,$(DB_FIRST))
test-services: setup
	$(PY) -m tests.postgres_redis
test-pages: setup system-deps
	$(PY) -m pytest -m ui_only
# The browser tests in two parts: these files at the start of one chain, the rest at the end of
# another.
PAGES_SECOND := tests/e2e/test_fleet.py tests/e2e/test_dark.py tests/e2e/test_overview.py tests/e2e/test_notify.py
test-pages-first: setup system-deps
	$(PY) -m pytest -m ui_only $(addprefix --ignore=,$(PAGES_SECOND))
test-pages-second: setup system-deps
	$(PY) -m pytest -m ui_only $(PAGES_SECOND)
# A minute of the chaos soak (bench/chaos.py) when PostgreSQL answers, after the pure tests.
test-pure-then-chaos: setup
	@$(MAKE) --no-print-directory test-pure
	@$(MAKE) --no-print-directory test-chaos
test-chaos: setup
	$(PY) bench/chaos.py --seconds 60 --seed 1 --skip-without-services

# The container image and compose.yaml, for real (tests/test_container.py): the images built
# from Debian's packages where missing (a debootstrap base, then the Dockerfile; minutes the first
# time), `docker compose up`, a login, a run on the worker container, `down -v`. It starts dockerd
# when none runs (and stops it). `make test` runs it only when the images are built already.
container-deps:
	@command -v dockerd >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1 && \
	  { docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; } || { \
	  [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "Installing docker.io, docker-compose and debootstrap (the container test) with apt-get..." && \
	  (apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null 2>&1 || \
	   (apt-get update -qq && apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null 2>&1)) \
	  || echo "note: docker or debootstrap could not be installed; tests/test_container.py is skipped"; }
test-container: setup container-deps
	SHIFTLOG_CONTAINER_TEST=1 $(PY) -m pytest tests/test_container.py
test-container-if-built: setup
	SHIFTLOG_CONTAINER_TEST=if-built $(PY) -m pytest tests/test_container.py

# The chaos soak on its own: `make chaos SECONDS=600 SEED=7`.
SECONDS ?= 120
chaos: setup
	$(PY) bench/chaos.py --seconds $(SECONDS) $(if $(SEED),--seed $(SEED))

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: setup
	$(PY) bench/step_overhead.py

clean:
	rm -rf var

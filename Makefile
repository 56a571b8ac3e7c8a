# Two commands do all the set-up on a fresh machine with Python >= 3.10 and make:
#   make demo   creates .venv, installs posemb, builds its CPU op, runs posemb verify once
#               and builds the lesson page from its results (posemb-lesson/index.html); run
#               again, it does only what a change needs
#   make test   creates .venv, installs posemb with the dev extra, runs ruff, then the tests
#               with the type check beside them (among them: the documentation site built
#               strictly and opened in a browser), all but the packaging tests
#   make test-all  make test with the packaging tests (what CI runs): the wheel built,
#               installed where no compiler exists and tested there, and the README's
#               install lines and make demo run in new environments
#   make docs   builds the documentation site into site/ (the lesson page inside it)
#   make wheel  builds the release wheel (manylinux-tagged, the op inside) and the sdist into
#               dist/, from a clean copy of the checkout (scripts/build_wheel.py)
# Versions come from constraints.txt so that every machine tests the same set.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The bytecode of the venv's packages is needed: where PYTHONDONTWRITEBYTECODE is set (CI
# images, this project's machines) nothing would write it later, and every process would
# compile torch again (the suite took 819 s against 691 s without it). pip writes it on one
# core (35 of the dev install's 58 s here), so the big installs pass --no-compile and
# COMPILE_SITE writes it on every core, beside the op's build (23 + 21 s). A file that does not
# compile (a package's Python 2 example) is left without, as pip leaves it: the exit status
# is ignored, a missing .pyc only costs time. BYTECODE=0 leaves it to Python (the suite's
# fresh checkouts, where Python writes it on first import).
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt
SITE   := "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
BYTECODE ?= 1
COMPILE_SITE := $(if $(filter 0,$(BYTECODE)),true,$(BIN)/python -m compileall -qq -j0 $(SITE) \
	>/dev/null 2>&1)
# A background job of sh ignores Ctrl-C: the trap ends it with make.
BUILD_OP := { $(COMPILE_SITE) & compiling=$$!; }; trap 'kill $$compiling 2>/dev/null' INT TERM; \
	$(BIN)/posemb kernels --build --if-possible; built=$$?; wait $$compiling; exit $$built
# The venv's own tools first (the jit extra's ninja, which torch looks for on PATH).
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo test test-all docs wheel lint format clean screenshots

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip first (constraints.txt pins it): the one Python 3.11 bundles (23.2) took 22 s to resolve
# the dev extra's ~110 packages here, 26.3 takes 9 s (the install with bytecode: 55 s, was 74 s).
# In each install step, so that a venv made before, or a failed upgrade, gets it next time.
$(VENV)/.installed-demo: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) pip
	$(PIP) --no-compile -e '.[lesson,jit]'
	$(BUILD_OP)
	@touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) pip
	$(PIP) --no-compile -e '.[dev]'
	# A test oracle: torchtune's vision RoPE. Its package imports torchao and more on import,
	# so the tests load that one module file, and none of its dependencies are installed.
	$(PIP) --no-compile --no-deps torchtune
	$(BUILD_OP)
	@touch $@ $(VENV)/.installed-demo

# The claims' results are made again when posemb's sources, its data files (the lab summaries
# the claims read) or the pinned versions change, so a second make demo takes seconds. A verify that fails (a claim that does not hold) wrote the
# file: .DELETE_ON_ERROR removes it, so the next make demo runs the claims again, not the page
# alone (make removes only a file the recipe changed: a refused, foreign file stays).
CLAIM_INPUTS := $(wildcard src/posemb/*.py src/posemb/*/*.py src/posemb/*/*/*.py \
	src/posemb/*/data/*) pyproject.toml constraints.txt
$(VENV)/claims.json: $(CLAIM_INPUTS) | $(VENV)/.installed-demo
	$(BIN)/posemb verify --save $@

.DELETE_ON_ERROR:

# The page is built again only when it is missing, or older than the claims or than a file of
# posemb's package (templates, scripts and vendored libraries too; the build's own outputs and
# bytecode left out): a second make demo prints the page's address. A page newer than the
# folder's ownership record (posemb/_owned.py), or one without it, goes to posemb lesson, which
# refuses a page the user edited or did not get from it. (Not a make target: make would delete
# the page a failed claim leaves, and it must stay to show the failure.)
LESSON := posemb-lesson/index.html
demo: $(VENV)/claims.json
	@newer=$$(find src/posemb -newer $(LESSON) -not -path '*/__pycache__/*' -not -name '_C*' \
	    -print -quit 2>/dev/null) || newer=unknown; \
	if [ -e $(LESSON) ] && [ $(LESSON) -nt $(VENV)/claims.json ] && [ -z "$$newer" ] && \
	    [ ! $(LESSON) -nt posemb-lesson/.posemb-owned.json ]; then \
	    echo "the lesson page is up to date: file://$(abspath $(LESSON))"; \
	else echo "$(BIN)/posemb lesson --claims $(VENV)/claims.json"; \
	    $(BIN)/posemb lesson --claims $(VENV)/claims.json; fi

# The documentation site into site/ (strict: a warning fails it), with the lesson page at
# site/lesson/ (its claims run now, about a minute). Open site/index.html: it works offline.
# Built in a temporary folder and copied in: a site/ holding files make docs did not write is
# refused (mkdocs itself would empty it).
docs: $(VENV)/.installed-dev
	$(BIN)/python scripts/build_docs.py site

wheel: $(VENV)/.installed-dev
	$(BIN)/python scripts/build_wheel.py dist

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Two workers, one per core of the project's machines. Each test module stays on one worker,
# the longest first (tests/conftest.py orders them; xdist's own reorder, by number of tests,
# ran the front door and the wheel last); the claims and the lesson page are made once for
# both. POSEMB_TEST_TIMELINE=file records where the time went (scripts/test_timeline.py).
# PYTEST_ARGS= runs it serially.
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder

# The lesson's screenshots (one per screen, light, dark, 400 and 320 px, into
# test-artifacts/lesson/) check nothing and took 36 s of the browser test: make test leaves
# them out (POSEMB_SCREENSHOTS=1 make test keeps them), make screenshots takes them.
screenshots: $(VENV)/.installed-dev
	POSEMB_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/lesson/test_browser.py

# The packaging tests (markers wheel and front_door: the wheel built and installed where no
# compiler exists, the README's install lines and make demo, each in new environments) install
# torch four times and build the op three times: a fifth of the suite's processor time, 225 s
# here. make test leaves them out, to stay under 10 minutes from a fresh clone on 2 cores;
# make test-all keeps them, and CI runs it (.ci/run). TEST_MARKS='...' picks others; a -m in
# PYTEST_ARGS is left alone (make test-all PYTEST_ARGS=tests/test_wheel.py runs that file).
TEST_MARKS ?= not wheel and not front_door
test-all: TEST_MARKS :=
test-all: test

# ruff first (a second); the type check (about 30 s of one core, cold) runs beside the tests,
# in the time their workers wait on pip and subprocesses, and prints after them. Either failing
# fails make test.
test: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	@$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & mypy=$$!; \
	trap 'kill $$mypy 2>/dev/null' INT TERM; \
	POSEMB_SCREENSHOTS=$${POSEMB_SCREENSHOTS:-0} $(BIN)/python -m pytest $(PYTEST_ARGS) \
	    $(if $(TEST_MARKS),$(if $(filter -m,$(PYTEST_ARGS)),,-m "$(TEST_MARKS)")); tests=$$?; \
	wait $$mypy; types=$$?; echo "mypy:"; cat $(VENV)/mypy.log; \
	exit $$(( tests ? tests : types ))

format: $(VENV)/.installed-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) site .pytest_cache .ruff_cache .mypy_cache .import_linter_cache .hypothesis build dist \
		src/*.egg-info src/posemb/_C*.so src/posemb/_C.json test-artifacts

# wiregate — everything a fresh machine needs goes through these targets.
#   make run    create .venv, install, generate .wiregate/ on first run, serve HTTPS + UDS
#   make test   create .venv, install with test extras, run the whole suite
#   make lint   ruff (check + format), mypy --strict on the package, import-layer contracts
PYTHON ?= python3
VENV   ?= .venv
WORKDIR ?= .wiregate
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: run test demo bench lint clean

$(STAMP): pyproject.toml setup.py constraints.txt gateway/carriers/_jsonraw_native.c gateway/inspection/_decode_native.c gateway/context/store/_vector_native.c gateway/context/store/_fts_native.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,dev]'
	touch $(STAMP)

run: $(STAMP)
	test -f $(WORKDIR)/wiregate.toml || $(BIN)/wiregate init --dir $(WORKDIR)
	$(BIN)/wiregate serve --config $(WORKDIR)/wiregate.toml

test: $(STAMP)
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/python -m gateway.demo

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

lint: $(STAMP)
	$(BIN)/ruff check gateway tests bench examples
	$(BIN)/ruff format --check gateway tests bench examples
	$(BIN)/mypy gateway
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache

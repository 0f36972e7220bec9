#!/usr/bin/env bash
# The hostile-input tests that need clang: an ASan+UBSan CPU-only build of fp8proj (in the
# calling build tree, under sanitize/), then one of
#   build         configure and build it (the CPU tests, the CLI, the two libFuzzer targets)
#   tests         run the CPU test suite (gtests, CLI cases, Python checks) in that build
#   fuzz TARGET   run libFuzzer target TARGET (safetensors | tune_table) from the committed
#                 seed corpus for FP8PROJ_FUZZ_SECONDS (default 60) seconds
# Exits 77 (ctest: skipped, with the reason) where clang++ with libFuzzer is not installed.
set -euo pipefail
src=$1 bin=$2 mode=$3
dir="$bin/sanitize"
jobs=${FP8PROJ_JOBS:-2}
# Any sanitizer report fails the run; a failed allocation is an error the code must handle,
# not a sanitizer abort (tests/cpu/hostile_input_test.cpp: HugeTensorAllocationIsANamedError).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

cxx=$(command -v clang++-14 || command -v clang++ || true)
cc=$(command -v clang-14 || command -v clang || true)
if [ -z "$cxx" ] || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$cxx" -x c++ -fsanitize=fuzzer,address,undefined - -o "$bin/.fuzz_probe" 2>/dev/null; then
  echo "SKIPPED: clang++ with libFuzzer and the sanitizer runtimes is not installed (scripts/setup-deps.sh installs clang-14 libclang-rt-14-dev)"
  exit 77
fi
rm -f "$bin/.fuzz_probe"

case "$mode" in
  build)
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -fsanitize=fuzzer-no-link -g -O1"
    launcher=()
    command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    cmake -S "$src" -B "$dir" -DFP8PROJ_CUDA=OFF -DFP8PROJ_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" \
      -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
    cmake --build "$dir" -j "$jobs" --target fp8proj_cpu_tests fp8proj_cli fp8proj_format_probe \
      fp8proj_safetensors_probe fuzz_safetensors fuzz_tune_table
    ;;
  tests)
    # The install test needs every installable target; this tree builds the test targets only
    # (the main build runs it).
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" -L cpu -E '^package\.'
    ;;
  fuzz)
    target=$4
    seconds=${FP8PROJ_FUZZ_SECONDS:-60}
    work="$dir/fuzz_work/$target"
    rm -rf "$work" && mkdir -p "$work/corpus" "$work/artifacts"
    # Fresh copy of the committed seeds: what the run finds stays in the build tree.
    cp "$src/tests/fuzz/corpus/$target"/* "$work/corpus/"
    "$dir/tests/fuzz/fuzz_$target" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -seed=${FP8PROJ_FUZZ_SEED:-1} -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus"
    ;;
  *)
    echo "usage: run.sh SRC BUILD build|tests|fuzz TARGET" >&2
    exit 2
    ;;
esac

// libFuzzer target: the safetensors parser (header length, JSON header, entries, tiling) on
// arbitrary bytes. Any input may be rejected with fp8proj::Error; nothing else may escape, and
// ASan/UBSan (the build's flags) report any memory or undefined-behaviour error as a crash.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fp8proj/error.hpp"
#include "io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto parsed = fp8proj::io::parse_safetensors(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), "fuzz.safetensors");
    // Touch what an accepted file hands out: every record's bytes lie inside the input.
    size_t sum = 0;
    for (const auto& t : parsed.tensors)
      for (std::byte b : t.data) sum += static_cast<size_t>(b);
    (void)sum;
  } catch (const fp8proj::Error&) {
  }
  return 0;
}

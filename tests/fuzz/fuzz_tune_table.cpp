// libFuzzer target: the tuned-table parser (JSON, stamp, shapes, buckets) on arbitrary bytes.
// Any input may be rejected with fp8proj::Error; an accepted table is looked up at every
// bucket edge, as the layer does.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fp8proj/error.hpp"
#include "fp8proj/tune.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const fp8proj::TuneTable t =
        fp8proj::parse_tune_table(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
    for (const auto& s : t.shapes) {
      if (t.find(s.n, s.k) != &s) __builtin_trap();
      for (const auto& b : s.buckets)
        if (s.bucket_for(b.m_lo) != &b || s.bucket_for(b.m_hi) != &b) __builtin_trap();
    }
  } catch (const fp8proj::Error&) {
  }
  return 0;
}

// Feeds the library's format conversions to the Python oracle test (test_formats.py):
//   format_probe encode   < float32[]  > uint8[]    float_to_e4m3
//   format_probe decode                > float32[256] e4m3_to_float of every code
//   format_probe ue8m0    < float32[]  > uint8[]    ue8m0_scale_for_amax(x, 1e-4) then (x, 1e-10)
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fp8proj/formats.hpp"

namespace {
std::vector<float> read_floats() {
  std::vector<float> in;
  float buf[4096];
  size_t got;
  while ((got = std::fread(buf, sizeof(float), 4096, stdin)) > 0) in.insert(in.end(), buf, buf + got);
  return in;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: format_probe encode|decode|ue8m0\n");
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "decode") {
    for (int c = 0; c < 256; ++c) {
      const float v = fp8proj::e4m3_to_float(static_cast<uint8_t>(c));
      std::fwrite(&v, sizeof v, 1, stdout);
    }
    return 0;
  }
  const std::vector<float> in = read_floats();
  std::vector<uint8_t> out;
  if (mode == "encode") {
    for (float x : in) out.push_back(fp8proj::float_to_e4m3(x));
  } else if (mode == "ue8m0") {
    for (float x : in) out.push_back(fp8proj::ue8m0_scale_for_amax(x, fp8proj::kWeightAmaxEps));
    for (float x : in) out.push_back(fp8proj::ue8m0_scale_for_amax(x, fp8proj::kActAmaxEps));
  } else {
    std::fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

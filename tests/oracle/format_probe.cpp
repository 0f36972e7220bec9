// Feeds the library's format conversions to the Python oracle test (test_formats.py):
//   format_probe encode   < float32[]  > uint8[]    float_to_e4m3
//   format_probe decode                > float32[256] e4m3_to_float of every code
//   format_probe ue8m0    < float32[]  > uint8[]    ue8m0_scale_for_amax(x, 1e-4) then (x, 1e-10)
//   format_probe fp32_weight N K < float32[N*K] > float32 scales[ceil(N/128)*ceil(K/128)] uint8[N*K]
//                                                   cpu::quantize_weight, ScaleMode::fp32 ("float")
//   format_probe fp32_act M K    < float32[M*K] > float32 scales[K/128][round_up(M,4)] uint8[M*K]
//                                                   cpu::quantize_activation, ScaleMode::fp32
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fp8proj/formats.hpp"
#include "fp8proj/quantize.hpp"

namespace {
std::vector<float> read_floats() {
  std::vector<float> in;
  float buf[4096];
  size_t got;
  while ((got = std::fread(buf, sizeof(float), 4096, stdin)) > 0) in.insert(in.end(), buf, buf + got);
  return in;
}
}  // namespace

template <typename Q>
int write_quantized(const Q& q) {
  std::fwrite(q.scales.data(), sizeof(float), q.scales.size(), stdout);
  std::fwrite(q.values.data(), 1, q.values.size(), stdout);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4) {  // the fp32-scale quantizers over a whole tensor
    const std::string mode = argv[1];
    const int64_t rows = std::atoll(argv[2]), cols = std::atoll(argv[3]);
    const std::vector<float> in = read_floats();
    if (rows <= 0 || cols <= 0 || static_cast<int64_t>(in.size()) != rows * cols) {
      std::fprintf(stderr, "%s: expected %lld x %lld floats on stdin, got %zu\n", argv[1], (long long)rows,
                   (long long)cols, in.size());
      return 2;
    }
    if (mode == "fp32_weight") {
      fp8proj::HostFp8Weight q = fp8proj::make_host_fp8_weight(rows, cols);
      fp8proj::cpu::quantize_weight(in.data(), rows, cols, q.out(), fp8proj::ScaleMode::fp32);
      return write_quantized(q);
    }
    if (mode == "fp32_act") {
      fp8proj::HostFp8Activation q = fp8proj::make_host_fp8_activation(rows, cols);
      fp8proj::cpu::quantize_activation(in.data(), rows, cols, q.out(), fp8proj::ScaleMode::fp32);
      return write_quantized(q);
    }
    std::fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: format_probe encode|decode|ue8m0 | fp32_weight N K | fp32_act M K\n");
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

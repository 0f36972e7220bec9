// Reads safetensors file paths from stdin, one a line, and prints for each one line:
//   ok <tensors> then per tensor (in name order) " hex-of-name:dtype:[shape]:fnv1a64-of-bytes"
//   err <message>
// tests/oracle/test_safetensors_differential.py compares this with the reference parser.
// Lines "ck PATH" open PATH as a Checkpoint (file, folder or index), "fp8 PATH TENSOR" and
// "bf16 PATH TENSOR" read a tensor from it (tests/fuzz/recount.py); they print "ok" or "err".
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

#include "fp8proj/checkpoint.hpp"
#include "fp8proj/error.hpp"
#include "io/safetensors.hpp"

int main() {
  std::string path;
  while (std::getline(std::cin, path)) {
    try {
      const auto sp = path.find(' ');
      const std::string verb = sp == std::string::npos ? "" : path.substr(0, sp);
      if (verb == "ck" || verb == "fp8" || verb == "bf16") {
        std::string rest = path.substr(sp + 1), tensor;
        if (verb != "ck") {
          const auto sp2 = rest.rfind(' ');
          tensor = rest.substr(sp2 + 1);
          rest = rest.substr(0, sp2);
        }
        const fp8proj::Checkpoint c(rest);
        if (verb == "fp8") (void)c.read_fp8_weight(tensor);
        if (verb == "bf16") (void)c.read_bf16(tensor);
        std::cout << "ok " << c.size() << "\n" << std::flush;
        continue;
      }
      const fp8proj::io::SafetensorsFile f(path);
      std::map<std::string, std::string> by_name;
      for (const auto& t : f.tensors()) {
        uint64_t h = 1469598103934665603ull;
        for (std::byte b : t.data) h = (h ^ static_cast<uint8_t>(b)) * 1099511628211ull;
        std::string shape;
        for (size_t i = 0; i < t.info.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(t.info.shape[i]);
        std::string hex;
        for (unsigned char c : t.info.name) hex += "0123456789abcdef"[c >> 4], hex += "0123456789abcdef"[c & 15];
        by_name[hex] = std::string(fp8proj::dtype_name(t.info.dtype)) + ":[" + shape + "]:" + std::to_string(h);
      }
      std::cout << "ok " << by_name.size();
      for (const auto& [n, d] : by_name) std::cout << " " << n << ":" << d;
      std::cout << "\n";
    } catch (const fp8proj::Error& e) {
      std::string m = e.what();
      for (char& c : m)
        if (c == '\n') c = ' ';
      std::cout << "err " << m << "\n";
    }
    std::cout.flush();
  }
  return 0;
}

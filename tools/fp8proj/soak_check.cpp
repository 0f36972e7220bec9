// The soak's inputs, guarded outputs and checks (soak.hpp). Every output lies between two 64 KiB
// guard regions of canary bytes and is poisoned (0xFFFF, a bf16 NaN) before the calls; after
// them: every guard byte intact, every element written and finite (a planted row: all NaN), the
// sampled rows against the fp64 oracle, and a twin call bitwise equal to the first.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "fp8proj/error.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/reference.hpp"
#include "soak.hpp"

namespace fp8proj::cli::soak {

namespace {

// Grows a buffer to at least `bytes` (a quarter more, to grow rarely); never empty.
void reserve(Buffer& b, MemorySpace space, size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  if (b.bytes() < bytes) {
    b = Buffer();  // free first: the largest buffers are gigabytes
    b = Buffer(space, bytes + bytes / 4);
  }
}

bool finite_bits(uint16_t v) { return (v & 0x7F80u) != 0x7F80u; }
bool nan_bits(uint16_t v) { return (v & 0x7FFFu) > 0x7F80u; }

}  // namespace

// ---- inputs ----

void Inputs::prepare(const Draw& d) {
  const int64_t m = d.m, k = d.shape.k, stride = d.x_stride;
  reserve(x_, space_, static_cast<size_t>(m * stride) * sizeof(bf16));
  fill_normal(space_, x_.data<bf16>(), m * stride, mix(d.data_seed ^ 1), d.x_stddev);
  if (d.nan_row >= 0) {
    const bf16 v = bf16::from_bits(d.nan_inf ? 0x7F80 : 0x7FC1);  // +inf / a quiet NaN
    copy_bytes(x_.data<bf16>() + d.nan_row * stride + d.nan_col, space_, &v, MemorySpace::host, sizeof v);
  }
  reserve(g_, space_, static_cast<size_t>(k) * sizeof(bf16));
  fill_normal(space_, g_.data<bf16>(), k, mix(d.data_seed ^ 2), 1.0f);
  g_host_.resize(static_cast<size_t>(k));
  copy_bytes(g_host_.data(), MemorySpace::host, g_.data(), space_, g_host_.size() * sizeof(bf16));
  if (d.entry == Entry::quantized) {  // the caller's own quantization (an epilogue's, in a model)
    const int64_t ld = activation_scale_ld(m);
    reserve(qv_, space_, static_cast<size_t>(m * k));
    reserve(qs_, space_, static_cast<size_t>(k / 128 * ld) * sizeof(float));
    q_ = {qv_.data<uint8_t>(), qs_.data<float>(), m, k, ld};
    const QuantOps& ops = quant_ops(space_);
    ops.quantize_activation(x_.data<bf16>(), m, k, q_, nullptr);
    ops.synchronize(nullptr);
  }
  rows_.resize(d.sample_rows.size() * static_cast<size_t>(k));
  if (static_cast<int64_t>(d.sample_rows.size()) == m) {  // every row: one copy, then drop the stride
    std::vector<bf16> all(static_cast<size_t>(m * stride));
    copy_bytes(all.data(), MemorySpace::host, x_.data(), space_, all.size() * sizeof(bf16));
    for (int64_t i = 0; i < m; ++i) std::copy_n(all.data() + i * stride, k, rows_.data() + i * k);
    return;
  }
  for (size_t i = 0; i < d.sample_rows.size(); ++i)
    copy_bytes(rows_.data() + i * k, MemorySpace::host, x_.data<bf16>() + d.sample_rows[i] * stride, space_,
               static_cast<size_t>(k) * sizeof(bf16));
}

// ---- guarded outputs ----

uint8_t* GuardedOutputs::slot(int i) const {
  FP8PROJ_CHECK(i >= 0 && i < count_, "soak: output ", i, " of ", count_);
  return buf_.data<uint8_t>() + static_cast<size_t>(i) * slot_bytes_;
}

// Layout of output i: [guard | m x n bf16 | guard], each output 256-byte aligned (kGuardBytes
// is a multiple of 256); the second guard starts at the output's last byte + 1.
bf16* GuardedOutputs::out(int i) const { return reinterpret_cast<bf16*>(slot(i) + kGuardBytes); }

void GuardedOutputs::prepare(int count, int64_t m, int64_t n) {
  if (canary_.empty()) {
    canary_.resize(kGuardBytes);
    for (size_t j = 0; j < kGuardBytes; ++j) canary_[j] = guard_byte(j);
  }
  out_bytes_ = static_cast<size_t>(m * n) * sizeof(bf16);
  slot_bytes_ = static_cast<size_t>(round_up(static_cast<int64_t>(2 * kGuardBytes + out_bytes_), 256));
  count_ = count;
  reserve(buf_, space_, slot_bytes_ * static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    copy_bytes(slot(i), space_, canary_.data(), MemorySpace::host, kGuardBytes);
    copy_bytes(slot(i) + kGuardBytes + out_bytes_, space_, canary_.data(), MemorySpace::host, kGuardBytes);
    fill_bytes(space_, out(i), out_bytes_, 0xFF);
  }
}

void GuardedOutputs::poison_async(int count, StreamHandle stream) const {
  for (int i = 0; i < count; ++i) {
    if (space_ == MemorySpace::host)
      std::memset(static_cast<void*>(out(i)), 0xFF, out_bytes_);
    else
      memset_async(out(i), 0xFF, out_bytes_, stream);
  }
}

GuardedOutputs::Damage GuardedOutputs::check_guards(int i) const {
  Damage d;
  std::vector<uint8_t> g(kGuardBytes);
  copy_bytes(g.data(), MemorySpace::host, slot(i), space_, kGuardBytes);
  for (size_t j = 0; j < kGuardBytes; ++j)
    if (g[j] != canary_[j]) {
      if (d.first < 0) d.first = static_cast<int64_t>(j) - static_cast<int64_t>(kGuardBytes);
      ++d.before;
    }
  copy_bytes(g.data(), MemorySpace::host, slot(i) + kGuardBytes + out_bytes_, space_, kGuardBytes);
  for (size_t j = 0; j < kGuardBytes; ++j)
    if (g[j] != canary_[j]) {
      if (d.first < 0) d.first = static_cast<int64_t>(out_bytes_ + j);
      ++d.after;
    }
  return d;
}

void GuardedOutputs::fetch(int i, std::vector<uint16_t>& into) const {
  into.resize(out_bytes_ / sizeof(uint16_t));
  copy_bytes(into.data(), MemorySpace::host, out(i), space_, out_bytes_);
}

void GuardedOutputs::poke_guard_after(int i) const {
  const uint8_t b = static_cast<uint8_t>(~canary_[0]);
  copy_bytes(slot(i) + kGuardBytes + out_bytes_, space_, &b, MemorySpace::host, 1);
}

void GuardedOutputs::poke_element(int i, int64_t index, uint16_t bits) const {
  copy_bytes(reinterpret_cast<uint16_t*>(out(i)) + index, space_, &bits, MemorySpace::host, sizeof bits);
}

// ---- the oracle ----

std::vector<double> reference_rows(const Draw& d, const Inputs& in, LayerGroup& g, bool fp8) {
  const auto s = static_cast<int64_t>(d.sample_rows.size());
  const int64_t n = d.shape.n, k = d.shape.k;
  if (s == 0) return {};
  const bool norm = d.entry == Entry::rmsnorm;
  std::vector<float> a;
  if (fp8) {  // what the FP8 path computes from: the CPU quantization (bit-exact with the GPU's)
    HostFp8Activation q = make_host_fp8_activation(s, k);
    if (norm)
      cpu::rmsnorm_quantize(in.rows().data(), k, in.norm_host().data(), kRmsNormEps, s, k, q.out());
    else
      cpu::quantize_activation(in.rows().data(), s, k, q.out());
    a = cpu::dequantize(q.view());
  } else if (norm) {
    std::vector<bf16> y(static_cast<size_t>(s * k));
    cpu::rmsnorm(in.rows().data(), k, in.norm_host().data(), kRmsNormEps, s, k, y.data());
    a = cpu::to_float(y.data(), s * k);
  } else {
    a = cpu::to_float(in.rows().data(), s * k);
  }
  const std::vector<float>& w = fp8 ? g.weight_dequant() : g.weight_f32();
  // W . A^T: the oracle's threads split its first operand's rows, here all N of them.
  const std::vector<double> t = cpu::gemm_f64(w.data(), a.data(), n, s, k);
  std::vector<double> out(static_cast<size_t>(s * n));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < s; ++i) out[i * n + j] = t[j * s + i];
  return out;
}

// ---- the checks ----

std::string OutputCheck::summary() const {
  std::string text = ok() ? "ok" : "FAILED:";
  for (size_t i = 0; i < problems.size(); ++i) text += (i ? "; " : " ") + problems[i];
  if (compared) text += fmt::format(" (sampled rows: rel. error {:.3e}, bound {:.3e})", rel_err, tol);
  return text;
}

OutputCheck check_output(const Draw& d, const GuardedOutputs& out, int i, bool fp8, const std::vector<double>& ref,
                         const std::vector<uint16_t>* first, std::vector<uint16_t>& bits) {
  OutputCheck c;
  c.guard = out.check_guards(i);
  if (c.guard.before || c.guard.after)
    c.problems.push_back(fmt::format("guard region written: {} bytes before the output, {} after it (first at byte {} "
                                     "from the output's start, which is {} bytes long)",
                                     c.guard.before, c.guard.after, c.guard.first, out.out_bytes()));
  const int64_t m = d.m, n = d.shape.n;
  out.fetch(i, bits);
  int64_t first_unwritten = -1, first_bad = -1;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t v = bits[r * n + j];
      if (v == kPoison) {
        if (c.unwritten++ == 0) first_unwritten = r * n + j;
      } else if (r == d.nan_row) {
        c.nan_row_finite += fp8 ? !nan_bits(v) : finite_bits(v);
      } else if (!finite_bits(v)) {
        if (c.non_finite++ == 0) first_bad = r * n + j;
      }
    }
  if (c.unwritten)
    c.problems.push_back(fmt::format("{} of {} outputs never written (first: row {}, column {})", c.unwritten, m * n,
                                     first_unwritten / n, first_unwritten % n));
  if (c.non_finite)
    c.problems.push_back(fmt::format("{} outputs NaN or infinite (first: row {}, column {})", c.non_finite,
                                     first_bad / n, first_bad % n));
  if (c.nan_row_finite)
    c.problems.push_back(fmt::format("{} outputs of the row with the planted {} are {}", c.nan_row_finite,
                                     d.nan_inf ? "infinity" : "NaN", fp8 ? "not NaN" : "finite"));

  // The sampled rows (the planted one aside) against the oracle. The numerics contract's bound
  // (docs/design.md): twice the bf16 rounding of the exact product itself, or the fixed 2e-3
  // where that is larger (the rounding of a few outputs can read above 1e-3 by chance).
  std::vector<bf16> y;
  std::vector<double> p;
  for (size_t s = 0; s < d.sample_rows.size(); ++s) {
    const int64_t r = d.sample_rows[s];
    if (r == d.nan_row) continue;
    for (int64_t j = 0; j < n; ++j) {
      y.push_back(bf16::from_bits(bits[r * n + j]));
      p.push_back(ref[s * n + j]);
    }
  }
  if (!y.empty()) {
    const ErrorStats e = compare(y.data(), p.data(), static_cast<int64_t>(y.size()));
    double num = 0, den = 0;
    for (double v : p) {
      const double rounded = bf16_to_float(float_to_bf16(static_cast<float>(v)));
      num += (rounded - v) * (rounded - v);
      den += v * v;
    }
    const double rounding = den > 0 ? std::sqrt(num / den) : 0;
    c.compared = true;
    c.rel_err = e.rel_frobenius;
    c.tol = std::max(fp8 ? kFp8GemmRelTol : kBf16GemmRelTol, 2 * rounding);
    if (!(c.rel_err <= c.tol))
      c.problems.push_back(fmt::format("wrong values: relative Frobenius error {:.3e} above {:.3e} over {} sampled "
                                       "rows ({} outputs not finite there)",
                                       c.rel_err, c.tol, y.size() / n, e.non_finite));
  }
  if (first) {
    int64_t differ = 0, at = -1;
    for (size_t j = 0; j < bits.size(); ++j)
      if (bits[j] != (*first)[j] && differ++ == 0) at = static_cast<int64_t>(j);
    c.bits_differ = differ > 0;
    if (differ)
      c.problems.push_back(fmt::format("not deterministic: {} outputs differ from the first call's bits (first: row "
                                       "{}, column {})",
                                       differ, at / n, at % n));
  }
  return c;
}

}  // namespace fp8proj::cli::soak

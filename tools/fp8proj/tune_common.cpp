// The pieces `fp8proj tune` and its check share (tune_common.hpp): the progress bar, CSV
// escaping, durations and shape labels.
#include "tune_common.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "fp8proj/error.hpp"
#include "fp8proj/models.hpp"

namespace fp8proj::cli {

std::string format_duration(double s) {
  const auto t = static_cast<int64_t>(std::max(0.0, std::round(s)));
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

Progress::Progress(double total_us) : total_(total_us), tty_(isatty(STDERR_FILENO) == 1) {
  t0_ = last_draw_ = std::chrono::steady_clock::now();
}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void Progress::start(const std::string& what) {
  what_ = what;
  draw(false);
}

void Progress::done(double us) {
  done_ += us;
  draw(false);
}

void Progress::clear() {
  if (tty_ && shown_) std::fprintf(stderr, "\r\033[K");
  shown_ = false;
}

void Progress::finish() {
  done_ = total_;
  if (tty_ || last_step_ != 20) draw(true);
  if (tty_) std::fprintf(stderr, "\n");
  shown_ = false;
}

void Progress::draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  const double f = total_ > 0 ? std::min(1.0, done_ / total_) : 1.0;
  const int step = static_cast<int>(f * 20);  // 5% steps for log files
  if (!force) {
    if (tty_ && shown_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    if (!tty_ && step == last_step_) return;
  }
  last_draw_ = now;
  last_step_ = step;
  const double el = elapsed_s();
  // ETA from the measured rate once a little is done; before that, from the estimate.
  const double eta = f > 0.02 ? el * (1 - f) / f : (total_ - done_) * 1e-6;
  constexpr int kWidth = 24;
  const int fill = static_cast<int>(f * kWidth);
  std::string what = what_;
  if (what.size() > 72) what = what.substr(0, 69) + "...";
  const std::string line =
      fmt::format("[{}{}] {:3.0f}%  {} elapsed, ETA {}  {}", std::string(fill, '#'), std::string(kWidth - fill, '.'),
                  100 * f, format_duration(el), format_duration(eta), what);
  if (tty_)
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
  else
    std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  shown_ = true;
}

std::string shape_label(int64_t n, int64_t k) {
  std::string out;
  for (const std::string& model : model_names())
    for (int tp : {1, 2, 4, 8}) {
      std::vector<ProjectionShape> shapes;
      try {
        shapes = dense_gemm_shapes(model, tp);
      } catch (const Error&) {
        continue;  // TP does not divide this model's heads
      }
      for (const auto& s : shapes)
        if (s.n == n && s.k == k)
          out += (out.empty() ? "" : " = ") + s.model + " " + s.gemm + " TP" + std::to_string(tp);
    }
  return out.empty() ? "custom" : out;
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

}  // namespace fp8proj::cli

// Pieces shared by `fp8proj tune` (cmd_tune.cpp) and its validation mode `fp8proj tune
// --check` (cmd_gatecheck.cpp), defined in tune_common.cpp: the progress bar, CSV escaping,
// durations, shape labels.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace fp8proj::cli {

// A progress bar on stderr: what is being measured now, the share of the estimated work
// done, elapsed time and ETA (the estimate recalibrated by the time the done part took). On
// a terminal it redraws one line; otherwise (a log file) it prints a line every 5%.
class Progress {
 public:
  explicit Progress(double total_us);
  void add_work(double us) { total_ += us; }
  // Before a measurement: what it is (shown at once on a terminal).
  void start(const std::string& what);
  // After it: its share of the estimated work.
  void done(double us);
  // Removes the bar before something else prints; the next update redraws it.
  void clear();
  void finish();
  double elapsed_s() const;

 private:
  void draw(bool force);
  double total_ = 0, done_ = 0;
  std::string what_;
  bool tty_ = false, shown_ = false;
  int last_step_ = -1;
  std::chrono::steady_clock::time_point t0_, last_draw_;
};

// A CSV field, quoted when it holds a comma, a quote or a newline.
std::string csv_escape(const std::string& s);
// "1:05" / "12:40" / "1:02:03".
std::string format_duration(double seconds);
// "glm5 q_b_proj TP1" when (n, k) is a known model shape at TP 1, 2, 4 or 8 (names joined by
// " = " when several share it), else "custom".
std::string shape_label(int64_t n, int64_t k);

}  // namespace fp8proj::cli

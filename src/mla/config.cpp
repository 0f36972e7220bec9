// MlaConfig (include/fp8proj/mla.hpp): presets, RoPE frequencies with YaRN, validation.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "fp8proj/error.hpp"
#include "fp8proj/mla.hpp"

namespace fp8proj {

namespace {

// YaRN's mscale: 0.1 * m * ln(factor) + 1 for factor > 1 (DeepSeek's yarn_get_mscale).
double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

// The rope dimension pair index at which a wavelength makes `rotations` turns over the
// original context: dim * ln(L / (rotations * 2 pi)) / (2 ln theta).
double yarn_correction_dim(double rotations, int dim, double theta, double original_len) {
  return dim * std::log(original_len / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
}

}  // namespace

MlaConfig MlaConfig::preset(std::string_view model, int tp_size, int tp_rank) {
  MlaConfig c;
  if (model == "glm5") {
    // GLM-5 (glm_moe_dsa): plain RoPE with theta 1e6, rms_norm_eps 1e-5.
    c.model = "glm5";
    c.hidden = 6144;
    c.heads = 64;
    c.q_lora_rank = 2048;
    c.kv_lora_rank = 512;
    c.qk_nope_dim = 192;
    c.qk_rope_dim = 64;
    c.v_head_dim = 256;
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-5f;
  } else if (model == "deepseek-v3") {
    c.model = "deepseek-v3";
    c.hidden = 7168;
    c.heads = 128;
    c.q_lora_rank = 1536;
    c.kv_lora_rank = 512;
    c.qk_nope_dim = 128;
    c.qk_rope_dim = 64;
    c.v_head_dim = 128;
    c.rope_theta = 10000.0;
    c.yarn = YarnScaling{40.0, 4096, 32.0, 1.0, 1.0, 1.0};
    c.rms_norm_eps = 1e-6f;
  } else if (model == "deepseek-v2-lite") {
    c.model = "deepseek-v2-lite";
    c.hidden = 2048;
    c.heads = 16;
    c.q_lora_rank = 0;  // plain q_proj 3072x2048
    c.kv_lora_rank = 512;
    c.qk_nope_dim = 128;
    c.qk_rope_dim = 64;
    c.v_head_dim = 128;
    c.rope_theta = 10000.0;
    c.yarn = YarnScaling{40.0, 4096, 32.0, 1.0, 0.707, 0.707};
    c.rms_norm_eps = 1e-6f;
  } else {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    FP8PROJ_FAIL("unknown MLA model '", model, "' (known: ", known, ")");
  }
  c.tp_size = tp_size;
  c.tp_rank = tp_rank;
  c.validate();
  return c;
}

std::vector<std::string> MlaConfig::preset_names() { return {"glm5", "deepseek-v3", "deepseek-v2-lite"}; }

float MlaConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (yarn && yarn->mscale_all_dim != 0.0) {
    const double m = yarn_mscale(yarn->factor, yarn->mscale_all_dim);
    s *= m * m;
  }
  return static_cast<float>(s);
}

float MlaConfig::rope_mscale() const {
  if (!yarn) return 1.0f;
  return static_cast<float>(yarn_mscale(yarn->factor, yarn->mscale) / yarn_mscale(yarn->factor, yarn->mscale_all_dim));
}

std::vector<float> MlaConfig::rope_inv_freq() const {
  const int pairs = qk_rope_dim / 2;
  std::vector<float> out(static_cast<size_t>(pairs));
  double low = 0, high = 0;
  if (yarn) {
    // Pairs below `low` turn fast enough to keep their frequency (extrapolate), pairs above
    // `high` are interpolated (f / factor), a linear ramp in between. DeepSeek-V3 (rope 64,
    // theta 1e4, 4096 positions, beta 32/1): low = 10, high = 23.
    low = std::max(std::floor(yarn_correction_dim(yarn->beta_fast, qk_rope_dim, rope_theta,
                                                  static_cast<double>(yarn->original_max_position))),
                   0.0);
    high = std::min(std::ceil(yarn_correction_dim(yarn->beta_slow, qk_rope_dim, rope_theta,
                                                  static_cast<double>(yarn->original_max_position))),
                    static_cast<double>(qk_rope_dim - 1));
    if (high == low) high += 0.001;  // as the reference does, to avoid a zero-width ramp
  }
  for (int i = 0; i < pairs; ++i) {
    const double f = 1.0 / std::pow(rope_theta, 2.0 * i / qk_rope_dim);
    double v = f;
    if (yarn) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double keep = 1.0 - ramp;  // weight of the original frequency
      v = f / yarn->factor * (1.0 - keep) + f * keep;
    }
    out[static_cast<size_t>(i)] = static_cast<float>(v);
  }
  return out;
}

void MlaConfig::validate() const {
  const std::string who = "MLA config '" + model + "': ";
  FP8PROJ_CHECK(hidden > 0 && hidden % 8 == 0, who, "hidden must be a positive multiple of 8, got ", hidden);
  FP8PROJ_CHECK(heads > 0, who, "heads must be positive, got ", heads);
  FP8PROJ_CHECK(tp_size >= 1 && heads % tp_size == 0, who, "tp_size ", tp_size, " does not divide the ", heads,
                " heads");
  FP8PROJ_CHECK(tp_rank >= 0 && tp_rank < tp_size, who, "tp_rank ", tp_rank, " is outside [0, ", tp_size, ")");
  FP8PROJ_CHECK(q_lora_rank >= 0 && q_lora_rank % 8 == 0, who,
                "q_lora_rank must be 0 (no q LoRA) or a multiple of 8, got ", q_lora_rank);
  // The absorbed decode projections step K by 32 (kv_lora for W_UV, nope for W_UK).
  FP8PROJ_CHECK(kv_lora_rank > 0 && kv_lora_rank % 32 == 0, who, "kv_lora_rank must be a positive multiple of 32, got ",
                kv_lora_rank);
  FP8PROJ_CHECK(qk_nope_dim > 0 && qk_nope_dim % 32 == 0, who, "qk_nope_head_dim must be a positive multiple of 32, got ",
                qk_nope_dim);
  // RoPE and the cache rows move 16-byte vectors (8 bf16); rope pairs stay inside one vector.
  FP8PROJ_CHECK(qk_rope_dim > 0 && qk_rope_dim % 8 == 0 && qk_rope_dim <= 256, who,
                "qk_rope_head_dim must be a multiple of 8 in [8, 256], got ", qk_rope_dim);
  FP8PROJ_CHECK(v_head_dim > 0 && v_head_dim % 8 == 0, who, "v_head_dim must be a positive multiple of 8, got ",
                v_head_dim);
  FP8PROJ_CHECK(rope_theta > 1.0, who, "rope_theta must be > 1, got ", rope_theta);
  FP8PROJ_CHECK(rms_norm_eps >= 0.0f, who, "rms_norm_eps must be >= 0");
  if (yarn) {
    FP8PROJ_CHECK(yarn->factor >= 1.0 && yarn->original_max_position > 0 && yarn->beta_fast > 0 &&
                      yarn->beta_slow > 0,
                  who, "YaRN needs factor >= 1, original_max_position > 0 and positive betas");
  }
}

std::string MlaConfig::describe() const {
  std::string s = model + ": hidden " + std::to_string(hidden) + ", " + std::to_string(heads) + " heads (" +
                  std::to_string(local_heads()) + " on rank " + std::to_string(tp_rank) + "/" +
                  std::to_string(tp_size) + "), ";
  s += has_q_lora() ? "q_lora " + std::to_string(q_lora_rank) : std::string("no q_lora (q_proj)");
  s += ", kv_lora " + std::to_string(kv_lora_rank) + ", nope/rope/v " + std::to_string(qk_nope_dim) + "/" +
       std::to_string(qk_rope_dim) + "/" + std::to_string(v_head_dim) + ", RoPE theta " +
       std::to_string(static_cast<int64_t>(rope_theta));
  if (yarn) s += " YaRN x" + std::to_string(static_cast<int>(yarn->factor));
  return s;
}

}  // namespace fp8proj

// Environment knobs parse strictly and say which variable was wrong.
#include <gtest/gtest.h>

#include "core/device_testing.hpp"
#include "core/pdl.hpp"
#include "env_guard.hpp"
#include "fp8proj/env.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/models.hpp"

namespace fp8proj {
namespace {

using testing::EnvGuard;

TEST(Env, PrefillFp8Values) {
  {
    EnvGuard g("FP8PROJ_PREFILL_FP8", nullptr);
    EXPECT_FALSE(env::prefill_fp8().has_value());
  }
  for (const char* on : {"1", "on", "prefill", "TRUE"}) {
    EnvGuard g("FP8PROJ_PREFILL_FP8", on);
    ASSERT_TRUE(env::prefill_fp8().has_value()) << on;
    EXPECT_TRUE(env::prefill_fp8()->enabled) << on;
    EXPECT_FALSE(env::prefill_fp8()->policy_all) << on;
  }
  {
    EnvGuard g("FP8PROJ_PREFILL_FP8", "all");
    EXPECT_TRUE(env::prefill_fp8()->policy_all);
  }
  {
    EnvGuard g("FP8PROJ_PREFILL_FP8", "0");
    EXPECT_FALSE(env::prefill_fp8()->enabled);
  }
  {
    EnvGuard g("FP8PROJ_PREFILL_FP8", "2");
    try {
      env::prefill_fp8();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FP8PROJ_PREFILL_FP8"), std::string::npos);
    }
  }
}

TEST(Env, IntegersAreStrict) {
  {
    EnvGuard g("FP8PROJ_MIN_FP8_TOKENS", "1024");
    EXPECT_EQ(env::min_fp8_tokens(), 1024);
  }
  for (const char* bad : {"12x", "-5", "abc", "1e3"}) {
    EnvGuard g("FP8PROJ_MIN_FP8_TOKENS", bad);
    EXPECT_THROW(env::min_fp8_tokens(), Error) << bad;
  }
  {
    EnvGuard g("FP8PROJ_LOG_LEVEL", "loud");
    EXPECT_THROW(env::log_level(), Error);
  }
}

// FP8PROJ_PDL: exactly 0 or 1; anything else is an error naming the variable and the values.
TEST(Env, PdlValues) {
  {
    EnvGuard g("FP8PROJ_PDL", nullptr);
    EXPECT_FALSE(env::pdl().has_value());
    EXPECT_TRUE(env::kDefaultPdl) << "PDL is on by default (measured faster at every decode point)";
  }
  {
    EnvGuard g("FP8PROJ_PDL", "1");
    EXPECT_EQ(env::pdl(), std::optional<bool>(true));
  }
  {
    EnvGuard g("FP8PROJ_PDL", "0");
    EXPECT_EQ(env::pdl(), std::optional<bool>(false));
  }
  for (const char* bad : {"2", "on", "true", "yes", " 1", "1 ", "01", "-1"}) {
    EnvGuard g("FP8PROJ_PDL", bad);
    try {
      env::pdl();
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("FP8PROJ_PDL='"), std::string::npos) << what;
      EXPECT_NE(what.find("is not one of 0, 1"), std::string::npos) << what;
    }
  }
}

// The override the GPU tests use wins over the knob and hands back to it.
TEST(Env, PdlTestingOverride) {
  set_pdl_for_testing(true);
  EXPECT_TRUE(pdl_enabled());
  set_pdl_for_testing(false);
  EXPECT_FALSE(pdl_enabled());
  set_pdl_for_testing(std::nullopt);
}

TEST(Models, ShapesOfDesignTable) {
  auto glm = projection_shapes("glm5", 4);
  ASSERT_EQ(glm.size(), 2u);
  EXPECT_EQ(glm[0].n, 4096);
  EXPECT_EQ(glm[0].k, 2048);
  EXPECT_EQ(glm[1].n, 6144);
  EXPECT_EQ(glm[1].k, 4096);
  auto ds = projection_shapes("deepseek-v3", 1);
  EXPECT_EQ(ds[0].n, 24576);
  EXPECT_EQ(ds[0].k, 1536);
  EXPECT_EQ(ds[1].n, 7168);
  EXPECT_EQ(ds[1].k, 16384);
  EXPECT_EQ(projection_shapes("deepseek-v3", 8)[0].n, 3072);
  EXPECT_THROW(projection_shapes("llama", 1), Error);
  EXPECT_THROW(projection_shapes("glm5", 3), Error);
}

}  // namespace
}  // namespace fp8proj

#include "mixers/attention/attention_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace stateflow {

void AttentionConfig::validate() const {
  auto in_range = [](const char* field, int64_t v, int64_t max) {
    SF_CHECK(v >= 1 && v <= max, "attention.", field, " must be >= 1 and <= ", max, ", got ", v);
  };
  in_range("heads", heads, 1024);
  in_range("kv_heads", kv_heads, heads);
  in_range("head_dim", head_dim, 1024);
  SF_CHECK(heads % kv_heads == 0, "attention.kv_heads = ", kv_heads, " must divide attention.heads = ", heads,
           " (each K/V head serves heads/kv_heads query heads)");
  SF_CHECK(rotary_dim == 0 || (rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= head_dim),
           "attention.rotary_dim = ", rotary_dim, " must be 0 (all of head_dim) or even and in 2..head_dim = ",
           head_dim);
  SF_CHECK(rope_theta > 1 && std::isfinite(rope_theta), "attention.rope_theta = ", rope_theta,
           " must be a finite number > 1 (typical: 1e4 to 1e7)");
  SF_CHECK(norm_eps > 0 && norm_eps < 1, "attention.norm_eps = ", norm_eps, " must be in (0, 1)");
}

nlohmann::json AttentionConfig::to_json() const {
  return {{"heads", heads},         {"kv_heads", kv_heads},       {"head_dim", head_dim},
          {"rotary_dim", rotary_dim}, {"rope_theta", rope_theta}, {"qk_norm", qk_norm},
          {"output_gate", output_gate}, {"norm_eps", norm_eps}};
}

void AttentionConfig::apply_json(const nlohmann::json& j) {
  SF_CHECK(j.is_object(), "attention config section must be a JSON object, got ", j.type_name());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    auto expect = [&](bool ok, const char* type) {
      SF_CHECK(ok, "attention.", k, " has the wrong type: expected ", type, ", got ", v.type_name());
    };
    auto integer = [&](int64_t& field) { expect(v.is_number_integer(), "an integer"), field = v.get<int64_t>(); };
    auto number = [&](double& field) { expect(v.is_number(), "a number"), field = v.get<double>(); };
    auto flag = [&](bool& field) { expect(v.is_boolean(), "true or false"), field = v.get<bool>(); };
    if (k == "heads") integer(heads);
    else if (k == "kv_heads") integer(kv_heads);
    else if (k == "head_dim") integer(head_dim);
    else if (k == "rotary_dim") integer(rotary_dim);
    else if (k == "rope_theta") number(rope_theta);
    else if (k == "qk_norm") flag(qk_norm);
    else if (k == "output_gate") flag(output_gate);
    else if (k == "norm_eps") number(norm_eps);
    else fail("attention: unknown field '", k, "'; fields: heads, kv_heads, head_dim, rotary_dim, rope_theta, ",
              "qk_norm, output_gate, norm_eps");
  }
}

int64_t AttentionConfig::num_parameters(int64_t d_model) const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  return d_model * (q + 2 * kv) + (output_gate ? d_model * q : 0) + (qk_norm ? 2 * head_dim : 0) + q * d_model;
}

}  // namespace stateflow

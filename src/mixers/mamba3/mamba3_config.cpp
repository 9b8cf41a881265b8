#include "mixers/mamba3/mamba3_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace stateflow {

void Mamba3Config::validate() const {
  auto in_range = [](const char* field, int64_t v, int64_t max) {
    SF_CHECK(v >= 1 && v <= max, "mamba3.", field, " must be >= 1 and <= ", max, ", got ", v);
  };
  in_range("heads", heads, 1024);
  in_range("head_dim", head_dim, 1024);
  in_range("state_size", state_size, 1024);
  in_range("rank", rank, 64);
  in_range("groups", groups, heads);
  in_range("block_size", block_size, 1024);
  SF_CHECK(heads % groups == 0, "mamba3.groups = ", groups, " must divide mamba3.heads = ", heads,
           " (each group's B and C serve heads/groups heads)");
  SF_CHECK(rope_fraction > 0 && rope_fraction <= 1, "mamba3.rope_fraction = ", rope_fraction,
           " must be in (0, 1] (0.5: half the state coordinates rotate; 1: all)");
  SF_CHECK(angles() >= 1, "mamba3.rope_fraction = ", rope_fraction, " with mamba3.state_size = ", state_size,
           " gives no rotary pair: raise either so that state_size * rope_fraction >= 2");
  SF_CHECK(a_floor > 0 && a_floor < 1, "mamba3.a_floor = ", a_floor, " must be in (0, 1)");
  SF_CHECK(norm_eps > 0 && norm_eps < 1, "mamba3.norm_eps = ", norm_eps, " must be in (0, 1)");
}

nlohmann::json Mamba3Config::to_json() const {
  return {{"heads", heads},       {"head_dim", head_dim},           {"state_size", state_size},
          {"rank", rank},         {"groups", groups},               {"rope_fraction", rope_fraction},
          {"block_size", block_size}, {"a_floor", a_floor},         {"norm_eps", norm_eps}};
}

void Mamba3Config::apply_json(const nlohmann::json& j) {
  SF_CHECK(j.is_object(), "mamba3 config section must be a JSON object, got ", j.type_name());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    auto expect = [&](bool ok, const char* type) {
      SF_CHECK(ok, "mamba3.", k, " has the wrong type: expected ", type, ", got ", v.type_name());
    };
    auto integer = [&](int64_t& field) { expect(v.is_number_integer(), "an integer"), field = v.get<int64_t>(); };
    auto number = [&](double& field) { expect(v.is_number(), "a number"), field = v.get<double>(); };
    if (k == "heads") integer(heads);
    else if (k == "head_dim") integer(head_dim);
    else if (k == "state_size") integer(state_size);
    else if (k == "rank") integer(rank);
    else if (k == "groups") integer(groups);
    else if (k == "rope_fraction") number(rope_fraction);
    else if (k == "block_size") integer(block_size);
    else if (k == "a_floor") number(a_floor);
    else if (k == "norm_eps") number(norm_eps);
    else fail("mamba3: unknown field '", k, "'; fields: heads, head_dim, state_size, rank, groups, rope_fraction, ",
              "block_size, a_floor, norm_eps");
  }
}

int64_t Mamba3Config::num_parameters(int64_t d_model) const {
  const int64_t HP = heads * head_dim, bc = rank * groups * state_size;
  const int64_t in_proj = d_model * (2 * HP + 2 * bc + 3 * heads + angles());
  const int64_t mimo = rank > 1 ? 3 * heads * rank * head_dim : 0;
  return in_proj + heads /*dt_bias*/ + 2 * state_size /*B, C norms*/ + 2 * heads * rank * state_size /*biases*/ +
         heads /*D*/ + mimo + HP * d_model;
}

}  // namespace stateflow

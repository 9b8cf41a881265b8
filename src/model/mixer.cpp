#include "model/mixer.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace stateflow {

// Function-local so that registrations from other files' static initialisers find it built.
static std::map<char, Mixer>& registry() {
  static std::map<char, Mixer> rows;
  return rows;
}

MixerRegistration::MixerRegistration(Mixer m) {
  SF_CHECK(m.letter >= 'A' && m.letter <= 'Z', "mixer '", m.name, "': its letter must be an upper-case letter");
  for (const auto& [letter, row] : registry())
    SF_CHECK(letter != m.letter && row.name != m.name, "mixers '", row.name, "' and '", m.name,
             "' both register letter ", m.letter, " or name ", m.name);
  registry().emplace(m.letter, std::move(m));
}

std::string mixer_letters_help() {
  std::string out;
  for (const Mixer* m : all_mixers())
    out += cat(out.empty() ? "" : ", ", m->letter, " = ", m->name, " (", m->description, ")");
  return out;
}

const Mixer& mixer_for_letter(char letter) {
  auto it = registry().find(letter);
  SF_CHECK(it != registry().end(), "layer pattern: unknown block letter '", letter, "'; known: ", mixer_letters_help(),
           ", and | between pipeline stages");
  return it->second;
}

const Mixer* find_mixer(const std::string& name) {
  for (const auto& [letter, row] : registry())
    if (row.name == name) return &row;
  return nullptr;
}

std::vector<const Mixer*> all_mixers() {
  std::vector<const Mixer*> out;
  for (const auto& [letter, row] : registry()) out.push_back(&row);
  return out;
}

int64_t largest_inner_block(const ModelConfig& cfg) {
  int64_t block = 1;
  for (char letter : cfg.blocks()) block = std::max(block, mixer_for_letter(letter).inner_block(cfg));
  return block;
}

static const nlohmann::json& field_of(const ModelConfig& cfg, const std::string& mixer, const char* field) {
  const nlohmann::json& s = cfg.section(mixer);
  SF_CHECK(s.contains(field), "model config: ", mixer, ".", field, " is missing");
  return s.at(field);
}

int64_t section_int(const ModelConfig& cfg, const std::string& mixer, const char* field, int64_t lo, int64_t hi) {
  const nlohmann::json& v = field_of(cfg, mixer, field);
  SF_CHECK(v.is_number_integer(), "model config: field '", mixer, ".", field,
           "' has the wrong type: expected an integer, got ", v.type_name());
  const int64_t x = v.get<int64_t>();
  SF_CHECK(x >= lo && x <= hi, "model config: ", mixer, ".", field, " = ", x, " is out of range; accepted: ", lo, "..",
           hi);
  return x;
}

double section_number(const ModelConfig& cfg, const std::string& mixer, const char* field, double lo, double hi) {
  const nlohmann::json& v = field_of(cfg, mixer, field);
  SF_CHECK(v.is_number(), "model config: field '", mixer, ".", field, "' has the wrong type: expected a number, got ",
           v.type_name());
  const double x = v.get<double>();
  SF_CHECK(x >= lo && x <= hi, "model config: ", mixer, ".", field, " = ", x, " is out of range; accepted: ", lo, "..",
           hi);
  return x;
}

bool section_flag(const ModelConfig& cfg, const std::string& mixer, const char* field) {
  const nlohmann::json& v = field_of(cfg, mixer, field);
  SF_CHECK(v.is_boolean(), "model config: field '", mixer, ".", field,
           "' has the wrong type: expected true or false, got ", v.type_name());
  return v.get<bool>();
}

}  // namespace stateflow

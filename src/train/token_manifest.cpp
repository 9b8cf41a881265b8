#include "train/token_manifest.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace stateflow {

namespace fs = std::filesystem;

TokenManifest read_token_manifest(const std::string& path) {
  SF_CHECK(fs::is_regular_file(path), "token manifest ", path,
           " does not exist or is not a file: --data tokens takes the .json manifest that tools/prepare_data.py "
           "writes");
  std::ifstream in(path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    fail("token manifest ", path, " is not valid JSON (", e.what(),
         "): --data tokens takes the .json manifest that tools/prepare_data.py writes; for a raw token file use "
         "--data tokens-u16 or tokens-u32 with --data-vocab");
  }
  SF_CHECK(j.is_object() && j.value("format", "") == kTokenManifestFormat, "token manifest ", path,
           " lacks \"format\": \"", kTokenManifestFormat, "\": is it a manifest of tools/prepare_data.py?");
  SF_CHECK(j.value("version", 0) == 1, "token manifest ", path, " has version ", j.value("version", 0),
           "; this stateflow reads version 1");
  auto integer = [&](const char* key) {
    SF_CHECK(j.contains(key) && j.at(key).is_number_integer(), "token manifest ", path, ": field '", key,
             "' is missing or not an integer");
    return j.at(key).get<int64_t>();
  };
  auto file = [&](const char* key) {
    SF_CHECK(j.contains(key) && j.at(key).is_string(), "token manifest ", path, ": field '", key,
             "' is missing or not a file name");
    fs::path p = j.at(key).get<std::string>();
    return (p.is_absolute() ? p : fs::path(path).parent_path() / p).string();
  };
  TokenManifest m;
  m.path = path;
  m.tokens_path = file("tokens");
  m.token_width = static_cast<int>(integer("token_width"));
  m.vocab_size = integer("vocab_size");
  m.num_tokens = integer("num_tokens");
  m.documents = j.contains("documents") ? integer("documents") : 0;
  if (j.contains("document_starts") && !j.at("document_starts").is_null()) m.document_starts_path = file("document_starts");
  m.tokenizer = j.value("tokenizer", nlohmann::json::object());
  SF_CHECK(m.token_width == 2 || m.token_width == 4, "token manifest ", path, ": token_width ", m.token_width,
           " must be 2 (uint16 ids) or 4 (uint32 ids)");
  SF_CHECK(m.vocab_size >= 1 && m.vocab_size <= (int64_t{1} << 31), "token manifest ", path, ": vocab_size ",
           m.vocab_size, " must be in [1, 2^31]");
  SF_CHECK(m.vocab_size <= (int64_t{1} << (8 * m.token_width)), "token manifest ", path, ": vocab_size ",
           m.vocab_size, " does not fit ", m.token_width, "-byte ids");
  SF_CHECK(fs::is_regular_file(m.tokens_path), "token manifest ", path, " names token file ", m.tokens_path,
           ", which does not exist: keep the manifest beside its token file");
  const auto bytes = fs::file_size(m.tokens_path);
  SF_CHECK(m.num_tokens >= 1 && bytes == uint64_t(m.num_tokens) * uint64_t(m.token_width), "token file ",
           m.tokens_path, " has ", bytes, " bytes but its manifest ", path, " says ", m.num_tokens, " tokens of ",
           m.token_width, " bytes: the two do not belong together (prepare the data again)");
  return m;
}

}  // namespace stateflow

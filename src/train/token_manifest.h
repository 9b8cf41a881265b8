// The manifest of a tokenized corpus, as tools/prepare_data.py writes it (docs/guide.md,
// "Preparing data"): a small JSON file beside the token file that says how to read it, so
// that `--data tokens --data-path corpus.json` needs no --data-vocab.
//
//   {"format": "stateflow-tokens", "version": 1,
//    "tokens": "corpus.u16",           token file, relative to the manifest's folder
//    "token_width": 2,                 bytes per id (2 or 4), little endian
//    "vocab_size": 8000, "num_tokens": 123456,
//    "tokenizer": {...},               what made the ids (informative: kind, model file)
//    "documents": 42, "separator": 2,  documents packed, each followed by this id (or null)
//    "document_starts": "corpus.docs"} uint64 LE offset of each document's first token
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace stateflow {

struct TokenManifest {
  std::string path;         // the manifest itself
  std::string tokens_path;  // resolved against the manifest's folder
  int token_width = 2;
  int64_t vocab_size = 0;
  int64_t num_tokens = 0;
  int64_t documents = 0;
  std::string document_starts_path;  // empty when the manifest lists none
  nlohmann::json tokenizer;          // as written; {} when absent
};

constexpr const char* kTokenManifestFormat = "stateflow-tokens";

// Reads and checks a manifest: every field present with the right type, the token file there
// with num_tokens * token_width bytes. Errors name the manifest and the field.
TokenManifest read_token_manifest(const std::string& path);

}  // namespace stateflow

#include "train/data.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/rng.h"

namespace stateflow {

static void check_batch_shape(int64_t batch, int64_t seq_len) {
  SF_CHECK(batch >= 1, "batch size ", batch, " must be >= 1");
  SF_CHECK(seq_len >= 1, "sequence length ", seq_len, " must be >= 1");
}

// ---------------------------------------------------------------- associative recall

AssociativeRecall::AssociativeRecall(int64_t vocab_size, RecallConfig cfg, uint64_t seed)
    : vocab_(vocab_size), cfg_(cfg), seed_(seed), num_keys_((vocab_size - 1 - cfg.noise_tokens) / 2) {
  SF_CHECK(cfg_.num_pairs >= 1, "recall task: num_pairs = ", cfg_.num_pairs, " must be >= 1");
  SF_CHECK(cfg_.num_queries >= 1, "recall task: num_queries = ", cfg_.num_queries, " must be >= 1");
  SF_CHECK(cfg_.noise_tokens >= 1, "recall task: noise_tokens = ", cfg_.noise_tokens,
           " must be >= 1 (1 = a single blank filler token)");
  SF_CHECK(vocab_ <= std::numeric_limits<int32_t>::max(), "recall task: vocab_size ", vocab_, " does not fit int32");
  // Keys must cover the distinct pairs, and at least two values keep the answer uncertain.
  int64_t needed = 1 + cfg_.noise_tokens + 2 * std::max<int64_t>(cfg_.num_pairs, 2);
  SF_CHECK(vocab_ >= needed, "recall task: vocab_size ", vocab_, " leaves ", std::max<int64_t>(num_keys_, 0),
           " keys for ", cfg_.num_pairs, " distinct pairs (keys = values = (vocab_size - 1 - noise_tokens) / 2); use ",
           "a vocab_size of at least ", needed, ", or fewer pairs or noise tokens");
}

std::string AssociativeRecall::describe() const {
  return cat("associative recall: vocab ", vocab_, " (", num_keys_, " keys, ", num_keys_, " values, ",
             cfg_.noise_tokens, " filler), ", cfg_.num_pairs, " pairs, ", cfg_.num_queries, " queries, seed ", seed_,
             ", chance accuracy ", 1.0 / static_cast<double>(num_keys_));
}

// k distinct values from [0, n), ascending (Floyd's algorithm: k draws, no O(n) scratch).
static std::vector<int64_t> sample_distinct_sorted(Rng& rng, int64_t n, int64_t k) {
  std::set<int64_t> chosen;
  for (int64_t j = n - k; j < n; ++j) {
    int64_t t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(j + 1)));
    chosen.insert(chosen.count(t) ? j : t);
  }
  return {chosen.begin(), chosen.end()};
}

Batch AssociativeRecall::next(int64_t batch, int64_t seq_len) {
  check_batch_shape(batch, seq_len);
  const int64_t P = cfg_.num_pairs, Q = cfg_.num_queries;
  SF_CHECK(seq_len >= min_seq_len(), "recall task: seq_len ", seq_len, " cannot hold ", P, " pairs and ", Q,
           " queries (2 tokens each); use --seq-len >= ", min_seq_len(), " or fewer pairs/queries");
  Rng rng = Rng::derive(seed_, batches_drawn_++);
  Batch out{batch, seq_len, std::vector<int32_t>(batch * seq_len), std::vector<int32_t>(batch * seq_len, -1)};
  std::vector<int32_t> seq(seq_len + 1);  // the last token is only ever a target
  std::vector<int32_t> values(P);
  for (int64_t r = 0; r < batch; ++r) {
    int32_t* tokens = out.tokens.data() + r * seq_len;
    int32_t* targets = out.targets.data() + r * seq_len;
    std::vector<int64_t> keys = sample_distinct_sorted(rng, num_keys_, P);
    for (int64_t i = P - 1; i > 0; --i) std::swap(keys[i], keys[rng.below(i + 1)]);  // random pair order
    seq[0] = kBos;
    for (int64_t i = 0; i < P; ++i) {
      values[i] = first_value() + static_cast<int32_t>(rng.below(num_keys_));
      seq[1 + 2 * i] = first_key() + static_cast<int32_t>(keys[i]);
      seq[2 + 2 * i] = values[i];
    }
    // The rest is Q query blocks and `fill` filler tokens in random order: choose which of
    // the Q + fill items are queries, then lay them out.
    int64_t fill = seq_len - 2 * P - 2 * Q;
    std::vector<int64_t> query_items = sample_distinct_sorted(rng, Q + fill, Q);
    int64_t pos = 1 + 2 * P;
    size_t next_query = 0;
    for (int64_t item = 0; item < Q + fill; ++item) {
      if (next_query < query_items.size() && query_items[next_query] == item) {
        ++next_query;
        int64_t pair = static_cast<int64_t>(rng.below(P));
        seq[pos] = seq[1 + 2 * pair];
        seq[pos + 1] = values[pair];
        targets[pos] = values[pair];
        pos += 2;
      } else {
        seq[pos++] = 1 + static_cast<int32_t>(rng.below(cfg_.noise_tokens));
      }
    }
    std::copy(seq.begin(), seq.begin() + seq_len, tokens);
  }
  return out;
}

// ---------------------------------------------------------------- file windows

static std::vector<uint8_t> read_file_bytes(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  SF_CHECK(!ec || ec == std::errc::no_such_file_or_directory, "cannot access data file ", path, ": ", ec.message());
  SF_CHECK(fs::exists(st), "data file ", path, " does not exist: check --data-path");
  SF_CHECK(fs::is_regular_file(st), "data file ", path, " is not a regular file: give a file, not a directory");
  std::ifstream in(path, std::ios::binary);
  SF_CHECK(in, "cannot open data file ", path, ": ", std::strerror(errno));
  std::vector<uint8_t> bytes(fs::file_size(path, ec));
  SF_CHECK(!ec, "cannot read the size of data file ", path, ": ", ec.message());
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  SF_CHECK(in.gcount() == static_cast<std::streamsize>(bytes.size()), "could read only ", in.gcount(), " of ",
           bytes.size(), " bytes of data file ", path);
  return bytes;
}

static int32_t decode_le(const uint8_t* p, int width) {
  uint32_t v = 0;
  for (int b = width - 1; b >= 0; --b) v = (v << 8) | p[b];
  return static_cast<int32_t>(v);
}

TokenWindows::TokenWindows(const std::string& path, int width, int64_t vocab, const std::string& kind)
    : path_(path), raw_(read_file_bytes(path)), width_(width), num_tokens_(0), vocab_(vocab) {
  SF_CHECK(width_ == 1 || width_ == 2 || width_ == 4, "token width ", width_, " must be 1, 2 or 4 bytes");
  SF_CHECK(vocab_ >= 1 && vocab_ <= int64_t{1} << 31, "vocab size ", vocab_, " must be in [1, 2^31]");
  SF_CHECK(!raw_.empty(), "data file ", path_, " is empty");
  SF_CHECK(raw_.size() % width_ == 0, "data file ", path_, " has ", raw_.size(), " bytes, not a multiple of the ",
           width_, "-byte token width of ", kind, ": is it a file of another token width?");
  num_tokens_ = static_cast<int64_t>(raw_.size()) / width_;
  for (int64_t i = 0; i < num_tokens_; ++i) {
    uint32_t id = static_cast<uint32_t>(token(i));
    SF_CHECK(id < static_cast<uint64_t>(vocab_), "data file ", path_, ": token ", i, " (byte offset ", i * width_,
             ") has id ", id, ", not below the vocab size ", vocab_, "; use --data-vocab > ", id,
             " or check that the file is ", kind);
  }
  description_ = cat(kind, " file ", path_, ": ", num_tokens_, " tokens, vocab ", vocab_);
}

int32_t TokenWindows::token(int64_t i) const { return decode_le(raw_.data() + i * width_, width_); }

Batch TokenWindows::next(int64_t batch, int64_t seq_len) {
  check_batch_shape(batch, seq_len);
  SF_CHECK(num_tokens_ >= seq_len + 1, "file ", path_, " has ", num_tokens_, " tokens, a sequence needs seq_len+1 = ",
           seq_len + 1, "; use a shorter --seq-len or a longer file");
  Batch out{batch, seq_len, std::vector<int32_t>(batch * seq_len), std::vector<int32_t>(batch * seq_len)};
  for (int64_t r = 0; r < batch; ++r) {
    if (offset_ + seq_len + 1 > static_cast<uint64_t>(num_tokens_)) offset_ = 0;
    int64_t start = static_cast<int64_t>(offset_);
    for (int64_t i = 0; i < seq_len; ++i) {
      out.tokens[r * seq_len + i] = token(start + i);
      out.targets[r * seq_len + i] = token(start + i + 1);
    }
    offset_ += seq_len;
  }
  return out;
}

void TokenWindows::set_position(uint64_t pos) {
  SF_CHECK(pos < static_cast<uint64_t>(num_tokens_), "data position ", pos, " is past the end of ", path_, " (",
           num_tokens_, " tokens): was the checkpoint made with another data file?");
  offset_ = pos;
}

static int64_t checked_text_vocab(int64_t vocab) {
  SF_CHECK(vocab >= 256, "text data is bytes, so its vocab size is 256; got --data-vocab ", vocab,
           ": use 256 or more");
  return vocab;
}

TextBytes::TextBytes(const std::string& path, int64_t vocab_size)
    : TokenWindows(path, 1, checked_text_vocab(vocab_size), "text") {}

static std::string token_file_kind(int width) {
  SF_CHECK(width == 2 || width == 4, "token files hold uint16 or uint32 ids: width ", width, " must be 2 or 4");
  return width == 2 ? "tokens-u16" : "tokens-u32";
}

TokenFile::TokenFile(const std::string& path, int width, int64_t vocab_size)
    : TokenWindows(path, width, vocab_size, token_file_kind(width)) {}

// ---------------------------------------------------------------- factory

std::unique_ptr<DataSource> make_data_source(const DataConfig& cfg) {
  const bool file_kind = cfg.kind == "text" || cfg.kind == "tokens-u16" || cfg.kind == "tokens-u32";
  SF_CHECK(cfg.kind == "recall" || file_kind, "unknown data kind '", cfg.kind,
           "': use recall, text, tokens-u16 or tokens-u32");
  SF_CHECK(cfg.vocab_size >= 0, "vocab size ", cfg.vocab_size, " must be >= 0 (0 = the data kind's default)");
  if (cfg.kind == "recall") {
    SF_CHECK(cfg.path.empty(), "recall data is generated, but a data path was given (", cfg.path,
             "): drop the path or choose --data text / tokens-u16 / tokens-u32");
    return std::make_unique<AssociativeRecall>(cfg.vocab_size ? cfg.vocab_size : kDefaultRecallVocab, cfg.recall,
                                               cfg.seed);
  }
  SF_CHECK(!cfg.path.empty(), cfg.kind, " data needs a file: pass --data-path");
  if (cfg.kind == "text") return std::make_unique<TextBytes>(cfg.path, cfg.vocab_size ? cfg.vocab_size : 256);
  SF_CHECK(cfg.vocab_size > 0, cfg.kind, " data needs the tokenizer's vocab size: pass --data-vocab");
  return std::make_unique<TokenFile>(cfg.path, cfg.kind == "tokens-u16" ? 2 : 4, cfg.vocab_size);
}

}  // namespace stateflow

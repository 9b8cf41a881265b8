// Training data: batches of token ids with next-token targets, from a synthetic recall task
// or from files. Every source is deterministic and has a position that a checkpoint can
// save and restore, so a resumed run sees exactly the batches it would have seen.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/batch.h"

namespace stateflow {

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual Batch next(int64_t batch, int64_t seq_len) = 0;
  virtual int64_t vocab_size() const = 0;  // every token and target id is below this
  virtual std::string describe() const = 0;
  // Where the stream stands (meaning is per source); set_position(position()) after any
  // next() calls makes the following next() calls repeat exactly.
  virtual uint64_t position() const = 0;
  virtual void set_position(uint64_t pos) = 0;
};

// Multi-query associative recall. Each sequence (seq_len + 1 tokens, the last one only
// seen as a target) is
//   BOS  k1 v1  k2 v2 ... kP vP   then, spread at random over the rest among filler tokens,
//   Q queries "k v" where k is one of the P keys and v its value.
// Keys within a sequence are distinct; values are drawn with replacement, so guessing
// scores 1/num_values. Only the position of a query's key carries a target (its value):
// loss and accuracy count answers only.
//
// Vocabulary layout (V = vocab_size, N = noise_tokens, K = (V - 1 - N) / 2):
//   0                 BOS
//   [1, 1 + N)        filler between queries, drawn uniformly (N = 1: one blank token)
//   [1 + N, 1 + N + K)     keys
//   [1 + N + K, 1 + N + 2K) values   (when V - 1 - N is odd the top id is unused)
//
// Batch number b (b = position, the number of batches drawn) is generated from
// Rng::derive(seed, b), so any batch can be regenerated on its own.
struct RecallConfig {
  int64_t num_pairs = 8;     // key-value pairs at the start of each sequence
  int64_t num_queries = 16;  // queries after them (keys drawn with replacement from the pairs)
  int64_t noise_tokens = 1;  // size of the filler range
};

class AssociativeRecall : public DataSource {
 public:
  AssociativeRecall(int64_t vocab_size, RecallConfig cfg, uint64_t seed);
  Batch next(int64_t batch, int64_t seq_len) override;
  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override;
  uint64_t position() const override { return batches_drawn_; }
  void set_position(uint64_t pos) override { batches_drawn_ = pos; }

  static constexpr int32_t kBos = 0;
  int32_t first_key() const { return static_cast<int32_t>(1 + cfg_.noise_tokens); }
  int32_t first_value() const { return static_cast<int32_t>(first_key() + num_keys_); }
  int64_t num_keys() const { return num_keys_; }  // = number of values
  // The shortest seq_len that holds BOS, the pairs and the queries.
  int64_t min_seq_len() const { return 2 * cfg_.num_pairs + 2 * cfg_.num_queries; }

 private:
  int64_t vocab_;
  RecallConfig cfg_;
  uint64_t seed_;
  int64_t num_keys_;
  uint64_t batches_drawn_ = 0;
};

// Next-token windows over a token sequence held in memory: row r of a batch is the
// seq_len + 1 tokens starting at the current offset (tokens = the first seq_len, targets =
// the last seq_len), and the offset then advances by seq_len, so each token is a target
// once per pass. A window that would run past the end starts over at offset 0 instead.
// position() is the offset (in tokens) where the next window starts.
class TokenWindows : public DataSource {
 public:
  Batch next(int64_t batch, int64_t seq_len) override;
  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override { return description_; }
  uint64_t position() const override { return offset_; }
  void set_position(uint64_t pos) override;
  int64_t num_tokens() const { return num_tokens_; }

 protected:
  // Reads `path` as tokens of `width` bytes (1, 2 or 4; little endian) and checks that
  // the size is a whole number of tokens and every id is below vocab. `kind` names the
  // format in messages.
  TokenWindows(const std::string& path, int width, int64_t vocab, const std::string& kind);

 private:
  int32_t token(int64_t i) const;

  std::string path_;
  std::vector<uint8_t> raw_;  // the file's bytes; tokens are decoded when windows are cut
  int width_;
  int64_t num_tokens_;
  int64_t vocab_;
  std::string description_;
  uint64_t offset_ = 0;
};

// A plain text file read as bytes: vocab 256 (or a larger vocab_size if given, for a model
// with spare ids).
class TextBytes : public TokenWindows {
 public:
  explicit TextBytes(const std::string& path, int64_t vocab_size = 256);
};

// A binary file of uint16 or uint32 (width 2 or 4) little-endian token ids, all checked to
// be below vocab_size on load.
class TokenFile : public TokenWindows {
 public:
  TokenFile(const std::string& path, int width, int64_t vocab_size);
};

struct DataConfig {
  std::string kind = "recall";  // recall | text | tokens-u16 | tokens-u32
  std::string path;             // text and token files
  int64_t vocab_size = 0;       // 0: the kind's default (recall 64, text 256); required for tokens
  uint64_t seed = 0;            // recall only: file windows are sequential
  RecallConfig recall;
};

constexpr int64_t kDefaultRecallVocab = 64;  // 31 keys and values: small enough to learn fast

std::unique_ptr<DataSource> make_data_source(const DataConfig& cfg);

}  // namespace stateflow

// Data sources: the recall task re-parsed and checked token by token, file windows against
// the file's contents, resume by position, and the errors a user can run into.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/rng.h"
#include "temp_dir.h"
#include "test_util.h"
#include "train/data.h"

using namespace stateflow;
using stateflow::testing::expect_error;
using stateflow::testing::fresh_seed;
using stateflow::testing::TempDir;
namespace fs = std::filesystem;

static void expect_same_batch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.batch, b.batch);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.targets, b.targets);
}

// ---------------------------------------------------------------- recall

struct RecallCase {
  int64_t vocab, seq_len;
  RecallConfig cfg;
};

static RecallCase random_recall_case(Rng& rng) {
  RecallCase c;
  c.cfg.num_pairs = 2 + static_cast<int64_t>(rng.below(15));
  c.cfg.num_queries = 1 + static_cast<int64_t>(rng.below(32));
  c.cfg.noise_tokens = 1 + static_cast<int64_t>(rng.below(6));
  c.vocab = 1 + c.cfg.noise_tokens + 2 * c.cfg.num_pairs + static_cast<int64_t>(rng.below(100));
  c.seq_len = 2 * (c.cfg.num_pairs + c.cfg.num_queries) + static_cast<int64_t>(rng.below(200));
  return c;
}

// Re-parses one row from the documented layout: BOS, the pairs, then filler and queries.
static void check_recall_row(const AssociativeRecall& src, const RecallConfig& cfg, const int32_t* tokens,
                             const int32_t* targets, int64_t T) {
  const int32_t key0 = src.first_key(), value0 = src.first_value();
  const int32_t K = static_cast<int32_t>(src.num_keys());
  auto is_key = [&](int32_t t) { return t >= key0 && t < key0 + K; };
  auto is_value = [&](int32_t t) { return t >= value0 && t < value0 + K; };
  ASSERT_EQ(tokens[0], AssociativeRecall::kBos);
  EXPECT_EQ(targets[0], -1);
  std::map<int32_t, int32_t> value_of;
  for (int64_t i = 0; i < cfg.num_pairs; ++i) {
    int32_t k = tokens[1 + 2 * i], v = tokens[2 + 2 * i];
    ASSERT_TRUE(is_key(k)) << "pair " << i << " key " << k;
    ASSERT_TRUE(is_value(v)) << "pair " << i << " value " << v;
    EXPECT_TRUE(value_of.emplace(k, v).second) << "key " << k << " repeated";
    EXPECT_EQ(targets[1 + 2 * i], -1);
    EXPECT_EQ(targets[2 + 2 * i], -1);
  }
  int64_t queries = 0;
  for (int64_t i = 1 + 2 * cfg.num_pairs; i < T; ++i) {
    if (is_key(tokens[i])) {  // a query: its key's position holds the paired value as target
      ++queries;
      ASSERT_TRUE(value_of.count(tokens[i])) << "queried key " << tokens[i] << " at " << i << " was never paired";
      EXPECT_EQ(targets[i], value_of[tokens[i]]) << "position " << i;
      if (i + 1 < T) {
        EXPECT_EQ(tokens[i + 1], targets[i]) << "the answer follows its key";
        EXPECT_EQ(targets[i + 1], -1);
      }
      ++i;
    } else {
      EXPECT_GE(tokens[i], 1) << "filler at " << i;
      EXPECT_LT(tokens[i], 1 + cfg.noise_tokens) << "filler at " << i;
      EXPECT_EQ(targets[i], -1) << "filler at " << i;
    }
  }
  EXPECT_EQ(queries, cfg.num_queries);
}

TEST(AssociativeRecall, LayoutAndAnswersReparse) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    RecallCase c = random_recall_case(rng);
    SCOPED_TRACE(::testing::Message() << "vocab " << c.vocab << " seq_len " << c.seq_len << " pairs "
                                      << c.cfg.num_pairs << " queries " << c.cfg.num_queries << " noise "
                                      << c.cfg.noise_tokens);
    AssociativeRecall src(c.vocab, c.cfg, rng.next_u64());
    const int64_t B = 1 + static_cast<int64_t>(rng.below(4));
    Batch b = src.next(B, c.seq_len);
    ASSERT_EQ(b.tokens.size(), size_t(B * c.seq_len));
    ASSERT_EQ(b.targets.size(), size_t(B * c.seq_len));
    for (int32_t t : b.tokens) ASSERT_TRUE(t >= 0 && t < src.vocab_size()) << t;
    for (int32_t t : b.targets) ASSERT_TRUE(t >= -1 && t < src.vocab_size()) << t;
    for (int64_t r = 0; r < B; ++r)
      check_recall_row(src, c.cfg, b.tokens.data() + r * c.seq_len, b.targets.data() + r * c.seq_len, c.seq_len);
  }
}

TEST(AssociativeRecall, DeterministicByPosition) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  RecallConfig cfg{8, 16, 1};
  AssociativeRecall a(64, cfg, seed), b(64, cfg, seed), other_seed(64, cfg, seed + 1);
  std::vector<Batch> stream;
  for (int i = 0; i < 4; ++i) stream.push_back(a.next(3, 96));
  EXPECT_EQ(a.position(), 4u);
  EXPECT_NE(stream[0].tokens, stream[1].tokens);
  EXPECT_NE(stream[0].tokens, other_seed.next(3, 96).tokens);
  b.set_position(2);
  expect_same_batch(b.next(3, 96), stream[2]);
  expect_same_batch(b.next(3, 96), stream[3]);
  b.set_position(0);
  expect_same_batch(b.next(3, 96), stream[0]);
}

// Answers are spread evenly over the values, so guessing scores about 1/num_values.
TEST(AssociativeRecall, AnswersNearUniform) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  AssociativeRecall src(40, RecallConfig{8, 32, 1}, seed);  // 19 keys and values
  std::map<int32_t, int64_t> count;
  int64_t answers = 0;
  for (int i = 0; i < 20; ++i) {
    Batch b = src.next(16, 128);
    for (int32_t t : b.targets)
      if (t >= 0) ++count[t], ++answers;
  }
  EXPECT_EQ(answers, 20 * 16 * 32);
  EXPECT_EQ(static_cast<int64_t>(count.size()), src.num_keys());
  for (auto [value, n] : count) EXPECT_LT(double(n) / answers, 2.0 / src.num_keys()) << "value " << value;
}

TEST(AssociativeRecall, Errors) {
  expect_error([] { AssociativeRecall(20, RecallConfig{16, 4, 1}, 0); }, "vocab_size 20");
  expect_error([] { AssociativeRecall(64, RecallConfig{0, 4, 1}, 0); }, "num_pairs");
  expect_error([] { AssociativeRecall(64, RecallConfig{4, 0, 1}, 0); }, "num_queries");
  expect_error([] { AssociativeRecall(64, RecallConfig{4, 4, 0}, 0); }, "noise_tokens");
  AssociativeRecall src(64, RecallConfig{8, 16, 1}, 0);
  expect_error([&] { src.next(2, 47); }, "--seq-len >= 48");
  expect_error([&] { src.next(0, 64); }, "batch size");
  EXPECT_NO_THROW(src.next(1, 48));
}

// ---------------------------------------------------------------- files

static std::vector<uint8_t> little_endian(const std::vector<uint32_t>& ids, int width) {
  std::vector<uint8_t> out;
  for (uint32_t id : ids)
    for (int b = 0; b < width; ++b) out.push_back(static_cast<uint8_t>(id >> (8 * b)));
  return out;
}

// Draws `draws` batches and checks each row against the ids, starting windows where the
// documented rule says: advance by seq_len, back to 0 when seq_len + 1 tokens do not fit.
// Returns how many windows wrapped.
static int check_windows(DataSource& src, const std::vector<uint32_t>& ids, int64_t B, int64_t T, int draws) {
  const int64_t n = static_cast<int64_t>(ids.size());
  int64_t start = static_cast<int64_t>(src.position());
  int wraps = 0;
  for (int d = 0; d < draws; ++d) {
    Batch b = src.next(B, T);
    for (int64_t r = 0; r < B; ++r) {
      if (start + T + 1 > n) start = 0, ++wraps;
      for (int64_t i = 0; i < T; ++i) {
        EXPECT_EQ(b.tokens[r * T + i], static_cast<int32_t>(ids[start + i])) << "draw " << d << " row " << r;
        EXPECT_EQ(b.targets[r * T + i], static_cast<int32_t>(ids[start + i + 1])) << "draw " << d << " row " << r;
      }
      start += T;
    }
    EXPECT_EQ(src.position(), static_cast<uint64_t>(start));
  }
  return wraps;
}

static std::vector<uint32_t> random_ids(Rng& rng, int64_t n, uint64_t vocab) {
  std::vector<uint32_t> ids(n);
  for (auto& id : ids) id = static_cast<uint32_t>(rng.below(vocab));
  return ids;
}

TEST(TextBytes, WindowsAndWrapAround) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  TempDir tmp;
  std::vector<uint32_t> ids = random_ids(rng, 50 + static_cast<int64_t>(rng.below(100)), 256);
  std::vector<uint8_t> bytes(ids.begin(), ids.end());
  std::unique_ptr<DataSource> src = make_data_source({"text", tmp.write("a.txt", bytes), 0, 0, {}});
  EXPECT_EQ(src->vocab_size(), 256);
  EXPECT_GT(check_windows(*src, ids, 3, 16, 6), 0);  // 288 tokens drawn from < 150: wraps
}

TEST(TokenFile, U16AndU32WindowsAndResume) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  TempDir tmp;
  for (int width : {2, 4}) {
    SCOPED_TRACE(::testing::Message() << "width " << width);
    const uint64_t vocab = width == 2 ? 50257 : 100000 + rng.below(1u << 20);  // u32 ids past 65535
    std::vector<uint32_t> ids = random_ids(rng, 200 + static_cast<int64_t>(rng.below(300)), vocab);
    std::string path = tmp.write("t" + std::to_string(width), little_endian(ids, width));
    DataConfig cfg{width == 2 ? "tokens-u16" : "tokens-u32", path, static_cast<int64_t>(vocab), 0, {}};
    std::unique_ptr<DataSource> src = make_data_source(cfg);
    EXPECT_EQ(src->vocab_size(), static_cast<int64_t>(vocab));
    const int64_t T = 8 + static_cast<int64_t>(rng.below(40));
    const int draws = static_cast<int>(ids.size() / (4 * T)) + 2;  // more than one pass: wraps
    EXPECT_GT(check_windows(*src, ids, 4, T, draws), 0);

    // Resume: a fresh source set to a saved position repeats the stream.
    uint64_t saved = src->position();
    Batch first = src->next(2, T), second = src->next(3, T);
    std::unique_ptr<DataSource> resumed = make_data_source(cfg);
    resumed->set_position(saved);
    expect_same_batch(resumed->next(2, T), first);
    expect_same_batch(resumed->next(3, T), second);
  }
}

TEST(TokenFile, Errors) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  TempDir tmp;

  // Too short for one sequence: names the counts and the fix.
  std::string short_path = tmp.write("short.u16", little_endian(random_ids(rng, 10, 100), 2));
  std::unique_ptr<DataSource> shorty = make_data_source({"tokens-u16", short_path, 100, 0, {}});
  expect_error([&] { shorty->next(1, 10); }, "has 10 tokens, a sequence needs seq_len+1 = 11; use a shorter --seq-len");
  EXPECT_NO_THROW(shorty->next(1, 9));
  expect_error([&] { shorty->set_position(10); }, "past the end");

  // An id out of the vocab: names the token offset, the id and the vocab.
  std::vector<uint32_t> ids = random_ids(rng, 64, 1000);
  const int64_t bad_at = static_cast<int64_t>(rng.below(ids.size()));
  ids[bad_at] = 1000 + static_cast<uint32_t>(rng.below(5000));
  for (int width : {2, 4}) {
    std::string path = tmp.write("bad" + std::to_string(width), little_endian(ids, width));
    expect_error([&] { make_data_source({width == 2 ? "tokens-u16" : "tokens-u32", path, 1000, 0, {}}); },
                 "token " + std::to_string(bad_at) + " (byte offset " + std::to_string(bad_at * width) +
                     ") has id " + std::to_string(ids[bad_at]) + ", not below the vocab size 1000");
  }

  // A size that is not a whole number of tokens.
  std::string odd = tmp.write("odd", std::vector<uint8_t>(7, 1));
  expect_error([&] { make_data_source({"tokens-u16", odd, 100, 0, {}}); }, "not a multiple of the 2-byte");
  std::string six = tmp.write("six", std::vector<uint8_t>(6, 1));
  expect_error([&] { make_data_source({"tokens-u32", six, 100, 0, {}}); }, "not a multiple of the 4-byte");

  std::string empty = tmp.write("empty.txt", {});
  expect_error([&] { make_data_source({"text", empty, 0, 0, {}}); }, "is empty");
  expect_error([&] { make_data_source({"text", (tmp.path / "missing.txt").string(), 0, 0, {}}); }, "does not exist");
  expect_error([&] { make_data_source({"text", tmp.path.string(), 0, 0, {}}); }, "not a regular file");
}

TEST(MakeDataSource, KindsDefaultsAndErrors) {
  std::unique_ptr<DataSource> recall = make_data_source({"recall", "", 0, 7, RecallConfig{8, 16, 1}});
  EXPECT_EQ(recall->vocab_size(), kDefaultRecallVocab);
  EXPECT_NE(recall->describe().find("associative recall"), std::string::npos);
  EXPECT_EQ(make_data_source({"recall", "", 300, 7, {}})->vocab_size(), 300);
  expect_error([] { make_data_source({"json", "", 0, 0, {}}); }, "unknown data kind 'json'");
  expect_error([] { make_data_source({"recall", "x.txt", 0, 0, {}}); }, "recall data is generated");
  expect_error([] { make_data_source({"text", "", 0, 0, {}}); }, "--data-path");
  expect_error([] { make_data_source({"tokens-u16", "x.bin", 0, 0, {}}); }, "--data-vocab");
  expect_error([] { make_data_source({"text", "x.txt", 100, 0, {}}); }, "vocab size is 256");
  expect_error([] { make_data_source({"recall", "", -5, 0, {}}); }, "vocab size -5");
}

// A tools/prepare_data.py manifest: the token file, width and vocabulary come from it, and
// data_vocab_size tells a preset's vocabulary without reading the tokens.
TEST(TokenManifest, TrainReadsTheTokenFileItNamesAndChecksIt) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  TempDir tmp;
  for (int width : {2, 4}) {
    const uint64_t vocab = width == 2 ? 300 : 70000;
    std::vector<uint32_t> ids = random_ids(rng, 50 + static_cast<int64_t>(rng.below(50)), vocab);
    ids.back() = static_cast<uint32_t>(vocab - 1);
    tmp.write("c.tokens", little_endian(ids, width));
    nlohmann::json m = {{"format", "stateflow-tokens"}, {"version", 1}, {"tokens", "c.tokens"},
                        {"token_width", width}, {"vocab_size", vocab}, {"num_tokens", ids.size()},
                        {"documents", 1}, {"tokenizer", {{"kind", "sentencepiece"}}}};
    const std::string path = tmp.write("c.json", {});
    std::ofstream(path) << m.dump();
    const DataConfig cfg{"tokens", path, 0, 0, {}};
    EXPECT_EQ(data_vocab_size(cfg), static_cast<int64_t>(vocab));
    std::unique_ptr<DataSource> src = make_data_source(cfg);
    EXPECT_EQ(src->vocab_size(), static_cast<int64_t>(vocab));
    check_windows(*src, ids, 2, 7, 3);

    auto broken = [&](const char* key, nlohmann::json value, const std::string& needle) {
      nlohmann::json b = m;
      if (value.is_null()) b.erase(key);
      else b[key] = value;
      std::ofstream(path) << b.dump();
      expect_error([&] { make_data_source(cfg); }, needle);
    };
    broken("format", "other", "lacks \"format\": \"stateflow-tokens\"");
    broken("num_tokens", ids.size() + 1, "do not belong together");
    broken("token_width", 3, "token_width 3 must be 2");
    broken("tokens", "missing.tokens", "which does not exist");
    broken("vocab_size", nullptr, "field 'vocab_size' is missing");
    broken("vocab_size", 2, "not below the vocab size 2");
  }
  std::ofstream(tmp.path / "raw.bin") << "not json";
  expect_error([&] { make_data_source({"tokens", (tmp.path / "raw.bin").string(), 0, 0, {}}); },
               "for a raw token file use --data tokens-u16");
  EXPECT_EQ(data_vocab_size({"text", "x.txt", 0, 0, {}}), 256);
  EXPECT_EQ(data_vocab_size({"recall", "", 0, 0, {}}), 0);  // recall takes the model's
}

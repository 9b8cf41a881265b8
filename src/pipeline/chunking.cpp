#include "pipeline/chunking.h"

#include "core/error.h"

namespace stateflow {

std::vector<int64_t> even_chunk_lengths(int64_t seq_len, int64_t n) {
  SF_CHECK(n >= 1, "--chunks must be at least 1, got ", n);
  SF_CHECK(n <= seq_len, "cannot cut a sequence of ", seq_len, " tokens into ", n,
           " chunks: use --chunks at most ", seq_len, " (every chunk needs at least one token)");
  std::vector<int64_t> out(n, seq_len / n);
  for (int64_t i = 0; i < seq_len % n; ++i) ++out[i];
  return out;
}

void validate_chunk_lengths(const std::vector<int64_t>& lengths, int64_t seq_len) {
  SF_CHECK(!lengths.empty(), "chunk lengths are empty: give at least one length");
  int64_t sum = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    SF_CHECK(lengths[i] >= 1, "chunk ", i, " has length ", lengths[i], ": every chunk needs at least one token");
    sum += lengths[i];
  }
  SF_CHECK(sum == seq_len, "chunk lengths ", format_chunk_lengths(lengths), " sum to ", sum,
           " but the sequence length is ", seq_len, ": make them sum to ", seq_len);
}

std::vector<int64_t> parse_chunk_lengths(const std::string& text) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SF_CHECK(!item.empty() && used == item.size(), "chunk lengths '", text, "': item '", item,
             "' is not an integer; write them like 64,32,96");
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::string format_chunk_lengths(const std::vector<int64_t>& lengths) {
  std::string s;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(lengths[i]);
  }
  return s;
}

}  // namespace stateflow

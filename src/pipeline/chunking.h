// How each sequence is cut into chunks: explicit lengths, or N nearly-equal chunks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace stateflow {

// N chunks whose lengths differ by at most one (the first seq_len % N are one longer).
std::vector<int64_t> even_chunk_lengths(int64_t seq_len, int64_t num_chunks);
// Throws stateflow::Error unless every length is >= 1 and they sum to seq_len.
void validate_chunk_lengths(const std::vector<int64_t>& lengths, int64_t seq_len);
// "a,b,c" -> {a, b, c}, with errors naming the bad item.
std::vector<int64_t> parse_chunk_lengths(const std::string& text);
std::string format_chunk_lengths(const std::vector<int64_t>& lengths);

}  // namespace stateflow

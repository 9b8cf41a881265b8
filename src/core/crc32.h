// CRC-32 (IEEE 802.3, the zlib/PNG polynomial), so a checkpoint can tell a file that was
// cut short or changed on disk from the one it wrote.
#pragma once
#include <cstddef>
#include <cstdint>

namespace stateflow {

// Continues a running CRC: crc32(b, n2, crc32(a, n1)) == crc32(a followed by b). Start at 0.
uint32_t crc32(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace stateflow

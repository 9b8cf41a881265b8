// A TCP rendezvous that hands rank 0's bytes (NCCL's unique id) to every other rank of a
// multi-process launch that has no MPI. Rank 0 listens on the address's port (all local
// interfaces); every other rank connects to HOST:PORT, retrying while rank 0 is not up yet,
// says who it is, and reads the bytes. Every wait gives up at the deadline with an Error
// naming the address and the fix.
#pragma once
#include <string>

namespace stateflow {

struct HostPort {
  std::string host;
  int port = 0;
};
// "HOST:PORT" (the port after the last ':'); throws on a malformed address.
HostPort parse_host_port(const std::string& address);

// Rank 0 passes `payload` and gets it back; the others get rank 0's payload.
std::string rendezvous_broadcast(const std::string& address, int rank, int world_size, const std::string& payload,
                                 double timeout_s);

}  // namespace stateflow

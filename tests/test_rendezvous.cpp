// The TCP rendezvous between threads on 127.0.0.1 (a free port each time): every rank gets
// rank 0's bytes; a rank with no rank 0 to reach, and a rank 0 nobody joins, fail with an
// Error naming the address within the timeout; a busy port, a rank with another world size
// and malformed addresses are refused with the fix named.
#include "pipeline/rendezvous.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

// A port nothing listens on right now (the kernel's pick for port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST(Rendezvous, EveryRankGetsRankZerosBytes) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int world = 2 + int(rng.below(4));
  std::string id(128, '\0');  // NCCL's id size; zero bytes included
  for (char& c : id) c = char(rng.below(256));
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> got(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = world - 1; r >= 0; --r)  // rank 0 last: the others must retry until it listens
    ranks.emplace_back([&, r] {
      try {
        got[size_t(r)] = rendezvous_broadcast(address, r, world, r == 0 ? id : std::string(128, 'x'), 10);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(got[size_t(r)], id) << "rank " << r;
  }
}

TEST(Rendezvous, NoRankZeroTimesOutNamingTheAddress) {
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { rendezvous_broadcast(address, 1, 2, "", 0.3); }, "could not connect to rank 0 at " + address);
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(Rendezvous, RankZeroAloneTimesOut) {
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { rendezvous_broadcast(address, 0, 3, "id", 0.3); }, "only 0 of the 2 other rank(s) connected");
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(Rendezvous, BusyPortNamesTheFix) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);  // someone else listens on the port
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  expect_error([&] { rendezvous_broadcast(address, 0, 2, "id", 0.3); }, "choose a free port with --rendezvous");
  ::close(fd);
}

TEST(Rendezvous, MismatchedWorldSizeIsRefused) {
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  std::string rank0_error, rank1_error;
  std::thread rank1([&] {
    try {
      rendezvous_broadcast(address, 1, 3, "", 5);
    } catch (const std::exception& e) {
      rank1_error = e.what();
    }
  });
  try {
    rendezvous_broadcast(address, 0, 2, "id", 5);
  } catch (const std::exception& e) {
    rank0_error = e.what();
  }
  rank1.join();
  EXPECT_NE(rank0_error.find("started with world size 3 but rank 0 with 2"), std::string::npos) << rank0_error;
  EXPECT_NE(rank1_error.find("got no id from rank 0"), std::string::npos) << rank1_error;
}

TEST(Rendezvous, AddressesAreHostColonPort) {
  EXPECT_EQ(parse_host_port("node7:29500").host, "node7");
  EXPECT_EQ(parse_host_port("node7:29500").port, 29500);
  EXPECT_EQ(parse_host_port("[::1]:5").host, "::1");
  for (const char* bad : {"node7", "node7:", ":80", "h:0", "h:65536", "h:12a", "h:-1"})
    expect_error([&] { parse_host_port(bad); }, "is not HOST:PORT");
}

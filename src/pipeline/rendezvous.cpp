#include "pipeline/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/error.h"

namespace stateflow {
namespace {

using Clock = std::chrono::steady_clock;

// Closes the descriptor at scope end.
struct Socket {
  int fd = -1;
  explicit Socket(int f) : fd(f) {}
  Socket(Socket&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Socket(const Socket&) = delete;
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? int(std::min<int64_t>(left, 1 << 30)) : 0;
}

// Waits until fd is ready for `events`; false at the deadline.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms_left(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Whole-buffer transfers against the deadline; false on timeout or a closed connection.
bool send_all(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!wait_ready(fd, POLLOUT, deadline)) return false;
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= size_t(k);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_ready(fd, POLLIN, deadline)) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= size_t(k);
  }
  return true;
}

// What every rank sends rank 0 first: a magic word (a stray client is rejected), its rank
// and the world size it was started with.
struct Hello {
  uint32_t magic, rank, world_size;
};
constexpr uint32_t kMagic = 0x53465244;  // "SFRD"

// A socket listening on `port` of every local address: dual-stack IPv6 where the host has
// it, else IPv4. -1 on failure (errno says why).
int listen_on(int port) {
  const int one = 1, zero = 0;
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd >= 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(uint16_t(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 64) == 0) return fd;
    ::close(fd);
  }
  fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(uint16_t(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 64) == 0) return fd;
  const int err = errno;
  ::close(fd);
  errno = err;
  return -1;
}

std::string serve(const HostPort& at, const std::string& address, int world_size, const std::string& payload,
                  Clock::time_point deadline, double timeout_s) {
  Socket listener(listen_on(at.port));
  SF_CHECK(listener.fd >= 0, "rendezvous: rank 0 cannot listen on port ", at.port, " (", std::strerror(errno),
           "); choose a free port with --rendezvous HOST:PORT (or MASTER_PORT)");
  std::vector<Socket> peers;
  std::vector<bool> seen(size_t(world_size), false);
  while (int(peers.size()) < world_size - 1) {
    SF_CHECK(wait_ready(listener.fd, POLLIN, deadline), "rendezvous: rank 0 waited ", timeout_s, " s on ", address,
             " but only ", peers.size(), " of the ", world_size - 1,
             " other rank(s) connected; start every rank with the same --rendezvous (or MASTER_ADDR/MASTER_PORT) "
             "and --world-size, or raise --timeout");
    Socket s(::accept(listener.fd, nullptr, nullptr));
    if (s.fd < 0) continue;
    Hello h{};
    if (!recv_all(s.fd, &h, sizeof h, deadline) || h.magic != kMagic) continue;  // not one of ours
    SF_CHECK(int(h.world_size) == world_size, "rendezvous: rank ", h.rank, " was started with world size ",
             h.world_size, " but rank 0 with ", world_size, "; start every rank with the same world size");
    SF_CHECK(h.rank >= 1 && int(h.rank) < world_size && !seen[h.rank], "rendezvous: rank ", h.rank,
             " connected twice or is out of range; every rank needs its own --rank below --world-size");
    seen[h.rank] = true;
    peers.push_back(std::move(s));
  }
  const uint64_t n = payload.size();
  for (Socket& s : peers)
    SF_CHECK(send_all(s.fd, &n, sizeof n, deadline) && send_all(s.fd, payload.data(), n, deadline),
             "rendezvous: rank 0 could not send the id over ", address, "; a rank disconnected");
  return payload;
}

std::string join(const HostPort& at, const std::string& address, int rank, int world_size,
                 Clock::time_point deadline, double timeout_s) {
  const std::string fix = cat("; is rank 0 running, and do all ranks use the same --rendezvous (or MASTER_ADDR/",
                              "MASTER_PORT)? Raise --timeout if rank 0 starts late");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(at.port);
  const int gai = ::getaddrinfo(at.host.c_str(), port.c_str(), &hints, &found);
  SF_CHECK(gai == 0, "rendezvous: cannot resolve '", at.host, "' of ", address, ": ", ::gai_strerror(gai),
           "; pass rank 0's host with --rendezvous HOST:PORT");
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(found, ::freeaddrinfo);
  // Rank 0 may not listen yet: retry until the deadline.
  while (true) {
    for (addrinfo* a = found; a; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (s.fd < 0 || ::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) continue;
      const Hello h{kMagic, uint32_t(rank), uint32_t(world_size)};
      uint64_t n = 0;
      SF_CHECK(send_all(s.fd, &h, sizeof h, deadline) && recv_all(s.fd, &n, sizeof n, deadline) && n < (1u << 20),
               "rendezvous: rank ", rank, " connected to ", address, " but got no id from rank 0 within ", timeout_s,
               " s", fix);
      std::string payload(n, '\0');
      SF_CHECK(recv_all(s.fd, payload.data(), n, deadline), "rendezvous: rank ", rank, " lost ", address,
               " while reading the id", fix);
      return payload;
    }
    SF_CHECK(Clock::now() < deadline, "rendezvous: rank ", rank, " could not connect to rank 0 at ", address,
             " within ", timeout_s, " s", fix);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

HostPort parse_host_port(const std::string& address) {
  const size_t colon = address.rfind(':');
  HostPort hp;
  if (colon != std::string::npos && colon > 0) {
    hp.host = address.substr(0, colon);
    const std::string port = address.substr(colon + 1);
    if (!port.empty() && port.find_first_not_of("0123456789") == std::string::npos && port.size() <= 5)
      hp.port = std::stoi(port);
  }
  if (hp.host.size() > 2 && hp.host.front() == '[' && hp.host.back() == ']') hp.host = hp.host.substr(1, hp.host.size() - 2);
  SF_CHECK(hp.port >= 1 && hp.port <= 65535, "rendezvous address '", address,
           "' is not HOST:PORT with a port in 1..65535 (e.g. --rendezvous 10.0.0.1:29500)");
  return hp;
}

std::string rendezvous_broadcast(const std::string& address, int rank, int world_size, const std::string& payload,
                                 double timeout_s) {
  SF_CHECK(timeout_s > 0, "rendezvous timeout must be positive, got ", timeout_s);
  const HostPort at = parse_host_port(address);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  if (world_size == 1) return payload;
  return rank == 0 ? serve(at, address, world_size, payload, deadline, timeout_s)
                   : join(at, address, rank, world_size, deadline, timeout_s);
}

}  // namespace stateflow

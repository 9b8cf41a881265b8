#include "pipeline/rank_env.h"

#include <charconv>

#include "core/error.h"

extern char** environ;

namespace stateflow {
namespace {

struct Source {
  const char* name;
  const char *rank, *world_size, *local_rank;
};

// In order of precedence.
constexpr Source kSources[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

int parse_count(const std::string& value, const std::string& what) {
  int v = -1;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  SF_CHECK(ec == std::errc() && end == value.data() + value.size() && v >= 0, what, " is '", value,
           "', not a non-negative integer");
  return v;
}

RankInfo validated(RankInfo r) {
  SF_CHECK(r.world_size >= 1, "world size from ", r.source, " is ", r.world_size, "; it must be at least 1");
  SF_CHECK(r.rank < r.world_size, "rank ", r.rank, " from ", r.source, " is not below the world size ", r.world_size);
  return r;
}

}  // namespace

std::optional<RankInfo> detect_rank(const RankFlags& flags, const Environment& env) {
  if (flags.rank >= 0 || flags.world_size >= 0 || flags.local_rank >= 0) {
    SF_CHECK(flags.rank >= 0 && flags.world_size >= 0, "give --rank and --world-size together (got --rank ",
             flags.rank, ", --world-size ", flags.world_size, ")");
    return validated({flags.rank, flags.world_size, flags.local_rank >= 0 ? flags.local_rank : flags.rank,
                      "flags (--rank, --world-size, --local-rank)"});
  }
  for (const Source& s : kSources) {
    auto rank = env.find(s.rank), world = env.find(s.world_size), local = env.find(s.local_rank);
    if (rank == env.end()) continue;
    const std::string source = cat(s.name, " (", s.rank, ", ", s.world_size, ", ", s.local_rank, ")");
    SF_CHECK(world != env.end(), source, ": ", s.rank, " is set but ", s.world_size,
             " is not; set both, or pass --rank and --world-size");
    RankInfo r;
    r.source = source;
    r.rank = parse_count(rank->second, s.rank);
    r.world_size = parse_count(world->second, s.world_size);
    r.local_rank = local != env.end() ? parse_count(local->second, s.local_rank) : r.rank;
    return validated(r);
  }
  return std::nullopt;
}

bool launched_by_mpirun(const Environment& env) { return env.count("OMPI_COMM_WORLD_RANK") > 0; }

std::string rendezvous_address(const std::string& flag, const Environment& env) {
  if (!flag.empty()) return flag;
  auto addr = env.find("MASTER_ADDR"), port = env.find("MASTER_PORT");
  if (addr != env.end() && port != env.end()) return addr->second + ":" + port->second;
  return "127.0.0.1:29500";
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

}  // namespace stateflow

// Checks and compares checkpoints for the kill-and-resume soak (tests/kill_resume_soak.sh):
//
//   checkpoint_check verify SAVE_DIR          every complete step directory (one with a
//                                             manifest) reads back and passes every check
//   checkpoint_check compare STEP_A STEP_B T  the same step and tensors; T = 0: bitwise equal,
//                                             else max relative difference <= T per tensor
//
// Prints one line saying what it found; exits 1 with the problem otherwise.
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "train/checkpoint.h"

using namespace stateflow;
namespace fs = std::filesystem;

static int verify(const std::string& save_dir) {
  int complete = 0, incomplete = 0;
  for (const auto& e : fs::directory_iterator(save_dir)) {
    if (!e.is_directory() || e.path().filename().string().rfind("step-", 0) != 0) continue;
    if (!fs::exists(e.path() / "manifest.json")) {
      ++incomplete;  // a save cut short: --resume skips it and the next save removes it
      continue;
    }
    read_checkpoint_tensors(e.path().string());
    ++complete;
  }
  SF_CHECK(complete > 0, save_dir, " holds no complete checkpoint");
  std::cout << save_dir << ": " << complete << " complete checkpoint(s) read back and verified, " << incomplete
            << " incomplete\n";
  return 0;
}

static int compare(const std::string& a, const std::string& b, double tolerance) {
  const int64_t step_a = read_manifest(a).state.step, step_b = read_manifest(b).state.step;
  SF_CHECK(step_a == step_b, a, " is step ", step_a, " but ", b, " is step ", step_b);
  const auto ta = read_checkpoint_tensors(a), tb = read_checkpoint_tensors(b);
  SF_CHECK(ta.size() == tb.size(), a, " holds ", ta.size(), " tensors but ", b, " ", tb.size());
  double worst = 0;
  std::string where;
  for (const auto& [name, x] : ta) {
    auto it = tb.find(name);
    SF_CHECK(it != tb.end(), b, " has no tensor ", name);
    const Tensor& y = it->second;
    SF_CHECK(x.numel() == y.numel() && x.dtype() == y.dtype(), name, " differs in shape or dtype");
    const double d = tolerance == 0 ? (std::memcmp(x.raw(), y.raw(), x.nbytes()) != 0 ? 1.0 : 0.0)
                                    : max_rel_diff(x, y);
    if (!(d <= worst)) worst = d, where = name;
  }
  if (tolerance == 0) {
    SF_CHECK(worst == 0, "step ", step_a, ": ", where, " is not bitwise equal between ", a, " and ", b);
    std::cout << "step " << step_a << ": all " << ta.size() << " tensors bitwise equal\n";
  } else {
    SF_CHECK(worst <= tolerance, "step ", step_a, ": ", where, " differs by ", worst, " (relative) between ", a,
             " and ", b, ", more than ", tolerance);
    std::cout << "step " << step_a << ": all " << ta.size() << " tensors within " << worst << " relative\n";
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "verify" && argc == 3) return verify(argv[2]);
    if (cmd == "compare" && argc == 5) return compare(argv[2], argv[3], std::stod(argv[4]));
    std::cerr << "usage: checkpoint_check verify SAVE_DIR | compare STEP_A STEP_B TOLERANCE\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "checkpoint_check: " << e.what() << "\n";
    return 1;
  }
}

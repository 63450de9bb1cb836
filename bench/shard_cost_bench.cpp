// The cost of splitting a check into shards: the total CPU seconds of N
// shard processes (`kvcheck check --shard I/N`, one thread each) plus
// `kvcheck merge`, against one process (one thread) on the same seed and
// cases, measured side by side in one run from the children's rusage, and
// printed as a ratio (goal: at most 1.05 for N = 8 and 20,000 cases). From
// the measured per-case, per-shard and merge costs it then prints what a
// run of 10^7 cases on 1,000 cores costs in wall time and where adding
// cores stops paying. A benchmark, not a test: it asserts nothing.
//
//   shard_cost_bench [--cases 20000] [--shards 8] [--seed 1] [--merge-shards 300] [--kvcheck PATH]
//
// --merge-shards M also times a merge of M one-case shards, for the merge's
// cost per shard (the N-shard merge is mostly process start-up).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#ifndef KVCHECK_BINARY
#define KVCHECK_BINARY "kvcheck"
#endif

namespace {

namespace fs = std::filesystem;

struct Cost {
  double cpu_seconds = 0;  ///< user + system of the child
  double wall_seconds = 0;
};

double seconds(const timeval& t) {
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
}

/// Runs `args` (argv[0] is the program) with stdout to /dev/null; exits on failure codes other than 0 and 1.
Cost run(const std::vector<std::string>& args) {
  timespec t0{}, t1{};
  std::fflush(stdout);  // or the child's copy of the buffer is printed again
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const pid_t pid = fork();
  if (pid == 0) {
    if (std::freopen("/dev/null", "w", stdout) == nullptr) _exit(127);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (!WIFEXITED(status) || WEXITSTATUS(status) > 1) {
    std::fprintf(stderr, "shard_cost_bench: %s ... failed (status %d)\n", args[0].c_str(), status);
    std::exit(2);
  }
  Cost c;
  c.cpu_seconds = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  c.wall_seconds =
      static_cast<double>(t1.tv_sec - t0.tv_sec) + static_cast<double>(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  long long cases = 20000, shards = 8, seed = 1, merge_shards = 300;
  std::string kvcheck = KVCHECK_BINARY;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--cases")
      cases = std::atoll(argv[i + 1]);
    else if (flag == "--shards")
      shards = std::atoll(argv[i + 1]);
    else if (flag == "--seed")
      seed = std::atoll(argv[i + 1]);
    else if (flag == "--merge-shards")
      merge_shards = std::atoll(argv[i + 1]);
    else if (flag == "--kvcheck")
      kvcheck = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: shard_cost_bench [--cases N] [--shards N] [--seed X] [--merge-shards M] "
                   "[--kvcheck PATH]\n");
      return 2;
    }
  }
  if (cases < 1 || shards < 1 || merge_shards <= shards) return 2;
  const fs::path dir = fs::temp_directory_path() / ("kvcheck-shard-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::vector<std::string> common = {
      kvcheck, "check", "--cases", std::to_string(cases), "--seed", std::to_string(seed), "--threads", "1"};
  auto with = [&common](std::vector<std::string> extra) {
    std::vector<std::string> a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };

  std::printf("kvcheck check --cases %lld --seed %lld, one thread per process\n", cases, seed);
  const Cost one = run(with({"--out", (dir / "one").string()}));
  Cost shard_total, shard_max;
  std::vector<std::string> merge = {kvcheck, "merge"};
  for (long long i = 0; i < shards; ++i) {
    const fs::path out = dir / ("shard" + std::to_string(i));
    const Cost c =
        run(with({"--shard", std::to_string(i) + "/" + std::to_string(shards), "--out", out.string()}));
    shard_total.cpu_seconds += c.cpu_seconds;
    shard_max.wall_seconds = std::max(shard_max.wall_seconds, c.wall_seconds);
    merge.push_back(out.string());
  }
  merge.insert(merge.end(), {"--out", (dir / "merged").string()});
  const Cost merged = run(merge);
  // Start-up and one case: what a process costs beyond its cases.
  const Cost empty = run({kvcheck, "check", "--cases", "1", "--seed", std::to_string(seed), "--threads", "1",
                          "--out", (dir / "empty").string()});
  // M shards of one case each, merged: the merge's cost per shard document.
  std::vector<std::string> many = {kvcheck, "merge"};
  for (long long i = 0; i < merge_shards; ++i) {
    const fs::path out = dir / "many" / std::to_string(i);
    run({kvcheck, "check", "--cases", std::to_string(merge_shards), "--seed", std::to_string(seed),
         "--threads", "1", "--shard", std::to_string(i) + "/" + std::to_string(merge_shards), "--out",
         out.string()});
    many.push_back(out.string());
  }
  many.insert(many.end(), {"--out", (dir / "many-merged").string()});
  const Cost many_merged = run(many);
  fs::remove_all(dir);

  const double ratio = (shard_total.cpu_seconds + merged.cpu_seconds) / one.cpu_seconds;
  const double per_case = one.cpu_seconds / static_cast<double>(cases);
  std::printf("%-34s %10s %10s\n", "", "CPU s", "wall s");
  std::printf("%-34s %10.3f %10.3f\n", "one process", one.cpu_seconds, one.wall_seconds);
  std::printf("%-34s %10.3f %10.3f\n", (std::to_string(shards) + " shards (sum; wall = slowest)").c_str(),
              shard_total.cpu_seconds, shard_max.wall_seconds);
  std::printf("%-34s %10.3f %10.3f\n", "merge", merged.cpu_seconds, merged.wall_seconds);
  std::printf("%-34s %10.3f %10.3f\n", "start-up + 1 case", empty.cpu_seconds, empty.wall_seconds);
  std::printf("%-34s %10.3f %10.3f\n", ("merge of " + std::to_string(merge_shards) + " shards").c_str(),
              many_merged.cpu_seconds, many_merged.wall_seconds);
  std::printf("ratio (shards + merge) / one process = %.3f   (goal <= 1.05 at N = 8, 20000 cases)\n", ratio);
  std::printf("per case %.3f ms CPU; merge of %lld shards %.1f ms CPU\n", per_case * 1e3, shards,
              merged.cpu_seconds * 1e3);

  // Paper: C cases on P cores, one shard per core. Wall ≈ start-up + C/P per-case
  // costs (the shards) + the merge, which reads P shard documents (linear in P,
  // per-shard cost from this run) and shrinks once. Adding cores stops paying where
  // the shards' time C·c/P equals the merge's P·m: P* = sqrt(C·c/m).
  const double big_cases = 1e7, cores = 1000;
  // The merge's cost per shard from the two merges (at least 1 µs: timer resolution).
  const double merge_per_shard = std::max(
      1e-6, (many_merged.cpu_seconds - merged.cpu_seconds) / static_cast<double>(merge_shards - shards));
  const double shard_wall = empty.wall_seconds + big_cases / cores * per_case;
  const double merge_wall = merged.cpu_seconds + (cores - static_cast<double>(shards)) * merge_per_shard;
  std::printf(
      "paper: 1e7 cases on 1000 cores: shards %.1f s + merge %.3f s = %.1f s wall (one core: %.1f h)\n",
      shard_wall, merge_wall, shard_wall + merge_wall, big_cases * per_case / 3600);
  std::printf("paper: scaling stops near P* = sqrt(C*c/m) = %.0f cores (merge %.3f ms per shard)\n",
              std::sqrt(big_cases * per_case / merge_per_shard), merge_per_shard * 1e3);
  return 0;
}

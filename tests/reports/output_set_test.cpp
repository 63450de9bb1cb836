// write_output_set: one set or nothing, never two runs mixed, no stale file
// left looking current, no temporary file left behind.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "reports/output_set.hpp"
#include "support/error.hpp"

namespace {

namespace fs = std::filesystem;
using kvcheck::reports::OutputFile;
using kvcheck::reports::write_output_set;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "kvcheck-output-set-XXXXXX").string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Names of the files in `dir` other than the lock file.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() != ".kvcheck-lock") names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<OutputFile> set_of(const fs::path& dir, const std::string& tag, std::size_t size) {
  std::vector<OutputFile> files;
  for (const char* name : {"report.json", "report.txt", "report.html", "junit.xml"}) {
    files.push_back({dir / name, tag + ":" + name + ":" + std::string(size, 'x')});
  }
  return files;
}

}  // namespace

TEST_CASE("OutputSet: every file of the set is written whole and nothing else is left", "[reports]") {
  TempDir d;
  write_output_set(set_of(d.path, "a", 10));
  REQUIRE(listing(d.path) ==
          std::vector<std::string>{"junit.xml", "report.html", "report.json", "report.txt"});
  REQUIRE(slurp(d.path / "report.json") == "a:report.json:xxxxxxxxxx");
  write_output_set(set_of(d.path, "b", 3));
  REQUIRE(slurp(d.path / "junit.xml") == "b:junit.xml:xxx");
  REQUIRE(listing(d.path).size() == 4);
}

TEST_CASE("OutputSet: a failed write publishes nothing and withdraws the earlier run's files", "[reports]") {
  TempDir d;
  write_output_set(set_of(d.path, "old-pass", 4));
  auto files = set_of(d.path, "new-fail", 4);
  files.push_back({d.path / "missing-dir" / "counterexample.json", "{}"});  // cannot be written
  try {
    write_output_set(files);
    FAIL("no error for an unwritable file");
  } catch (const kvcheck::Error& e) {
    REQUIRE(e.id() == kvcheck::ErrorId::kIo);
    REQUIRE(std::string(e.what()).find("counterexample.json") != std::string::npos);
  }
  // No stale PASS from the earlier run, no half of the new set, no temporary file.
  REQUIRE(listing(d.path).empty());
}

TEST_CASE("OutputSet: a full disk (file size limit) withdraws the set and leaves no temporary file",
          "[reports]") {
  TempDir d;
  write_output_set(set_of(d.path, "old-pass", 4));
  // In a child: RLIMIT_FSIZE makes the big file's write fail with EFBIG, as a full disk fails with ENOSPC.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    auto files = set_of(d.path, "new", 10);
    files[2].content.assign(1 << 20, 'h');  // report.html: past the limit
    try {
      write_output_set(files);
    } catch (const kvcheck::Error&) {
      ::_exit(7);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 7);
  REQUIRE(listing(d.path).empty());
}

TEST_CASE("OutputSet: concurrent runs into one directory never leave a mixed set", "[reports]") {
  TempDir d;
  for (int pair = 0; pair < 30; ++pair) {
    const std::string a = "run" + std::to_string(2 * pair), b = "run" + std::to_string(2 * pair + 1);
    std::thread ta([&] { write_output_set(set_of(d.path, a, 20000)); });
    std::thread tb([&] { write_output_set(set_of(d.path, b, 20000)); });
    ta.join();
    tb.join();
    // All four files come from the same run (whichever published last).
    const std::string owner = slurp(d.path / "report.json").substr(0, a.size());
    INFO("pair " << pair << " owner " << owner);
    REQUIRE((owner == a || owner == b));
    for (const char* name : {"report.txt", "report.html", "junit.xml"}) {
      REQUIRE(slurp(d.path / name).substr(0, owner.size() + 1) == owner + ":");
    }
    REQUIRE(listing(d.path).size() == 4);
  }
}

TEST_CASE("OutputSet: a failing writer withdraws under the lock and leaves what another run published",
          "[reports]") {
  TempDir d;
  write_output_set(set_of(d.path, "old-pass", 4));
  // This test is the other run: it holds the directory lock, as a run in its
  // publishing phase does.
  const int lock = ::open((d.path / ".kvcheck-lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  REQUIRE(lock >= 0);
  REQUIRE(::flock(lock, LOCK_EX) == 0);
  auto files = set_of(d.path, "new-fail", 4);
  files.push_back({d.path / "missing-dir" / "counterexample.json", "{}"});  // cannot be written
  std::string error;
  std::thread failing([&] {
    try {
      write_output_set(files);
    } catch (const kvcheck::Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // While another run holds the lock the failing writer has touched nothing.
  CHECK(listing(d.path) == std::vector<std::string>{"junit.xml", "report.html", "report.json", "report.txt"});
  // The other run publishes its report.json, then lets go.
  { std::ofstream(d.path / ".other") << "other-run:report.json"; }
  REQUIRE(::rename((d.path / ".other").c_str(), (d.path / "report.json").c_str()) == 0);
  ::close(lock);
  failing.join();
  CHECK(error.find("counterexample.json") != std::string::npos);
  // The other run's file stays whole; the earlier run's files the failing
  // writer saw unchanged are withdrawn.
  CHECK(listing(d.path) == std::vector<std::string>{"report.json"});
  CHECK(slurp(d.path / "report.json") == "other-run:report.json");
}

TEST_CASE("OutputSet: two outputs naming one file are refused naming both flags, nothing written",
          "[reports]") {
  using kvcheck::reports::require_distinct_outputs;
  TempDir d;
  const fs::path f = d.path / "r.json";
  try {
    require_distinct_outputs({{"--report", f}, {"--junit", d.path / "x" / ".." / "r.json"}});
    FAIL("no error for two flags naming one file");
  } catch (const kvcheck::Error& e) {
    CHECK(e.id() == kvcheck::ErrorId::kUsage);
    CHECK(e.where() == "--junit");
    CHECK_THAT(e.what(), Catch::Contains("--report"));
  }
  // Two names of one existing file (a hard link) are one file.
  std::ofstream(f) << "x";
  fs::create_hard_link(f, d.path / "link.json");
  CHECK_THROWS_AS(require_distinct_outputs({{"--report", f}, {"--html", d.path / "link.json"}}),
                  kvcheck::Error);
  require_distinct_outputs({{"--report", f}, {"--html", d.path / "r.html"}});
  // The set refuses two members at one path before writing anything.
  CHECK_THROWS_AS(write_output_set({{d.path / "a.txt", "1"}, {d.path / "." / "a.txt", "2"}}), kvcheck::Error);
  CHECK_FALSE(fs::exists(d.path / "a.txt"));
}

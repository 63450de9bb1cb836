// The one atomic file writer (support/atomic_write.hpp): a file is replaced
// whole or left as it was, and no temporary file is left behind.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/atomic_write.hpp"
#include "support/error.hpp"

TEST_CASE("write_file_atomic: replaces the file, and on failure keeps the old one and leaves no temp") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("kvcheck_atomic_write_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };

  const fs::path file = dir / "report.json";
  kvcheck::write_file_atomic(file, "old");
  REQUIRE(read(file) == "old");
  kvcheck::write_file_atomic(file, std::string("new\0data", 8));
  REQUIRE(read(file) == std::string("new\0data", 8));

  // Target is a directory: rename fails, the directory and its content stay.
  const fs::path target_dir = dir / "taken";
  fs::create_directories(target_dir);
  kvcheck::write_file_atomic(target_dir / "inner.txt", "keep");
  try {
    kvcheck::write_file_atomic(target_dir, "x");
    FAIL("expected kvcheck::Error");
  } catch (const kvcheck::Error& e) {
    REQUIRE(e.id() == kvcheck::ErrorId::kIo);
    REQUIRE(e.where() == target_dir.string());
  }
  REQUIRE(fs::is_directory(target_dir));
  REQUIRE(read(target_dir / "inner.txt") == "keep");

  // Missing parent directory.
  REQUIRE_THROWS_AS(kvcheck::write_file_atomic(dir / "no" / "such" / "file", "x"), kvcheck::Error);

  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++entries;
    REQUIRE(e.path().filename().string().find(".tmp-") == std::string::npos);
  }
  REQUIRE(entries == 2);  // report.json and taken/
  REQUIRE(read(file) == std::string("new\0data", 8));
  fs::remove_all(dir);
}

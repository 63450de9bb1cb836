// The one Catch2 main shared by every test executable.
//
// Every run judges something: the warnings NoAssertions (a test case or leaf
// section that ran no assertion fails) and NoTests (a run whose filter
// matches no test case exits 2) are always on. ctest runs one entry per test
// case by name (catch_discover_tests), and splits a name at ';' into entries
// that match nothing: without NoTests they would pass having run nothing.
// They are set here rather than as `--warn` arguments because Catch2 v2
// takes only one `--warn` per command line.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int code = session.applyCommandLine(argc, argv); code != 0) return code;
  auto& data = session.configData();
  data.warnings = static_cast<Catch::WarnAbout::What>(data.warnings | Catch::WarnAbout::NoAssertions |
                                                      Catch::WarnAbout::NoTests);
  // Catch exits with the number of failed assertions; 4 is ctest's skip code
  // (SKIP_RETURN_CODE 4: a CUDA test without a device), so a test with
  // exactly four failed assertions would read as skipped, not failed.
  const int failed = session.run();
  return failed == 4 ? 5 : failed;
}

// detail::attend_fma: model/certified_attend.cpp compiled with -mfma (see
// model/CMakeLists.txt; only on x86-64, only called when the CPU has an FMA).
#define KVCHECK_CERTIFIED_ATTEND attend_fma
#include "model/certified_attend.cpp"  // NOLINT(bugprone-suspicious-include)

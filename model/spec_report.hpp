// The reference model's reproduction of SPEC §6, as a readable table: every
// number recomputed (attention lab, bytes, ring trace, state 3, verify and
// prefill overwrite lists, layer-bound cache), beside the SPEC's value and a
// match mark. The values are computed here; the SPEC's are quoted only to
// compare against.
#pragma once

#include <string>
#include <vector>

namespace kvcheck::model {

/// One reproduced quantity.
struct SpecLine {
  std::string section;   ///< "attention lab", "bytes", ...
  std::string quantity;  ///< what is measured
  std::string computed;  ///< what the model computed
  std::string spec;      ///< what SPEC §6 says
  bool match = false;
};

/// Recomputes SPEC §6.
std::vector<SpecLine> reproduce_spec();

/// Renders the lines as an aligned text table with a final verdict line.
std::string spec_table(const std::vector<SpecLine>& lines);

}  // namespace kvcheck::model

// The reference model's reproduction of docs/semantics.md "Golden values", as a readable table: every
// number recomputed (attention lab, bytes, ring trace, state 3, verify and
// prefill overwrite lists, layer-bound cache), beside docs/semantics.md's value and a
// match mark. The values are computed here; docs/semantics.md's are quoted only to
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
  std::string spec;      ///< what docs/semantics.md "Golden values" says
  bool match = false;
};

/// Recomputes docs/semantics.md "Golden values".
std::vector<SpecLine> reproduce_spec();

/// Renders the lines as an aligned text table with a final verdict line.
std::string spec_table(const std::vector<SpecLine>& lines);

}  // namespace kvcheck::model

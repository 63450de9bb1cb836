// XML/HTML text escaping shared by the JUnit and HTML writers (internal).
#pragma once

#include <string>
#include <string_view>

namespace kvcheck::reports::detail {

/// Escapes & < > " ' and replaces characters XML 1.0 forbids (C0 controls
/// other than tab, newline, carriage return) with U+FFFD, so names and
/// commands from user files cannot break the document.
std::string xml_escape(std::string_view text);

}  // namespace kvcheck::reports::detail

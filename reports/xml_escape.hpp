// XML/HTML text escaping shared by the JUnit and HTML writers (internal).
#pragma once

#include <string>
#include <string_view>

namespace kvcheck::reports::detail {

/// Escapes & < > " ' and replaces with U+FFFD every character XML 1.0 (and
/// HTML) forbids: C0 controls other than tab, newline and carriage return,
/// U+FFFE and U+FFFF, surrogates, and any byte sequence that is not UTF-8
/// (a path on the command line may be any bytes). Names and commands from
/// user input can then never break the document.
std::string xml_escape(std::string_view text);

}  // namespace kvcheck::reports::detail

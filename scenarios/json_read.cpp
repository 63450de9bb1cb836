#include "scenarios/json_read.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

namespace kvcheck::scenarios::json_read {

// ---- paths and errors --------------------------------------------------------

std::string join_key(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string join_index(const std::string& path, std::size_t index) {
  return path + "[" + std::to_string(index) + "]";
}

[[noreturn]] void fail(ErrorId id, std::string where, const std::string& rule) {
  throw Error(id, std::move(where), rule);
}

// ---- SAX document builder ------------------------------------------------------

/// Builds a json DOM like nlohmann's own SAX DOM parser, and additionally
/// rejects duplicate keys (the default parser keeps the last silently),
/// non-finite numbers (1e999 parses to inf) and nesting beyond kMaxJsonDepth,
/// each with the JSON path where it happened.
namespace {

class DomBuilder {
 public:
  DomBuilder(json& root, bool one_line) : root_(root), one_line_(one_line) {}

  bool null() { return put(json(nullptr)) != nullptr; }
  bool boolean(bool value) { return put(json(value)) != nullptr; }
  bool number_integer(json::number_integer_t value) { return put(json(value)) != nullptr; }
  bool number_unsigned(json::number_unsigned_t value) { return put(json(value)) != nullptr; }
  bool number_float(json::number_float_t value, const json::string_t& text) {
    if (!std::isfinite(value)) {
      fail(ErrorId::kNonFinite, next_path(), "number " + text + " does not fit a double");
    }
    return put(json(value)) != nullptr;
  }
  bool string(json::string_t& value) { return put(json(std::move(value))) != nullptr; }
  bool binary(json::binary_t& /*value*/) {
    fail(ErrorId::kJsonSyntax, next_path(), "binary values are not JSON text");
  }
  bool start_object(std::size_t /*elements*/) { return open(json::object()); }
  bool key(json::string_t& key) {
    Frame& top = frames_.back();
    if (top.node->contains(key)) {
      fail(ErrorId::kJsonSyntax, join_key(frame_path(frames_.size() - 1), key),
           "duplicate key '" + key + "'");
    }
    top.key = std::move(key);
    return true;
  }
  bool end_object() {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*elements*/) { return open(json::array()); }
  bool end_array() {
    frames_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) {
    // Number literals beyond the double range (1e999) arrive here as
    // out_of_range 406; they are non-finite values, reported at their path.
    if (ex.id == 406) {
      fail(ErrorId::kNonFinite, next_path(), "number does not fit a double (overflows to infinity)");
    }
    // nlohmann's text reads "[json.exception.parse_error.101] parse error at
    // line 1, column 5: syntax error ..."; keep what follows "parse error at ".
    std::string message = ex.what();
    const auto at = message.find("parse error at ");
    if (at != std::string::npos) message = message.substr(at + 15);
    if (one_line_) {
      // A JSON Lines record is parsed alone: its "line 1, column C" is the column.
      const auto col = message.find("line 1, ");
      if (col != std::string::npos) message.erase(col, 8);
    }
    fail(ErrorId::kJsonSyntax, "byte " + std::to_string(position), "malformed JSON: " + message);
  }

 private:
  struct Frame {
    json* node;
    std::string key;  // current key when node is an object
  };

  // Path of the container at frames_[i] (its position inside its parent).
  std::string frame_path(std::size_t i) const {
    std::string path;
    for (std::size_t f = 0; f < i; ++f) {
      const Frame& frame = frames_[f];
      path = frame.node->is_object() ? join_key(path, frame.key) : join_index(path, frame.node->size() - 1);
    }
    return path;
  }

  // Path the next value put will have.
  std::string next_path() const {
    if (frames_.empty()) return "";
    const Frame& top = frames_.back();
    const std::string parent = frame_path(frames_.size() - 1);
    return top.node->is_object() ? join_key(parent, top.key) : join_index(parent, top.node->size());
  }

  bool open(json&& container) {
    if (frames_.size() >= static_cast<std::size_t>(kMaxJsonDepth)) {
      fail(ErrorId::kJsonSyntax, next_path(),
           "nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    json* node = put(std::move(container));
    frames_.push_back({node, {}});
    return true;
  }

  // Places a value in the open container (or as the root). Pointers into an
  // array stay valid: nothing is appended to a parent while a child is open.
  json* put(json&& value) {
    if (frames_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Frame& top = frames_.back();
    if (top.node->is_array()) {
      top.node->push_back(std::move(value));
      return &top.node->back();
    }
    json& slot = (*top.node)[top.key];
    slot = std::move(value);
    return &slot;
  }

  json& root_;
  bool one_line_;
  std::vector<Frame> frames_;
};

}  // namespace

json parse_document(std::string_view text, bool one_line) {
  json root;
  DomBuilder builder(root, one_line);
  json::sax_parse(text.begin(), text.end(), &builder, json::input_format_t::json, /*strict=*/true,
                  /*ignore_comments=*/false);
  return root;
}

// ---- typed reads ------------------------------------------------------------------

std::string describe(const json& j) {
  if (j.is_number_float()) return "a floating-point number";
  if (j.is_number()) return "an integer";
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_null()) return "null";
  if (j.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void type_error(const json& j, const std::string& path, std::string_view expected) {
  fail(ErrorId::kJsonType, path, "expected " + std::string(expected) + ", found " + describe(j));
}

const json& as_object(const json& j, const std::string& path) {
  if (!j.is_object()) type_error(j, path, "an object");
  return j;
}

const json& as_array(const json& j, const std::string& path) {
  if (!j.is_array()) type_error(j, path, "an array");
  return j;
}

void check_keys(const json& object, const std::string& path, const std::vector<std::string_view>& allowed,
                std::string_view owner) {
  for (const auto& item : object.items()) {
    if (std::find(allowed.begin(), allowed.end(), item.key()) != allowed.end()) continue;
    std::string list;
    for (std::string_view key : allowed) {
      if (!list.empty()) list += ", ";
      list += key;
    }
    const std::string what = owner.empty()
                                 ? "unknown key '" + item.key() + "'"
                                 : "key '" + item.key() + "' does not belong to " + std::string(owner);
    fail(ErrorId::kJsonUnknownKey, join_key(path, item.key()), what + " (allowed: " + list + ")");
  }
}

const json* find(const json& object, std::string_view key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

const json& require(const json& object, const std::string& path, std::string_view key,
                    std::string_view owner) {
  const json* value = find(object, key);
  if (value == nullptr) {
    fail(ErrorId::kJsonMissingKey, join_key(path, key),
         "missing required key '" + std::string(key) + "'" +
             (owner.empty() ? "" : " of " + std::string(owner)));
  }
  return *value;
}

std::int64_t get_i64(const json& j, const std::string& path) {
  if (j.is_number_integer() && !j.is_number_unsigned()) return j.get<std::int64_t>();
  if (j.is_number_unsigned()) {
    const auto value = j.get<std::uint64_t>();
    if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(ErrorId::kSize, path, "integer " + std::to_string(value) + " exceeds the 64-bit range");
    }
    return static_cast<std::int64_t>(value);
  }
  if (j.is_number_float()) {
    // Integer literals beyond uint64 parse as doubles; name the real problem.
    const double value = j.get<double>();
    if (std::trunc(value) == value && std::fabs(value) >= 0x1p63) {
      fail(ErrorId::kSize, path, "integer exceeds the 64-bit range");
    }
  }
  type_error(j, path, "an integer");
}

std::int32_t get_i32(const json& j, const std::string& path) {
  const std::int64_t value = get_i64(j, path);
  if (value > std::numeric_limits<std::int32_t>::max() || value < std::numeric_limits<std::int32_t>::min()) {
    fail(ErrorId::kSize, path, "integer " + std::to_string(value) + " exceeds the 32-bit range");
  }
  return static_cast<std::int32_t>(value);
}

std::uint64_t get_u64(const json& j, const std::string& path) {
  if (j.is_number_unsigned()) return j.get<std::uint64_t>();
  if (j.is_number_integer()) {
    fail(ErrorId::kJsonValue, path, "expected a non-negative integer, found " + j.dump());
  }
  if (j.is_number_float()) {
    const double value = j.get<double>();
    if (std::trunc(value) == value && std::fabs(value) >= 0x1p64) {
      fail(ErrorId::kSize, path, "integer exceeds the unsigned 64-bit range");
    }
  }
  type_error(j, path, "a non-negative integer");
}

double get_f64(const json& j, const std::string& path) {
  if (!j.is_number()) type_error(j, path, "a number");
  return j.get<double>();  // finite: the DOM builder rejected inf
}

std::optional<double> get_optional_f64(const json& j, const std::string& path) {
  if (j.is_null()) return std::nullopt;
  if (!j.is_number()) type_error(j, path, "a number or null");
  return j.get<double>();
}

bool get_bool(const json& j, const std::string& path) {
  if (!j.is_boolean()) type_error(j, path, "a boolean");
  return j.get<bool>();
}

std::string get_string(const json& j, const std::string& path) {
  if (!j.is_string()) type_error(j, path, "a string");
  return j.get<std::string>();
}

std::vector<double> get_f64_array(const json& j, const std::string& path) {
  as_array(j, path);
  std::vector<double> out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) out.push_back(get_f64(j[i], join_index(path, i)));
  return out;
}

void check_real(double value, const std::string& path) {
  if (!std::isfinite(value)) fail(ErrorId::kNonFinite, path, "value must be finite");
  if (std::fabs(value) > kMaxMagnitude) {
    fail(ErrorId::kNonFinite, path, "magnitude exceeds 1e18 (products would overflow f32)");
  }
}

std::string read_input_file(const std::filesystem::path& path, std::string_view what) {
  const std::string name = path.string();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail(ErrorId::kIo, name, "is a directory, not " + std::string(what));
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail(ErrorId::kIo, name, "cannot read: " + ec.message());
  if (size > kMaxFileBytes) fail(ErrorId::kSize, name, "file is larger than 256 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorId::kIo, name, "cannot open for reading");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) fail(ErrorId::kIo, name, "read failed");
  return buffer.str();
}

std::vector<std::filesystem::path> collect_files(
    const std::vector<std::string>& files_or_dirs,
    const std::function<bool(const std::filesystem::path&)>& wanted) {
  namespace fs = std::filesystem;
  std::vector<fs::path> out;
  for (const std::string& arg : files_or_dirs) {
    const fs::path root(arg);
    std::error_code ec;
    const fs::file_status status = fs::status(root, ec);
    if (ec || !fs::exists(status)) fail(ErrorId::kIo, arg, "no such file or directory");
    if (!fs::is_directory(status)) {
      out.push_back(root.lexically_normal());
      continue;
    }
    fs::recursive_directory_iterator it(root, ec), end;
    if (ec) fail(ErrorId::kIo, arg, "cannot list directory: " + ec.message());
    for (; it != end; it.increment(ec)) {
      if (ec) fail(ErrorId::kIo, arg, "cannot list directory: " + ec.message());
      std::error_code entry_ec;
      if (it->is_regular_file(entry_ec) && wanted(it->path())) out.push_back(it->path().lexically_normal());
    }
    if (ec) fail(ErrorId::kIo, arg, "cannot list directory: " + ec.message());
  }
  std::sort(out.begin(), out.end(),
            [](const fs::path& a, const fs::path& b) { return a.generic_string() < b.generic_string(); });
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace kvcheck::scenarios::json_read

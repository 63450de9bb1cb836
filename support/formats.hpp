// The element formats of stored rows, one table. Every place that asks what
// formats there are, what one is called, how many bytes a row of it takes or
// how finely it rounds reads KVCHECK_FORMATS: the one ElementFormat enum
// (scenarios::Format, impl::ElementFormat and model::Encoding are names for
// it, so no code translates between them), the names of scenario files,
// traces, the exec protocol and reports, the row bytes of the caches, the
// generator's budget and the memory estimate, the unit roundoff of the
// checker's tolerances. How a format rounds and lays out its bytes is
// written twice on purpose, from the format's definition: the reference's
// encoder (model/encoding.hpp) and the caches' (impl/element_format.hpp),
// so a bug in one is caught by the other.
//
// Dependency-free (the standard library only), so model/, impl/, scenarios/,
// properties/, cli/ and reports/ may all include it. Host only (the CUDA
// kernels take the format as a template argument and size rows on the host).
// Adding a format: docs/development.md.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvcheck {

// X(id, name, element_bytes, scale_block, unit_roundoff, code_bits):
//   id, name       the enumerator and the string of scenario files, traces,
//                  the exec protocol, reports and messages;
//   element_bytes  bytes of one element's code;
//   scale_block    elements per one-byte block scale stored after the row's
//                  codes (0: no scale): fp8 stores one ue8m0 byte per 32
//                  elements, the last block possibly short;
//   unit_roundoff  half the relative spacing of the element type (the
//                  tolerances' format term);
//   code_bits      bits of a position-code id the format stores exactly
//                  (properties/position_code.hpp: at most the significand).
#define KVCHECK_FORMATS(X)            \
  X(kF64, "f64", 8, 0, 0x1.0p-53, 20) \
  X(kF32, "f32", 4, 0, 0x1.0p-24, 12) \
  X(kBf16, "bf16", 2, 0, 0x1.0p-8, 8) \
  X(kFp8, "fp8", 1, 32, 0x1.0p-4, 4)

/// How one stored row's elements are encoded: "f64" (IEEE binary64), "f32"
/// (binary32), "bf16" (the upper half of binary32, round to nearest even),
/// "fp8" (OCP e4m3 codes, then one ue8m0 scale byte per 32 elements).
enum class ElementFormat : std::uint8_t {
#define KVCHECK_FORMAT_ENUMERATOR(id, name, element_bytes, scale_block, unit_roundoff, code_bits) id,
  KVCHECK_FORMATS(KVCHECK_FORMAT_ENUMERATOR)
#undef KVCHECK_FORMAT_ENUMERATOR
};

/// Every format, in table order (the order names are listed in messages).
inline constexpr ElementFormat kElementFormats[] = {
#define KVCHECK_FORMAT_VALUE(id, name, element_bytes, scale_block, unit_roundoff, code_bits) \
  ElementFormat::id,
    KVCHECK_FORMATS(KVCHECK_FORMAT_VALUE)
#undef KVCHECK_FORMAT_VALUE
};

/// Number of ElementFormat values, counted from the table.
inline constexpr int kElementFormatCount =
    static_cast<int>(sizeof kElementFormats / sizeof kElementFormats[0]);

/// One row of the table as data.
struct ElementFormatInfo {
  std::string_view name;       ///< "f64", "f32", "bf16", "fp8"
  std::int64_t element_bytes;  ///< bytes of one element's code
  std::int64_t scale_block;    ///< elements per one-byte block scale; 0: none
  double unit_roundoff;        ///< 2^-53, 2^-24, 2^-8, 2^-4
  int code_bits;               ///< bits of a position-code id stored exactly
};

/// The table's rows as data, in table order.
inline constexpr ElementFormatInfo kElementFormatInfo[] = {
#define KVCHECK_FORMAT_INFO(id, name, element_bytes, scale_block, unit_roundoff, code_bits) \
  {name, element_bytes, scale_block, unit_roundoff, code_bits},
    KVCHECK_FORMATS(KVCHECK_FORMAT_INFO)
#undef KVCHECK_FORMAT_INFO
};

/// The table row of `format`.
constexpr const ElementFormatInfo& format_info(ElementFormat format) noexcept {
  return kElementFormatInfo[static_cast<int>(format)];
}

/// Name of a format ("f64", "f32", "bf16", "fp8").
constexpr std::string_view format_name(ElementFormat format) noexcept {
  return format_info(format).name;
}

/// Parses a format name; returns false (and leaves *out alone) when unknown.
constexpr bool parse_format(std::string_view name, ElementFormat* out) noexcept {
  for (const ElementFormat f : kElementFormats) {
    if (format_name(f) == name) {
      *out = f;
      return true;
    }
  }
  return false;
}

/// Bytes of one element's code (fp8: 1, its block scales apart).
constexpr std::int64_t format_element_bytes(ElementFormat format) noexcept {
  return format_info(format).element_bytes;
}

/// Elements per one-byte block scale, 0 for a format without scales.
constexpr std::int64_t format_scale_block(ElementFormat format) noexcept {
  return format_info(format).scale_block;
}

/// Bytes of one stored row of `elements` elements: the codes, then one scale
/// byte per block *begun* (ceiling: a row of 33 fp8 elements has two blocks,
/// the second of one element, and both encoders write its scale, so a cache
/// allocates 33 + 2 = 35 bytes; 512 elements take 512 + 16 = 528).
constexpr std::int64_t format_row_bytes(ElementFormat format, std::int64_t elements) noexcept {
  const ElementFormatInfo& f = format_info(format);
  const std::int64_t scales = f.scale_block > 0 ? (elements + f.scale_block - 1) / f.scale_block : 0;
  return f.element_bytes * elements + scales;
}

/// Unit roundoff of the element type (half its relative spacing).
constexpr double format_unit_roundoff(ElementFormat format) noexcept {
  return format_info(format).unit_roundoff;
}

// ---------------------------------------------------------------------------
// The formats a cache writes its attention outputs in (docs/semantics.md
// "Output formats"), a table of its own: an output format is not a stored
// row's format (there is no fp16 row, and no fp8 output), and it is not the
// accumulation either: a kernel that accumulates in binary32 and writes
// bf16 rounds each output once more, into the output format, after the
// accumulation's last operation.
//
// X(id, name, significand_bits, min_exponent, max_finite):
//   id, name          the enumerator and the string of the exec hello
//                     ("output_format") and the reports;
//   significand_bits  p, the leading bit included (bf16 8, fp16 11);
//   min_exponent      emin: the smallest normal exponent (below 2^emin the
//                     spacing stays 2^(emin - p + 1): gradual underflow);
//   max_finite        the largest finite value (above it a rounding overflows).
// kAccumulation is "not declared": outputs are the accumulation's own
// results, rounded no further (p 0: no table figures).
#define KVCHECK_OUTPUT_FORMATS(X)                   \
  X(kAccumulation, "accumulation", 0, 0, 0.0)       \
  X(kF64, "f64", 53, -1022, 0x1.fffffffffffffp1023) \
  X(kF32, "f32", 24, -126, 0x1.fffffep127)          \
  X(kBf16, "bf16", 8, -126, 0x1.fep127)             \
  X(kFp16, "fp16", 11, -14, 65504.0)

/// The format of a cache's attention outputs (Capabilities::output_format).
enum class OutputFormat : std::uint8_t {
#define KVCHECK_OUTPUT_FORMAT_ENUMERATOR(id, name, significand_bits, min_exponent, max_finite) id,
  KVCHECK_OUTPUT_FORMATS(KVCHECK_OUTPUT_FORMAT_ENUMERATOR)
#undef KVCHECK_OUTPUT_FORMAT_ENUMERATOR
};

/// Every output format, in table order (kAccumulation first).
inline constexpr OutputFormat kOutputFormats[] = {
#define KVCHECK_OUTPUT_FORMAT_VALUE(id, name, significand_bits, min_exponent, max_finite) OutputFormat::id,
    KVCHECK_OUTPUT_FORMATS(KVCHECK_OUTPUT_FORMAT_VALUE)
#undef KVCHECK_OUTPUT_FORMAT_VALUE
};

/// One row of the output table as data.
struct OutputFormatInfo {
  std::string_view name;  ///< "accumulation", "f64", "f32", "bf16", "fp16"
  int significand_bits;   ///< p (0: kAccumulation)
  int min_exponent;       ///< emin
  double max_finite;      ///< largest finite value
};

/// The output table's rows as data, in table order.
inline constexpr OutputFormatInfo kOutputFormatInfo[] = {
#define KVCHECK_OUTPUT_FORMAT_INFO(id, name, significand_bits, min_exponent, max_finite) \
  {name, significand_bits, min_exponent, max_finite},
    KVCHECK_OUTPUT_FORMATS(KVCHECK_OUTPUT_FORMAT_INFO)
#undef KVCHECK_OUTPUT_FORMAT_INFO
};

/// The table row of `format`.
constexpr const OutputFormatInfo& output_format_info(OutputFormat format) noexcept {
  return kOutputFormatInfo[static_cast<int>(format)];
}

/// Name of an output format ("accumulation", "f64", "f32", "bf16", "fp16").
constexpr std::string_view output_format_name(OutputFormat format) noexcept {
  return output_format_info(format).name;
}

/// Parses a declared output format ("f64", "f32", "bf16", "fp16"; not
/// "accumulation", which is what declaring none means); false when unknown.
constexpr bool parse_output_format(std::string_view name, OutputFormat* out) noexcept {
  for (const OutputFormat f : kOutputFormats) {
    if (f != OutputFormat::kAccumulation && output_format_name(f) == name) {
      *out = f;
      return true;
    }
  }
  return false;
}

/// Unit roundoff of an output format, 2^-p (bf16 2^-8, fp16 2^-11); 0 for
/// kAccumulation (no rounding beyond the accumulation's).
constexpr double output_format_unit_roundoff(OutputFormat format) noexcept {
  const int p = output_format_info(format).significand_bits;
  double u = p > 0 ? 1.0 : 0.0;
  for (int i = 0; i < p; ++i) u /= 2;
  return u;
}

}  // namespace kvcheck

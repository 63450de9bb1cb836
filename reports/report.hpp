// Report: everything one kvcheck invocation hands to the writers (JSON, text,
// JUnit, HTML). The context says how the run was made (version, seed, backend,
// fault, command line) so any report can be replayed; the runs are the
// observations of properties/observation.hpp; the check summary is present
// only for property checks. Nothing here holds wall-clock time: equal input
// gives byte-identical reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "properties/observation.hpp"
#include "reports/output_set.hpp"

namespace kvcheck::reports {

/// How the reported runs were made; enough to replay them.
struct ReportContext {
  std::string tool_version = "0.1.0";  ///< kvcheck version
  std::uint64_t seed = 0;              ///< the invocation's seed
  std::string backend = "cpu";         ///< "cpu", "cuda", ...
  std::string fault = "none";          ///< injected fault, "none" for production code
  /// The reference's real significand bits, as every run records them: 53,
  /// 114 (`--precision 113`, mpfr_float_backend<34>) or 168 (`--precision 169`).
  int precision_bits = 114;
  int precision_requested = 113;  ///< `--precision` as given: 53, 113 or 169
  std::string command;            ///< the exact command line
};

/// One coverage class of a property check and its minimum-coverage gate.
struct CoverageCount {
  std::string name;          ///< e.g. "ring wrap", "verify with rejection"
  std::int64_t count = 0;    ///< cases that hit the class
  std::int64_t minimum = 1;  ///< gate: fewer hits fail the check
  /// True when the gate is met.
  bool met() const noexcept { return count >= minimum; }
};

/// A check's failing case that passes when replayed alone in a fresh cache:
/// the failure depends on the cases that ran before it in its process (the
/// engine keeps state across close/open, or is not deterministic).
struct EarlierCases {
  std::int64_t earlier_cases_run = 0;     ///< cases that ran before it in that process
  std::vector<std::uint64_t> case_seeds;  ///< the ones kept to reproduce it, oldest first
  std::vector<std::string> files;         ///< their schedules as written, in the same order
  bool reproduced = false;                ///< running them first in a fresh cache made it fail again
  std::string first_failure_there;        ///< its first failure in that process
};

/// A check of two caches side by side (`--against`, `--repeat-bitwise`):
/// what was compared over every case, and where the reported case differs.
struct SideBySide {
  std::string property;  ///< "agreement" (--against) or "repeat-bitwise"
  std::string first;     ///< the first cache (--impl), "A" in every difference
  std::string second;    ///< the second cache (--against; the first again for repeat-bitwise), "B"
  bool bitwise = false;  ///< outputs compared bit for bit (else within the larger tolerance)
  properties::ComparedCounts compared;  ///< what was compared, over every case
  /// The reported case's differing steps, one line each, in step order
  /// (empty when every case agreed).
  std::vector<std::string> differences;
};

/// The one line every writer shows for a side-by-side check, e.g.
/// "agreement of cpu (A) and layer (B), outputs within the larger
/// tolerance: 200 cases, 2900 steps (2900 resident sets), 5100 queries
/// compared (5100 reads, 5100 outputs)".
std::string side_by_side_text(const SideBySide& s);

/// The outcome of a property check (absent for single scenario runs).
struct CheckSummary {
  std::int64_t cases = 0;               ///< cases generated (ran + refused + skipped)
  std::int64_t failures = 0;            ///< cases that failed
  std::vector<CoverageCount> coverage;  ///< coverage classes with their gates
  std::string counterexample_file;      ///< shrunk schedule written as JSON, if any
  std::string replay_command;           ///< exact command that replays the failure
  std::uint64_t failing_case_seed = 0;  ///< seed of the failing case
  /// Seeds of every failing case in case order, the first
  /// properties::kListedFailingCases of them (`failures` counts all).
  std::vector<std::uint64_t> failing_case_seeds;
  /// What the cache makes available (properties::observed_name), passing or not.
  std::string observed;
  /// Set when the failing case passes alone in a fresh cache (the failure is
  /// still a FAIL, labelled "depends on earlier cases").
  std::optional<EarlierCases> depends_on_earlier = std::nullopt;
  // The counts (after the fields above, so their aggregate order stays).
  std::int64_t refused = 0;                     ///< cases the cache refused at open (they did not run)
  std::int64_t skipped = 0;                     ///< cases outside the cache's capabilities (not sent)
  std::int64_t queries = 0;                     ///< queries of the cases that ran
  std::int64_t queries_not_output_checked = 0;  ///< of those, queries whose output was not judged
  /// The gate on cases that ran: fewer than min_run_share * cases fail the
  /// check (`--min-run-share`).
  double min_run_share = 0;
  /// Set for a check of two caches side by side.
  std::optional<SideBySide> side_by_side = std::nullopt;
  /// False for replayed files compared side by side: their cases were not
  /// drawn, so a failure has no case seed to show.
  bool cases_drawn = true;
  /// `--max-failures N` given (0: not given), and the cases after the check
  /// stopped at its N-th failing case (not among `cases`; 0: it did not stop).
  std::int64_t max_failures = 0;
  std::int64_t cases_not_run = 0;
  /// Whether the failing case's seed is shown: a case failed and was drawn.
  bool shows_failing_case_seed() const noexcept { return failures != 0 && cases_drawn; }
  /// Cases that ran: neither refused nor skipped.
  std::int64_t ran() const noexcept { return cases - refused - skipped; }
  /// True when at least min_run_share of the cases ran.
  bool run_share_met() const noexcept;
  /// True when no case failed, enough cases ran and every coverage gate is met.
  bool passed() const noexcept;
};

/// One part of a command that runs several (`kvcheck demo`): what it printed
/// and whether it showed what it is meant to show. A part that plants a
/// fault (a bug switch, a trace of a faulty engine) is meant to fail: it
/// shows what it should when kvcheck catches the fault.
struct ReportPart {
  std::string title;                             ///< e.g. "6. A recorded trace audited"
  std::string text;                              ///< what the part printed (no timings)
  ReportContext context;                         ///< how its runs were made (its own command)
  std::vector<properties::RunObservation> runs;  ///< its runs (a counterexample, an audited trace)
  std::optional<CheckSummary> check;             ///< its property check, if any
  bool planted_fault = false;                    ///< the part plants a fault kvcheck must catch
  bool failed = false;                           ///< what it showed: something failed (a fault caught)
  /// True when the part showed what it is meant to: a planted fault caught,
  /// anything else passed.
  bool as_meant() const noexcept { return failed == planted_fault; }
};

/// The full report.
struct Report {
  ReportContext context;
  std::vector<properties::RunObservation> runs;
  std::optional<CheckSummary> check;
  /// Files written in the same set as the reports (the counterexample); the
  /// writers never read them.
  std::vector<OutputFile> attachments;
  /// The parts of a command that runs several, in the order it ran them
  /// (empty for check, replay and audit).
  std::vector<ReportPart> parts;
  /// True when every run passed, the check (if any) passed and every part
  /// showed what it is meant to; without a check or parts, at least one run
  /// must have run (not all refused or skipped): a replay that ran nothing
  /// judged nothing.
  bool passed() const noexcept;
};

/// A part as a report of its own (its context, runs and check), for the
/// writers that render a part as they render a report.
Report part_report(const ReportPart& part);

/// What the parts of a report add up to.
struct PartCounts {
  std::int64_t parts = 0;     ///< every part
  std::int64_t as_meant = 0;  ///< parts that showed what they are meant to
  std::int64_t planted = 0;   ///< parts that plant a fault
  std::int64_t caught = 0;    ///< of those, faults caught (the part failed, as meant)
};

/// The counts of `report`'s parts.
PartCounts part_counts(const Report& report) noexcept;

/// The one line every writer shows for parts, e.g. "6 parts: 6 showed what
/// they should; 2 of 2 planted faults caught".
std::string part_counts_text(const PartCounts& counts);

/// A part's verdict word: "PASS", "FAIL", "CAUGHT" (a planted fault caught)
/// or "MISSED" (a planted fault not caught).
std::string part_verdict(const ReportPart& part);

/// What the runs of a report add up to (every writer shows these).
struct RunCounts {
  std::int64_t runs = 0;                        ///< every run, skipped ones included
  std::int64_t ran = 0;                         ///< runs that ran (not refused, not skipped)
  std::int64_t passed = 0;                      ///< of those, runs that passed
  std::int64_t failed = 0;                      ///< runs that failed
  std::int64_t refused = 0;                     ///< runs whose configuration the cache refused at open
  std::int64_t skipped = 0;                     ///< runs outside the cache's capabilities (not sent)
  std::int64_t queries = 0;                     ///< queries of the runs that ran
  std::int64_t queries_not_output_checked = 0;  ///< of those, queries whose output was not judged
};

/// The counts of `report`'s runs.
RunCounts run_counts(const Report& report) noexcept;

/// The one line every writer shows for the runs, e.g. "3 runs: 2 ran (2
/// passed, 0 failed), 1 refused, 0 skipped; 0 of 41 queries not
/// output-checked"; "no run ran" leads when none did.
std::string run_counts_text(const RunCounts& counts);

/// The one line every writer shows for a check, e.g. "2000 cases: 239 ran,
/// 1761 refused, 0 skipped; 0 failed; 0 of 5120 queries not output-checked",
/// with "below the minimum share" when too few ran.
std::string check_counts_text(const CheckSummary& check);

// ---- the counts of one run and one step, defined once ------------------------
// Every writer prints these and nothing it counts itself; the run's other
// totals (lost_rows, extra_reads, collisions, output_failures, max_eps_units,
// queries, queries_not_output_checked) are the verdict's (properties/verdict.cpp).

/// Scenario steps a run observed: distinct step indices, a step on several
/// layers counted once, a step that writes no rows (accept, finish, reset)
/// counted like any other; a run that stopped early counts the steps it
/// reached. `steps=` in the text, `totals.steps` in the JSON, the HTML's
/// steps column.
std::int64_t steps_observed(const properties::RunObservation& run) noexcept;

/// What one step's queries add up to (the text explanation and the HTML step
/// table show these).
struct StepCounts {
  std::int64_t overwritten = 0;      ///< overwritten visible rows, summed over queries
  std::int64_t missing = 0;          ///< visible rows not read, summed over queries
  std::int64_t extra = 0;            ///< extra reads, summed over queries
  std::int64_t failing_queries = 0;  ///< queries whose verdict is failed
  std::int64_t output_failures = 0;  ///< queries whose output missed its tolerance
  /// Queries that read wrong rows: their output error measures the wrong
  /// rows, not the kernel, and is left out of max_eps_units (as the run's).
  std::int64_t wrong_reads = 0;
  std::int64_t not_output_checked = 0;  ///< queries whose output was not judged (wrong reads included)
  double max_eps_units = 0;      ///< largest output error of the queries that read correctly
  std::int64_t worst_query = -1;  ///< index of that query, -1 when none read correctly
};

/// The counts of `step`'s queries.
StepCounts step_counts(const properties::StepObservation& step) noexcept;

/// True when the format stores the generated rows exactly ("f64": rows are
/// generated as doubles): its outputs carry no quantization error and the
/// reports print none.
bool format_stores_exact_rows(std::string_view format) noexcept;

/// The resident set after a step, for a cache that reports frees or
/// declares a bound, with the step's slot events: "resident 12 rows, 3
/// blocks (bound 4 blocks per request: held 5); padded 2, moved 0, freed 4
/// (1 still visible)"; with cached rows (docs/semantics.md "Cached rows")
/// "resident 8 rows, 2 blocks (...), cached 4 rows, 1 blocks; padded 0,
/// moved 0, freed 0, cached 4, evicted 2". Empty when the step has nothing of this (every
/// writer shows this line and counts nothing itself).
std::string resident_text(const properties::StepObservation& step);

/// A request that began from a shared prefix, as every writer says it:
/// "request 1 began from request 0's first 5 positions (shared)"; "(stored
/// again)" when the cache stored every row again at the begin, "(2 stored
/// again, 3 shared)" when some.
std::string prefix_text(const properties::PrefixObservation& prefix);

/// The shared prefix whose begin came with `step`'s call (the first step of
/// a request that began from one), or nullptr.
const properties::PrefixObservation* prefix_begun_at(const properties::RunObservation& run,
                                                     const properties::StepObservation& step) noexcept;

/// The run's shared prefixes begun through scenario step `through` (every
/// one when `through` < 0), each as prefix_text, at most `limit` of them and
/// then "… (N more)": the lines a failing run's explanation gives.
std::vector<std::string> prefix_lines(const properties::RunObservation& run, std::int64_t through,
                                      std::size_t limit = 4);

/// The window as the scenario gives it, its own parameter with the
/// convention: "5(keys)", "4(left)" (4 rows to the left: 5 keys).
std::string window_text(const properties::RunObservation& run);
/// The keys each layer's queries see, "2,global,4 keys", when the scenario
/// gives each layer its own window; empty otherwise.
std::string layer_windows_text(const properties::RunObservation& run);

// ---- paged caches: block tables and block lifetimes, defined once -----------
// A paged cache (RunObservation::block_size > 0) puts position p of a request
// in some slot; the block of that slot is slot / block_size, the request's
// logical block p / block_size. kvcheck never sees a block freed: it sees the
// slots the cache said it wrote and read. So a block's life is told by its
// tenancies: a tenancy begins when a request's logical block is first
// written into the physical block, is used by that request's writes and
// reads of the block, and ends when another logical block (of another
// request, or of the same one) is written into it.

/// One tenancy of a physical block.
struct BlockTenancy {
  std::int64_t block = 0;               ///< physical block (slot / block_size)
  std::int64_t request = 0;             ///< the request whose rows it held
  std::int64_t logical = 0;             ///< the request's logical block (position / block_size)
  std::int64_t first_written_step = 0;  ///< scenario step of the first write
  std::int64_t last_used_step = 0;      ///< scenario step of the last write or read by that request
  std::int64_t ended_step = -1;         ///< scenario step whose write began the next tenancy; -1: still held
  std::int64_t next_request = -1;       ///< the next tenant's request (when ended)
  std::int64_t next_logical = -1;       ///< the next tenant's logical block (when ended)
};

/// One entry of a request's block table.
struct BlockTableEntry {
  std::int64_t logical = 0;   ///< position / block_size
  std::int64_t physical = 0;  ///< the block the cache wrote that logical block's rows to, latest
  bool held = true;           ///< false: another tenancy has since written the physical block
};

/// A request's block table (entries by logical block).
struct RequestBlockTable {
  std::int64_t request = 0;
  std::vector<BlockTableEntry> entries;
};

/// Block tables and lifetimes of one layer of a paged run, through one step.
struct PagedView {
  std::int64_t block_size = 0;
  std::int32_t layer = 0;
  std::int64_t through_step = -1;        ///< scenario step index of the last step taken in
  std::vector<RequestBlockTable> tables;  ///< by request
  std::vector<BlockTenancy> lifetimes;    ///< in the order the tenancies began
  std::int64_t blocks = 0;                ///< distinct physical blocks written
  std::int64_t reuses = 0;                ///< tenancies that ended (the block was written again)
  std::int64_t reused_by_other = 0;       ///< of those, the next tenant was another request
};

/// The block tables and lifetimes of `run` on the layer of `run.steps[through]`,
/// from the steps up to and including that one. Empty (block_size 0) when the
/// run is not paged or `through` < 0.
PagedView paged_view(const properties::RunObservation& run, std::int64_t through);

/// The tenancy that held position `position` of `request` in `view` (made
/// by paged_view(run, through)) when the request last wrote it, up to
/// `run.steps[through]`: the one in force at that write, not a later
/// tenancy of the same logical block; nullptr when none.
const BlockTenancy* tenancy_of(const PagedView& view, const properties::RunObservation& run, std::int64_t through,
                               std::int64_t request, std::int64_t position) noexcept;

/// "block 3 (request 0's block 1): written at step 2, last used at step 4,
/// reused by request 1 (its block 0) at step 5" (or "still held").
std::string tenancy_text(const BlockTenancy& t);

/// "[0:3, 1:7, 2:1 reused]": logical -> physical, entries whose block another
/// tenancy has since written marked "reused".
std::string block_table_text(const RequestBlockTable& table, std::size_t limit = 16);

/// "5 blocks written, 2 reuses (1 by another request)".
std::string paged_counts_text(const PagedView& view);

/// Index into `run.steps` of the step every writer pictures and explains:
/// the first failing step, else the last with queries, else the last; -1
/// when the run observed no step.
std::int64_t pictured_step(const properties::RunObservation& run) noexcept;

// ---- helpers shared by the writers -------------------------------------------

/// True when the query lost a row, read an extra row or missed its tolerance.
bool query_failed(const properties::QueryObservation& query) noexcept;

/// True when the step has a failing query, a collision or a failed expectation.
/// A typed refusal (`error`) alone is not a failure: scenarios may expect it.
bool step_failed(const properties::StepObservation& step) noexcept;

/// Index of the first failing step, or -1.
std::int64_t first_failing_step(const properties::RunObservation& run) noexcept;

/// Index of the query to explain in a step: the first failing one, else the
/// last one; -1 when the step has no queries.
std::int64_t focus_query(const properties::StepObservation& step) noexcept;

/// Per-query overwritten counts of a step, in query order (the JSON's
/// `overwritten_counts`).
std::vector<std::int64_t> overwritten_per_query(const properties::StepObservation& step);

/// Per-query overwritten counts of a step, e.g. "[5,4,3,2,1,0]".
std::string overwritten_counts(const properties::StepObservation& step);

/// "[a,b,c]", truncated after `limit` items as "[a,b,… (N more)]".
std::string int_list(const std::vector<std::int64_t>& values, std::size_t limit = 16);

/// A double in the shortest form that round-trips ("0.5", "1e-300", "inf").
std::string format_double(double value);

/// The replay command of a run: the check's replay command when present,
/// else the context's command line; empty when neither is known.
std::string replay_command(const Report& report);

/// One line on a failure that passes alone in a fresh cache: "depends on
/// earlier cases: case seed S failed after N earlier cases in its process
/// but passes alone in a fresh cache; reproduced after the K cases before it
/// (case seeds a, b, ...)" (or "not reproduced ..."), seeds after the 16th
/// left out.
std::string earlier_cases_text(const EarlierCases& earlier, std::uint64_t failing_case_seed);

}  // namespace kvcheck::reports

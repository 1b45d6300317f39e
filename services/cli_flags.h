#ifndef STRATA_SERVICES_CLI_FLAGS_H_
#define STRATA_SERVICES_CLI_FLAGS_H_

// Command-line preparation shared by the binaries' main(), ahead of absl::ParseCommandLine:
// "--some-flag" is rewritten to "--some_flag" (absl flag names cannot hold '-'), and every flag is checked
// against absl's registry, so an unknown flag or a bad value becomes a usage error the binary reports in
// its own words (absl would print its message and exit(1)). Thread-compatible: call from main().

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::services {

// `args` is the whole command line, program first; arguments after "--" are left alone. On success the
// values are already set and absl::ParseCommandLine over the rewritten arguments sets them again.
// INVALID_ARGUMENT naming the flag otherwise.
absl::Status PrepareFlagArgs(std::vector<std::string>* args);

// PrepareFlagArgs, then absl::ParseCommandLine over the rewritten arguments. Returns the positional
// arguments, the program name first; INVALID_ARGUMENT naming the flag for a usage error. Also turns off
// absl::Mutex deadlock detection, which Debian's Abseil leaves on (a graph update per lock).
absl::StatusOr<std::vector<std::string>> ParseFlags(std::vector<std::string> args);

// Installs SIGINT/SIGTERM handlers: the first signal sets the returned flag (the CLI cancels its call), a
// second one ends the process at once. Call once, from main().
const std::atomic<bool>* CancelOnSignal();

// True when the command line asks for help: "--help", "-h" or "-help" before any "--".
bool WantsHelp(const std::vector<std::string>& args);

// The exit codes every Strata binary uses, and the line --help prints about them.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // invalid input, failed or refused request or job
inline constexpr int kExitUsage = 2;    // unknown flag or command, bad flag value, missing argument
inline constexpr char kExitCodesHelp[] =
    "exit codes: 0 ok, 1 failure (invalid input, failed or refused request or job), 2 usage error";

// The --help text of a binary (print it on stdout and exit kExitOk): `usage` (how it is called, its
// commands), then every flag defined in the source files whose base names are `flag_files` (the binary's
// main and any library file that defines its flags), sorted, as typed (--max-tokens) with the flag's
// default and help, then `exit_codes`. Flags of other files (absl's own, other binaries') are left out.
std::string HelpText(absl::string_view usage, const std::vector<absl::string_view>& flag_files,
                     absl::string_view exit_codes = kExitCodesHelp);

// OK for a level strata::InitLogging knows ("trace", "debug", "info", "warn", "error", "critical", "off");
// INVALID_ARGUMENT naming --log-level otherwise.
absl::Status CheckLogLevel(const std::string& level);

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLI_FLAGS_H_

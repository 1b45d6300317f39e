#include "services/cli_flags.h"

#include <algorithm>
#include <csignal>

#include "absl/flags/parse.h"

#include <string_view>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "engine/log.h"

namespace strata::services {
namespace {

bool IsFlag(std::string_view arg) { return arg.size() > 1 && arg[0] == '-'; }

}  // namespace

absl::Status PrepareFlagArgs(std::vector<std::string>* args) {
  for (size_t i = 1; i < args->size(); ++i) {
    std::string& arg = (*args)[i];
    if (arg == "--") break;
    if (!IsFlag(arg)) continue;
    const size_t dashes = arg.compare(0, 2, "--") == 0 ? 2 : 1;
    const size_t equals = arg.find('=');
    const size_t name_end = equals == std::string::npos ? arg.size() : equals;
    const std::string shown = arg.substr(0, name_end);  // as typed, for messages
    for (size_t c = dashes; c < name_end; ++c) {
      if (arg[c] == '-') arg[c] = '_';
    }
    const std::string name = arg.substr(dashes, name_end - dashes);

    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && name.rfind("no", 0) == 0) {
      // "--noquick" sets a bool flag to false; it takes no value.
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() && equals == std::string::npos) continue;
    }
    if (flag == nullptr || flag->IsRetired()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", shown));
    }
    std::string value;
    if (equals != std::string::npos) {
      value = arg.substr(equals + 1);
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < args->size()) {
      value = (*args)[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag ", shown, " needs a value"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("bad value '", value, "' for ", shown));
    }
  }
  return absl::OkStatus();
}

std::string HelpText(absl::string_view usage, const std::vector<absl::string_view>& flag_files,
                     absl::string_view exit_codes) {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    const std::string filename = flag->Filename();
    absl::string_view file = filename;
    if (const size_t slash = file.rfind('/'); slash != absl::string_view::npos) file.remove_prefix(slash + 1);
    for (absl::string_view wanted : flag_files) {
      if (file == wanted) flags.push_back(flag);
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) { return a->Name() < b->Name(); });
  std::string text(usage);
  if (!text.empty() && text.back() != '\n') text += '\n';
  absl::StrAppend(&text, "\nflags (each also as --name=value):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    std::string shown(flag->Name());
    std::replace(shown.begin(), shown.end(), '_', '-');
    std::string def = flag->DefaultValue();
    if (def.empty()) def = "none";
    absl::StrAppend(&text, "  --", shown, "  (default: ", def, ")\n      ", flag->Help(), "\n");
  }
  absl::StrAppend(&text, "\n", exit_codes, "\n");
  return text;
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") return false;
    if (args[i] == "--help" || args[i] == "-h" || args[i] == "-help") return true;
  }
  return false;
}

absl::Status CheckLogLevel(const std::string& level) {
  for (const char* known : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    if (level == known) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bad value '", level, "' for --log-level; expected debug, info, warn, error or off"));
}

absl::StatusOr<std::vector<std::string>> ParseFlags(std::vector<std::string> args) {
  TurnOffMutexDeadlockDetection();  // every binary parses its flags first
  if (absl::Status status = PrepareFlagArgs(&args); !status.ok()) return status;
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(args.size()), argv.data());
  return std::vector<std::string>(positional.begin(), positional.end());
}

namespace {
std::atomic<bool> g_cancel_requested{false};
void OnCancelSignal(int) { g_cancel_requested.store(true); }
}  // namespace

const std::atomic<bool>* CancelOnSignal() {
  struct sigaction action = {};
  action.sa_handler = OnCancelSignal;
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  return &g_cancel_requested;
}

}  // namespace strata::services

#ifndef STRATA_TESTS_SERVICES_SERVER_PROCESS_UTIL_H_
#define STRATA_TESTS_SERVICES_SERVER_PROCESS_UTIL_H_

// A server binary (strata-server, strata-packd) run as a child process by a test: its output goes to a log
// file, its port is read from the line it logs once listening ("(port N"), and it is signalled and waited for
// with deadlines. The destructor kills a child still running. The binaries' paths come from the build
// (STRATA_SERVER_BINARY, STRATA_PACKD_BINARY). Header-only. One thread uses an instance.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

extern char** environ;

namespace strata::services::testing {

class ServerProcess {
 public:
  ServerProcess(const std::string& binary, const std::vector<std::string>& args, std::string log_path)
      : log_path_(std::move(log_path)) {
    std::vector<std::string> argv_strings = {binary};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attributes, &none);  // the child starts with no signal blocked
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
    if (posix_spawn(&pid_, binary.c_str(), &actions, &attributes, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
  }

  ~ServerProcess() {
    if (pid_ > 0 && !exit_code_.has_value()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  bool started() const { return pid_ > 0; }

  // The port the server logged, or 0 when it did not within `timeout` (or exited).
  int WaitForPort(absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      const std::string log = Log();
      if (const size_t at = log.find("(port "); at != std::string::npos) {
        const size_t start = at + 6;
        const size_t stop = log.find_first_not_of("0123456789", start);
        int port = 0;
        if (stop != std::string::npos && absl::SimpleAtoi(log.substr(start, stop - start), &port)) return port;
      }
      if (WaitForExit(absl::ZeroDuration()).has_value()) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }

  void Signal(int signal_number) const {
    if (pid_ > 0) kill(pid_, signal_number);
  }

  // The exit code (128 + N when killed by signal N), or nothing when still running after `timeout`.
  std::optional<int> WaitForExit(absl::Duration timeout = absl::Seconds(60)) {
    if (exit_code_.has_value() || pid_ <= 0) return exit_code_;
    const absl::Time end = absl::Now() + timeout;
    for (;;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_code_;
      }
      if (absl::Now() >= end) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::string Log() const {
    std::ifstream in(log_path_);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  std::string log_path_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

}  // namespace strata::services::testing

#endif  // STRATA_TESTS_SERVICES_SERVER_PROCESS_UTIL_H_

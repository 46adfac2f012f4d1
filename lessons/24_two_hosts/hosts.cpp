// hosts.cpp: two hosts on one machine, made with the commands an administrator types (ip, tc,
// unshare), each printed as it runs.
#include "hosts.h"

#include <sched.h>     // unshare, CLONE_NEWNET
#include <signal.h>    // kill
#include <sys/wait.h>  // WIFEXITED
#include <unistd.h>    // geteuid, access, getpid

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/child_process.h"  // defines: ChildProcess, describe_status
#include "common/report.h"         // defines: format
#include "common/verdict.h"        // defines: CourseError

namespace lesson24 {
namespace fs = std::filesystem;

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::stringstream folders(path);
  for (std::string folder; std::getline(folders, folder, ':');) {
    if (!folder.empty() && ::access((folder + "/" + name).c_str(), X_OK) == 0)
      return folder + "/" + name;
  }
  return "";
}

namespace {
std::string joined(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& word : argv) line += (line.empty() ? "" : " ") + word;
  return line;
}

constexpr const char* kPrefix = "gl24-";  // this lesson's namespaces: gl24-<pid>-<host>

// Runs `argv` (its program found by find_program), printed first when `print`; throws
// course::CourseError naming the command and its first line of output when it fails.
void run(const std::vector<std::string>& argv, bool print = true) {
  std::vector<std::string> command = argv;
  command[0] = find_program(argv[0]);
  if (print) std::printf("  # %s\n", joined(argv).c_str());
  std::fflush(stdout);
  course::ChildProcess child(command, {}, true);
  const std::vector<std::string> said = child.read_rest();
  const auto status = child.wait_for(std::chrono::seconds(30));
  if (status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return;
  throw course::CourseError(
      "`" + joined(argv) + "` failed (" + (status ? course::describe_status(*status) : "hung") +
          ")" + (said.empty() ? "" : ": " + said.front()),
      "run it by hand as root to see why; `ip netns list` shows what is left");
}
}  // namespace

std::string why_no_hosts() {
  if (::geteuid() != 0)
    return "making network namespaces needs root (run it with sudo, or as root in a VM)";
  for (const char* program : {"ip", "tc", "unshare"}) {
    if (find_program(program).empty())
      return std::string("no `") + program + "` (Debian: apt-get install iproute2 util-linux)";
  }
  // Root may still be refused one (a container without CAP_SYS_ADMIN): ask in a child, whose
  // namespace goes with it.
  try {
    run({"unshare", "--net", "true"}, /*print=*/false);
  } catch (const std::exception& e) {
    return "this machine refuses a network namespace even to root (" + std::string(e.what()) + ")";
  }
  return "";
}

std::string TwoHosts::name(int host) { return "host" + std::to_string(host); }
std::string TwoHosts::address(int host) { return "10.24.0." + std::to_string(host + 1); }

//! [make]
TwoHosts::TwoHosts() {
  const std::string pid = std::to_string(::getpid());
  for (int h = 0; h < 2; ++h) {
    netns_[h] = kPrefix + pid + "-" + std::to_string(h);
    cable_[h] = std::string("gl24") + (h == 0 ? "a" : "b") + pid;  // at most 15 characters
  }
  try {
    for (int h = 0; h < 2; ++h) {
      run({"ip", "netns", "add", netns_[h]});
      // Each host's name and both addresses, in the hosts file its processes read (ip netns exec
      // puts /etc/netns/NAME/hosts in place of /etc/hosts): host0 finds host1 by name, and back.
      fs::create_directories("/etc/netns/" + netns_[h]);
      std::ofstream hosts("/etc/netns/" + netns_[h] + "/hosts");
      hosts << "127.0.0.1 localhost\n"
            << address(0) << " " << name(0) << "\n"
            << address(1) << " " << name(1) << "\n";
      if (!hosts.flush()) throw course::CourseError("cannot write /etc/netns/" + netns_[h], "");
    }
    run({"ip", "link", "add", cable_[0], "netns", netns_[0], "type", "veth", "peer", "name",
         cable_[1], "netns", netns_[1]});
    for (int h = 0; h < 2; ++h) {
      run({"ip", "-n", netns_[h], "addr", "add", address(h) + "/24", "dev", cable_[h]});
      run({"ip", "-n", netns_[h], "link", "set", "lo", "up"});
      run({"ip", "-n", netns_[h], "link", "set", cable_[h], "up"});
    }
  } catch (...) {
    remove();  // what was made so far
    throw;
  }
}
//! [make]

TwoHosts::~TwoHosts() { remove(); }

void TwoHosts::remove() {
  for (int h = 0; h < 2; ++h) {
    if (netns_[h].empty()) continue;
    std::error_code ignored;
    fs::remove_all("/etc/netns/" + netns_[h], ignored);
    if (fs::exists("/run/netns/" + netns_[h], ignored)) {
      try {
        run({"ip", "netns", "del", netns_[h]}, false);  // the cable goes with its namespace
      } catch (const std::exception& e) {
        std::fprintf(stderr, "warning: %s\n", e.what());
      }
    }
  }
}

std::vector<std::string> TwoHosts::on(int host, const std::vector<std::string>& argv) const {
  // ip netns exec: into the host's network stack; unshare --uts: a host name of its own, set by
  // sh before it becomes the program (exec), so that the program's process is the one started.
  std::vector<std::string> command{find_program("ip"),
                                   "netns",
                                   "exec",
                                   netns_[host],
                                   find_program("unshare"),
                                   "--uts",
                                   "sh",
                                   "-c",
                                   "hostname \"$0\" && exec \"$@\"",
                                   name(host)};
  command.insert(command.end(), argv.begin(), argv.end());
  return command;
}

std::string TwoHosts::rate_name(double gbit) {
  if (gbit <= 0) return "unlimited";
  return gbit >= 1 ? course::format("%.0fgbit", gbit) : course::format("%.0fmbit", gbit * 1000);
}

long long TwoHosts::burst_bytes(double gbit) {
  return std::max(64LL * 1024, static_cast<long long>(gbit * 1e9 / 8 / 1000));
}

void TwoHosts::limit(double gbit) {
  // A token bucket: `gbit` on average, and a burst of at most 1 ms of it at full speed (at least
  // 64 KB, a TCP segment the cable takes whole); a packet waits at most 100 ms, then is dropped.
  const long long burst = burst_bytes(gbit);
  for (int h = 0; h < 2; ++h) {
    if (gbit <= 0) {
      if (limited_) run({"tc", "-n", netns_[h], "qdisc", "del", "dev", cable_[h], "root"});
      continue;
    }
    run({"tc", "-n", netns_[h], "qdisc", "replace", "dev", cable_[h], "root", "tbf", "rate",
         rate_name(gbit), "burst", std::to_string(burst), "latency", "100ms"});
  }
  limited_ = gbit > 0;
}

void TwoHosts::cut() {
  for (int h = 0; h < 2; ++h) run({"ip", "-n", netns_[h], "link", "set", cable_[h], "down"});
}

void TwoHosts::mend() {
  for (int h = 0; h < 2; ++h) run({"ip", "-n", netns_[h], "link", "set", cable_[h], "up"});
}

int remove_stale_hosts() {
  int removed = 0;
  // A namespace in /run/netns (gone after a reboot), or its hosts file in /etc/netns (kept).
  for (const char* folder : {"/run/netns", "/etc/netns"}) {
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(folder, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(kPrefix, 0) != 0) continue;
      const long pid = std::strtol(name.c_str() + std::strlen(kPrefix), nullptr, 10);
      // The process that made it is gone.
      const bool gone = ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
      if (pid <= 0 || !gone) continue;
      try {
        if (fs::exists("/run/netns/" + name, error)) run({"ip", "netns", "del", name}, false);
      } catch (const std::exception&) {  // (left for the next run, or for `ip netns del` by hand)
      }
      fs::remove_all("/etc/netns/" + name, error);
      ++removed;
    }
  }
  return removed;
}

}  // namespace lesson24

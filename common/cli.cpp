// cli.cpp: CLI11 behind a small interface, and the start of every lesson.
#include "common/cli.h"

#include <ATen/Parallel.h>  // defines: at::get_num_threads, at::set_num_threads
#include <sched.h>

#include <CLI/CLI.hpp>  // defines: CLI::App
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "common/device.h"
#include "common/verdict.h"

namespace course {

namespace {
// CLI11 prints an option's name and type in a 30-column field, then its help on the same line,
// however long; a line break in the help continues under that column. So a validator's own words
// ("INT:INT in [0 - 1024]") would push the help onto a line of its own: the range goes into the
// help instead, and help past 100 columns is folded at a word (as is the program's description).
constexpr std::size_t kHelpColumn = 30, kHelpWidth = 100 - kHelpColumn;
std::string folded(const std::string& help, std::size_t width = kHelpWidth) {
  std::string text, line, word;
  std::istringstream words(help);
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      text += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return text + line;
}
// A number flag held to [min, max], the range said in its help.
template <typename T>
void add_ranged(CLI::App& app, const std::string& flag, T& value, const std::string& help, T min,
                T max) {
  std::ostringstream text;
  text << help << " [" << min << "-" << max << "]";
  app.add_option(flag, value, folded(text.str()))
      ->check(CLI::Range(min, max).description(""))
      ->capture_default_str();
}
}  // namespace

struct Cli::Impl {
  CLI::App app;
  CommonOptions& options;
  Impl(const std::string& description, const std::string& program, CommonOptions& opts)
      : app(description, program), options(opts) {}
};

Cli::Cli(const std::string& program, const std::string& description, CommonOptions& options)
    : impl_(std::make_unique<Impl>(folded(description, 100), program, options)) {
  auto& app = impl_->app;
  app.add_option("--device", options.device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--seed", options.seed, "random seed")->capture_default_str();
  app.add_flag("--quick", options.quick, "a few seconds of work (smoke tests)");
  add_ranged(app, "--threads", options.threads,
             "CPU threads for LibTorch (0 = all cores; at most the cores)", 0, 1024);
}

Cli::~Cli() = default;

void Cli::add_data_dir() {
  impl_->app.add_option("--data-dir", impl_->options.data_dir,
                        folded("folder with the Fashion-MNIST .gz files (default: "
                               "$GPU_LESSONS_DATA_DIR, then " GPU_LESSONS_DEFAULT_DATA_DIR ")"));
}

void Cli::add_option(const std::string& flag, int& value, const std::string& help, int min,
                     int max) {
  add_ranged(impl_->app, flag, value, help, min, max);
}

void Cli::add_option(const std::string& flag, double& value, const std::string& help, double min,
                     double max) {
  add_ranged(impl_->app, flag, value, help, min, max);
}

void Cli::add_option(const std::string& flag, std::string& value, const std::string& help,
                     const std::vector<std::string>& choices) {
  std::string one_of;
  for (const auto& choice : choices) one_of += (one_of.empty() ? "" : "|") + choice;
  impl_->app.add_option(flag, value, folded(help + " {" + one_of + "}"))
      ->check(CLI::IsMember(choices).description(""))
      ->capture_default_str();
}

void Cli::add_path(const std::string& flag, std::string& value, const std::string& help) {
  impl_->app.add_option(flag, value, folded(help))->type_name("PATH");
}

void Cli::add_flag(const std::string& flag, bool& value, const std::string& help) {
  impl_->app.add_flag(flag, value, folded(help));
}

void Cli::add_hidden_path(const std::string& flag, std::string& value) {
  impl_->app.add_option(flag, value)->group("");  // CLI11: no group, no line in --help
}

void Cli::add_hidden_flag(const std::string& flag, bool& value) {
  impl_->app.add_flag(flag, value)->group("");
}

std::optional<int> Cli::parse(int argc, char** argv) {
  try {
    impl_->app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << impl_->app.help();
    return kExitPass;
  } catch (const CLI::ParseError& error) {
    print_error(error.what(), "run '" + impl_->app.get_name() + " --help' to see the flags");
    return kExitUsage;
  }
  return std::nullopt;
}

namespace {
// The quota in `dir`, in cores (0: none): cgroup v2's cpu.max ("QUOTA PERIOD", or "max PERIOD"),
// else v1's cpu.cfs_quota_us and cpu.cfs_period_us (a quota of -1 for none).
double quota_in(const std::string& dir) {
  double quota = 0, period = 0;
  std::ifstream v2(dir + "/cpu.max");
  std::string first;
  if (v2 >> first >> period)
    return first == "max" || period <= 0 ? 0 : std::atof(first.c_str()) / period;
  std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us");
  return q >> quota && p >> period && quota > 0 && period > 0 ? quota / period : 0;
}
}  // namespace

int cpu_quota_cores(const std::string& cgroup_root, const std::string& self_cgroup) {
  // This process's cgroup, from the line "0::/PATH" (v2) or "N:cpu,...:/PATH" (v1) of
  // /proc/self/cgroup; each folder from it up to the root may hold a quota, and the smallest holds.
  std::ifstream lines(self_cgroup);
  std::string line, v1, v2;
  while (std::getline(lines, line)) {
    const auto colon = line.find(':'), second = line.find(':', colon + 1);
    if (colon == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(colon + 1, second - colon - 1) + ",";
    if (controllers == ",,") v2 = line.substr(second + 1);
    if (controllers.find(",cpu,") != std::string::npos) v1 = "/cpu" + line.substr(second + 1);
  }
  double cores = 0;
  if (v1.empty() && v2.empty()) {  // no /proc/self/cgroup: the root of either layout
    cores = std::max(quota_in(cgroup_root), quota_in(cgroup_root + "/cpu"));
  }
  std::string dir = v1.empty() ? v2 : v1;  // a v1 cpu controller is where the quota is
  if (!dir.empty() && dir.back() == '/') dir.pop_back();  // "/" is the root: ""
  // Up the tree: "/a/b", then "/a", then "" (the root).
  while (true) {
    const double here = quota_in(cgroup_root + dir);
    if (here > 0 && (cores == 0 || here < cores)) cores = here;
    const auto slash = dir.rfind('/');
    if (slash == std::string::npos) break;
    dir.resize(slash);
  }
  return cores > 0 ? std::max(1, static_cast<int>(std::ceil(cores))) : 0;
}

int available_cores() {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  const int quota = cpu_quota_cores();
  return quota > 0 ? std::min(cores, quota) : cores;
}

CpuThreads::CpuThreads(int threads) : previous_(at::get_num_threads()) {
  if (threads > 0) at::set_num_threads(threads);
}

CpuThreads::~CpuThreads() {
  if (at::get_num_threads() != previous_) at::set_num_threads(previous_);
}

namespace {
c10::Device start(const CommonOptions& options, const DeviceChoice& choice) {
  // LibTorch 1.13 starts with one intra-op thread on a 2-core machine; the course uses them all.
  // More threads than cores never help: at the end of each operator every thread waits for the
  // slowest, and a thread that has no core waits for one (bench_training's BM_TrainStepThreadsCpu
  // measures it). So --threads is held to the cores, and says so.
  const int cores = available_cores();
  at::set_num_threads(options.threads > 0 ? std::min(options.threads, cores) : cores);
  std::cout << "Device: " << describe(choice.device) << std::endl;
  if (!choice.fallback.empty()) {
    std::cout << "  note: --device " << choice.requested << " runs on the CPU: " << choice.fallback
              << std::endl;
  }
  if (options.threads > cores) {
    std::cout << "  note: --threads " << options.threads << " is more than the " << cores
              << " cores this process may use; LibTorch runs " << cores << std::endl;
  }
  return choice.device;
}
}  // namespace

c10::Device start_lesson(const CommonOptions& options, const c10::Device& chosen) {
  DeviceChoice choice = resolve_device(options.device);  // its fallback note included
  if (options.device == "auto") {  // the lesson's own choice, kept (a GPU as cuda:0)
    choice.device = chosen.is_cuda() && !chosen.has_index() ? c10::Device(c10::kCUDA, 0) : chosen;
  }
  return start(options, choice);
}

c10::Device start_lesson(const CommonOptions& options) {
  return start(options, resolve_device(options.device));
}

}  // namespace course

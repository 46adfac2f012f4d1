// cli.cpp: CLI11 behind a small interface, and the start of every lesson.
#include "common/cli.h"

#include <sched.h>

#include <iostream>
#include <thread>

#include <ATen/Parallel.h>  // defines: at::get_num_threads, at::set_num_threads
#include <CLI/CLI.hpp>      // defines: CLI::App

#include "common/device.h"
#include "common/memory.h"
#include "common/verdict.h"

namespace course {

struct Cli::Impl {
  CLI::App app;
  CommonOptions& options;
  Impl(const std::string& description, const std::string& program, CommonOptions& opts)
      : app(description, program), options(opts) {}
};

Cli::Cli(const std::string& program, const std::string& description, CommonOptions& options)
    : impl_(std::make_unique<Impl>(description, program, options)) {
  auto& app = impl_->app;
  app.add_option("--device", options.device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--seed", options.seed, "random seed")->capture_default_str();
  app.add_flag("--quick", options.quick, "a few seconds of work (smoke tests)");
  app.add_option("--threads", options.threads, "CPU threads for LibTorch (0 = all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
}

Cli::~Cli() = default;

void Cli::add_data_dir() {
  impl_->app.add_option("--data-dir", impl_->options.data_dir,
                        "folder with the Fashion-MNIST .gz files (default: $GPU_LESSONS_DATA_DIR, "
                        "then " GPU_LESSONS_DEFAULT_DATA_DIR ")");
}

void Cli::add_option(const std::string& flag, int& value, const std::string& help, int min,
                     int max) {
  impl_->app.add_option(flag, value, help)->check(CLI::Range(min, max))->capture_default_str();
}

void Cli::add_option(const std::string& flag, double& value, const std::string& help, double min,
                     double max) {
  impl_->app.add_option(flag, value, help)->check(CLI::Range(min, max))->capture_default_str();
}

void Cli::add_option(const std::string& flag, std::string& value, const std::string& help,
                     const std::vector<std::string>& choices) {
  impl_->app.add_option(flag, value, help)->check(CLI::IsMember(choices))->capture_default_str();
}

void Cli::add_path(const std::string& flag, std::string& value, const std::string& help) {
  impl_->app.add_option(flag, value, help)->type_name("PATH");
}

void Cli::add_flag(const std::string& flag, bool& value, const std::string& help) {
  impl_->app.add_flag(flag, value, help);
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

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

CpuThreads::CpuThreads(int threads) : previous_(at::get_num_threads()) {
  if (threads > 0) at::set_num_threads(threads);
}

CpuThreads::~CpuThreads() {
  if (at::get_num_threads() != previous_) at::set_num_threads(previous_);
}

c10::Device start_lesson(const CommonOptions& options) {
  // LibTorch 1.13 starts with one intra-op thread on a 2-core machine; the course uses them all.
  at::set_num_threads(options.threads > 0 ? options.threads : available_cores());
  const DeviceChoice choice = resolve_device(options.device);
  // Count CPU allocations from here on, so lessons can report CPU memory like CUDA memory.
  install_counting_cpu_allocator();
  std::cout << "Device: " << describe(choice.device) << std::endl;
  if (!choice.fallback.empty()) {
    std::cout << "  note: --device " << choice.requested << " runs on the CPU: " << choice.fallback
              << std::endl;
  }
  return choice.device;
}

}  // namespace course

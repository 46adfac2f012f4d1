// cli.h defines: the flags every lesson shares (--device, --seed, --quick, --threads, --help),
// a small wrapper to add a lesson's own flags, and start_lesson() (threads, device, first line).
#pragma once

#include <c10/core/Device.h>  // defines: c10::Device

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace course {

/// Flags shared by every lesson. A lesson sets its defaults before Cli::parse().
struct CommonOptions {
  std::string device = "auto";  ///< auto|cpu|cuda|cuda:N
  std::string data_dir;         ///< empty: $GPU_LESSONS_DATA_DIR, then the Debian package's folder
  std::uint64_t seed = 0;       ///< every random number in a lesson derives from it
  bool quick = false;           ///< a few seconds of work, for smoke tests
  int threads = 0;              ///< CPU threads for LibTorch; 0 = all cores
};

/// Command-line parsing for a lesson (CLI11 underneath, kept out of the lessons' compile time).
class Cli {
 public:
  Cli(const std::string& program, const std::string& description, CommonOptions& options);
  ~Cli();
  Cli(const Cli&) = delete;
  Cli& operator=(const Cli&) = delete;

  /// Adds --data-dir (lessons that read Fashion-MNIST).
  void add_data_dir();
  void add_option(const std::string& flag, int& value, const std::string& help, int min, int max);
  void add_option(const std::string& flag, double& value, const std::string& help, double min,
                  double max);
  void add_option(const std::string& flag, std::string& value, const std::string& help,
                  const std::vector<std::string>& choices);
  /// A file path (any string; the lesson checks it when it uses it).
  void add_path(const std::string& flag, std::string& value, const std::string& help);
  void add_flag(const std::string& flag, bool& value, const std::string& help);
  /// A flag the program passes to itself (a child process it starts): parsed, but not listed by
  /// --help, since a learner never types it.
  void add_hidden_path(const std::string& flag, std::string& value);
  void add_hidden_flag(const std::string& flag, bool& value);

  /// Parses argv. Returns an exit code when the program must stop now (0 after --help,
  /// 2 after a bad flag, with the reason on stderr), or nothing to go on.
  std::optional<int> parse(int argc, char** argv);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Applies --threads, resolves --device (UsageError on a bad one) and prints the device line,
/// always the lesson's first line, plus the reason when a CUDA request fell back to the CPU.
/// `chosen` is the lesson's own choice, the tutorials' `cuda if available else cpu`, which
/// --device auto (the default) keeps (a GPU as cuda:0); another --device overrides it.
c10::Device start_lesson(const CommonOptions& options, const c10::Device& chosen);
/// The same, with --device auto's choice made by resolve_device.
c10::Device start_lesson(const CommonOptions& options);

/// The CPU time a quota gives this process, in cores rounded up: the smallest quota of its cgroup
/// and the cgroups above it (cgroup v2's cpu.max, else v1's cfs_quota_us over cfs_period_us), as
/// /proc/self/cgroup names them under `cgroup_root`; 0 when there is none.
int cpu_quota_cores(const std::string& cgroup_root = "/sys/fs/cgroup",
                    const std::string& self_cgroup = "/proc/self/cgroup");
/// The number of CPU cores this process may use: those it may run on (its affinity), at most its
/// CPU quota.
int available_cores();

/// Sets LibTorch's CPU thread count for a scope, the previous one back at its end (`threads` <= 0:
/// left alone). One thread makes CPU arithmetic repeat bit for bit: a multi-threaded BLAS (MKL, in
/// PyTorch's LibTorch) may split a product's sums between threads differently on each run.
class CpuThreads {
 public:
  explicit CpuThreads(int threads);
  ~CpuThreads();
  CpuThreads(const CpuThreads&) = delete;
  CpuThreads& operator=(const CpuThreads&) = delete;

 private:
  int previous_;
};

}  // namespace course

// Lesson 22 (going further from 10) — a model trained in Python, compiled, and run from C++
// without declaring it again. Lesson 10 loads the tutorial's torch.save(model.state_dict()) into an
// ANN written a second time in C++. Here Python hands over the model itself: torch.export records
// what the ANN's forward() does as a graph of ATen operators, AOTInductor compiles that graph into
// machine code for one device and packs it, with the weights, into a .pt2 file, and C++ loads that
// package with torch::inductor::AOTIModelPackageLoader and calls it. No Python, no compiler and no
// C++ model class are needed where the package runs.
//
// You will learn:
//   - how Python makes the package (python/tutorial_program.py --export: the tutorial's training,
//     then torch.export.export and torch._inductor.aoti_compile_and_package);
//   - how C++ loads it and runs it (AOTIModelPackageLoader, run(), get_metadata());
//   - that it computes what the same weights compute in lesson 05's ANN (lesson 10's route), and
//     what Python printed for them;
//   - what a package checks about its inputs and what it does not (AOTI_RUNTIME_CHECK_INPUTS);
//   - what it costs and saves against the eager model, on a batch of 64 and on the whole test set.
//
// Run:    build/bin/lesson22_aot_inductor [--device ...] [--quick] [--data-dir DIR]
//           [--package FILE [--state-dict FILE]] [--remake]
//         Without --package the lesson has Python make one for its device (once: it is kept in the
//         build's packages/ folder), from the Python whose torch is this LibTorch.
// Checks: the package's logits equal the eager ANN's within float32's tolerance and its
//         predictions differ only where two classes tie within it; its test accuracy is the one
//         Python printed. Exit 0 PASS, 1 FAIL, 2 bad flag, file or package, 77 on a LibTorch
//         without AOTInductor (before 2.6: Debian's 1.13).
#include <torch/torch.h>  // defines: torch::Tensor, torch::NoGradGuard, torch::max, torch::topk

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "common/ann.h"              // defines: ANN (lesson 05's)
#include "common/child_process.h"    // defines: ChildProcess, describe_status, self_executable
#include "common/cli.h"              // defines: Cli, start_lesson
#include "common/compare.h"          // defines: max_rel_diff, tolerance_for
#include "common/data.h"             // defines: ImageSet, find_fashion_mnist, load_fashion_mnist
#include "common/report.h"           // defines: format (printf into a std::string)
#include "common/timing.h"           // defines: time_median, describe, timing_note
#include "common/verdict.h"          // defines: Verdict, CourseError, report_error
#include "common/version.h"          // defines: GPU_LESSONS_TORCH_AT_LEAST
#include "torch_files/state_dict.h"  // defines: read_python_state_dict, load_state_dict

#if GPU_LESSONS_TORCH_AT_LEAST(2, 6)            // AOTIModelPackageLoader came with PyTorch 2.6
#include <caffe2/serialize/inline_container.h>  // defines: PyTorchStreamReader (a .pt2's zip)
#include <dlfcn.h>  // defines: dlopen, dlinfo, dladdr (which libtorch.so this process runs)
#include <link.h>   // defines: link_map
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>  // AOTIModelPackageLoader
#define LESSON22_WITH_AOTI 1
#endif

#ifdef LESSON22_WITH_AOTI
namespace lesson22 {

// ---- knobs --------------------------------------------------------------------------------------
//! [knobs]
constexpr std::int64_t kBatchSize = 64;  // the tutorial's test DataLoader(batch_size=64)
constexpr int kPythonEpochs = 1;         // the package's training: one of the tutorial's epochs
constexpr int kQuickSamples = 10000;     // --quick: Python trains on the first 10,000 images
constexpr std::int64_t kClasses = 10;
constexpr int kWarmup = 5, kRuns = 30;  // timed calls: untimed first, then the median of these
//! [knobs]

// ---- the package, made by Python ----------------------------------------------------------------
//! [make]
struct Made {
  std::string package;     // the .pt2 AOTInductor wrote
  std::string state_dict;  // the same weights, torch.save(model.state_dict()): lesson 10's file
};

// The Python whose torch is this LibTorch: $GPU_LESSONS_PYTHON, else the one CMake found.
std::string python() {
  if (const char* p = std::getenv("GPU_LESSONS_PYTHON"); p && *p) return p;
  return LESSON22_PYTHON;  // the 2.11 flavour's .venv/bin/python; empty when there is none
}

// The tutorial's program: in the source tree this was built from, else under the current folder.
std::string tutorial_program() {
  const std::string built = LESSON22_TUTORIAL_PROGRAM;
  return std::filesystem::exists(built) ? built : "python/tutorial_program.py";
}

// python/tutorial_program.py trains the tutorial's ANN for kPythonEpochs, prints its test
// accuracy, saves its state_dict, and exports and compiles it for `device` (its --export): the
// package and the state_dict of one set of weights, in `folder`. Made once: a second run finds
// them (unless `remake`). Python's lines are shown as it prints them.
Made make_package(const std::filesystem::path& folder, const torch::Device& device, bool quick,
                  bool remake) {
  const std::string name =
      std::string("ann-") + (device.is_cuda() ? "cuda" : "cpu") + (quick ? "-quick" : "");
  const Made made{(folder / (name + ".pt2")).string(), (folder / (name + ".state.pt")).string()};
  namespace fs = std::filesystem;
  if (!remake && fs::exists(made.package) && fs::exists(made.state_dict) &&
      fs::last_write_time(made.package) > fs::last_write_time(tutorial_program())) {
    std::cout << "package: " << made.package
              << " (made by an earlier run; --remake makes it again)\n";
    return made;
  }
  if (python().empty())
    throw course::CourseError(
        "no Python with torch " + std::string(TORCH_VERSION) + " to make the package",
        "run scripts/setup (the 2.11 flavour's .venv), set GPU_LESSONS_PYTHON, "
        "or give a package made elsewhere with --package FILE");
  fs::create_directories(folder);
  std::vector<std::string> argv{python(),   tutorial_program(),
                                "--epochs", std::to_string(kPythonEpochs),
                                "--device", device.is_cuda() ? "cuda" : "cpu",
                                "--save",   made.state_dict,
                                "--export", made.package};
  if (quick) argv.insert(argv.end(), {"--limit", std::to_string(kQuickSamples)});
  std::cout << "package: Python makes it (training, then torch.export and AOTInductor):\n  $";
  for (const auto& a : argv) std::cout << " " << a;
  std::cout << std::endl;
  std::unique_ptr<course::ChildProcess> started;
  try {
    started =
        std::make_unique<course::ChildProcess>(argv, std::vector<std::string>{"PYTHONUNBUFFERED=1"},
                                               /*with_stderr=*/true);
  } catch (const std::runtime_error& e) {
    throw course::CourseError(
        std::string("cannot start Python: ") + e.what(),
        "set GPU_LESSONS_PYTHON to a python3 with torch, or rerun scripts/setup");
  }
  course::ChildProcess& child = *started;
  std::vector<std::string> lines;  // its warnings too, shown only if it fails
  for (std::string line; child.read_line(line);) {
    lines.push_back(line);
    for (const char* shown : {"Using:", "Epoch ", "Test Accuracy", "saved ", "exported "})
      if (line.rfind(shown, 0) == 0) std::cout << "  python> " << line << std::endl;
  }
  const auto status = child.wait_for(std::chrono::minutes(30));
  if (!status || *status != 0) {
    for (std::size_t i = lines.size() > 15 ? lines.size() - 15 : 0; i < lines.size(); ++i)
      std::cerr << "  python> " << lines[i] << "\n";
    throw course::CourseError("Python could not make the package (" +
                                  (status ? course::describe_status(*status) : "still running") +
                                  ")",
                              "its last lines are above; the package needs torch 2.6 or newer with "
                              "a C++ compiler (g++), and for CUDA a GPU where it is made");
  }
  return made;
}
//! [make]

// ---- the package, loaded and run ----------------------------------------------------------------
// The package's compiled code needs "libtorch.so" by that name and finds whichever the process has
// loaded first. A program that never loaded this LibTorch's libtorch.so (linked with --as-needed
// and calling nothing from it) makes the package pick up another one on the library path: another
// version, and a crash inside LibTorch. The lesson links it (CMakeLists.txt) and checks.
//! [libtorch]
void check_libtorch_loaded() {
  std::string loaded;  // the libtorch.so this process has, if any
  if (void* handle = dlopen("libtorch.so", RTLD_NOW | RTLD_NOLOAD)) {  // only if already loaded
    link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map) loaded = map->l_name;
    dlclose(handle);
  }
  Dl_info ours{};  // the file of LibTorch's code this program calls: libtorch_cpu.so
  dladdr(reinterpret_cast<void*>(&torch::cuda::is_available), &ours);
  const auto folder = std::filesystem::path(ours.dli_fname ? ours.dli_fname : "").parent_path();
  if (loaded.empty() || std::filesystem::path(loaded).parent_path() != folder)
    throw course::CourseError("this program has not loaded the libtorch.so beside its " +
                                  folder.string() + "/libtorch_cpu.so, which a package needs",
                              "link with -Wl,--no-as-needed -ltorch (lessons/CMakeLists.txt does)");
}
//! [libtorch]

//! [load]
// The device a package's code was compiled for ("cpu", "cuda"), read from the metadata beside it
// in the zip before anything is loaded: a CUDA package's code cannot even be loaded where there
// is no CUDA driver. "" for a file that is not a package.
std::string compiled_for(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader zip(path);  // LibTorch's reader of torch's zip files
    for (const auto& name : zip.getAllRecords()) {
      if (name.size() < 22 || name.compare(name.size() - 22, 22, ".wrapper_metadata.json") != 0)
        continue;
      const auto [bytes, size] = zip.getRecord(name);  // {"AOTI_DEVICE_KEY": "cuda", ...}
      const std::string json(static_cast<const char*>(bytes.get()), size);
      const std::string key = "\"AOTI_DEVICE_KEY\": \"";
      const auto at = json.find(key);
      if (at != std::string::npos)
        return json.substr(at + key.size(), json.find('"', at + key.size()) - at - key.size());
    }
  } catch (const c10::Error&) {  // not a zip, or one cut short
  }
  return "";
}

// A .pt2 of the tutorial's ANN (input [B, 1, 28, 28] float32 in [0, 1], output [B, 10] logits),
// loaded once, run on batches of images.
class Package {
 public:
  Package(const std::string& path, const torch::Device& device) : device_(device) {
    if (!std::filesystem::is_regular_file(path))
      throw course::CourseError("no package " + path,
                                "give the .pt2 file that "
                                "torch._inductor.aoti_compile_and_package wrote (--package FILE)");
    const std::string kind = compiled_for(path);  // "cpu" or "cuda"
    if (kind.empty())
      throw course::CourseError(
          path + " is not an AOTInductor package",
          "a package is the .pt2 (a zip) that aoti_compile_and_package writes; "
          "a torch.save file is lesson 10's (--state-dict)");
    if (kind !=
        c10::DeviceTypeName(device.type(), /*lower_case=*/true))  // its code runs only there
      throw course::CourseError(
          path + " was compiled for " + kind + ", this run is on " + device.str(),
          kind == "cuda" ? "run it with --device cuda on a machine with a GPU, or make a "
                           "package for the CPU (tutorial_program.py --device cpu --export)"
                         : "run it with --device cpu, or make one on the GPU's machine");
    // A package checks its input's dtype, sizes and strides only when this is set (its code reads
    // it once); without it a batch of another size can run through code made for one size.
    setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", /*overwrite=*/1);
    check_libtorch_loaded();
    try {
      loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path);
    } catch (const c10::Error& e) {  // a damaged package, or code this machine cannot load
      throw course::CourseError(
          "cannot load " + path + ": " + e.msg().substr(0, e.msg().find('\n')),
          "make the package again on this machine's kind (tutorial_program.py "
          "--export), with the torch of this LibTorch");
    }
    metadata_ = loader_->get_metadata();
  }

  // The package's answer for `x` [B, 1, 28, 28] on the device it was made for: [B, 10] there.
  torch::Tensor forward(const torch::Tensor& x) {
    std::vector<torch::Tensor> out;
    try {
      out = loader_->run({x});
    } catch (const std::exception&) {  // the package's code printed its reason ("Error: ...")
      throw course::CourseError("the package refused a [" + std::to_string(x.size(0)) +
                                    ", 1, 28, 28] float32 batch (its reason is printed above)",
                                "a package of the tutorial's ANN takes [B, 1, 28, 28]; export it "
                                "with the batch dimension dynamic (torch.export.Dim), and for a "
                                "batch of 1 without aot_inductor.check_lowerbound, as "
                                "tutorial_program.py --export does");
    }
    if (out.size() != 1 || out[0].sizes() != torch::IntArrayRef{x.size(0), kClasses})
      throw course::CourseError("the package answered a batch of " + std::to_string(x.size(0)) +
                                    " with " + (out.empty() ? "nothing" : c10::str(out[0].sizes())),
                                "it is not a package of the tutorial's ANN ([B, 10] logits)");
    return out[0];
  }

  // The logits for `images` [B, 28, 28] as the tutorial's loader gives them, on the CPU.
  torch::Tensor logits(const torch::Tensor& images) {
    return forward(images.unsqueeze(1).to(device_).contiguous())
        .cpu();  // ToTensor's [B, 1, 28, 28]
  }

  std::string metadata(const std::string& key) const {
    const auto it = metadata_.find(key);
    return it == metadata_.end() ? "" : it->second;
  }

 private:
  torch::Device device_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  std::unordered_map<std::string, std::string> metadata_;
};
//! [load]

// ---- the checks ---------------------------------------------------------------------------------
// `forward` over `images` in batches of `batch`, as the tutorial's test loop does: [N, 10].
torch::Tensor in_batches(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                         const torch::Tensor& images, std::int64_t batch) {
  std::vector<torch::Tensor> parts;
  for (std::int64_t i = 0; i < images.size(0); i += batch)
    parts.push_back(forward(images.slice(0, i, i + batch)));
  return torch::cat(parts);
}

// Lesson 05's ANN with the weights of `state_dict_file` (lesson 10's route), on `device`, in eval.
course::ANN eager_model(const std::string& state_dict_file, const torch::Device& device) {
  course::ANN model;
  course::load_state_dict(
      *model, course::read_python_state_dict(state_dict_file), state_dict_file,
      "give the state_dict saved with the package (tutorial_program.py --save)");
  model->to(device);
  model->eval();
  return model;
}

//! [compare]
struct Agreement {
  double rel_diff = 0;           // max |package - eager| / max |eager| over all logits
  std::int64_t differ = 0;       // images whose predicted class differs
  std::int64_t unexplained = 0;  // of those, images whose two top eager logits do not tie
};

// The package's logits against the eager model's on the same images. A prediction may differ
// only where the eager model's two best classes are within rounding of each other.
Agreement compare(const torch::Tensor& package, const torch::Tensor& eager) {
  Agreement a;
  a.rel_diff = course::max_rel_diff(package, eager);
  const auto differs = std::get<1>(torch::max(package, 1)) != std::get<1>(torch::max(eager, 1));
  const auto top2 = std::get<0>(torch::topk(eager, 2, 1));
  const double scale = eager.abs().max().item<double>();
  const auto tie =
      (top2.select(1, 0) - top2.select(1, 1)) <= 2 * course::tolerance_for(torch::kFloat) * scale;
  a.differ = differs.sum().item<std::int64_t>();
  a.unexplained = (differs & ~tie).sum().item<std::int64_t>();
  return a;
}
//! [compare]

double accuracy(const torch::Tensor& logits, const torch::Tensor& labels) {
  return (std::get<1>(torch::max(logits, 1)) == labels).sum().item<double>() /
         static_cast<double>(labels.size(0));
}

// ---- the timings --------------------------------------------------------------------------------
//! [time]
// One call of the package against one forward() of the eager model on the same batch, for a
// batch of 64 and for the whole test set at once.
void time_both(Package& package, course::ANN& eager, const torch::Tensor& images,
               const torch::Device& device) {
  torch::NoGradGuard no_grad;
  std::printf("\n%-14s %-44s %s\n", "batch", "package (AOTInductor)", "eager ANN (lesson 05's)");
  std::vector<course::Timing> all;
  for (const std::int64_t batch : {kBatchSize, images.size(0)}) {
    const auto x = images.slice(0, 0, batch).unsqueeze(1).to(device).contiguous();
    const auto compiled = course::time_median([&] { package.forward(x); }, device, kWarmup, kRuns);
    const auto plain = course::time_median([&] { eager->forward(x); }, device, kWarmup, kRuns);
    std::printf("%-14s %-44s %s\n", (std::to_string(batch) + " images").c_str(),
                course::describe(course::per_piece(compiled, 1e-6), "us").c_str(),
                course::describe(course::per_piece(plain, 1e-6), "us").c_str());
    all.insert(all.end(), {compiled, plain});
  }
  std::printf("%s", course::timing_note(all).c_str());
}
//! [time]

}  // namespace lesson22
#endif  // LESSON22_WITH_AOTI

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson22.cpp includes this file for its functions
int main(int argc, char** argv) try {
  course::CommonOptions options;
  std::string package_path, state_dict_path;
  bool remake = false;
  course::Cli cli("lesson22_aot_inductor",
                  "Lesson 22: a model trained in Python, compiled by AOTInductor, run from C++.",
                  options);
  cli.add_data_dir();
  cli.add_path("--package", package_path,
               "a .pt2 of the tutorial's ANN made elsewhere (default: Python makes one)");
  cli.add_path("--state-dict", state_dict_path,
               "with --package: the same weights saved by torch.save, to compare with");
  cli.add_flag("--remake", remake, "have Python make the package again");
  if (auto code = cli.parse(argc, argv)) return *code;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  device = course::start_lesson(options, device);  // --device may override it; printed first
  course::Verdict verdict;
  [[maybe_unused]] const auto data_folder = course::find_fashion_mnist(options.data_dir);
#ifndef LESSON22_WITH_AOTI
  verdict.waive("LibTorch " + std::string(TORCH_VERSION) +
                " has no AOTInductor; it needs 2.6 or "
                "newer: run the 2.11 flavour (GPU_LESSONS_TORCH=2.11 ./run-lessons)");
  return verdict.finish("lesson 22 on " + device.str());
#else
  using namespace lesson22;
  if (!state_dict_path.empty() && package_path.empty())
    throw course::UsageError("--state-dict compares with a package given by --package",
                             "give both, or neither (Python then makes both)");
  const auto test = course::load_fashion_mnist(data_folder, /*train=*/false);
  if (package_path.empty()) {
    const auto folder =
        std::filesystem::path(course::self_executable()).parent_path().parent_path();
    const Made made = make_package(folder / "packages", device, options.quick, remake);
    package_path = made.package;
    state_dict_path = made.state_dict;
  }

  Package package(package_path, device);
  std::cout << "loaded " << package_path << " (compiled for " << package.metadata("AOTI_DEVICE_KEY")
            << (package.metadata("torch").empty() ? "" : " by torch " + package.metadata("torch"))
            << ")\n";
  torch::NoGradGuard no_grad;
  const auto logits = in_batches([&](const torch::Tensor& x) { return package.logits(x); },
                                 test.images, kBatchSize);
  const double acc = accuracy(logits, test.labels);
  std::printf("Test Accuracy: %.4f\n", acc);

  if (const std::string python_said = package.metadata("test_accuracy"); !python_said.empty()) {
    const double p = std::stod(python_said);  // printed to 4 decimals; one image is 0.0001
    verdict.check(std::abs(acc - p) <= 0.5e-4 + 1.0 / static_cast<double>(test.labels.size(0)),
                  "the package's test accuracy is the one Python printed",
                  course::format("%.4f vs Python's %.4f", acc, p));
  }
  if (!state_dict_path.empty()) {
    auto eager = eager_model(state_dict_path, device);
    const auto eager_logits = in_batches(
        [&](const torch::Tensor& x) { return eager->forward(x.unsqueeze(1).to(device)).cpu(); },
        test.images, kBatchSize);
    const Agreement a = compare(logits, eager_logits);
    verdict.check(a.rel_diff <= course::tolerance_for(torch::kFloat),
                  "its logits are the eager ANN's with the same weights (lesson 10's route)",
                  course::format("max rel diff %.2g, tolerance %.0e", a.rel_diff,
                                 course::tolerance_for(torch::kFloat)));
    verdict.check(
        a.unexplained == 0, "its predictions differ only where two classes tie",
        course::format("%lld of %lld differ, %lld without a tie", static_cast<long long>(a.differ),
                       static_cast<long long>(test.labels.size(0)),
                       static_cast<long long>(a.unexplained)));
    time_both(package, eager, test.images, device);
  }
  if (verdict.checks() == 0)  // a package with neither Python's accuracy nor its weights
    verdict.check(acc > 0.1, "the package classifies better than chance",
                  course::format("%.4f vs 0.10", acc));
  return verdict.finish("lesson 22 on " + device.str());
#endif
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif

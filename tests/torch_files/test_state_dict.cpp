// Tests of torch_files/state_dict.h: state_dicts written for Python read back equal, loads that
// are strict and all or nothing, misfit and damaged files refused for their reason, LibTorch's own
// archives checked before they are read, Adam's state by parameter.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/temporary_folder.h"
#include "common/verdict.h"
#include "scratch_files.h"
#include "torch_files/state_dict.h"

namespace fs = std::filesystem;

namespace {

// The tutorial's layer names and shapes, small: what the lessons' state_dicts look like.
struct TinyImpl : torch::nn::Module {
  explicit TinyImpl(std::int64_t hidden = 4)
      : fc1(register_module("fc1", torch::nn::Linear(3, hidden))),
        out(register_module("out", torch::nn::Linear(hidden, 2))) {}
  torch::nn::Linear fc1, out;
};
TORCH_MODULE(Tiny);

// The message of the CheckpointError `work` throws ("" when it throws none).
std::string refusal_of(const std::function<void()>& work) {
  try {
    work();
  } catch (const course::CheckpointError& e) {
    EXPECT_FALSE(e.hint().empty()) << e.what();
    return e.what();
  }
  return "";
}

}  // namespace

// Tests that a file in a missing folder is refused before anything is trained, naming the flag.
TEST(StateDict, CheckWritableNamesTheFlagAndTheFolder) {
  const course::TemporaryFolder folder("check-writable-");
  EXPECT_NO_THROW(course::check_writable(folder.file("run.pt"), "--checkpoint"));
  EXPECT_NO_THROW(course::check_writable("", "--checkpoint"));  // no file asked for
  try {
    course::check_writable(folder.file("missing/run.pt"), "--checkpoint");
    ADD_FAILURE() << "a missing folder was accepted";
  } catch (const course::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("--checkpoint " + folder.file("missing/run.pt")),
              std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("create the folder first"), std::string::npos) << e.hint();
  }
}

TEST(StateDict, WrittenForPythonReadsBackEqual) {
  Scratch scratch;
  Tiny model;
  course::write_python_state_dict(course::state_dict(*model), scratch.file("sd.pt"));
  const course::StateDict back = course::read_python_state_dict(scratch.file("sd.pt"));
  ASSERT_EQ(back.size(), 4u);
  const std::vector<std::string> names = {"fc1.weight", "fc1.bias", "out.weight", "out.bias"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(back[i].first, names[i]);
    EXPECT_TRUE(torch::equal(back[i].second, course::state_dict(*model)[i].second));
  }
  EXPECT_NE(refusal_of([&] {
              course::write_python_state_dict({}, "/no/such/folder/sd.pt");
            }).find("cannot write /no/such/folder/sd.pt"),
            std::string::npos);
}

// Tests the strict load: every name and shape checked, a floating dtype converted, and nothing
// copied when anything is wrong.
TEST(StateDict, LoadIsStrictAndAllOrNothing) {
  Tiny model, other;
  const torch::Tensor before = model->fc1->weight.detach().clone();
  course::StateDict wider = course::state_dict(*Tiny(8)), fewer = course::state_dict(*other),
                    more = fewer, ints = fewer;
  fewer.pop_back();
  more.emplace_back("fc2.weight", torch::zeros({2, 2}));
  ints[3].second = torch::zeros({2}, torch::kLong);
  const std::vector<std::pair<course::StateDict, std::string>> bad = {
      {wider, "'fc1.weight' is [8, 3] Float in the file but [4, 3] Float in the model"},
      {fewer, "has no 'out.bias'"},
      {more, "has 'fc2.weight', which the model does not have"},
      {ints, "'out.bias' is [2] Long in the file"}};
  for (const auto& [tensors, expected] : bad) {
    const std::string refusal =
        refusal_of([&, &tensors = tensors] {  // C++17 lambdas capture no structured binding
          course::load_state_dict(*model, tensors, "file.pt", "the fix");
        });
    EXPECT_NE(refusal.find(expected), std::string::npos) << refusal;
    EXPECT_EQ(refusal.rfind("file.pt", 0), 0u) << refusal;
    EXPECT_TRUE(torch::equal(model->fc1->weight, before)) << expected;
  }
  course::StateDict doubles = course::state_dict(*other);
  for (auto& entry : doubles) entry.second = entry.second.to(torch::kDouble);
  course::load_state_dict(*model, doubles, "doubles.pt", "the fix");
  EXPECT_EQ(model->fc1->weight.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(model->fc1->weight, other->fc1->weight));
}

// Tests the other models' state_dicts a lesson shows its loader refusing: each is refused by the
// strict load for the reason its name gives.
TEST(StateDict, MisfitStateDictsAreRefusedForTheirReason) {
  Tiny model;
  const auto misfits = course::misfit_state_dicts(course::state_dict(*model));
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"wrong shape", "'fc1.weight' is [8, 3] Float in the file but [4, 3] Float in the model"},
      {"missing key", "has no 'out.bias'"},
      {"extra key", "has 'extra.weight', which the model does not have"}};
  ASSERT_EQ(misfits.size(), expected.size());
  for (std::size_t i = 0; i < misfits.size(); ++i) {
    EXPECT_EQ(misfits[i].first, expected[i].first);
    const std::string refusal = refusal_of(
        [&] { course::load_state_dict(*model, misfits[i].second, "file.pt", "the fix"); });
    EXPECT_NE(refusal.find(expected[i].second), std::string::npos) << refusal;
  }
}

// Tests the damaged copies of a file a lesson shows its loader refusing: each is in the folder and
// damaged as its name says, the random bytes the same for one seed; an unreadable file throws.
TEST(StateDict, DamagedCopiesAreDamagedAsNamed) {
  Scratch scratch;
  const std::string bytes(1001, 'x');
  write_bytes(scratch.file("run.pt"), bytes);
  const auto copies = course::write_damaged_copies(scratch.file("run.pt"), scratch.path(), 7);
  ASSERT_EQ(copies.size(), 5u);
  for (const auto& [what, file] : copies) {
    EXPECT_EQ(std::filesystem::path(file).parent_path(), scratch.path()) << what;
  }
  EXPECT_EQ(copies[0].first, "missing file");
  EXPECT_FALSE(std::filesystem::exists(copies[0].second));
  EXPECT_EQ(read_bytes(copies[1].second), "");
  EXPECT_EQ(read_bytes(copies[2].second), bytes.substr(0, 500));
  EXPECT_EQ(read_bytes(copies[3].second), bytes.substr(0, 1000));
  const std::string noise = read_bytes(copies[4].second);
  EXPECT_EQ(noise.size(), bytes.size());
  EXPECT_NE(noise, bytes);
  course::write_damaged_copies(scratch.file("run.pt"), scratch.path(), 7);
  EXPECT_EQ(read_bytes(copies[4].second), noise);
  EXPECT_THROW(course::write_damaged_copies(scratch.file("none.pt"), scratch.path(), 7),
               std::runtime_error);
}

// Tests the reader of Python's state_dicts against damage everywhere: a file written for Python,
// truncated at 97 offsets and with one byte changed at 211 positions, is refused with a
// CheckpointError or read back exactly; none crashes, hangs or reads something else.
TEST(StateDict, CorruptionSweep) {
  Scratch scratch;
  torch::manual_seed(4);
  Tiny model(64);
  course::write_python_state_dict(course::state_dict(*model), scratch.file("sd.pt"));
  const std::string bytes = read_bytes(scratch.file("sd.pt"));
  int refused = 0, loaded = 0;
  damage_everywhere(bytes, scratch.file("damaged.pt"), [&](const std::string& what) {
    Tiny copy(64);
    try {
      course::load_state_dict(*copy, course::read_python_state_dict(scratch.file("damaged.pt")),
                              "damaged.pt", "");
      loaded += 1;
      EXPECT_EQ(course::max_abs_diff(copy->parameters(), model->parameters()), 0.0) << what;
    } catch (const course::CheckpointError&) {
      refused += 1;
    }
  });
  EXPECT_EQ(refused + loaded, kDamagedCopies);
  std::printf("state_dict corruption sweep: %d refused, %d read back exactly\n", refused, loaded);
}

// Tests the checks before LibTorch reads an archive: a missing file, a folder, Python's format, a
// damaged file; then a module's names and shapes against what torch::save wrote.
TEST(StateDict, LibTorchArchivesAreCheckedBeforeTheyAreRead) {
  Scratch scratch;
  Tiny model, wide(8);
  torch::save(model, scratch.file("tiny.pt"));
  torch::save(wide, scratch.file("wide.pt"));
  course::write_python_state_dict(course::state_dict(*model), scratch.file("python.pt"));
  std::string bytes = read_bytes(scratch.file("tiny.pt"));
  write_bytes(scratch.file("cut.pt"), bytes.substr(0, bytes.size() - 10));
  EXPECT_EQ(refusal_of([&] { course::check_module_file(*model, scratch.file("tiny.pt")); }), "");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {scratch.file("none.pt"), "no file at"},
      {scratch.path().string(), "is not a file"},
      {scratch.file("python.pt"), "Python's torch.save format"},
      {scratch.file("cut.pt"), "is not a readable LibTorch archive"},
      {scratch.file("wide.pt"), "'fc1.weight' is [8, 3]"}};
  for (const auto& [path, expected] : bad) {
    const std::string refusal =
        refusal_of([&, &path = path] { course::check_module_file(*model, path); });
    EXPECT_NE(refusal.find(expected), std::string::npos) << refusal;
  }
  torch::serialize::InputArchive archive;
  archive.load_from(scratch.file("tiny.pt"));
  const course::StateDict tensors = course::archive_tensors(archive);
  ASSERT_EQ(tensors.size(), 4u);
  EXPECT_EQ(tensors[0].first, "fc1.weight");
}

// Tests Adam's state by parameter: none before a step, the moments after, equal for an Adam that
// loaded the other's state, and refused when its shapes are not the parameters'.
TEST(StateDict, AdamStateByParameter) {
  Tiny model, copy;
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  EXPECT_EQ(course::adam_state(adam, model->fc1->weight), nullptr);
  model->out(model->fc1(torch::rand({5, 3}))).sum().backward();
  adam.step();
  const auto* state = course::adam_state(adam, model->fc1->weight);
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->exp_avg().sizes(), model->fc1->weight.sizes());
  EXPECT_EQ(state->step(), 1);
  torch::optim::Adam other(copy->parameters(), torch::optim::AdamOptions(1e-3));
  EXPECT_EQ(course::max_adam_diff(adam, model->parameters(), other, copy->parameters()),
            std::numeric_limits<double>::infinity());
  torch::serialize::OutputArchive out;
  adam.save(out);
  std::ostringstream saved;
  out.save_to(saved);
  const auto load = [&](torch::optim::Adam& into) {
    std::istringstream stream(saved.str());
    torch::serialize::InputArchive in;
    in.load_from(stream);
    into.load(in);
  };
  load(other);
  EXPECT_EQ(course::max_adam_diff(adam, model->parameters(), other, copy->parameters()), 0.0);
  EXPECT_EQ(course::adam_crc32(adam), course::adam_crc32(other));
  EXPECT_EQ(refusal_of([&] { course::check_adam_state(other, copy->parameters(), "ok.pt"); }), "");
  Tiny wide(8);  // the same number of parameters, other shapes: Adam's own load takes the state
  torch::optim::Adam wide_adam(wide->parameters(), torch::optim::AdamOptions(1e-3));
  load(wide_adam);
  EXPECT_NE(refusal_of([&] {
              course::check_adam_state(wide_adam, wide->parameters(), "x.pt");
            }).find("x.pt: Adam's state of parameter 0 is [4, 3], the parameter [8, 3]"),
            std::string::npos);
  EXPECT_NE(course::tensor_crc32(0, torch::ones({3})), course::tensor_crc32(0, torch::zeros({3})));
  // load_adam_checked: the same state loads; another shape, or an archive without one, does not.
  const auto archive_of = [](const std::string& bytes) {
    std::istringstream stream(bytes);
    torch::serialize::InputArchive in;
    in.load_from(stream);
    return in;
  };
  torch::optim::Adam again(copy->parameters(), torch::optim::AdamOptions(1e-3));
  torch::serialize::InputArchive archive = archive_of(saved.str());
  EXPECT_EQ(refusal_of([&] { course::load_adam_checked(again, archive, "ok.pt"); }), "");
  EXPECT_EQ(course::max_adam_diff(adam, model->parameters(), again, copy->parameters()), 0.0);
  // max_state_diff: the same Adam state over other parameters differs; a model and Adam with
  // themselves do not.
  EXPECT_GT(course::max_state_diff(*model, adam, *copy, again), 0.0);
  EXPECT_EQ(course::max_state_diff(*model, adam, *model, adam), 0.0);
  torch::optim::Adam wider(wide->parameters(), torch::optim::AdamOptions(1e-3));
  archive = archive_of(saved.str());
  EXPECT_NE(refusal_of([&] {
              course::load_adam_checked(wider, archive, "w.pt");
            }).find("w.pt: Adam's state of parameter 0 is [4, 3]"),
            std::string::npos);
  torch::serialize::OutputArchive weights;
  weights.write("fc1.weight", torch::zeros({4, 3}));
  std::ostringstream not_adam;
  weights.save_to(not_adam);
  archive = archive_of(not_adam.str());
  EXPECT_EQ(refusal_of([&] { course::load_adam_checked(again, archive, "n.pt"); }),
            "n.pt has no optimizer state");
  archive = archive_of(not_adam.str());
  EXPECT_EQ(refusal_of([&] { course::read_archive_int(archive, "epoch", "n.pt", "not mine"); }),
            "n.pt has no 'epoch': not mine");
  archive = archive_of(not_adam.str());
  EXPECT_EQ(refusal_of([&] { course::read_archive_int(archive, "step", "n.pt"); }),
            "n.pt has no 'step': it is not a whole checkpoint");
  // read_archive_string: a string, or "" for a missing key or another kind of value.
  torch::serialize::OutputArchive strings;
  strings.write("name", c10::IValue(std::string("ANN")));
  strings.write("number", c10::IValue(std::int64_t{3}));
  std::ostringstream written;
  strings.save_to(written);
  archive = archive_of(written.str());
  EXPECT_EQ(course::read_archive_string(archive, "name"), "ANN");
  EXPECT_EQ(course::read_archive_string(archive, "number"), "");
  EXPECT_EQ(course::read_archive_string(archive, "missing"), "");
}

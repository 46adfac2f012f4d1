// Tests of torch_files/torch_file.h, the check of a torch file before LibTorch reads it, on files
// made here (by LibTorch's own writers) and by Python's torch (the fuzz seeds): good files pass
// and read back; every kind of file LibTorch's readers would crash, leak or run out of memory on
// is refused with its reason; a damaged record is found by its CRC-32; a file saved without
// CRC-32s passes. No dataset needed.
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "scratch_files.h"
#include "torch_files/torch_file.h"

namespace {

namespace fs = std::filesystem;

// A string literal's bytes, NULs included.
template <std::size_t N>
std::string bytes_of(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

class TorchFileTest : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return scratch_.file(name); }

  // A state_dict in torch.save's format: {"weight": [2, 3], "bias": [2]}.
  std::string state_dict(const std::string& name) const {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
    dict.insert("weight", torch::arange(6, torch::kFloat).reshape({2, 3}));
    dict.insert("bias", torch::tensor({7.0f, 8.0f}));
    std::ofstream out(file(name), std::ios::binary);
    course::write_torch_save(dict, [&](const void* data, std::size_t size) {
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
      return size;
    });
    return file(name);
  }
  // A LibTorch archive (what torch::save and lesson 10's checkpoints write).
  std::string archive(const std::string& name) const {
    torch::serialize::OutputArchive out;
    out.write("weights", torch::ones({4}));
    out.write("step", c10::IValue(std::int64_t{3}));
    out.save_to(file(name));
    return file(name);
  }
  // A zip written as LibTorch writes them, with `records` (name, bytes), each with its CRC-32.
  std::string zip(const std::string& name,
                  const std::vector<std::pair<std::string, std::string>>& records) const {
    caffe2::serialize::PyTorchStreamWriter out(file(name));
    for (const auto& [record, bytes] : records) out.writeRecord(record, bytes.data(), bytes.size());
    out.writeEndOfFile();
    return file(name);
  }
  // `path`'s records copied to `name`, with its version record holding `version`.
  std::string with_version(const std::string& path, const std::string& name,
                           const std::string& version) const {
    caffe2::serialize::PyTorchStreamReader in(path);
    caffe2::serialize::PyTorchStreamWriter out(file(name));
    for (const std::string& record : in.getAllRecords()) {
      if (record == "version" || record == ".data/version") continue;
      auto [data, size] = in.getRecord(record);
      out.writeRecord(record, data.get(), size);
    }
    out.writeRecord("version", version.data(), version.size());  // the writer then adds none
    out.writeEndOfFile();
    return file(name);
  }

 private:
  Scratch scratch_;
};

// Tests that the files LibTorch and Python write pass, and read back as they were written.
TEST_F(TorchFileTest, GoodFilesPassAndReadBack) {
  const course::TorchFile archive =
      course::check_torch_file(this->archive("archive.pt"), course::CrcCheck::kEveryRecord);
  EXPECT_EQ(archive.refusal, "");
  EXPECT_TRUE(archive.crcs_recorded);
  EXPECT_TRUE(archive.has_record("constants.pkl"));
  EXPECT_TRUE(archive.has_record("DATA.PKL"));  // found as LibTorch finds it: case ignored
  const course::TorchFile sd =
      course::check_torch_file(state_dict("state_dict.pt"), course::CrcCheck::kEveryRecord);
  ASSERT_EQ(sd.refusal, "");
  EXPECT_EQ(sd.bytes, read_bytes(file("state_dict.pt")));
  EXPECT_FALSE(sd.has_record("constants.pkl"));
  const c10::IValue value = course::read_torch_save(sd);
  ASSERT_TRUE(value.isGenericDict());
  EXPECT_TRUE(
      torch::equal(value.toGenericDict().at("bias").toTensor(), torch::tensor({7.0f, 8.0f})));
  for (const std::string seed : {"py1.13-linear-state_dict.pt", "py2.11-linear-state_dict.pt",
                                 "py2.11-transposed.pt", "py1.13-plain-dict.pt"}) {
    const course::TorchFile python = course::check_torch_file(
        std::string(TORCH_FILE_SEEDS) + "/" + seed, course::CrcCheck::kEveryRecord);
    EXPECT_EQ(python.refusal, "") << seed;
    const c10::IValue read = course::read_torch_save(python);
    ASSERT_TRUE(read.isGenericDict()) << seed;
    for (const auto& item : read.toGenericDict()) {
      if (item.value().isTensor()) {
        EXPECT_EQ(course::storage_refusal(item.value().toTensor()), "") << seed;
      }
    }
  }
}

// Tests a file Python's torch 2.11 saved after torch.serialization.set_crc32_options(False):
// every CRC-32 is 0. torch.load reads it, and so does the check, saying its bytes were not
// checked; LibTorch then reads it too.
TEST_F(TorchFileTest, FileSavedWithoutCrcsPasses) {
  const course::TorchFile file = course::check_torch_file(
      std::string(TORCH_FILE_SEEDS) + "/py2.11-no-crc32.pt", course::CrcCheck::kEveryRecord);
  EXPECT_EQ(file.refusal, "");
  EXPECT_FALSE(file.crcs_recorded);
  for (const auto& entry : file.directory) EXPECT_EQ(entry.crc, 0u) << entry.name;
  const c10::IValue value = course::read_torch_save(file);
  ASSERT_TRUE(value.isGenericDict());
  EXPECT_TRUE(value.toGenericDict().contains("weight"));
  EXPECT_TRUE(value.toGenericDict().contains(course::kPlaceholderKey));  // it was an OrderedDict
}

// Tests that a record whose bytes no longer match its CRC-32 is found when every record is
// checked (a state_dict, with no checksum of its own), named, and let through when only the
// structure is (a checkpoint, whose own checksum covers its tensors).
TEST_F(TorchFileTest, DamagedRecordIsFoundByItsCrc) {
  const std::string good = state_dict("good.pt");
  std::string bytes = read_bytes(good);
  const std::size_t at = bytes.find(std::string("\x00\x00\xe0\x40", 4));  // 7.0f, in data/1
  ASSERT_NE(at, std::string::npos);
  bytes[at + 3] ^= 0x01;
  write_bytes(file("damaged.pt"), bytes);
  const course::TorchFile every =
      course::check_torch_file(file("damaged.pt"), course::CrcCheck::kEveryRecord);
  EXPECT_EQ(every.damaged_record, "data/1");
  EXPECT_NE(every.refusal.find("its entry data/1 does not match the CRC-32"), std::string::npos)
      << every.refusal;
  EXPECT_EQ(course::check_torch_file(file("damaged.pt"), course::CrcCheck::kStructure).refusal, "");
}

// Tests the files LibTorch's zip reader opens and then refuses in its constructor, after reading
// the zip's directory: no version record, a version it does not support, a version whose bytes do
// not match their CRC. That constructor then throws without freeing the directory (a leak), so
// the check refuses each first; the same records rewritten without damage still pass.
TEST_F(TorchFileTest, FilesLibTorchsReaderWouldLeakOnAreRefused) {
  for (const std::string& good : {archive("archive.pt"), state_dict("state_dict.pt")}) {
    std::string bytes = read_bytes(good);
    for (const std::string name : {"/.data/version", "/version"}) {
      for (std::size_t at = bytes.find(name); at != std::string::npos; at = bytes.find(name, at)) {
        bytes[at + name.size() - 7] = 'x';  // .../version becomes .../xersion
      }
    }
    write_bytes(file("unversioned.pt"), bytes);
    const auto refusal = [](const std::string& path) {
      return course::check_torch_file(path, course::CrcCheck::kStructure).refusal;
    };
    EXPECT_EQ(refusal(file("unversioned.pt")), "it has no format version") << good;
    EXPECT_NE(refusal(with_version(good, "v99.pt", "99\n"))
                  .find("its format version is not one LibTorch reads"),
              std::string::npos);
    caffe2::serialize::PyTorchStreamReader reader(good);
    const std::string record = reader.hasRecord(".data/version") ? ".data/version" : "version";
    auto [version, length] = reader.getRecord(record);
    const std::string text(static_cast<const char*>(version.get()), length);
    const std::string rewritten = with_version(good, "rewritten.pt", text);
    EXPECT_EQ(refusal(rewritten), "") << good;
    bytes = read_bytes(rewritten);
    const std::size_t header = bytes.rfind(std::string("PK\x03\x04", 4), bytes.find("/version"));
    ASSERT_NE(header, std::string::npos);
    const std::size_t data = header + 30 + static_cast<unsigned char>(bytes[header + 26]) +
                             static_cast<unsigned char>(bytes[header + 28]) +
                             256 * static_cast<unsigned char>(bytes[header + 29]);
    ASSERT_EQ(bytes.substr(data, length), text);
    bytes[data] = bytes[data] == '1' ? '2' : '1';  // one digit changed, its CRC left as it was
    write_bytes(file("version_damaged.pt"), bytes);
    EXPECT_EQ(refusal(file("version_damaged.pt")), "its format version is damaged") << good;
  }
  write_bytes(file("empty.pt"), "");
  EXPECT_EQ(course::check_torch_file(file("empty.pt"), course::CrcCheck::kStructure).refusal,
            "the file is empty");
  write_bytes(file("noise.pt"), std::string(1000, 'x'));
  EXPECT_NE(course::check_torch_file(file("noise.pt"), course::CrcCheck::kStructure)
                .refusal.find("no zip directory"),
            std::string::npos);
}

// Tests the file fuzz_torch_file found: a directory entry whose local header offset says zip64
// (0xFFFFFFFF) and whose extra field runs past the file. LibTorch 1.13's zip reader would copy the
// extra field's length from its buffer, past the file's end; every other check passes it. The
// check refuses it before LibTorch reads the file.
TEST(TorchFileRegression, DirectoryEntryRunningPastTheFileIsRefused) {
  const std::string path = std::string(FUZZ_REGRESSIONS) + "/zip-extra-field-past-the-end";
  ASSERT_FALSE(read_bytes(path).empty()) << path;
  EXPECT_NE(
      course::check_torch_file(path, course::CrcCheck::kStructure).refusal.find("no zip directory"),
      std::string::npos);
}

// Tests the TorchScript sources in an archive's code/ folder, which LibTorch compiles when the
// archive's pickle names their classes. What LibTorch writes passes (an archive holding another,
// a string and a tuple); a class attribute assigned without a type, on which LibTorch 1.13's
// parser crashes (the regression input, found by fuzz_checkpoint, is such a file), and every
// other line that is not a typed attribute are refused.
TEST_F(TorchFileTest, SourcesHoldingMoreThanAttributesAreRefused) {
  const std::string regression = std::string(FUZZ_REGRESSIONS) + "/class-attribute-without-type";
  ASSERT_FALSE(read_bytes(regression).empty()) << regression;
  EXPECT_NE(course::check_torch_file(regression, course::CrcCheck::kEveryRecord)
                .refusal.find("holds more than a module's attributes"),
            std::string::npos);

  torch::serialize::OutputArchive outer, inner;
  inner.write("weight", torch::ones({2}));
  outer.write("model", inner);
  outer.write("name", c10::IValue(std::string("ann")));
  outer.write("betas", c10::IValue(std::make_tuple(0.9, 0.999)));
  outer.save_to(file("nested.pt"));
  EXPECT_EQ(course::check_torch_file(file("nested.pt"), course::CrcCheck::kEveryRecord).refusal,
            "");

  const std::string object = bytes_of(
      "\x80\x02"
      "c__torch__\nModule\nq\x00)\x81}q\x01"
      "b.");
  const std::string head =
      "class Module(Module):\n  __parameters__ = [\"w\", ]\n  __buffers__ = []\n";
  const std::vector<std::string> lines = {
      "",  // passes: the class alone
      "  __parrteames__ = []\n",
      "  x = 1\n",
      "  x : Tuple[float\n",
      "  x : Tensor = 1\n",
      "  __annotations__[\"a\\\"\"] = Tensor\n",
      "  def forward(self):\n",
      "class Module(Other):\n",
      "import os\n",
  };
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string path = zip("source" + std::to_string(i) + ".pt",
                                 {{"data.pkl", object}, {"code/__torch__.py", head + lines[i]}});
    const std::string refusal =
        course::check_torch_file(path, course::CrcCheck::kEveryRecord).refusal;
    if (i == 0) {
      EXPECT_EQ(refusal, "");
    } else {
      EXPECT_NE(refusal.find("code/__torch__.py holds more than a module"), std::string::npos)
          << lines[i] << refusal;
    }
  }
}

// Tests the pickles LibTorch 1.13's unpickler would run into trouble on, each in a zip with
// correct CRCs: it would grow its memo table to any index (30 GB for the one the fuzzer found),
// allocate a string's length before reading it, read past its stack or its marks, make a storage
// larger than the record holding it, leak a list that holds itself, or overflow its stack freeing
// values nested a thousand deep. Each is refused with its reason; the same storage reference with
// its true size passes.
TEST_F(TorchFileTest, PicklesLibTorchsUnpicklerCannotTakeAreRefused) {
  const std::string storage = bytes_of(
      "\x80\x02(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
      "0X\x03\x00\x00\x00"
      "cpu");  // MARK 'storage' torch.FloatStorage '0' 'cpu': all but the element count
  const std::vector<std::pair<std::string, std::string>> cases = {
      {bytes_of("\x80\x02N\x72\x6d\x61\x74\x71."), "memo index past its own length"},
      {bytes_of("\x80\x02r\x00\x00\x00\x00."), "memoizes from an empty stack"},
      {bytes_of("\x80\x02h\x05."), "reads a memo entry it never wrote"},
      {bytes_of("\x80\x02X\xff\xff\xff\x7f"
                "abc."),
       "string longer than the pickle"},
      {bytes_of("\x80\x02t."), "tuple without its MARK"},
      {bytes_of("\x80\x02NN(\x81\x81t."), "tuple without"},  // its MARK is past the stack
      {bytes_of("\x80\x02NR."), "calls nothing"},
      {bytes_of("\x80\x02}(Nu."), "a key alone"},
      {bytes_of("\x80\x02\x81."), "makes an object from nothing"},
      {bytes_of("\x80\x02N"), "ends before its STOP"},
      {bytes_of("\x80\x02\xff."), "an opcode LibTorch does not read"},
      {bytes_of("\x80\x02](q\x00h\x00"
                "e."),
       "a container that holds itself"},  // L.append(L)
      {bytes_of("\x80\x02N") + std::string(1001, '\x85') + ".", "more than 1000 deep"},
      {storage + bytes_of("K\x0btQ."), "larger than the record holding it"},  // 11 floats
      {storage + bytes_of("J\x00\x00\x00\x40tQ."), "larger than the record holding it"},
      {storage + bytes_of("X\x01\x00\x00\x00"
                          "5tQ."),
       "a storage reference the lesson cannot check"},
  };
  const std::string ten_floats(40, '\0');
  int index = 0;
  for (const auto& [pickle, expected] : cases) {
    std::string name = std::to_string(index++);
    name += ".pt";
    const std::string path = zip(name, {{"data.pkl", pickle}, {"data/0", ten_floats}});
    const course::TorchFile checked =
        course::check_torch_file(path, course::CrcCheck::kEveryRecord);
    EXPECT_NE(checked.refusal.find(expected), std::string::npos)
        << "case " << index - 1 << ": " << checked.refusal << " (expected: " << expected << ")";
    // The same pickle checked on its own, as a reader checks a pickle it rewrote.
    EXPECT_EQ(course::pickle_refusal(pickle, checked, "data.pkl"), checked.refusal);
  }
  const std::string fits =
      zip("fits.pt", {{"data.pkl", storage + bytes_of("K\x0atQ.")}, {"data/0", ten_floats}});
  EXPECT_EQ(course::check_torch_file(fits, course::CrcCheck::kEveryRecord).refusal, "");
}

// Tests every element a tensor's sizes and strides reach against its storage.
// The tensors are made as LibTorch's unpickler makes them from a file: sizes, strides and offset
// set on the tensor as the pickle gives them, which LibTorch's own as_strided would refuse.
TEST(StorageRefusal, TensorsReachingPastTheirStorage) {
  const auto unpickled = [](std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides,
                            std::int64_t offset = 0) {
    torch::Tensor t = torch::arange(10, torch::kFloat);  // a storage of 40 bytes
    t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
    t.unsafeGetTensorImpl()->set_storage_offset(offset);
    return t;
  };
  EXPECT_EQ(course::storage_refusal(torch::arange(10, torch::kFloat)), "");
  EXPECT_EQ(course::storage_refusal(unpickled({5}, {2})), "");
  EXPECT_EQ(course::storage_refusal(unpickled({2, 5}, {5, 1})), "");
  EXPECT_EQ(course::storage_refusal(torch::Tensor()), "");
  EXPECT_EQ(course::storage_refusal(unpickled({10}, {2})),
            "([10]) reaches past the 40 bytes stored for it");
  EXPECT_NE(course::storage_refusal(unpickled({3}, {1}, 8)), "");
  EXPECT_NE(course::storage_refusal(unpickled({2, 3}, {std::int64_t{1} << 62, 1})), "");
}

// Tests a generator state before it is restored: only a contiguous byte vector that LibTorch's
// generator takes passes, and the generator is left as it was.
TEST(GeneratorState, RefusedBeforeItIsRestored) {
  at::Generator generator = at::globalContext().defaultGenerator(torch::kCPU);
  const torch::Tensor good = generator.get_state();
  const torch::Tensor next = torch::rand({4});
  generator.set_state(good);
  EXPECT_EQ(course::generator_state_refusal(torch::kCPU, good), "");
  EXPECT_EQ(course::generator_state_refusal(torch::kCPU, good.to(torch::kFloat)),
            "not a contiguous byte vector");
  EXPECT_EQ(
      course::generator_state_refusal(torch::kCPU, torch::cat({good, good}).slice(0, 0, -1, 2)),
      "not a contiguous byte vector");
  EXPECT_NE(course::generator_state_refusal(torch::kCPU, good.slice(0, 0, 10).clone()), "");
  EXPECT_TRUE(torch::equal(torch::rand({4}), next));  // the generator was put back each time
}

// Tests the rewrite of a state_dict's pickle: a plain dict comes out, other pickles are left.
TEST(PlainDictPickle, OnlyAnOrderedDictIsRewritten) {
  const std::string other = bytes_of("\x80\x02}q\x00.");
  EXPECT_EQ(course::plain_dict_pickle(other), other);
  EXPECT_EQ(course::plain_dict_pickle(""), "");
}

// Tests that damage anywhere in a state_dict (truncated at 50 lengths, one byte changed at 150
// places) is refused, or passes and reads back the very tensors written, never a crash.
TEST_F(TorchFileTest, DamageAnywhereIsRefusedOrHarmless) {
  const std::string bytes = read_bytes(state_dict("good.pt"));
  int refused = 0, read = 0;
  std::size_t damage_at = 0;
  const auto check = [&](const std::string& damaged) {
    write_bytes(file("damaged.pt"), damaged);
    const course::TorchFile checked =
        course::check_torch_file(file("damaged.pt"), course::CrcCheck::kEveryRecord);
    if (!checked.refusal.empty()) {
      refused += 1;
      return;
    }
    try {
      const c10::IValue value = course::read_torch_save(checked);
      read += 1;
      ASSERT_TRUE(value.isGenericDict());
      EXPECT_TRUE(
          torch::equal(value.toGenericDict().at("bias").toTensor(), torch::tensor({7.0f, 8.0f})))
          << "damage at " << damage_at;
    } catch (const std::exception&) {
      refused += 1;  // LibTorch's own refusal of what the check let through
    }
  };
  for (int i = 0; i < 50; ++i) check(bytes.substr(0, bytes.size() * i / 50));
  for (int i = 0; i < 150; ++i) {
    std::string copy = bytes;
    damage_at = (copy.size() - 1) * i / 149;
    copy[damage_at] ^= 0x5a;
    check(copy);
  }
  EXPECT_EQ(refused + read, 200);
  EXPECT_GE(refused, 50);  // at least every truncated copy
  std::printf("damage sweep: %d refused, %d read back exactly\n", refused, read);
}

}  // namespace

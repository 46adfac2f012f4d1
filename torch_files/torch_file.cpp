// torch_file.cpp: the checks of torch_file.h. What each refuses, and why, is said where it is
// checked; the refusals' wording is what the lessons print after "is not a ... (".
#include "torch_files/torch_file.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>  // defines: at::globalContext (the default generators)
#include <caffe2/serialize/in_memory_adapter.h>      // defines: MemoryReadAdapter
#include <caffe2/serialize/inline_container.h>       // defines: PyTorchStreamReader/Writer (zip)
#include <caffe2/serialize/versions.h>               // defines: kMin/kMaxSupportedFileFormatVersion
#include <torch/csrc/jit/serialization/export.h>     // defines: writeArchiveAndTensors
#include <torch/csrc/jit/serialization/pickler.h>    // defines: torch::jit::Pickler
#include <torch/csrc/jit/serialization/unpickler.h>  // defines: torch::jit::Unpickler
#include <zlib.h>  // defines: crc32_z, inflate (the zip's own formats)

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "common/verdict.h"  // defines: error_message

namespace course {

namespace {

std::uint64_t little_endian(const std::string& bytes, std::size_t at, int size) {
  std::uint64_t value = 0;
  for (int i = size - 1; i >= 0; --i)
    value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

// The zip's central directory, found the way LibTorch's zip reader (miniz) finds it: the last
// end-of-directory record, or the zip64 one that a zip64 locator just before it points at.
// Empty when there is none, or when an entry (its name, extra field or comment) runs past the
// file. (LibTorch's reader does not check the CRC-32s recorded here: check_torch_file does.)
std::vector<ZipEntry> zip_directory(const std::string& zip) {
  std::vector<ZipEntry> entries;
  if (zip.size() < 22) return entries;
  const std::size_t end = zip.rfind(std::string("PK\x05\x06", 4), zip.size() - 22);
  if (end == std::string::npos) return entries;
  std::uint64_t count = little_endian(zip, end + 10, 2);
  std::uint64_t offset = little_endian(zip, end + 16, 4);
  if (end >= 20 + 56 && zip.compare(end - 20, 4, "PK\x06\x07") == 0) {  // a zip64 locator
    const std::uint64_t eocd64 = little_endian(zip, end - 20 + 8, 8);
    if (eocd64 > zip.size() - 56) return entries;  // no wrap-around
    if (zip.compare(eocd64, 4, "PK\x06\x06") == 0) {
      count = little_endian(zip, eocd64 + 32, 8);
      offset = little_endian(zip, eocd64 + 48, 8);
    }
  }
  for (std::uint64_t i = 0; i < count; ++i) {  // each entry is 46 bytes or more: count is bounded
    if (offset > zip.size() || zip.size() - offset < 46 ||
        zip.compare(offset, 4, "PK\x01\x02") != 0) {
      entries.clear();
      return entries;
    }
    const std::uint64_t name = little_endian(zip, offset + 28, 2);
    const std::uint64_t extra = little_endian(zip, offset + 30, 2);
    const std::uint64_t comment = little_endian(zip, offset + 32, 2);
    // The whole entry, its extra field and comment too, within the file: LibTorch 1.13's zip
    // reader (miniz) reads an entry's extra field, when its sizes or local header offset say
    // zip64 (0xFFFFFFFF), from the directory's start with the length the entry gives, and its
    // in-memory reader copies that many bytes whatever the file holds (found by fuzz_torch_file).
    if (zip.size() - offset - 46 < name + extra + comment) {
      entries.clear();
      return entries;
    }
    ZipEntry entry;
    entry.name = zip.substr(offset + 46, name);
    entry.flags = little_endian(zip, offset + 8, 2);
    entry.method = little_endian(zip, offset + 10, 2);
    entry.crc = static_cast<std::uint32_t>(little_endian(zip, offset + 16, 4));
    entry.compressed = little_endian(zip, offset + 20, 4);
    entry.size = little_endian(zip, offset + 24, 4);
    entry.attributes = little_endian(zip, offset + 38, 4);
    entry.local_header = little_endian(zip, offset + 42, 4);
    entries.push_back(std::move(entry));
    offset += 46 + name + extra + comment;
  }
  return entries;
}

// A value the pickle check follows: what LibTorch's unpickler would hold, as far as the check
// needs it. Values live in one vector and refer to each other by index, as LibTorch's IValues
// refer to each other by pointer: a container read back from the memo is the same container.
struct PickleNode {
  enum Kind { kOther, kInt, kString, kTuple, kScalarType } kind = kOther;
  std::int64_t number = 0;              // an int, or a scalar type (torch.FloatStorage, ...)
  std::string text;                     // a string
  std::vector<std::uint32_t> children;  // what it holds: items, or a call's function and input
};

// Why LibTorch's unpickler must not see `pickle`, or "" when it may (pickle_refusal). The check
// runs the pickle's opcodes on a stack of PickleNodes the way LibTorch's torch::jit::Unpickler
// runs them on its own stack, and refuses what that unpickler does not check (measured and read in
// LibTorch 1.13; 2.x checks some of it):
//   - a memo index past the pickle's length: the unpickler grows its memo table to any index
//     (LONG_BINPUT 0x7174616d: 30 GB, found by fuzz_checkpoint);
//   - a string longer than the bytes left: it allocates the length before reading;
//   - an opcode with too few values on the stack, or no MARK, where 1.13 reads past its vectors;
//   - a storage reference (BINPERSID) whose element count times element size is more than the
//     record `record_size(key)` holds: the unpickler makes the storage that large, over the
//     record's smaller buffer, and every read of the tensor then runs past it;
//   - a container that holds itself (its reference counts never reach 0: a leak), and values
//     nested more than 1000 deep (freeing them recurses once per level, so a deep enough chain
//     overflows the stack; real files nest a few levels);
//   - an opcode the unpickler does not know (it would throw; the check cannot follow it).
std::string check_pickle(
    const std::string& pickle,
    const std::function<std::optional<std::uint64_t>(const std::string&)>& record_size) {
  std::vector<PickleNode> nodes(1);  // nodes[0]: any value the check needs nothing of
  std::vector<std::uint32_t> stack;
  std::vector<std::size_t> marks;
  std::unordered_map<std::uint64_t, std::uint32_t> memo;
  std::size_t at = 0;
  auto left = [&] { return pickle.size() - at; };
  auto take = [&](std::size_t n, std::uint64_t& value) {
    if (left() < n) return false;
    value = little_endian(pickle, at, static_cast<int>(n));
    at += n;
    return true;
  };
  auto line = [&](std::string& text) {  // GLOBAL's module and name
    const std::size_t end = pickle.find('\n', at);
    if (end == std::string::npos) return false;
    text = pickle.substr(at, end - at);
    at = end + 1;
    return true;
  };
  auto pop_to_mark = [&](std::size_t& start) {
    if (marks.empty()) return false;
    start = marks.back();
    marks.pop_back();
    return start <= stack.size();
  };
  // A new value holding the stack's values from `start` on, in their place.
  auto make = [&](PickleNode::Kind kind, std::size_t start) {
    PickleNode node;
    node.kind = kind;
    node.children.assign(stack.begin() + static_cast<std::ptrdiff_t>(start), stack.end());
    stack.resize(start);
    nodes.push_back(std::move(node));
    stack.push_back(static_cast<std::uint32_t>(nodes.size() - 1));
  };
  // The stack's values from `start` on go into the container at `into`.
  auto fill = [&](std::uint32_t into, std::size_t start) {
    auto& children = nodes[into].children;
    children.insert(children.end(), stack.begin() + static_cast<std::ptrdiff_t>(start),
                    stack.end());
    stack.resize(start);
  };
  std::uint64_t n = 0;
  if (!take(1, n) || n != 0x80 || !take(1, n) || n != 2) return "it is not a protocol 2 pickle";
  bool stopped = false;
  while (!stopped) {
    std::uint64_t opcode = 0;
    if (!take(1, opcode)) return "its pickle ends before its STOP";
    std::size_t start = 0;
    switch (opcode) {
      case '.':  // STOP
        stopped = true;
        break;
      case 'N':
      case 0x88:
      case 0x89:
      case 'G':  // None, True, False, BINFLOAT
        if (opcode == 'G' && !take(8, n)) return "its pickle is cut short";
        stack.push_back(0);
        break;
      case '}':
      case ']':
      case ')':  // EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE
        make(opcode == ')' ? PickleNode::kTuple : PickleNode::kOther, stack.size());
        break;
      case '(':  // MARK
        marks.push_back(stack.size());
        break;
      case 'q':
      case 'r':  // BINPUT, LONG_BINPUT
        if (!take(opcode == 'q' ? 1 : 4, n)) return "its pickle is cut short";
        if (stack.empty()) return "its pickle memoizes from an empty stack";
        if (n >= pickle.size()) return "its pickle has a memo index past its own length";
        memo[n] = stack.back();
        break;
      case 'h':
      case 'j': {  // BINGET, LONG_BINGET
        if (!take(opcode == 'h' ? 1 : 4, n)) return "its pickle is cut short";
        const auto found = memo.find(n);
        if (found == memo.end()) return "its pickle reads a memo entry it never wrote";
        stack.push_back(found->second);
        break;
      }
      case 'K':
      case 'M':
      case 'J':
      case 0x8a: {  // BININT1, BININT2, BININT, LONG1
        if (opcode == 0x8a && (!take(1, n) || n != 8)) return "its pickle has a long int";
        if (!take(opcode == 'K' ? 1 : opcode == 'M' ? 2 : opcode == 'J' ? 4 : 8, n)) {
          return "its pickle is cut short";
        }
        PickleNode node;
        node.kind = PickleNode::kInt;
        node.number = opcode == 'J' ? static_cast<std::int32_t>(n) : static_cast<std::int64_t>(n);
        nodes.push_back(std::move(node));
        stack.push_back(static_cast<std::uint32_t>(nodes.size() - 1));
        break;
      }
      case 'X':
      case 0x8d: {  // BINUNICODE, BINUNICODE8
        if (!take(opcode == 'X' ? 4 : 8, n)) return "its pickle is cut short";
        if (n > left()) return "its pickle has a string longer than the pickle";
        PickleNode node;
        node.kind = PickleNode::kString;
        node.text = pickle.substr(at, n);
        at += n;
        nodes.push_back(std::move(node));
        stack.push_back(static_cast<std::uint32_t>(nodes.size() - 1));
        break;
      }
      case 't':  // TUPLE
        if (!pop_to_mark(start)) return "its pickle builds a tuple without its MARK";
        make(PickleNode::kTuple, start);
        break;
      case 0x85:
      case 0x86:
      case 0x87:  // TUPLE1, TUPLE2, TUPLE3
        if (stack.size() < opcode - 0x84) return "its pickle builds a tuple from nothing";
        make(PickleNode::kTuple, stack.size() - (opcode - 0x84));
        break;
      case 'l':
      case 'd':  // LIST, DICT
        if (!pop_to_mark(start)) return "its pickle builds a container without its MARK";
        if (opcode == 'd' && (stack.size() - start) % 2 != 0) return "its pickle has a key alone";
        make(PickleNode::kOther, start);
        break;
      case 'e':
      case 'u':  // APPENDS, SETITEMS
        if (!pop_to_mark(start) || start == 0)
          return "its pickle fills a container without its MARK";
        if (opcode == 'u' && (stack.size() - start) % 2 != 0) return "its pickle has a key alone";
        fill(stack[start - 1], start);
        break;
      case 'a':
      case 's':  // APPEND, SETITEM
        if (stack.size() < (opcode == 'a' ? 2u : 3u)) return "its pickle fills nothing";
        start = stack.size() - (opcode == 'a' ? 1 : 2);
        fill(stack[start - 1], start);
        break;
      case 'c': {  // GLOBAL: torch.FloatStorage and the like stand for their scalar type
        std::string module, name;
        if (!line(module) || !line(name)) return "its pickle is cut short";
        PickleNode node;
        if (module == "torch") {
#define GPU_LESSONS_STORAGE(_, type)                                \
  if (name == #type "Storage") {                                    \
    node.kind = PickleNode::kScalarType;                            \
    node.number = static_cast<std::int64_t>(c10::ScalarType::type); \
  }
          AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(GPU_LESSONS_STORAGE)
#undef GPU_LESSONS_STORAGE
        }
        nodes.push_back(std::move(node));
        stack.push_back(static_cast<std::uint32_t>(nodes.size() - 1));
        break;
      }
      case 0x81:  // NEWOBJ
        if (stack.empty()) return "its pickle makes an object from nothing";
        stack.pop_back();
        break;
      case 'b':
      case 'R':  // BUILD, REDUCE: the result may be (or hold) its input
        if (stack.size() < 2) return "its pickle calls nothing";
        make(PickleNode::kOther, stack.size() - 2);
        break;
      case 'Q': {  // BINPERSID: ('storage', scalar type, key, location, element count)
        if (stack.empty()) return "its pickle refers to a storage with nothing";
        const PickleNode& reference = nodes[stack.back()];
        stack.pop_back();
        const std::vector<std::uint32_t>& items = reference.children;
        if (reference.kind != PickleNode::kTuple || items.size() < 5 ||
            nodes[items[2]].kind != PickleNode::kString ||
            nodes[items[4]].kind != PickleNode::kInt ||
            (nodes[items[1]].kind != PickleNode::kScalarType &&
             nodes[items[1]].kind != PickleNode::kInt) ||
            nodes[items[1]].number < 0 ||
            nodes[items[1]].number >= static_cast<std::int64_t>(c10::ScalarType::NumOptions) ||
            nodes[items[1]].number == static_cast<std::int64_t>(c10::ScalarType::Undefined)) {
          return "its pickle has a storage reference the lesson cannot check";
        }
        const auto type = static_cast<c10::ScalarType>(nodes[items[1]].number);
        const std::string& key = nodes[items[2]].text;
        const std::int64_t count = nodes[items[4]].number;
        const std::optional<std::uint64_t> stored = record_size(key);
        std::int64_t bytes = 0;
        if (!stored || count < 0 ||
            __builtin_mul_overflow(count, static_cast<std::int64_t>(c10::elementSize(type)),
                                   &bytes) ||
            static_cast<std::uint64_t>(bytes) > *stored) {
          return "its storage '" + key.substr(0, 40) + "' is larger than the record holding it";
        }
        nodes.emplace_back();  // the tensor
        stack.push_back(static_cast<std::uint32_t>(nodes.size() - 1));
        break;
      }
      default:
        return "its pickle has an opcode LibTorch does not read (" + std::to_string(opcode) + ")";
    }
  }
  // Every value, walked without recursion: no value may hold itself, none may nest too deeply.
  constexpr std::uint32_t kMaxDepth = 1000;
  std::vector<std::uint8_t> state(nodes.size(), 0);  // 0 not seen, 1 on the path, 2 done
  std::vector<std::uint32_t> depth(nodes.size(), 1);
  std::vector<std::pair<std::uint32_t, std::size_t>> path;  // node, next child
  for (std::uint32_t root = 0; root < nodes.size(); ++root) {
    if (state[root] != 0) continue;
    state[root] = 1;
    path.emplace_back(root, 0);
    while (!path.empty()) {
      const std::uint32_t node = path.back().first;
      const std::size_t next = path.back().second++;
      if (next < nodes[node].children.size()) {
        const std::uint32_t child = nodes[node].children[next];
        if (state[child] == 1) return "its pickle has a container that holds itself";
        if (state[child] == 0) {
          state[child] = 1;
          path.emplace_back(child, 0);
        }
        continue;
      }
      for (const std::uint32_t child : nodes[node].children) {
        depth[node] = std::max(depth[node], depth[child] + 1);
      }
      if (depth[node] > kMaxDepth) return "its pickle nests values more than 1000 deep";
      state[node] = 2;
      path.pop_back();
    }
  }
  return "";
}

std::string lower_ascii(std::string text) {
  for (char& c : text) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  return text;
}

// The size of each record by its name as LibTorch's zip reader finds it, ignoring ASCII case (the
// smallest, where several names differ only in case).
std::unordered_map<std::string, std::uint64_t> record_sizes(
    const std::vector<ZipEntry>& directory) {
  std::unordered_map<std::string, std::uint64_t> sizes;
  for (const ZipEntry& entry : directory) {
    const auto [found, added] = sizes.emplace(lower_ascii(entry.name), entry.size);
    if (!added) found->second = std::min(found->second, entry.size);
  }
  return sizes;
}

// For check_pickle: the size of the record a storage key names, in `folder` (lower case).
std::function<std::optional<std::uint64_t>(const std::string&)> storage_sizes(
    std::unordered_map<std::string, std::uint64_t> sizes, const std::string& folder) {
  return
      [sizes = std::move(sizes), folder](const std::string& key) -> std::optional<std::uint64_t> {
        const auto found = sizes.find(folder + lower_ascii(key));
        if (found == sizes.end()) return std::nullopt;
        return found->second;
      };
}

// A record's bytes as LibTorch's reader gets them: stored as they are (LibTorch and Python write
// nothing else), or deflated, which miniz inflates. Nothing when they do not lie inside the file
// or do not inflate to the size the directory records.
std::optional<std::string> record_bytes(const std::string& zip, const ZipEntry& entry) {
  const std::uint64_t at = entry.local_header;
  if ((entry.flags & 0x61) != 0 || (entry.method != 0 && entry.method != 8) ||
      (entry.attributes & 0x10) != 0 || at == 0xffffffffu || at > zip.size() ||
      zip.size() - at < 30 || zip.compare(at, 4, "PK\x03\x04") != 0) {
    return std::nullopt;  // encrypted, patched, another method, a folder, or outside the file
  }
  const std::uint64_t data =
      at + 30 + little_endian(zip, at + 26, 2) + little_endian(zip, at + 28, 2);
  if (data > zip.size() || zip.size() - data < entry.compressed) return std::nullopt;
  if (entry.method == 0) {
    if (entry.size != entry.compressed) return std::nullopt;
    return zip.substr(data, entry.size);
  }
  std::string out(entry.size, '\0');  // bounded: entries claim at most deflate's largest ratio
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) return std::nullopt;
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(zip.data() + data));
  stream.avail_in = static_cast<uInt>(entry.compressed);
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  const int status = inflate(&stream, Z_FINISH);
  const bool whole = status == Z_STREAM_END && stream.total_out == entry.size;
  inflateEnd(&stream);
  if (!whole) return std::nullopt;
  return out;
}

bool crc_matches(const std::string& bytes, const ZipEntry& entry) {
  return crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()) == entry.crc;
}

// A TorchScript source in an archive's code/ folder, which LibTorch's reader compiles when a
// pickle names one of its classes. LibTorch's own archives (torch::save, OutputArchive) hold one
// class of typed attributes for each nested archive, and nothing else:
//   class Module(Module):
//     __parameters__ = ["fc1.weight", ]       (and __buffers__)
//     __annotations__ = []
//     __annotations__["fc1.weight"] = Tensor
//     epoch : int
// A line of another shape is refused: LibTorch 1.13's parser crashes on some (an attribute
// assigned without a type: fuzz/regressions/fuzz_checkpoint/class-attribute-without-type). Read
// by hand, not with std::regex, whose recursion grows with the line.
class SourceLine {
 public:
  explicit SourceLine(std::string_view text) : rest_(text) {}
  bool done() const { return rest_.empty(); }
  bool word(std::string_view w) {
    if (rest_.substr(0, w.size()) != w) return false;
    rest_.remove_prefix(w.size());
    return true;
  }
  bool name() {  // an identifier
    std::size_t n = 0;
    while (n < rest_.size() &&
           (std::isalpha(static_cast<unsigned char>(rest_[n])) || rest_[n] == '_' ||
            (n > 0 && std::isdigit(static_cast<unsigned char>(rest_[n]))))) {
      ++n;
    }
    rest_.remove_prefix(n);
    return n > 0;
  }
  bool string() {  // "printable ASCII, without quotes or backslashes"
    if (!word("\"")) return false;
    while (!rest_.empty() && rest_[0] >= ' ' && rest_[0] <= '~' && rest_[0] != '"' &&
           rest_[0] != '\\') {
      rest_.remove_prefix(1);
    }
    return word("\"");
  }
  bool type(int depth = 0) {  // Tensor, __torch__.___torch_mangle_1.Module, Tuple[float, float]
    if (depth > 8 || !name()) return false;
    while (word(".")) {
      if (!name()) return false;
    }
    if (!word("[")) return true;
    do {
      if (!type(depth + 1)) return false;
    } while (word(", "));
    return word("]");
  }
  bool strings() {  // ["a", "b", ]
    if (!word("[")) return false;
    while (string()) {
      if (!word(", ")) return false;
    }
    return word("]");
  }

 private:
  std::string_view rest_;
};

std::string source_refusal(const std::string& source, const std::string& record) {
  std::string_view rest(source);
  bool in_class = false;
  while (!rest.empty()) {
    const std::size_t end = std::min(rest.find('\n'), rest.size());
    SourceLine line(rest.substr(0, end));
    rest.remove_prefix(std::min(end + 1, rest.size()));
    bool fits = line.done();
    if (!fits && line.word("class ")) {
      fits = line.name() && line.word("(Module):") && line.done();
      in_class = fits;
    } else if (!fits && in_class && line.word("  ")) {
      if (line.word("__parameters__ = ") || line.word("__buffers__ = ")) {
        fits = line.strings() && line.done();
      } else if (line.word("__annotations__")) {
        fits = line.word(" = []") ? line.done()
                                  : line.word("[") && line.string() && line.word("] = ") &&
                                        line.type() && line.done();
      } else {
        fits = line.name() && line.word(" : ") && line.type() && line.done();
      }
    }
    if (!fits) {
      return "its source " + record.substr(0, 80) + " holds more than a module's attributes";
    }
  }
  return "";
}

// The record's name inside the archive's folder ("archive/data/0" is "data/0").
std::string record_name(const ZipEntry& entry) {
  return entry.name.substr(entry.name.find('/') + 1);
}

// Why LibTorch's zip reader (caffe2::serialize::PyTorchStreamReader) would refuse `file`, or ""
// when it opens it. Its constructor reads the directory, then the first entry's folder (every
// record's prefix), ".data/serialization_id" if there is one, and the format version from
// ".data/version" or "version". When any of that fails after the directory was read, it throws
// without freeing the directory (measured on LibTorch 1.13: every such file leaks it), so these
// files are refused before LibTorch sees them: fuzz/regressions/fuzz_checkpoint. Then what it
// reads after its constructor: every record, into a buffer of the size the directory gives
// before a byte is read (so no entry may claim more than its bytes can hold), and every pickle,
// through its unpickler (check_pickle). A record's CRC-32 is checked where `crc` asks for it.
std::string zip_refusal(TorchFile& file, CrcCheck crc) {
  const std::string& zip = file.bytes;
  const std::vector<ZipEntry>& directory = file.directory;
  if (zip.empty()) return "the file is empty";
  if (directory.empty()) return "no zip directory: the file is cut short, or not a zip archive";
  const std::string& first = directory.front().name;
  const std::size_t slash = first.find('/');
  if (slash == std::string::npos || first.find('\0') < slash) {
    return "its first entry is not in a folder";
  }
  // Saved without CRC-32s (Python's torch.serialization.set_crc32_options(False)): every record
  // says 0. torch.load reads such a file; so does this check, without checking any record's bytes.
  file.crcs_recorded = std::any_of(directory.begin(), directory.end(),
                                   [](const ZipEntry& entry) { return entry.crc != 0; });
  const bool check_crcs = file.crcs_recorded;
  // The reader finds a record by name ignoring ASCII case: every entry it might pick must read.
  auto records = [&](const std::string& record) {
    std::vector<const ZipEntry*> found;
    const std::string wanted = lower_ascii(first.substr(0, slash + 1) + record);
    for (const ZipEntry& entry : directory) {
      if (lower_ascii(entry.name) == wanted) found.push_back(&entry);
    }
    return found;
  };
  // A stored (uncompressed) record inside the file whose bytes match the CRC-32 recorded for
  // them. The reader's constructor checks the version's and the id's itself (and leaks when they
  // fail), so those are checked even in a fuzzing build.
  auto stored = [&](const ZipEntry& entry, std::string& bytes, bool even_fuzzing) {
    if (entry.method != 0 || entry.size == 0 || entry.size == 0xffffffffu) return false;
    const std::optional<std::string> found = record_bytes(zip, entry);
    if (!found) return false;
    bytes = *found;
    return !check_crcs || (kFuzzingBuild && !even_fuzzing) || crc_matches(bytes, entry);
  };
  std::string bytes;
  for (const ZipEntry* id : records(".data/serialization_id")) {
    if (!stored(*id, bytes, true)) return "its serialization id is damaged";
  }
  std::vector<const ZipEntry*> versions = records(".data/version");
  if (versions.empty()) versions = records("version");
  if (versions.empty()) return "it has no format version";
  for (const ZipEntry* version : versions) {
    if (!stored(*version, bytes, true)) return "its format version is damaged";
    constexpr std::uint64_t kMin = caffe2::serialize::kMinSupportedFileFormatVersion;
    constexpr std::uint64_t kMax = caffe2::serialize::kMaxSupportedFileFormatVersion;
    std::uint64_t number = 0;
    std::size_t digits = 0;
    while (digits < bytes.size() && digits < 8 && bytes[digits] >= '0' && bytes[digits] <= '9') {
      number = number * 10 + static_cast<std::uint64_t>(bytes[digits++] - '0');
    }
    if (digits == 0 || number < kMin || number > kMax) {
      return "its format version is not one LibTorch reads (" + std::to_string(kMin) + " to " +
             std::to_string(kMax) + ")";
    }
  }
  const std::unordered_map<std::string, std::uint64_t> sizes = record_sizes(directory);
  for (const ZipEntry& entry : directory) {
    if (entry.size == 0xffffffffu || entry.compressed == 0xffffffffu) {
      return "it has an entry of 4 GiB or more";  // zip64 sizes: LibTorch's own files have none
    }
    // A torch file has no folders. The zip reader reads an entry marked as one as empty, so a
    // tensor's record marked so would load other bytes than its CRC-32 vouches for (found by a
    // damage sweep: one bit of an entry's attributes, and a bias loaded wrong without an error).
    if ((entry.attributes & 0x10) != 0 || (!entry.name.empty() && entry.name.back() == '/')) {
      return "its entry " + entry.name.substr(0, 80) + " is marked as a folder";
    }
    if (entry.method == 8 ? entry.size / 1032 > entry.compressed  // deflate's largest ratio
                          : entry.size > entry.compressed) {
      return "its entry " + entry.name.substr(0, 80) + " claims more bytes than it holds";
    }
    const std::string suffix = lower_ascii(
        entry.name.substr(entry.name.size() - std::min<std::size_t>(entry.name.size(), 3)));
    if (suffix == ".py") {  // a TorchScript source (in code/): stored, or deflated when larger
      const std::optional<std::string> source = record_bytes(zip, entry);
      if (!source || (check_crcs && !kFuzzingBuild && !crc_matches(*source, entry))) {
        return "its source " + entry.name.substr(0, 80) + " is damaged";
      }
      const std::string refusal = source_refusal(*source, entry.name);
      if (!refusal.empty()) return refusal;
    }
    if (suffix != "pkl") continue;
    if (!stored(entry, bytes, false))
      return "its pickle " + entry.name.substr(0, 80) + " is damaged";
    // A storage key names a record beside the pickle: archive/data.pkl's "0" is archive/data/0.
    std::string folder = lower_ascii(entry.name);
    if (folder.size() >= 4 && folder.compare(folder.size() - 4, 4, ".pkl") == 0) {
      folder.resize(folder.size() - 4);
    }
    const std::string refusal = check_pickle(bytes, storage_sizes(sizes, folder + '/'));
    if (!refusal.empty()) return refusal;
  }
  if (crc == CrcCheck::kEveryRecord && check_crcs && !kFuzzingBuild) {
    for (const ZipEntry& entry : directory) {
      const std::optional<std::string> record = record_bytes(zip, entry);
      if (!record || !crc_matches(*record, entry)) {
        file.damaged_record = record_name(entry).substr(0, 80);
        return "its entry " + file.damaged_record +
               " does not match the CRC-32 the zip records for it";
      }
    }
  }
  return "";
}

}  // namespace

bool TorchFile::has_record(const std::string& record) const {
  if (directory.empty()) return false;
  const std::string& first = directory.front().name;
  const std::string wanted = lower_ascii(first.substr(0, first.find('/') + 1) + record);
  return std::any_of(directory.begin(), directory.end(),
                     [&](const ZipEntry& entry) { return lower_ascii(entry.name) == wanted; });
}

TorchFile check_torch_file(const std::string& path, CrcCheck crc) {
  TorchFile file;
  std::ifstream in(path, std::ios::binary);
  file.bytes.assign(std::istreambuf_iterator<char>(in), {});
  file.directory = zip_directory(file.bytes);
  file.refusal = zip_refusal(file, crc);
  return file;
}

std::string pickle_refusal(const std::string& pickle, const TorchFile& file,
                           const std::string& record) {
  if (file.directory.empty())
    return "no zip directory: the file is cut short, or not a zip archive";
  const std::string& first = file.directory.front().name;
  std::string folder = lower_ascii(first.substr(0, first.find('/') + 1) + record);
  if (folder.size() >= 4 && folder.compare(folder.size() - 4, 4, ".pkl") == 0) {
    folder.resize(folder.size() - 4);
  }
  return check_pickle(pickle, storage_sizes(record_sizes(file.directory), folder + '/'));
}

namespace {
std::string little_endian32(std::uint32_t n) {
  std::string bytes(4, '\0');
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes;
}
}  // namespace

//! [plain-dict-pickle]
// A state_dict is a collections.OrderedDict. LibTorch's unpickler expects that class only as a
// tensor's (empty) backward hooks and turns it into None, so torch::pickle_load fails on the
// files that torch.save(model.state_dict(), path) writes ("Expected GenericDict but got None").
// torch.save writes pickle protocol 2 and always opens and closes a state_dict the same way; two
// edits of the opcodes make it a plain dict, which the unpickler reads. Anything else is left as
// it is (a plain dict needs nothing).
std::string plain_dict_pickle(std::string pickle) {
  // Opening: PROTO 2, GLOBAL collections.OrderedDict, BINPUT 0, EMPTY_TUPLE, REDUCE, BINPUT 1.
  static const std::string kOpening(
      "\x80\x02"
      "ccollections\nOrderedDict\nq\x00)Rq\x01",
      33);
  if (pickle.compare(0, kOpening.size(), kOpening) != 0) return pickle;
  // Becomes: an empty dict in memo 1, and the class still in memo 0 (each tensor's hooks refer
  // to it) as the value of a placeholder entry: EMPTY_DICT, BINPUT 1, MARK, BINUNICODE key,
  // GLOBAL, BINPUT 0, SETITEMS.
  const std::string key = kPlaceholderKey;
  pickle = std::string("\x80\x02}q\x01(X", 7) + little_endian32(key.size()) + key +
           std::string("ccollections\nOrderedDict\nq\x00u", 28) + pickle.substr(kOpening.size());
  // Closing: {'_metadata': OrderedDict(...)} BUILD STOP sets the attribute _metadata (each
  // module's version). Cut from that dict (EMPTY_DICT, BINPUT/LONG_BINPUT) and keep STOP.
  static const std::string kMetadata("X\x09\x00\x00\x00_metadata", 14);
  const std::size_t at = pickle.rfind(kMetadata);
  if (at != std::string::npos && pickle.size() >= 2 &&
      pickle.compare(pickle.size() - 2, 2, "b.") == 0) {
    std::size_t open = std::string::npos;
    if (at >= 3 && pickle[at - 3] == '}' && pickle[at - 2] == 'q') open = at - 3;
    if (at >= 6 && pickle[at - 6] == '}' && pickle[at - 5] == 'r') open = at - 6;
    if (open != std::string::npos) pickle = pickle.substr(0, open) + ".";
  }
  return pickle;
}
//! [plain-dict-pickle]

c10::IValue read_torch_save(const TorchFile& file) {
  caffe2::serialize::PyTorchStreamReader zip(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(file.bytes.data(), file.bytes.size()));
  if (!zip.hasRecord("data.pkl")) throw std::runtime_error("no data.pkl in the zip");
  auto [bytes, size] = zip.getRecord("data.pkl");
  const std::string pickle =
      plain_dict_pickle(std::string(static_cast<const char*>(bytes.get()), size));
  const std::string unsafe = pickle_refusal(pickle, file, "data.pkl");  // the rewrite, checked
  if (!unsafe.empty()) throw std::runtime_error(unsafe);
  std::size_t offset = 0;
  auto read = [&](char* buffer, std::size_t n) {
    n = std::min(n, pickle.size() - offset);
    std::memcpy(buffer, pickle.data() + offset, n);
    offset += n;
    return n;
  };
  auto read_storage = [&](const std::string& key) {
    return std::get<0>(zip.getRecord("data/" + key));
  };
  torch::jit::Unpickler unpickler(read, /*type_resolver=*/nullptr, /*obj_loader=*/nullptr,
                                  read_storage, c10::Device(c10::kCPU));
  return unpickler.parse_ivalue();
}

void write_torch_save(const c10::impl::GenericDict& dict,
                      const std::function<std::size_t(const void*, std::size_t)>& write) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* data, std::size_t size) { pickle.insert(pickle.end(), data, data + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);  // no TorchScript type tag
  pickler.protocol();
  pickler.pushIValue(dict);
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter zip(write);  // data.pkl + data/<key>, as torch.save
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     zip);
  zip.writeEndOfFile();
}

// The sizes and strides come from the file's pickle and LibTorch's unpickler takes them as they
// are: a damaged file could otherwise make a tensor that reads (and a copy_ that writes) past
// the end of the bytes the file gave it.
std::string storage_refusal(const at::Tensor& tensor) {
  if (!tensor.defined()) return "";
  std::ostringstream refusal;
  refusal << "(" << tensor.sizes() << ") reaches past the " << tensor.storage().nbytes()
          << " bytes stored for it";
  for (const std::int64_t size : tensor.sizes()) {
    if (size < 0) return refusal.str();  // the unpickler takes negative sizes too
  }
  if (tensor.numel() == 0) return "";
  if (tensor.storage_offset() < 0) return refusal.str();
  std::int64_t last = tensor.storage_offset();  // the furthest element, in elements
  for (std::int64_t d = 0; d < tensor.dim(); ++d) {
    std::int64_t reach = 0;
    if (tensor.stride(d) < 0 ||
        __builtin_mul_overflow(tensor.size(d) - 1, tensor.stride(d), &reach) ||
        __builtin_add_overflow(last, reach, &last)) {
      return refusal.str();
    }
  }
  std::int64_t end = 0;
  if (__builtin_add_overflow(last, 1, &end) ||
      __builtin_mul_overflow(end, static_cast<std::int64_t>(tensor.element_size()), &end) ||
      end > static_cast<std::int64_t>(tensor.storage().nbytes())) {
    return refusal.str();
  }
  return "";
}

// A generator reads a state's bytes from its data pointer, whatever its strides; LibTorch's own
// checks (size, format, a valid Mersenne Twister state) run in set_state. Trying the state and
// putting the old one back means restoring it later, after a model has changed, cannot fail
// (found by fuzz_checkpoint: a float tensor there threw from set_state after the copies).
std::string generator_state_refusal(const c10::Device& device, const at::Tensor& state) {
  if (!state.defined() || state.scalar_type() != at::kByte || state.dim() != 1 ||
      !state.is_contiguous()) {
    return "not a contiguous byte vector";
  }
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor now = generator.get_state();
  std::string refusal;
  try {
    generator.set_state(state.to(at::kCPU));
  } catch (const std::exception& e) {
    refusal = error_message(e);
  }
  generator.set_state(now);
  return refusal;
}

}  // namespace course

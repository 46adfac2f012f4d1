// checkpoint_zip.h defines: tag_storages_cuda, a checkpoint file (a zip of PyTorch's format)
// copied with its tensors recorded as a GPU run records them, for the tests that load a GPU's
// file on the CPU (lessons 10 and 14).
#pragma once

#include <caffe2/serialize/inline_container.h>  // defines: PyTorchStreamReader, PyTorchStreamWriter
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

// Copies the zip at `from` to `to` with every storage's recorded device changed from "cpu" to
// "cuda:0", as a GPU run records it (the string is pickled once and referred to after that).
inline void tag_storages_cuda(const std::string& from, const std::string& to) {
  caffe2::serialize::PyTorchStreamReader in(from);
  caffe2::serialize::PyTorchStreamWriter out(to);
  const std::string cpu(
      "X\x03\x00\x00\x00"
      "cpu",
      8),
      cuda(
          "X\x06\x00\x00\x00"
          "cuda:0",
          11);
  for (const std::string& name : in.getAllRecords()) {
    if (name == "version" || name == ".data/version") continue;  // the writer adds its own
    auto [data, size] = in.getRecord(name);
    std::string bytes(static_cast<const char*>(data.get()), size);
    if (name == "data.pkl") {
      const std::size_t at = bytes.find(cpu);
      ASSERT_NE(at, std::string::npos);
      bytes.replace(at, cpu.size(), cuda);
    }
    out.writeRecord(name, bytes.data(), bytes.size());
  }
  out.writeEndOfFile();
}

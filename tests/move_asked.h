// move_asked.h defines: expect_move_asked, how a test on a CPU-only machine tells a function that
// moves a model to a device from one that moves nothing.
#pragma once

#include <c10/core/Device.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

// On a CPU-only machine every device a model can really move to is the CPU, where a move changes
// nothing a test can see. The meta device (tensors with shapes and no numbers) is the one other
// device LibTorch always has, and a module cannot move there: Module::to replaces each tensor's
// data with set_data(), which refuses to turn a CPU tensor into a meta one. That refusal is the
// evidence: it comes only from a move that was asked for. `move` gets the meta device; a move
// that was never written returns without the refusal, and the test fails saying so.
inline void expect_move_asked(const std::function<void(const c10::Device&)>& move,
                              const std::string& what) {
  try {
    move(c10::Device(c10::kMeta));
  } catch (const std::exception& e) {
    const std::string message = e.what();
    if (message.find("set_data") != std::string::npos) return;  // the move was asked for
    ADD_FAILURE() << what << ": unexpected error: " << message.substr(0, message.find('\n'));
    return;
  }
  ADD_FAILURE() << what << " moved nothing to the device it was given: call model->to(device)";
}

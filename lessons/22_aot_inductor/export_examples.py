#!/usr/bin/env python3
"""Lesson 22's three examples, run and checked: what torch.export records of the tutorial's ANN,
what it refuses (a branch that depends on the data), and what TorchScript says of itself now.

  python3 lessons/22_aot_inductor/export_examples.py

Run it with the Python whose torch is the build's LibTorch (the 2.11 flavour's .venv). It prints
each example's result and exits 0 when each is what the lesson's page says, 1 naming the one that
is not (a test runs it: lesson22.export-examples).
"""
import os
import sys
import warnings

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from tutorial_program import ANN  # noqa: E402  the tutorial's model


def main():
    wrong = []

    # [captures]
    model = ANN().eval()
    batch = torch.export.Dim("batch", min=1, max=1 << 20)  # the batch size left free
    program = torch.export.export(model, (torch.rand(64, 1, 28, 28),),
                                  dynamic_shapes={"x": {0: batch}})
    operators = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    # [captures]
    print("the ANN's forward(), as torch.export records it:", ", ".join(operators))
    if operators.count("aten.linear.default") != 3 or operators.count("aten.relu.default") != 2:
        wrong.append("the ANN's graph is not three linear and two relu operators")
    shape = [node.meta["val"].shape for node in program.graph.nodes if node.name == "x"][0]
    print(f"its input x: [{', '.join(str(size) for size in shape)}] (the first, a symbol: any batch)")

    # [refuses]
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # which way it goes depends on the data, not on the shapes
                return x * 2
            return x - 1

    try:
        torch.export.export(Branchy(), (torch.rand(3),))
        refused = ""
    except Exception as error:  # noqa: BLE001  the error torch.export raises, whatever its class
        refused = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    # [refuses]
    print("a branch on the data:", refused or "exported (not refused)")
    if "data-dependent" not in refused:
        wrong.append("torch.export did not refuse a branch on the data")

    # [cond]
    class Conditional(nn.Module):
        def forward(self, x):  # both ways become graphs of their own; the data picks at run time
            return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))

    conditional = torch.export.export(Conditional(), (torch.rand(3),)).module()
    # [cond]
    answers = [conditional(torch.full((3,), v)).tolist() for v in (1.0, -1.0)]
    print("the same branch with torch.cond, exported, on ones and on minus ones:", answers)
    if answers != [[2.0, 2.0, 2.0], [-2.0, -2.0, -2.0]]:
        wrong.append("the torch.cond version did not take each branch")

    # [torchscript]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.script(ANN())
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    # [torchscript]
    print("torch.jit.script says:", said[0] if said else "nothing")
    if not any("deprecated" in s and "torch.export" in s for s in said):
        wrong.append("torch.jit.script gave no deprecation warning naming torch.export")

    for what in wrong:
        print("WRONG:", what)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

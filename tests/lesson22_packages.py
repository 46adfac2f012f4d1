#!/usr/bin/env python3
"""Packages of the tutorial's ANN made the way a user outside the course makes them, for lesson
22's tests: other weights (seed 7, one epoch on the first 3,000 training images), torch.export and
aoti_compile_and_package with nothing of the course's (no metadata), for the CPU.

  lesson22_packages.py FOLDER [--data-dir DIR]

writes FOLDER/dynamic.pt2 (the batch dimension dynamic) and FOLDER/batch64.pt2 (exported on a
batch of 64 with no dynamic dimension: a package made for that one size), then prints the test
accuracy of those weights as the tutorial prints it ("Test Accuracy: 0.xxxx") and writes that line
to FOLDER/accuracy.txt, last: the folder holds all three or no accuracy.txt.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from tutorial_program import ANN, FashionMNIST  # noqa: E402  the tutorial's model and data

parser = argparse.ArgumentParser()
parser.add_argument("folder")
parser.add_argument("--data-dir", default=os.environ.get("GPU_LESSONS_DATA_DIR")
                    or "/usr/share/datasets/fashion-mnist")
args = parser.parse_args()
os.makedirs(args.folder, exist_ok=True)
torch.manual_seed(7)
model = ANN()
optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
loader = torch.utils.data.DataLoader(FashionMNIST(args.data_dir, train=True, limit=3000),
                                     batch_size=64, shuffle=True)
for features, labels in loader:
    loss = nn.functional.cross_entropy(model(features), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
model.eval()
test = torch.utils.data.DataLoader(FashionMNIST(args.data_dir, train=False), batch_size=64)
with torch.no_grad():
    correct = sum((model(x).argmax(1) == y).sum().item() for x, y in test)
said = f"Test Accuracy: {correct / len(test.dataset):.4f}"

example = torch.rand(64, 1, 28, 28)
dynamic = torch.export.export(model, (example,),
                              dynamic_shapes={"x": {0: torch.export.Dim("batch", max=1 << 20)}})
torch._inductor.aoti_compile_and_package(dynamic, package_path=os.path.join(args.folder, "dynamic.pt2"))
fixed = torch.export.export(model, (example,))
torch._inductor.aoti_compile_and_package(fixed, package_path=os.path.join(args.folder, "batch64.pt2"))
print(said, flush=True)
with open(os.path.join(args.folder, "accuracy.txt.partial"), "w") as f:
    f.write(said + "\n")
os.replace(os.path.join(args.folder, "accuracy.txt.partial"), os.path.join(args.folder, "accuracy.txt"))

#!/usr/bin/env python3
"""Lesson 10's Python side: the Python tutorials' way of saving and loading lesson 05's MLP.

  save FILE [--epochs N]   train N epochs (default 1) in Python, then
                           torch.save(model.state_dict(), FILE)
  load FILE                model.load_state_dict(torch.load(FILE, map_location="cpu",
                                                            weights_only=True))

Either way it ends with the Fashion-MNIST test accuracy of the model it holds, printed as the C++
lesson prints it ("test accuracy: 0.xxxx"), so both sides can be compared on the same weights:

  python3 lessons/10_checkpointing/roundtrip.py save model.pt
  build/bin/lesson10_checkpointing --from-python model.pt --to-python back.pt
  python3 lessons/10_checkpointing/roundtrip.py load back.pt

Run it with the Python whose torch matches the C++ build's LibTorch (Debian's python3-torch for
the debian flavour, .venv/bin/python for 2.11). Data: --data-dir, else $GPU_LESSONS_DATA_DIR, else
/usr/share/datasets/fashion-mnist.
"""
import argparse
import gzip
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    """Lesson 05's classifier: Linear attributes fc1, fc2, fc3 give the state_dict's keys."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load_split(folder, prefix):
    images = read_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"))
    return images.reshape(-1, 784).float().div_(255), labels.long()


@torch.no_grad()
def test_accuracy(model, images, labels):
    model.eval()
    correct = 0
    for start in range(0, len(labels), 1000):  # batches of 1000, as the C++ lesson evaluates
        logits = model(images[start:start + 1000])
        correct += (logits.argmax(1) == labels[start:start + 1000]).sum().item()
    return correct / len(labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["save", "load"])
    parser.add_argument("file")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--data-dir", default=os.environ.get(
        "GPU_LESSONS_DATA_DIR", "/usr/share/datasets/fashion-mnist"))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = Mlp()
    if args.action == "save":
        images, labels = load_split(args.data_dir, "train")
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for epoch in range(args.epochs):
            model.train()
            for idx in torch.randperm(len(labels)).split(64):
                optimizer.zero_grad()
                F.cross_entropy(model(images[idx]), labels[idx]).backward()
                optimizer.step()
        # [save]
        torch.save(model.state_dict(), args.file)
        # [save]
        print(f"saved {args.file} (torch {torch.__version__})")
    else:
        # [load]
        state_dict = torch.load(args.file, map_location="cpu", weights_only=True)
        model.load_state_dict(state_dict)  # strict: every key present, every shape equal
        # [load]
        print(f"loaded {args.file} (torch {torch.__version__})")
    images, labels = load_split(args.data_dir, "t10k")
    print(f"test accuracy: {test_accuracy(model, images, labels):.4f}")


if __name__ == "__main__":
    main()

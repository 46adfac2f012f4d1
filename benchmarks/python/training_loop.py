#!/usr/bin/env python3
"""The lesson 05 loop in Python (PyTorch), for comparison with the C++ lesson on the same machine
and the same torch build: MLP 784-128-64-10, cross-entropy, Adam lr 1e-3, batch 64, the dataset
resident in one tensor and batches picked by a shuffled index tensor, loss summed on the device.

Run:  python3 benchmarks/python/training_loop.py [--epochs 5] [--threads N] [--device cpu|cuda]
                                                 [--data-dir DIR]
It prints the seconds of each epoch, the median, and the test accuracy.
Needs PyTorch and Fashion-MNIST; run it with the Python whose torch is the C++ build's LibTorch
(scripts/yardstick does: Debian's python3-torch for the debian flavour, .venv for 2.11).
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from tutorial_program import read_idx  # noqa: E402  (the IDX reader; a missing file named)


def load(folder, prefix, device):
    """One split, resident on the device: images as rows of 784 floats in [0, 1], labels int64."""
    images = read_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"))
    return images.reshape(-1, 784).float().div_(255).to(device), labels.long().to(device)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data-dir", default=os.environ.get(
        "GPU_LESSONS_DATA_DIR", "/usr/share/datasets/fashion-mnist"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # the C++ lessons use all cores too
    device = torch.device(args.device)
    train_x, train_y = load(args.data_dir, "train", device)
    test_x, test_y = load(args.data_dir, "t10k", device)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                          nn.Linear(64, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    n = train_x.shape[0]
    seconds = []
    for epoch in range(args.epochs):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        model.train()
        order = torch.randperm(n, device=device)
        loss_sum = torch.zeros((), device=device)
        for i in range(0, n, args.batch_size):
            idx = order[i:i + args.batch_size]
            x, y = train_x.index_select(0, idx), train_y.index_select(0, idx)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * len(idx)
        mean_loss = loss_sum.item() / n  # .item() waits for the device: the clock is honest
        seconds.append(time.perf_counter() - start)
        print(f"python epoch {epoch + 1}/{args.epochs}  loss {mean_loss:.4f}  {seconds[-1]:.3f} s")
    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    print(f"python torch {torch.__version__} on {device}, {torch.get_num_threads()} threads: "
          f"median {statistics.median(seconds):.3f} s/epoch, test accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()

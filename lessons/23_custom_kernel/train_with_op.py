#!/usr/bin/env python3
"""Lesson 23 from Python: the course's own operator, loaded and called as PyTorch calls its own.

torch.ops.load_library() loads the library that lesson 23 links (libgpu_lessons_ops.so); its
TORCH_LIBRARY block registers the operator as it loads, and from then on Python finds it by name,
torch.ops.gpu_lessons.train_epoch, as C++ finds it through the dispatcher. This program makes the
tutorial's ANN, puts its parameters and Adam's state in flat tensors, draws an order of the
training images and trains on them with the operator; it saves what it started from and what it
got, so that C++ can train from the same start and compare:

  python3 lessons/23_custom_kernel/train_with_op.py --library build/bin/libgpu_lessons_ops.so \\
      --steps 100 --save python.pt

  --library FILE  the operator's library (lesson 23 prints its path)
  --steps N       train N steps of 64 (0: one epoch of all the images)
  --limit N       the first N training images only (all 60,000 without it)
  --device D      cpu or cuda (default: cuda when there is one, as the tutorial chooses)
  --seed N        torch.manual_seed(N) first
  --threads N     torch.set_num_threads(N): on the CPU, as many as the C++ run, whose products
                  then split their sums as Python's do
  --save FILE     torch.save({"start", "order", "losses", "parameters"}) after training
  --data-dir DIR  the Fashion-MNIST folder (else $GPU_LESSONS_DATA_DIR, else Debian's)

Run it with the Python whose torch is the LibTorch the library was built with.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from tutorial_program import ANN, read_idx  # noqa: E402  (the tutorial's model, the IDX reader)

BATCH_SIZE = 64  # the tutorial's DataLoader(batch_size=64)
LR = 0.001       # optim.Adam(model.parameters(), lr=0.001)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", required=True)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--device", choices=["cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--save")
    parser.add_argument("--data-dir", default=os.environ.get("GPU_LESSONS_DATA_DIR")
                        or "/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    if not os.path.isfile(args.library):
        sys.exit(f"error: no library {args.library}\nHINT: build lesson 23 first "
                 "(scripts/build.sh), and give the path lesson 23 prints")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)

    # [load]
    torch.ops.load_library(args.library)  # runs its TORCH_LIBRARY: the operator is registered
    train_epoch = torch.ops.gpu_lessons.train_epoch
    # [load]

    torch.manual_seed(args.seed)
    model = ANN()
    images = read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz"))[:args.limit]
    labels = read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz"))[:args.limit]
    images = images.reshape(-1, 28 * 28).float().div(255).to(device)  # ToTensor()'s [0, 1]
    labels = labels.long().to(device)
    samples = len(labels) if args.steps == 0 else min(len(labels), args.steps * BATCH_SIZE)
    order = torch.randperm(len(labels))[:samples].to(device)  # DataLoader(shuffle=True)'s order

    # [train]
    parameters = torch.cat([p.detach().flatten() for p in model.parameters()]).to(device)
    start = parameters.clone()
    gradients = torch.zeros_like(parameters)
    exp_avg, exp_avg_sq = torch.zeros_like(parameters), torch.zeros_like(parameters)
    step = torch.zeros((), device=device)  # Adam's step count, on the device
    losses = train_epoch(parameters, gradients, exp_avg, exp_avg_sq, step, images, labels, order,
                         BATCH_SIZE, LR)
    # [train]
    print(f"torch.ops.gpu_lessons.train_epoch on {device}: {len(losses)} steps, loss "
          f"{losses[0].item():.4f} -> {losses[-1].item():.4f}, Adam's step {step.item():.0f}")
    if args.save:
        torch.save({"start": start.cpu(), "order": order.cpu(), "losses": losses.cpu(),
                    "parameters": parameters.cpu()}, args.save)


if __name__ == "__main__":
    main()
